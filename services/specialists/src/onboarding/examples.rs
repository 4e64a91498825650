//! The types a README's examples use, found where they are defined: what
//! a newcomer meets first in a library.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::Regex;
use zopu_runtime::text::clip_chars;
use zopu_sandbox::tools::SearchInput;

use super::{EXAMPLE_PROGRAM_DIRS, in_examples};
use zopu_answerer::port::{self, FlowError, Port};
use zopu_answerer::results::EvidenceItem;

/// Types a README's example starts from, at most this many.
pub(super) const EXAMPLE_TYPES_MAX: usize = 3;

/// A capitalised identifier used as a type or a class in code: called
/// (`JavaFile.builder`), constructed (`new Disruptor<>`) or declared with
/// (`TypeSpec helloWorld =`).
pub(super) const TYPE_USE_PATTERN: &str = r"(?:\bnew\s+([A-Z][A-Za-z0-9]*)|\b([A-Z][A-Za-z0-9]*)(?:\.[a-z]|(?:<[^>]*>)?\s+[a-z][A-Za-z0-9]*\s*=))";

pub(super) static TYPE_USE: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(TYPE_USE_PATTERN).ok());

/// The types used on a line of code, in order (see [`TYPE_USE_PATTERN`]);
/// all-capital names (`URL`, constants) left out.
pub(super) fn types_on(line: &str) -> impl Iterator<Item = &str> {
    TYPE_USE
        .iter()
        .flat_map(move |re| re.captures_iter(line))
        .filter_map(|captures| captures.get(1).or_else(|| captures.get(2)))
        .map(|name| name.as_str())
        .filter(|name| name.chars().any(|c| c.is_ascii_lowercase()))
}

/// The types the README's code examples use, in order of first use: the
/// lines of its fenced (```` ``` ````) and AsciiDoc (`----`) blocks.
pub(super) fn example_types(readme: &str) -> Vec<String> {
    let mut types: Vec<String> = Vec::new();
    let mut in_block = false;
    for line in readme.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") || trimmed == "----" {
            in_block = !in_block;
            continue;
        }
        if !in_block {
            continue;
        }
        for name in types_on(line) {
            if !types.iter().any(|known| known == name) {
                types.push(name.to_owned());
            }
        }
    }
    types
}

/// Type uses read from the examples, at most (the sandbox's own cap), and
/// per file: enough to see what each of many files starts from.
pub(super) const EXAMPLE_MATCHES: usize = 500;
pub(super) const EXAMPLE_MATCHES_PER_FILE: usize = 5;

/// The types the project's own example programs use (the shallowest
/// examples directory listed, searched to any depth), the ones used by the
/// most example files first.
pub(super) async fn examples_types<P: Port>(
    port: &mut P,
    directories: &[String],
) -> Result<Vec<String>, FlowError> {
    let Some(directory) = directories
        .iter()
        .filter(|directory| {
            EXAMPLE_PROGRAM_DIRS.contains(&directory.rsplit('/').next().unwrap_or(directory))
        })
        .min_by_key(|directory| (directory.matches('/').count(), directory.as_str()))
        .cloned()
    else {
        return Ok(Vec::new());
    };
    let input = SearchInput {
        pattern: TYPE_USE_PATTERN.to_owned(),
        literal: false,
        case_insensitive: false,
        path: directory,
        max_matches: Some(EXAMPLE_MATCHES),
        max_matches_per_file: Some(EXAMPLE_MATCHES_PER_FILE),
    };
    let Ok(found) = port::search(port, "search:example-uses", input).await? else {
        return Ok(Vec::new());
    };
    // Per type: the example files using it, and where it was first seen.
    let mut users: Vec<(String, BTreeSet<String>)> = Vec::new();
    for found in &found.matches {
        for name in types_on(&found.line) {
            match users.iter_mut().find(|(known, _)| known == name) {
                Some((_, paths)) => {
                    paths.insert(found.path.clone());
                }
                None => users.push((name.to_owned(), BTreeSet::from([found.path.clone()]))),
            }
        }
    }
    // Stable: equally used types keep their order of first use.
    users.sort_by_key(|(_, paths)| std::cmp::Reverse(paths.len()));
    Ok(users.into_iter().map(|(name, _)| name).collect())
}

/// README example types looked up, at most.
pub(super) const EXAMPLE_TYPES_SEARCHED: usize = 8;

/// Whether `path` is a source file (not a test or an example) named after
/// `type_name`, as languages with a type per file name them (`JavaFile.java`,
/// `RingBuffer.kt`).
pub(super) fn is_file_of_type(path: &str, type_name: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.split_once('.').is_some_and(|(stem, extension)| {
        stem == type_name
            && matches!(
                extension,
                "java" | "kt" | "scala" | "cs" | "swift" | "groovy"
            )
    }) && zopu_answerer::explore::role_of(path) == zopu_answerer::explore::FileRole::Source
        && !in_examples(path)
}

/// A library's entry points: the declarations of the types its README's
/// example starts from (or, when the README shows no code, the types its
/// own example programs use most), each in the one source file named
/// after it.
pub(super) async fn find_example_types<P: Port>(
    port: &mut P,
    readme: &str,
    directories: &[String],
) -> Result<Vec<EvidenceItem>, FlowError> {
    let mut entry_points: Vec<EvidenceItem> = Vec::new();
    let (types, origin) = match example_types(readme) {
        types if !types.is_empty() => (types, "the README's example starts from"),
        _ => (
            examples_types(port, directories).await?,
            "the project's examples use",
        ),
    };
    for (index, type_name) in types.into_iter().take(EXAMPLE_TYPES_SEARCHED).enumerate() {
        if entry_points.len() >= EXAMPLE_TYPES_MAX {
            break;
        }
        let input = SearchInput {
            pattern: format!(
                r"\b(class|interface|enum|record|object|struct|trait)\s+{}\b",
                regex::escape(&type_name)
            ),
            literal: false,
            case_insensitive: false,
            path: String::new(),
            max_matches: Some(20),
            max_matches_per_file: Some(1),
        };
        let Ok(found) = port::search(port, &format!("search:example-type:{index}"), input).await?
        else {
            continue;
        };
        let mut declared = found
            .matches
            .into_iter()
            .filter(|found| is_file_of_type(&found.path, &type_name));
        if let (Some(declaration), None) = (declared.next(), declared.next()) {
            let line = u32::try_from(declaration.line_number).unwrap_or(u32::MAX);
            entry_points.push(EvidenceItem {
                path: declaration.path,
                start_line: line,
                end_line: line,
                snippet: clip_chars(declaration.line.trim(), 160),
                note: format!("public API: {origin} {type_name}"),
                verified: false,
            });
        }
    }
    Ok(entry_points)
}
