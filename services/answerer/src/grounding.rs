//! Grounding: every evidence item is checked against the workspace before it
//! is accepted. The path must exist (at the inspected commit: the workspace
//! holds exactly that checkout), the line range must exist, and the quoted
//! snippet must really be there (whitespace-insensitive, within a few lines
//! of the cited range). A path that does not exist is dropped; an item whose
//! range or snippet does not check out stays only as an assumption
//! (`verified: false`).

use std::collections::BTreeMap;

use zopu_sandbox::tools::ReadFileInput;

use crate::port::{self, FlowError, Port};
use crate::results::EvidenceItem;

/// Lines of slack around a cited range when looking for the snippet.
const SLACK_LINES: u32 = 3;
/// Longest range read for one file.
const RANGE_LINES_MAX: u32 = 2_000;
/// Most distinct files checked in one call.
const FILES_MAX: usize = 40;

/// What grounding did to a list of evidence: `T` is an evidence item, or
/// (with [`verify_tagged`]) an item beside the tag its caller gave it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Grounded<T = EvidenceItem> {
    pub kept: Vec<T>,
    /// Items dropped because their path does not exist or cannot be read.
    pub dropped: Vec<T>,
}

fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `snippet` occurs in `content` (whitespace-insensitive).
pub fn snippet_present(content: &str, snippet: &str) -> bool {
    let needle = normalize(snippet.trim_end_matches('…'));
    !needle.is_empty() && normalize(content).contains(&needle)
}

/// Checks every item; `step` prefixes the step names of the reads.
pub async fn verify<P: Port>(
    port: &mut P,
    step: &str,
    items: Vec<EvidenceItem>,
) -> Result<Grounded, FlowError> {
    let tagged = items.into_iter().map(|item| ((), item)).collect();
    let grounded = verify_tagged(port, step, tagged).await?;
    let untag = |items: Vec<((), EvidenceItem)>| items.into_iter().map(|(_, item)| item).collect();
    Ok(Grounded {
        kept: untag(grounded.kept),
        dropped: untag(grounded.dropped),
    })
}

/// [`verify`] for items that each carry a tag (the finding an item backs,
/// say), handed back beside the checked item. The tags never reach the
/// port: the reads, their step names and inputs are those of [`verify`]
/// for the same items.
pub async fn verify_tagged<P: Port, T>(
    port: &mut P,
    step: &str,
    items: Vec<(T, EvidenceItem)>,
) -> Result<Grounded<(T, EvidenceItem)>, FlowError> {
    let mut by_path: BTreeMap<String, Vec<(T, EvidenceItem)>> = BTreeMap::new();
    let mut grounded = Grounded {
        kept: Vec::new(),
        dropped: Vec::new(),
    };
    for (tag, mut item) in items {
        item.verified = false;
        item.path = item.path.trim().trim_start_matches("./").to_owned();
        if item.path.is_empty() {
            // A note without a location: kept as an unverified assumption.
            grounded.kept.push((tag, item));
            continue;
        }
        by_path
            .entry(item.path.clone())
            .or_default()
            .push((tag, item));
    }
    for (index, (path, items)) in by_path.into_iter().enumerate() {
        if index >= FILES_MAX {
            grounded.kept.extend(items);
            continue;
        }
        let ranged = items
            .iter()
            .map(|(_, item)| item)
            .filter(|item| item.start_line > 0);
        let low = ranged
            .clone()
            .map(|item| item.start_line)
            .min()
            .unwrap_or(1)
            .saturating_sub(SLACK_LINES)
            .max(1);
        let high = ranged
            .map(|item| item.end_line.max(item.start_line))
            .max()
            .unwrap_or(low + 400)
            + SLACK_LINES;
        let high = high.min(low + RANGE_LINES_MAX);
        let input = ReadFileInput {
            path: path.clone(),
            start_line: Some(u64::from(low)),
            end_line: Some(u64::from(high)),
            ..Default::default()
        };
        match port::read_file(port, &format!("{step}:{index}"), input).await? {
            Err(_) => grounded.dropped.extend(items),
            Ok(output) if output.binary => grounded.dropped.extend(items),
            Ok(output) => {
                let lines: Vec<&str> = output.content.lines().collect();
                let last_line = output.start_line + lines.len() as u64;
                for (tag, mut item) in items {
                    let range_exists = item.start_line == 0
                        || u64::from(item.start_line) < last_line.max(output.start_line + 1);
                    let window = if item.start_line == 0 {
                        output.content.clone()
                    } else {
                        let from = item.start_line.saturating_sub(SLACK_LINES).max(low) - low;
                        let to = (item.end_line.max(item.start_line) + SLACK_LINES)
                            .saturating_sub(low)
                            + 1;
                        let to = (to as usize).min(lines.len());
                        lines
                            .get(from as usize..to)
                            .map(|slice| slice.join("\n"))
                            .unwrap_or_default()
                    };
                    item.verified = range_exists
                        && !item.snippet.is_empty()
                        && snippet_present(&window, &item.snippet);
                    if item.verified && item.start_line > 0 && item.end_line == 0 {
                        item.end_line = item.start_line;
                    }
                    if !range_exists {
                        item.start_line = 0;
                        item.end_line = 0;
                        item.note =
                            format!("{} (the cited lines do not exist; unverified)", item.note);
                    }
                    grounded.kept.push((tag, item));
                }
            }
        }
    }
    Ok(grounded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::DirectPort;
    use zopu_sandbox::policy::{SandboxLimits, WorkspaceRoot};
    use zopu_sandbox::tools::Sandbox;

    fn port_with(files: &[(&str, &str)]) -> (tempfile::TempDir, DirectPort) {
        let dir = tempfile::tempdir().unwrap();
        for (path, content) in files {
            let full = dir.path().join("repo").join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, content).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("repo")).unwrap();
        let sandbox = Sandbox::new(
            WorkspaceRoot::open(dir.path()).unwrap(),
            SandboxLimits::default(),
        )
        .unwrap();
        (dir, DirectPort::new(sandbox))
    }

    fn item(path: &str, start: u32, snippet: &str) -> EvidenceItem {
        EvidenceItem {
            path: path.into(),
            start_line: start,
            end_line: start,
            snippet: snippet.into(),
            note: "n".into(),
            verified: true,
        }
    }

    #[tokio::test]
    async fn real_snippets_verify_and_invented_ones_do_not() {
        let (_dir, mut port) = port_with(&[(
            "src/lib.rs",
            "// top\npub fn login(user: &str) -> bool {\n    true\n}\n",
        )]);
        let grounded = verify(
            &mut port,
            "verify",
            vec![
                item("src/lib.rs", 2, "pub fn login(user: &str)"),
                item("src/lib.rs", 2, "fn logout()"),
                item("src/missing.rs", 1, "anything"),
                item("src/lib.rs", 900, "pub fn login"),
                item("../etc/passwd", 1, "root"),
            ],
        )
        .await
        .unwrap();
        assert_eq!(grounded.dropped.len(), 2, "{grounded:?}");
        assert!(grounded.dropped.iter().any(|i| i.path == "src/missing.rs"));
        let verified: Vec<_> = grounded.kept.iter().map(|i| i.verified).collect();
        assert_eq!(verified, vec![true, false, false]);
        assert_eq!(
            grounded.kept[2].start_line, 0,
            "a range past the end is not kept"
        );
    }

    #[tokio::test]
    async fn tags_come_back_beside_their_items_after_the_same_reads() {
        let files = [(
            "src/lib.rs",
            "// top\npub fn login(user: &str) -> bool {\n    true\n}\n",
        )];
        let items = vec![
            item("src/lib.rs", 2, "fn logout()"),
            item("src/missing.rs", 1, "anything"),
            item("", 0, ""),
            item("src/lib.rs", 2, "pub fn login(user: &str)"),
        ];
        let (_dir, mut port) = port_with(&files);
        let untagged = verify(&mut port, "verify", items.clone()).await.unwrap();
        let (_dir, mut tagged_port) = port_with(&files);
        let tagged = verify_tagged(
            &mut tagged_port,
            "verify",
            items.into_iter().enumerate().collect(),
        )
        .await
        .unwrap();
        assert_eq!(tagged_port.tool_calls, port.tool_calls);
        // The item without a path first, then by path, each with its tag.
        let kept: Vec<(usize, bool)> = tagged
            .kept
            .iter()
            .map(|(tag, item)| (*tag, item.verified))
            .collect();
        assert_eq!(kept, [(2, false), (0, false), (3, true)]);
        let dropped: Vec<usize> = tagged.dropped.iter().map(|(tag, _)| *tag).collect();
        assert_eq!(dropped, [1]);
        let items = |tagged: Vec<(usize, EvidenceItem)>| -> Vec<EvidenceItem> {
            tagged.into_iter().map(|(_, item)| item).collect()
        };
        assert_eq!(items(tagged.kept), untagged.kept);
        assert_eq!(items(tagged.dropped), untagged.dropped);
    }
}
