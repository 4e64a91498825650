//! Issue definition (main spec section 31) with the offline provider: reuse
//! the project's latest exploration when it is about the same thing, gather
//! repository evidence, and write an implementation-ready issue whose
//! current world cites only verified code. Publishing to a tracker is a
//! separate, later action.

use std::collections::BTreeSet;
use zopu_core::text::clip_chars;

use zopu_schema::pb::FlowPhase;

use crate::explore::{self, Gathered};
use crate::grounding;
use crate::port::{FlowError, Port};
use crate::results::{EvidenceItem, ExplorationResult, IssueResult, Provenance, ResultVersion};

/// Files cited by an offline issue.
const TOP_FILES: usize = 4;

/// What issue definition starts from.
#[derive(Debug, Clone, Default)]
pub struct IssueInput {
    pub request: String,
    pub provider: String,
    pub repository_commit: String,
    /// The project's latest exploration (flow run id, result), if any.
    pub exploration: Option<(String, ExplorationResult)>,
    /// The test command from the project's summary, if known.
    pub test_command: Option<String>,
    /// The user's stated preferences the conversation agent shared
    /// (`flow.requested`'s `preferences`), e.g. "Skip tests in issue drafts".
    pub preferences: Vec<String>,
}

/// Phrases of a preference that keeps tests out of issue drafts.
const SKIP_TESTS: &[&str] = &[
    "skip tests",
    "no tests",
    "without tests",
    "omit tests",
    "leave out tests",
    "leave tests out",
    "exclude tests",
];

/// Whether the user asked for issue drafts without tests.
pub fn skips_tests(preferences: &[String]) -> bool {
    preferences.iter().any(|preference| {
        let preference = preference.to_lowercase();
        SKIP_TESTS.iter().any(|phrase| preference.contains(phrase))
    })
}

/// The request without the "create an issue" wrapper, as a title.
pub fn title_of(request: &str) -> String {
    let mut text = request.trim().trim_end_matches(['.', '!', '?']).to_owned();
    let lower = text.to_lowercase();
    for prefix in [
        "please ",
        "can you ",
        "could you ",
        "create an issue to ",
        "create an issue for ",
        "create an issue about ",
        "create issue: ",
        "make an issue to ",
        "make an issue for ",
        "file an issue to ",
        "file an issue for ",
        "file an issue about ",
        "open an issue to ",
        "open an issue for ",
        "write an issue to ",
        "write an issue for ",
        "draft an issue to ",
        "draft an issue for ",
        "issue: ",
    ] {
        if lower.starts_with(prefix) {
            text = text[prefix.len()..].to_owned();
            break;
        }
    }
    let mut chars = text.trim().chars();
    let title: String = match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => "Untitled issue".to_owned(),
    };
    clip_chars(&title, 100)
}

fn relevant(exploration: &ExplorationResult, keywords: &[String]) -> bool {
    let own: BTreeSet<String> = exploration
        .keywords
        .iter()
        .map(|k| k.to_lowercase())
        .collect();
    keywords.iter().any(|k| own.contains(&k.to_lowercase()))
}

/// Offline issue definition through `port`.
pub async fn define<P: Port>(port: &mut P, input: &IssueInput) -> Result<IssueResult, FlowError> {
    port.phase(FlowPhase::Plan, 1, "Understanding the request")
        .await?;
    let keywords = explore::keywords(&input.request);
    let reused = input
        .exploration
        .as_ref()
        .filter(|(_, exploration)| relevant(exploration, &keywords) || keywords.is_empty());
    port.phase(FlowPhase::Act, 1, "Gathering repository evidence")
        .await?;
    let gathered: Gathered = explore::gather(port, "issue:1", &keywords, TOP_FILES).await?;
    let mut evidence: Vec<EvidenceItem> = explore::findings(&gathered, TOP_FILES)
        .into_iter()
        .flat_map(|f| f.evidence.into_iter().take(2))
        .collect();
    if let Some((_, exploration)) = reused {
        for finding in &exploration.findings {
            for item in finding.evidence.iter().filter(|e| e.verified).take(2) {
                if !evidence
                    .iter()
                    .any(|e| e.path == item.path && e.start_line == item.start_line)
                {
                    evidence.push(item.clone());
                }
            }
        }
    }
    evidence.truncate(12);
    port.phase(
        FlowPhase::Reflect,
        1,
        "Reviewing the issue against the evidence",
    )
    .await?;
    let grounded = grounding::verify(port, "verify", evidence).await?;
    let evidence: Vec<EvidenceItem> = grounded.kept;
    let verified: Vec<&EvidenceItem> = evidence.iter().filter(|e| e.verified).collect();
    let title = title_of(&input.request);
    let mut paths: Vec<String> = Vec::new();
    for item in &verified {
        if !paths.contains(&item.path) {
            paths.push(item.path.clone());
        }
    }
    let current_world = if verified.is_empty() {
        format!(
            "No code in the repository mentions {}: the capability appears not to exist yet (assumption from keyword search).",
            keywords
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        let cited: Vec<String> = verified
            .iter()
            .take(4)
            .map(|e| {
                format!(
                    "`{}` line {} (`{}`)",
                    e.path,
                    e.start_line,
                    clip_chars(&e.snippet, 80).replace('`', "'")
                )
            })
            .collect();
        let mut text = format!("The relevant code today lives in {}.", cited.join("; "));
        if let Some((_, exploration)) = reused {
            text.push_str(&format!(
                " An earlier exploration found: {}",
                clip_chars(&exploration.summary, 400)
            ));
        }
        text
    };
    let desired_world = format!(
        "After this change: {}.",
        clip_chars(input.request.trim().trim_end_matches('.'), 600)
    );
    let mut scope: Vec<String> = paths
        .iter()
        .take(4)
        .map(|p| format!("Changes in `{p}` and the code it calls"))
        .collect();
    let with_tests = !skips_tests(&input.preferences);
    if with_tests {
        scope.push("Tests covering the new or changed behaviour".to_owned());
    }
    let mut non_goals = vec![
        "Publishing the issue to an external tracker".to_owned(),
        "Refactoring the touched files beyond what the change needs".to_owned(),
        "Changes outside the areas listed in scope".to_owned(),
    ];
    if !with_tests {
        non_goals.push("Tests: the user asked to leave them out of issue drafts".to_owned());
    }
    let test = input.test_command.clone().map_or_else(
        || "the project's test suite".to_owned(),
        |c| format!("`{c}`"),
    );
    let mut acceptance_criteria = vec![format!("{} works as described in the request", title)];
    if with_tests {
        acceptance_criteria.push(format!(
            "Automated tests cover the new behaviour and {test} passes"
        ));
    }
    acceptance_criteria.push("Existing behaviour outside the scope is unchanged".to_owned());
    acceptance_criteria.push("User-visible changes are documented".to_owned());
    let mut risks = vec!["Heuristic: the affected code was located by keyword search; confirm the scope before implementing.".to_owned()];
    if paths.len() > 2 {
        risks.push(format!(
            "The change touches {} files; coordinate if others are working there.",
            paths.len()
        ));
    }
    let mut open_questions: Vec<String> = gathered
        .unmatched
        .iter()
        .map(|k| format!("Where should `{k}` live? Nothing in the repository mentions it yet."))
        .collect();
    open_questions.push("Which edge cases and failure modes must be handled?".to_owned());
    let mut shape: Vec<String> = verified
        .iter()
        .take(3)
        .map(|e| format!("Start in `{}` near line {}", e.path, e.start_line))
        .collect();
    if with_tests {
        shape.push("Add or extend tests next to the existing ones".to_owned());
    }
    let summary = format!(
        "{title}. Grounded in {} verified repository location(s){}.",
        verified.len(),
        reused
            .map(|(id, _)| format!(", reusing exploration run {id}"))
            .unwrap_or_default()
    );
    Ok(IssueResult {
        version: ResultVersion::CURRENT,
        title,
        summary,
        current_world,
        desired_world,
        scope,
        non_goals,
        acceptance_criteria,
        evidence,
        risks,
        open_questions,
        suggested_implementation_shape: shape,
        based_on_flow_run: reused.map(|(id, _)| id.clone()).unwrap_or_default(),
        provenance: Provenance {
            provider: input.provider.clone(),
            heuristic: true,
            repository_commit: input.repository_commit.clone(),
            ..Default::default()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preference_to_skip_tests_is_recognized() {
        assert!(skips_tests(&["Skip tests in issue drafts".to_owned()]));
        assert!(skips_tests(&[
            "Answer in German".to_owned(),
            "Please write issues WITHOUT TESTS".to_owned()
        ]));
        assert!(!skips_tests(&["Answer in German".to_owned()]));
        assert!(!skips_tests(&[]));
    }

    #[test]
    fn titles_drop_the_request_wrapper() {
        assert_eq!(
            title_of("Create an issue to add rate limiting to the login endpoint."),
            "Add rate limiting to the login endpoint"
        );
        assert_eq!(title_of(""), "Untitled issue");
    }
}
