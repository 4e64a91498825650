//! What moves a file in the ranking beyond its own matches: the code
//! index's ranking of the question blended in, the files the leading file
//! calls into (a definition it uses, followed by name), and the files it
//! imports or that import it.

use std::collections::BTreeSet;
use zopu_core::keywords::code_forms;
use zopu_runtime::text::clip_chars;

use zopu_sandbox::tools::{FoundFile, ReadFileInput, SearchInput};

use super::{
    Asks, FileRole, MATCHES_PER_KEYWORD, RankedFile, is_quoted_phrase, role_of, sort_ranked,
    weight_of,
};
use crate::port::{self, FlowError, Port};

/// Files the code index ranks for a question.
pub(super) const INDEX_FILES: usize = 50;
/// Longest question passed to the code index.
pub(super) const INDEX_QUERY_CHARS: usize = 1_000;
/// How much of a file's final score is the code index's ranking (the rest
/// is the keyword search's); each is scaled to its best file first.
/// (`zopu-bench eval`, dev half: 0.7 gave top-1 0.69 and recall@3 0.74, against
/// 0.72 and 0.67 for the search alone and 0.65 and 0.73 for the index alone.)
pub(super) const INDEX_SHARE: f64 = 0.7;

/// Phrases and signs code calls by a name of their own: a question says
/// "command line" where the code says `cli`, shows `#!` where it says
/// `shebang`, and asks for "allowed values" where a command-line library
/// says `choices` (click, argparse, commander, yargs). Each name is searched
/// and given to the code index beside the question's own words.
pub(super) const NAMED_PHRASES: &[(&str, &str)] = &[
    ("command line", "cli"),
    ("command-line", "cli"),
    ("#!", "shebang"),
    ("allowed values", "choices"),
];

/// Where a question says something is given, not what it is about: a value
/// passed "on the command line" is read by the code the question asks
/// about, seldom by the command-line module itself.
pub(super) const SETTING_PHRASES: &[&str] = &["on the command line", "on the command-line"];

/// What the code index is asked: the question, then (when it differs) the
/// question again with its words in the short forms code writes them in
/// ("data dir" for "data directory", so the index sees the pair side by
/// side as in `data_dir`), and the names of [`NAMED_PHRASES`] it holds.
/// The names of the [`NAMED_PHRASES`] a question holds, leaving out
/// [`SETTING_PHRASES`].
pub(super) fn named_in(question: &str) -> Vec<&'static str> {
    let lower = SETTING_PHRASES
        .iter()
        .fold(question.to_lowercase(), |text, phrase| {
            text.replace(phrase, " ")
        });
    let mut names: Vec<&'static str> = Vec::new();
    for (phrase, name) in NAMED_PHRASES {
        if lower.contains(phrase) && !names.contains(name) {
            names.push(name);
        }
    }
    names
}

pub(super) fn index_query(question: &str) -> String {
    let mut query = clip_chars(question, INDEX_QUERY_CHARS);
    for name in named_in(question) {
        query.push(' ');
        query.push_str(name);
    }
    let mut shortened = false;
    let short: Vec<String> = zopu_core::keywords::tokens(&query)
        .into_iter()
        .map(
            |(token, stem)| match stem.and_then(|stem| code_forms(&stem).into_iter().nth(1)) {
                Some(short) => {
                    shortened = true;
                    short
                }
                None => token.to_owned(),
            },
        )
        .collect();
    if shortened {
        query.push(' ');
        query.push_str(&short.join(" "));
    }
    query
}

/// Folds the code index's ranking into the keyword search's: each score
/// scaled to its best file, the index's weighed by the square of the
/// file's role weight (the index scores prose, where a question's own words
/// abound, as readily as code), mixed by [`INDEX_SHARE`]. Files only the index found join
/// with what it says they define.
pub(super) fn blend(ranked: &mut Vec<RankedFile>, indexed: &[FoundFile], asks: Asks) {
    let best_search = ranked.iter().map(|f| f.score).fold(0.0, f64::max);
    let weighed: Vec<(&FoundFile, f64)> = indexed
        .iter()
        .map(|found| (found, found.score * weight_of(&found.path, asks).powi(2)))
        .collect();
    let best_index = weighed.iter().map(|(_, score)| *score).fold(0.0, f64::max);
    let share = INDEX_SHARE;
    for file in ranked.iter_mut() {
        file.score = if best_search > 0.0 {
            (1.0 - share) * file.score / best_search
        } else {
            0.0
        };
    }
    for (found, score) in weighed {
        let index_part = if best_index > 0.0 {
            share * score / best_index
        } else {
            0.0
        };
        let defines = found
            .definitions
            .iter()
            .map(|d| (d.line, d.name.clone()))
            .collect();
        match ranked.iter_mut().find(|f| f.path == found.path) {
            Some(file) => {
                file.score += index_part;
                file.index_score = found.score;
                file.defines = defines;
                file.best_line = found.best_line;
                file.linked = found.linked.iter().cloned().collect();
            }
            None => ranked.push(RankedFile {
                path: found.path.clone(),
                score: index_part,
                index_score: found.score,
                defines,
                best_line: found.best_line,
                linked: found.linked.iter().cloned().collect(),
                ..Default::default()
            }),
        }
    }
    // A phrase the question quotes is a message or a line the user saw:
    // the source that holds it verbatim is where the answer starts, though
    // the index (which sees words, not phrases) may rank it low.
    for file in ranked.iter_mut() {
        if file
            .keywords
            .iter()
            .any(|keyword| is_quoted_phrase(keyword))
            && weight_of(&file.path, asks) >= 1.0
        {
            file.score += QUOTED_PHRASE_SHARE;
        }
    }
    sort_ranked(ranked);
}

/// What a file of full weight for the question (source, or what it asks
/// for) gains when it holds a phrase the question quotes: the keyword
/// search's share again. (`zopu-bench eval`: commander's "Did you mean ...?"
/// question found `suggestSimilar.js`, dev recall@3 0.82 → 0.83; nothing
/// else moved.)
pub(super) const QUOTED_PHRASE_SHARE: f64 = 1.0 - INDEX_SHARE;

/// What a file linked by name to the leading file gains, as a share of the
/// leading file's score. (`zopu-bench eval`, dev half, recall@3: 0.81 without,
/// 0.82 at 0.05 and 0.1, 0.81 at 0.15, 0.79 at 0.25; the holdout half went
/// 0.72 → 0.77 at 0.1.)
pub(super) const LINK_WEIGHT: f64 = 0.1;
/// The leading file's definitions whose users are searched.
pub(super) const LINKED_NAMES: usize = 3;
/// The files after the leading one checked for a definition it uses.
pub(super) const LINK_CANDIDATES: usize = 10;
/// Shorter names link too much to be telling.
pub(super) const LINK_NAME_MIN_CHARS: usize = 4;

/// A search pattern for `name` as a whole word: `\b` on each side that
/// ends in a word character (`$emit` has none before its `$`).
pub(super) fn whole_word(name: &str) -> String {
    let boundary = |c: Option<char>| {
        if c.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            r"\b"
        } else {
            ""
        }
    };
    format!(
        "{}{}{}",
        boundary(name.chars().next()),
        regex::escape(name),
        boundary(name.chars().last())
    )
}

/// The answer to a question is seldom one file: the function the leading
/// file defines is called from another, or it calls one defined elsewhere.
/// A source file that uses one of the names the leading file defines (of
/// the question's words), and a file among the next [`LINK_CANDIDATES`]
/// that defines such a name the leading file uses, gain [`LINK_WEIGHT`] of
/// the leading file's score; the leading file stays first.
pub(super) async fn follow_links<P: Port>(
    port: &mut P,
    step: &str,
    ranked: &mut [RankedFile],
) -> Result<(), FlowError> {
    let Some((top, rest)) = ranked.split_first_mut() else {
        return Ok(());
    };
    if rest.is_empty() {
        return Ok(());
    }
    let mut linked: BTreeSet<String> = BTreeSet::new();
    let names = top
        .defines
        .iter()
        .map(|(_, name)| name)
        .filter(|name| name.chars().count() >= LINK_NAME_MIN_CHARS)
        .take(LINKED_NAMES);
    for (index, name) in names.enumerate() {
        let input = SearchInput {
            pattern: whole_word(name),
            literal: false,
            case_insensitive: false,
            path: String::new(),
            max_matches: Some(MATCHES_PER_KEYWORD),
            max_matches_per_file: Some(1),
        };
        if let Ok(users) = port::search(port, &format!("{step}:users:{index}"), input).await? {
            linked.extend(
                users
                    .matches
                    .into_iter()
                    .filter(|user| user.path != top.path && role_of(&user.path) == FileRole::Source)
                    .map(|user| user.path),
            );
        }
    }
    let read = ReadFileInput {
        path: top.path.clone(),
        ..Default::default()
    };
    if let Ok(read) = port::read_file(port, &format!("{step}:uses"), read).await? {
        for file in rest.iter().take(LINK_CANDIDATES) {
            let uses = file.defines.iter().any(|(_, name)| {
                name.chars().count() >= LINK_NAME_MIN_CHARS
                    && regex::Regex::new(&whole_word(name))
                        .is_ok_and(|re| re.is_match(&read.content))
            });
            if uses {
                linked.insert(file.path.clone());
            }
        }
    }
    for file in rest.iter_mut() {
        if linked.contains(&file.path) {
            file.score += LINK_WEIGHT * top.score;
        }
    }
    sort_ranked(rest);
    Ok(())
}

/// What a file the leading file imports, or that imports it, gains as a
/// share of the leading file's score, among the [`LINK_CANDIDATES`] after
/// it. (`zopu-bench eval`, recall@3: dev 0.843 → 0.849 and holdout 0.796 →
/// 0.802 at 0.1; 0.05 gained nothing; 0.15 and 0.2 lost more than they
/// gained; without the name links of [`follow_links`] the holdout half fell
/// to 0.765, so both stay.)
pub(super) const IMPORT_LINK_WEIGHT: f64 = 0.1;

/// The code index knows which of its results import each other: a file
/// the leading one imports (its helper module, the submodule it declares)
/// or that imports it gains [`IMPORT_LINK_WEIGHT`] of the leading file's
/// score, if it is of full weight for the question (a test linked to the
/// source it tests gains only when the question asks for tests); the
/// leading file stays first.
pub(super) fn follow_imports(ranked: &mut [RankedFile], asks: Asks) {
    let Some((top, rest)) = ranked.split_first_mut() else {
        return;
    };
    for file in rest.iter_mut().take(LINK_CANDIDATES) {
        // A test linked to the source it tests is no answer to a question
        // about behaviour: only files of full weight for the question gain.
        if weight_of(&file.path, asks) < 1.0 {
            continue;
        }
        if top.linked.contains(&file.path) || file.linked.contains(&top.path) {
            file.score += IMPORT_LINK_WEIGHT * top.score;
        }
    }
    sort_ranked(rest);
}
