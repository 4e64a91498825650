//! The answerer's pure interface: a question and its workspace index in,
//! ranked evidence and an answer draft out. The index is a [`Gathered`]:
//! the keywords searched, the files ranked for them, the keywords nothing
//! matched or whose search hit the cap, and the read windows of the top
//! files. [`draft`] turns it into the findings of the top files (their
//! evidence not yet checked), the system map, the risks, the unknowns and
//! the summary; [`finish`] takes the draft and its evidence as grounding
//! checked it and completes the [`ExplorationResult`]. [`broader_terms`]
//! decides whether a round that matched nothing is searched again with
//! shorter stems.
//!
//! Nothing here calls the port, reads a file, the clock or randomness: the
//! same index gives the same draft. [`crate::explore::explore`] only wraps
//! these functions with the port's calls (search, read, grounding), so this
//! is where the answer's content is decided and tested.

use zopu_runtime::text::clip_chars;

use crate::explore::{ExploreInput, Gathered, findings, system_map};
use crate::results::{
    EvidenceItem, ExplorationResult, Finding, Provenance, ResultVersion, SystemMap,
};

/// Files read, reported as findings and drawn on the system map.
pub const TOP_FILES: usize = 5;
/// Most risks listed, the heuristic caveat included.
const RISKS_MAX: usize = 6;
/// Most files named as the next ones to read.
const NEXT_READS_MAX: usize = 3;
/// Files named in the summary as the strongest matches.
const STRONGEST_MAX: usize = 3;
/// Shortest part of a term a broader round searches, in bytes.
const BROADER_PART_MIN: usize = 4;
/// Characters of a part a broader round keeps: its stem.
const BROADER_STEM_CHARS: usize = 5;

/// An answer drafted from a workspace index, before its evidence is
/// checked against the workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Draft {
    /// The terms searched (the index's keywords).
    pub keywords: Vec<String>,
    pub summary: String,
    /// One finding per top file, best first; its evidence is what the read
    /// windows show (`verified: false`) and `assumption` is not yet set.
    pub findings: Vec<Finding>,
    pub system_map: SystemMap,
    pub risks: Vec<String>,
    pub unknowns: Vec<String>,
}

impl Draft {
    /// Every evidence item of the findings, tagged with the index of the
    /// finding it backs, in finding order: what grounding checks.
    pub fn evidence(&self) -> Vec<(usize, EvidenceItem)> {
        self.findings
            .iter()
            .enumerate()
            .flat_map(|(index, finding)| {
                finding
                    .evidence
                    .iter()
                    .map(move |item| (index, item.clone()))
            })
            .collect()
    }
}

/// The terms of one more, broader round when `gathered` ranked no file:
/// each term split at `_ - . /`, its parts of at least four bytes cut to
/// their first five characters. `None` when the round found files, or when
/// nothing broader is left to search.
pub fn broader_terms(gathered: &Gathered) -> Option<Vec<String>> {
    if !gathered.ranked.is_empty() {
        return None;
    }
    let broader: Vec<String> = gathered
        .keywords
        .iter()
        .flat_map(|term| term.split(['_', '-', '.', '/']))
        .filter(|part| part.len() >= BROADER_PART_MIN)
        .map(|part| part.chars().take(BROADER_STEM_CHARS).collect())
        .collect();
    (!broader.is_empty() && broader != gathered.keywords).then_some(broader)
}

/// Drafts the answer to `question` from its workspace index: the findings
/// of the top files with their unchecked evidence, the system map, the
/// risks (the heuristic caveat, keywords whose search hit the match cap,
/// open TODO/FIXME/HACK notes in the read windows), the unknowns (keywords
/// nothing mentions) and the summary.
pub fn draft(question: &str, gathered: &Gathered) -> Draft {
    let found = findings(gathered, TOP_FILES);
    let summary = summary(gathered, &found);
    Draft {
        keywords: gathered.keywords.clone(),
        summary,
        findings: found,
        system_map: system_map(question, gathered, TOP_FILES),
        risks: risks(gathered),
        unknowns: unknowns(gathered),
    }
}

/// Completes a draft with its evidence as grounding checked it (each item
/// tagged with the index of its finding, as [`Draft::evidence`] gave it):
/// an item grounding dropped is gone, a finding without verified evidence
/// is an assumption, and the next actions point at the verified evidence.
pub fn finish(
    draft: Draft,
    grounded: Vec<(usize, EvidenceItem)>,
    input: &ExploreInput,
) -> ExplorationResult {
    let Draft {
        keywords,
        summary,
        mut findings,
        system_map,
        risks,
        unknowns,
    } = draft;
    for finding in &mut findings {
        finding.evidence.clear();
    }
    for (index, item) in grounded {
        if let Some(finding) = findings.get_mut(index) {
            finding.evidence.push(item);
        }
    }
    for finding in &mut findings {
        finding.assumption = !finding.evidence.iter().any(|item| item.verified);
    }
    let next_actions = next_actions(&findings);
    ExplorationResult {
        version: ResultVersion::CURRENT,
        question: input.question.clone(),
        summary,
        system_map,
        findings,
        risks,
        unknowns,
        next_actions,
        keywords,
        provenance: Provenance {
            provider: input.provider.clone(),
            heuristic: true,
            repository_commit: input.repository_commit.clone(),
            ..Default::default()
        },
    }
}

fn quoted_list(keywords: &[String]) -> String {
    keywords
        .iter()
        .map(|keyword| format!("`{keyword}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What was searched and what matched, or that nothing did.
fn summary(gathered: &Gathered, found: &[Finding]) -> String {
    let searched = quoted_list(&gathered.keywords);
    if gathered.ranked.is_empty() {
        return format!(
            "No file in the repository matches {searched}; the question may use different words than the code."
        );
    }
    let strongest: Vec<String> = gathered
        .ranked
        .iter()
        .take(STRONGEST_MAX)
        .map(|file| format!("`{}`", file.path))
        .collect();
    format!(
        "Searched for {searched}: {} file(s) match; the strongest are {}. {}",
        gathered.ranked.len(),
        strongest.join(", "),
        found
            .first()
            .map(|finding| finding.claim.clone())
            .unwrap_or_default()
    )
}

/// The heuristic caveat, the capped searches, then the open notes in the
/// read windows (in path order), [`RISKS_MAX`] in all.
fn risks(gathered: &Gathered) -> Vec<String> {
    let mut risks = vec!["Heuristic result: files were located by keyword search and ranking, not by running or fully reading the code; confirm before acting on it.".to_owned()];
    for keyword in &gathered.capped {
        risks.push(format!(
            "The search for `{keyword}` hit its match cap; less obvious places may be missing."
        ));
    }
    for (path, (first, content)) in &gathered.windows {
        for (offset, line) in content.lines().enumerate() {
            if (line.contains("TODO") || line.contains("FIXME") || line.contains("HACK"))
                && risks.len() < RISKS_MAX
            {
                risks.push(format!(
                    "`{path}` line {} has an open note near the matches: {}",
                    first + offset as u64,
                    clip_chars(line.trim(), 160)
                ));
            }
        }
    }
    risks
}

/// The keywords nothing mentions, and that no code was run.
fn unknowns(gathered: &Gathered) -> Vec<String> {
    let mut unknowns: Vec<String> = gathered
        .unmatched
        .iter()
        .map(|keyword| format!("Nothing in the repository mentions `{keyword}`."))
        .collect();
    unknowns.push("Runtime behaviour was not observed: no code was run.".to_owned());
    unknowns
}

/// The first verified evidence of the first findings that have one, then
/// the way on to an issue.
fn next_actions(findings: &[Finding]) -> Vec<String> {
    let mut next_actions: Vec<String> = findings
        .iter()
        .filter_map(|finding| finding.evidence.iter().find(|item| item.verified))
        .take(NEXT_READS_MAX)
        .map(|item| format!("Read `{}` around line {}.", item.path, item.start_line))
        .collect();
    next_actions.push("Ask for an issue to turn a finding into a scoped change.".to_owned());
    next_actions
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::explore::{RankedFile, rank};

    fn words(words: &[&str]) -> Vec<String> {
        words.iter().map(|word| (*word).to_owned()).collect()
    }

    /// A ranked file with its matches: (line, text, keyword).
    fn ranked(path: &str, score: f64, matches: &[(u64, &str, &str)]) -> RankedFile {
        RankedFile {
            path: path.to_owned(),
            score,
            matches: matches
                .iter()
                .map(|(line, text, keyword)| (*line, (*text).to_owned(), (*keyword).to_owned()))
                .collect(),
            keywords: matches
                .iter()
                .map(|(_, _, keyword)| (*keyword).to_owned())
                .collect(),
            ..Default::default()
        }
    }

    fn input(question: &str) -> ExploreInput {
        ExploreInput {
            question: question.to_owned(),
            provider: "offline".to_owned(),
            repository_commit: "0123456789abcdef0123456789abcdef01234567".to_owned(),
        }
    }

    /// Two files: `src/session.rs` defines `parse_session` (line 3) and
    /// mentions `token` (line 7); `src/store.rs` mentions `session` (line 2)
    /// and has no read window.
    fn two_files() -> Gathered {
        Gathered {
            keywords: words(&["session", "token"]),
            ranked: vec![
                ranked(
                    "src/session.rs",
                    9.0,
                    &[
                        (3, "pub fn parse_session() {", "session"),
                        (7, "    check(token);", "token"),
                    ],
                ),
                ranked("src/store.rs", 4.0, &[(2, "// keeps a session", "session")]),
            ],
            windows: BTreeMap::from([(
                "src/session.rs".to_owned(),
                (
                    1,
                    "// Sessions.\n\npub fn parse_session() {\n    todo()\n}\n\n    check(token);\n"
                        .to_owned(),
                ),
            )]),
            ..Default::default()
        }
    }

    #[test]
    fn findings_follow_the_ranking_by_keyword_coverage_and_role() {
        let hit = |keyword: &str, path: &str, line: u64, text: &str| {
            (keyword.to_owned(), line, format!("{path}\u{0}{text}"))
        };
        // The same two lines in a source file, a test and a doc; one of the
        // words in another source file.
        let mut hits = Vec::new();
        for path in ["src/session.rs", "tests/session.rs", "docs/session.md"] {
            hits.push(hit("session", path, 3, "pub fn parse_session() {"));
            hits.push(hit("token", path, 7, "check(token);"));
        }
        hits.push(hit("token", "src/other.rs", 5, "check(token);"));
        let sizes: BTreeMap<String, u64> = [
            "src/session.rs",
            "src/other.rs",
            "tests/session.rs",
            "docs/session.md",
        ]
        .into_iter()
        .map(|path| (path.to_owned(), 400))
        .collect();
        let paths: Vec<String> = sizes.keys().cloned().collect();
        let index = |keywords: &[&str]| {
            let keywords = words(keywords);
            Gathered {
                ranked: rank(&keywords, &hits, &sizes, &paths),
                keywords,
                ..Default::default()
            }
        };
        let claimed = |draft: &Draft| -> Vec<String> {
            draft
                .findings
                .iter()
                .map(|finding| finding.claim.split('`').nth(1).unwrap_or("").to_owned())
                .collect()
        };

        // Same lines: the source before the test before the doc (role
        // weights); one word of two comes last (coverage).
        let drafted = draft(
            "How are session tokens parsed?",
            &index(&["session", "token"]),
        );
        assert_eq!(
            claimed(&drafted),
            [
                "src/session.rs",
                "tests/session.rs",
                "docs/session.md",
                "src/other.rs"
            ]
        );
        assert_eq!(
            drafted.summary,
            "Searched for `session`, `token`: 4 file(s) match; the strongest are `src/session.rs`, \
             `tests/session.rs`, `docs/session.md`. `src/session.rs` refers to `session`, `token` on 2 line(s)"
        );
        // The map draws the files in the same order.
        let drawn: Vec<&str> = drafted.system_map.nodes[1..]
            .iter()
            .map(|node| node.label.as_str())
            .collect();
        assert_eq!(drawn, claimed(&drafted));

        // Asked about the tests, the test leads.
        let drafted = draft(
            "Which tests cover session tokens?",
            &index(&["session", "token", "tests"]),
        );
        assert_eq!(
            claimed(&drafted)[0],
            "tests/session.rs",
            "{:?}",
            drafted.findings
        );
    }

    #[test]
    fn a_question_nothing_matches_says_so_and_names_the_unmatched_keywords() {
        let gathered = Gathered {
            keywords: words(&["zzyzx", "handl"]),
            unmatched: words(&["zzyzx", "handl"]),
            ..Default::default()
        };
        let drafted = draft("Where is the zzyzx handled?", &gathered);
        assert_eq!(
            drafted.summary,
            "No file in the repository matches `zzyzx`, `handl`; the question may use different words than the code."
        );
        assert_eq!(
            drafted.unknowns,
            [
                "Nothing in the repository mentions `zzyzx`.",
                "Nothing in the repository mentions `handl`.",
                "Runtime behaviour was not observed: no code was run.",
            ]
        );
        assert!(drafted.findings.is_empty());
        assert_eq!(drafted.system_map.nodes.len(), 1, "only the question");
        assert_eq!(drafted.risks.len(), 1, "{:?}", drafted.risks);
        let result = finish(drafted, Vec::new(), &input("Where is the zzyzx handled?"));
        assert_eq!(
            result.next_actions,
            ["Ask for an issue to turn a finding into a scoped change."]
        );
        assert_eq!(result.keywords, ["zzyzx", "handl"]);
    }

    #[test]
    fn a_round_that_matched_nothing_is_searched_again_with_shorter_stems_once() {
        let round = |keywords: &[&str], ranked: Vec<RankedFile>| Gathered {
            keywords: words(keywords),
            ranked,
            ..Default::default()
        };
        assert_eq!(
            broader_terms(&round(
                &["quuxfrobnicator_zeta", "blorptastic-wibble", "ab"],
                Vec::new()
            )),
            Some(words(&["quuxf", "zeta", "blorp", "wibbl"]))
        );
        assert_eq!(
            broader_terms(&round(&["src/net.io/client"], Vec::new())),
            Some(words(&["clien"]))
        );
        // Files were found: no second round.
        assert_eq!(
            broader_terms(&round(
                &["quuxfrobnicator"],
                vec![ranked("src/a.rs", 1.0, &[])]
            )),
            None
        );
        // Already stems, or nothing long enough: nothing broader to search.
        assert_eq!(broader_terms(&round(&["quuxf", "zeta"], Vec::new())), None);
        assert_eq!(broader_terms(&round(&["ab", "x_y"], Vec::new())), None);
    }

    #[test]
    fn a_capped_keyword_is_a_risk() {
        let gathered = Gathered {
            keywords: words(&["widget"]),
            ranked: vec![ranked("src/w.rs", 1.0, &[(1, "draw_widget();", "widget")])],
            capped: words(&["widget"]),
            ..Default::default()
        };
        let risks = draft("How is the widget drawn?", &gathered).risks;
        assert_eq!(risks.len(), 2, "{risks:?}");
        assert!(risks[0].starts_with("Heuristic result:"), "{risks:?}");
        assert_eq!(
            risks[1],
            "The search for `widget` hit its match cap; less obvious places may be missing."
        );
    }

    #[test]
    fn open_notes_in_the_read_windows_become_risks_six_at_most() {
        let mut gathered = Gathered {
            keywords: words(&["route"]),
            ranked: vec![
                ranked("src/a.rs", 2.0, &[(10, "fn route() {}", "route")]),
                ranked("src/b.rs", 1.0, &[(1, "// route", "route")]),
            ],
            windows: BTreeMap::from([
                (
                    "src/b.rs".to_owned(),
                    (1, "// TODO: b1\n// TODO: b2\n// TODO: b3\n// TODO: b4\n".to_owned()),
                ),
                (
                    "src/a.rs".to_owned(),
                    (
                        10,
                        "fn route() {}\n    // TODO: handle trailing slashes\n// FIXME late\nlet x = 1; // HACK\n"
                            .to_owned(),
                    ),
                ),
            ]),
            ..Default::default()
        };
        let risks = draft("How are routes matched?", &gathered).risks;
        // The caveat, then the windows in path order, cut at six.
        assert_eq!(
            risks[1..],
            [
                "`src/a.rs` line 11 has an open note near the matches: // TODO: handle trailing slashes",
                "`src/a.rs` line 12 has an open note near the matches: // FIXME late",
                "`src/a.rs` line 13 has an open note near the matches: let x = 1; // HACK",
                "`src/b.rs` line 1 has an open note near the matches: // TODO: b1",
                "`src/b.rs` line 2 has an open note near the matches: // TODO: b2",
            ]
        );
        // A capped keyword comes before the notes and counts toward the six.
        gathered.capped = words(&["route"]);
        let risks = draft("How are routes matched?", &gathered).risks;
        assert_eq!(risks.len(), 6, "{risks:?}");
        assert!(risks[1].contains("match cap"), "{risks:?}");
        assert!(risks[5].contains("`src/b.rs` line 1 "), "{risks:?}");
        // A window without an open note adds nothing.
        gathered.capped.clear();
        gathered.windows.clear();
        assert_eq!(draft("How are routes matched?", &gathered).risks.len(), 1);
    }

    #[test]
    fn verified_evidence_makes_a_fact_and_unverified_evidence_an_assumption() {
        let question = "How is a session token parsed?";
        let drafted = draft(question, &two_files());
        // Before grounding nothing is verified, and the evidence is tagged
        // with the finding it backs.
        let evidence = drafted.evidence();
        let located: Vec<(usize, &str, u32, &str)> = evidence
            .iter()
            .map(|(index, item)| {
                (
                    *index,
                    item.path.as_str(),
                    item.start_line,
                    item.note.as_str(),
                )
            })
            .collect();
        assert_eq!(
            located,
            [
                (0, "src/session.rs", 3, "defines `parse_session`"),
                (0, "src/session.rs", 7, "mentions `token`"),
                (1, "src/store.rs", 2, "mentions `session`"),
            ]
        );
        assert!(evidence.iter().all(|(_, item)| !item.verified));

        // Grounding verified the definition, dropped the mention on line 7
        // and could not verify `src/store.rs`; it hands items back grouped
        // by path, not in finding order.
        let mut definition = evidence[0].clone();
        definition.1.verified = true;
        let store = evidence[2].clone();
        let result = finish(drafted.clone(), vec![store, definition], &input(question));
        assert_eq!(result.findings.len(), 2);
        let session = &result.findings[0];
        assert_eq!(session.evidence.len(), 1, "{session:?}");
        assert_eq!(session.evidence[0].start_line, 3);
        assert!(!session.assumption, "{session:?}");
        let store = &result.findings[1];
        assert_eq!(store.evidence.len(), 1, "{store:?}");
        assert!(store.assumption, "{store:?}");
        assert_eq!(
            result.next_actions,
            [
                "Read `src/session.rs` around line 3.",
                "Ask for an issue to turn a finding into a scoped change.",
            ]
        );
        // The rest of the draft is carried over as drafted.
        assert_eq!(result.summary, drafted.summary);
        assert_eq!(result.risks, drafted.risks);
        assert_eq!(result.question, question);
        assert_eq!(result.provenance.provider, "offline");
        assert!(result.provenance.heuristic);

        // Everything dropped: every finding is an assumption, with no evidence.
        let result = finish(drafted, Vec::new(), &input(question));
        assert!(
            result
                .findings
                .iter()
                .all(|finding| finding.assumption && finding.evidence.is_empty())
        );
        assert_eq!(result.next_actions.len(), 1, "{:?}", result.next_actions);
    }

    #[test]
    fn the_same_index_gives_the_same_draft_and_result() {
        let question = "How is a session token parsed?";
        let mut reordered = two_files();
        // Windows read in another order make the same index.
        let windows = std::mem::take(&mut reordered.windows);
        for (path, window) in windows.into_iter().rev() {
            reordered.windows.insert(path, window);
        }
        let first = draft(question, &two_files());
        let second = draft(question, &reordered);
        assert_eq!(first, second);
        assert_eq!(first.findings.len(), 2);
        let verified = |drafted: &Draft| {
            drafted
                .evidence()
                .into_iter()
                .map(|(index, mut item)| {
                    item.verified = true;
                    (index, item)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            finish(first.clone(), verified(&first), &input(question)),
            finish(second.clone(), verified(&second), &input(question))
        );
    }
}
