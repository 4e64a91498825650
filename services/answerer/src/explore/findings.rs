//! What an exploration reports from the files it gathered: the findings
//! (each with its verified evidence window) and the system map of the
//! leading files and how they connect.

use zopu_runtime::text::clip_chars;

use super::{Gathered, RankedFile, definitions};
use crate::results::{EvidenceItem, Finding, MapEdge, MapNode, SystemMap};

/// Findings with evidence for the top files of a search round.
pub fn findings(gathered: &Gathered, top: usize) -> Vec<Finding> {
    let mut out = Vec::new();
    for file in gathered.ranked.iter().take(top) {
        let keywords: Vec<String> = file.keywords.iter().cloned().collect();
        let defs = gathered
            .windows
            .get(&file.path)
            .map(|w| definitions(w, &gathered.keywords))
            .unwrap_or_default();
        let together = file.best_line.and_then(|line| {
            let (start, content) = gathered.windows.get(&file.path)?;
            let text = content
                .lines()
                .nth(usize::try_from(line.checked_sub(*start)?).ok()?)?;
            Some(EvidenceItem {
                path: file.path.clone(),
                start_line: line as u32,
                end_line: line as u32,
                snippet: clip_chars(text.trim(), 200),
                note: "holds several of the question's words together".to_owned(),
                verified: false,
            })
        });
        let mut evidence: Vec<EvidenceItem> = together
            .into_iter()
            .chain(
                defs.iter()
                    .filter(|(line, _, _)| Some(*line) != file.best_line)
                    .map(|(line, name, text)| EvidenceItem {
                        path: file.path.clone(),
                        start_line: *line as u32,
                        end_line: *line as u32,
                        snippet: text.clone(),
                        note: format!("defines `{name}`"),
                        verified: false,
                    }),
            )
            .collect();
        for (line, text, keyword) in &file.matches {
            if evidence.len() >= 3 {
                break;
            }
            if evidence.iter().any(|e| u64::from(e.start_line) == *line) {
                continue;
            }
            evidence.push(EvidenceItem {
                path: file.path.clone(),
                start_line: *line as u32,
                end_line: *line as u32,
                snippet: clip_chars(text.trim(), 200),
                note: format!("mentions `{keyword}`"),
                verified: false,
            });
        }
        let subject = if keywords.is_empty() {
            "the question's terms (in its path)".to_owned()
        } else {
            keywords
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let claim = if defs.is_empty() {
            format!(
                "`{}` refers to {subject} on {} line(s)",
                file.path,
                file.matches.len()
            )
        } else {
            let names: Vec<String> = defs
                .iter()
                .map(|(_, name, _)| format!("`{name}`"))
                .collect();
            format!(
                "`{}` defines {} related to {subject}",
                file.path,
                names.join(", ")
            )
        };
        let detail = format!(
            "Ranked by keyword search and the code index (score {:.2}: {} keyword(s), {} matching line(s), index score {:.1}{}{}).",
            file.score,
            file.keywords.len(),
            file.matches.len(),
            file.index_score,
            if file.defines.is_empty() {
                String::new()
            } else {
                let names: Vec<String> = file
                    .defines
                    .iter()
                    .map(|(_, name)| format!("`{name}`"))
                    .collect();
                format!(", defines {}", names.join(", "))
            },
            if file.path_hits > 0 {
                ", path matches the question"
            } else {
                ""
            }
        );
        out.push(Finding {
            claim,
            detail,
            evidence,
            assumption: false,
        });
    }
    out
}

pub(super) fn stem_of(path: &str) -> Option<String> {
    let name = path.rsplit('/').next()?;
    let stem = name.split('.').next()?.to_lowercase();
    (stem.len() >= 3
        && !matches!(
            stem.as_str(),
            "index" | "main" | "mod" | "lib" | "__init__" | "init" | "app" | "utils"
        ))
    .then_some(stem)
}

/// A small map: the question, the top files, and which file names another.
pub fn system_map(question: &str, gathered: &Gathered, top: usize) -> SystemMap {
    let mut map = SystemMap::default();
    map.nodes.push(MapNode {
        id: "question".into(),
        label: clip_chars(question, 100),
        detail: "the question explored".into(),
    });
    let files: Vec<&RankedFile> = gathered.ranked.iter().take(top).collect();
    for (index, file) in files.iter().enumerate() {
        map.nodes.push(MapNode {
            id: format!("f{index}"),
            label: clip_chars(&file.path, 110),
            detail: format!("{} matching line(s)", file.matches.len()),
        });
    }
    for (a, from) in files.iter().enumerate() {
        let Some((_, content)) = gathered.windows.get(&from.path) else {
            continue;
        };
        let content = content.to_lowercase();
        for (b, to) in files.iter().enumerate() {
            if a != b
                && let Some(stem) = stem_of(&to.path)
                && content.contains(&stem)
            {
                map.edges.push(MapEdge {
                    from: format!("f{a}"),
                    to: format!("f{b}"),
                    label: "names".into(),
                });
            }
        }
    }
    for (index, file) in files.iter().enumerate() {
        let label = file
            .keywords
            .iter()
            .next()
            .map_or_else(|| "path".to_owned(), |k| format!("matches {k}"));
        map.edges.push(MapEdge {
            from: "question".into(),
            to: format!("f{index}"),
            label: clip_chars(&label, 100),
        });
    }
    map
}
