//! The repository's entry points: conventional paths and the manifests'
//! declared ones, confirmed by a marker in the file (a `main`, a server
//! start), and a library root that only re-exports followed to the file it
//! re-exports.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::Regex;

use super::{ENTRY_POINTS_MAX, entry_marker, in_examples, read_lines};
use zopu_answerer::port::{self, FlowError, Port};
use zopu_answerer::results::EvidenceItem;

/// Conventional entry points of ecosystems without a manifest entry.
pub(super) const CONVENTIONAL_ENTRY_POINTS: &[&str] = &[
    "main.py",
    "app.py",
    "manage.py",
    "wsgi.py",
    "asgi.py",
    "app/main.py",
    "src/main.py",
    "main.go",
    "index.js",
    "server.js",
];

/// The entry points to read: the manifests' candidates, then the
/// conventional ones, `__main__.py` and `src/bin/*.rs`; only listed files,
/// each once, at most [`ENTRY_POINTS_MAX`].
pub(super) fn entry_candidates(mut candidates: Vec<String>, files: &[String]) -> Vec<String> {
    for conventional in CONVENTIONAL_ENTRY_POINTS {
        if files.iter().any(|file| file == conventional) {
            candidates.push((*conventional).to_owned());
        }
    }
    for file in files {
        if file.ends_with("/__main__.py") && file.split('/').count() <= 3 {
            candidates.push(file.clone());
        }
        if file.starts_with("src/bin/") && file.ends_with(".rs") && file.split('/').count() == 3 {
            candidates.push(file.clone());
        }
    }
    let mut seen = BTreeSet::new();
    candidates.retain(|candidate| {
        files.contains(candidate) && !in_examples(candidate) && seen.insert(candidate.clone())
    });
    candidates.truncate(ENTRY_POINTS_MAX);
    candidates
}

/// An entry point's evidence: the line that makes `path` one.
pub(super) fn entry_point(path: &str, content: &str) -> Option<EvidenceItem> {
    let (line, snippet) = entry_marker(content)?;
    Some(EvidenceItem {
        path: path.to_owned(),
        start_line: line,
        end_line: line,
        snippet,
        note: "entry point".to_owned(),
        verified: false,
    })
}

/// Reads each candidate for the line that makes it an entry point. A
/// candidate that only re-exports another module (`module.exports =
/// require('./lib/express')`, `export * from './src/index'`) leads to that
/// module, which is read as an entry point too.
pub(super) async fn read_entry_points<P: Port>(
    port: &mut P,
    candidates: &[String],
    files: &[String],
) -> Result<Vec<EvidenceItem>, FlowError> {
    let mut entry_points: Vec<EvidenceItem> = Vec::new();
    let mut queue: Vec<String> = candidates.to_vec();
    let mut index = 0;
    while index < queue.len() && entry_points.len() < ENTRY_POINTS_MAX {
        let path = queue[index].clone();
        let step = format!("read:entry:{index}");
        index += 1;
        let Ok(read) = port::read_file(port, &step, read_lines(path.clone())).await? else {
            continue;
        };
        entry_points.extend(entry_point(&path, &read.content));
        if let Some(target) = reexported(&path, &read.content, files)
            && !queue.contains(&target)
        {
            queue.insert(index, target);
        }
    }
    Ok(entry_points)
}

pub(super) static REEXPORT: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r#"^\s*(?:module\.exports\s*=\s*require\(\s*['"](\.{1,2}/[^'"]+)['"]\s*\)|export\s+(?:\*|\{[^}]*\})\s+from\s+['"](\.{1,2}/[^'"]+)['"])"#,
    )
    .ok()
});

/// Code lines a file that only re-exports another module has at most.
pub(super) const REEXPORT_LINES_MAX: usize = 8;

/// The listed module a short JavaScript/TypeScript file at `path` re-exports
/// whole, if that is all it does.
pub(super) fn reexported(path: &str, content: &str, files: &[String]) -> Option<String> {
    let re = REEXPORT.as_ref()?;
    let code: Vec<&str> = content
        .lines()
        .map(str::trim)
        .filter(|line| {
            !line.is_empty()
                && !line.starts_with("//")
                && !line.starts_with("/*")
                && !line.starts_with('*')
                && !matches!(*line, "'use strict';" | "\"use strict\";")
        })
        .collect();
    if code.len() > REEXPORT_LINES_MAX {
        return None;
    }
    let target = code.iter().find_map(|line| {
        let captures = re.captures(line)?;
        captures
            .get(1)
            .or_else(|| captures.get(2))
            .map(|m| m.as_str())
    })?;
    let mut parts: Vec<&str> = path.split('/').collect();
    parts.pop();
    for part in target.split('/') {
        match part {
            "." | "" => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    let base = parts.join("/");
    ["", ".js", ".ts", ".mjs", ".cjs", "/index.js", "/index.ts"]
        .iter()
        .map(|suffix| format!("{base}{suffix}"))
        .find(|candidate| files.contains(candidate))
}
