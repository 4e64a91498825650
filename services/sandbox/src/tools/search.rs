//! `search`: ripgrep's engine (grep-regex + grep-searcher) over a
//! gitignore-aware walk in path order. Every file is opened through the path policy (no
//! symlink, no hard link); binary files, files over `max_file_bytes` and
//! files with suspicious names are skipped and counted. With a match cap the
//! matches of the files first in path order are kept, so a search is
//! deterministic; they are returned sorted by path and line.

use std::fs::File;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, MmapChoice, Searcher, SearcherBuilder, Sink, SinkMatch};
use ignore::WalkState;
use serde::{Deserialize, Serialize};

use super::files::{is_secret_content, repo_dir, repo_relative, walker};
use super::{Error, ToolOutput};
use crate::policy::{Expect, SandboxLimits, WorkspaceRoot, open_beneath};

/// Longest pattern accepted, in bytes.
const MAX_PATTERN_BYTES: usize = 1_024;
/// Longest line text returned per match, in bytes.
const MAX_LINE_BYTES: usize = 300;
/// Regex compile size limit.
const REGEX_SIZE_LIMIT: usize = 10 * 1024 * 1024;
/// Searcher heap limit (bounds memory on a huge single line).
const HEAP_LIMIT: usize = 16 * 1024 * 1024;

/// Input of `search`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchInput {
    pub pattern: String,
    /// Treat `pattern` as a literal string, not a regex.
    #[serde(default)]
    pub literal: bool,
    #[serde(default)]
    pub case_insensitive: bool,
    /// Directory relative to the repository root (empty: the root).
    #[serde(default)]
    pub path: String,
    /// Most matches (capped by `sandbox.max_matches`).
    #[serde(default)]
    pub max_matches: Option<usize>,
    /// Most matches kept per file (none: no per-file limit), so a cap
    /// reached early still covers many files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_matches_per_file: Option<usize>,
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchMatch {
    pub path: String,
    pub line_number: u64,
    /// The line, cut to 300 bytes, invalid UTF-8 replaced.
    pub line: String,
}

/// Output of `search`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchOutput {
    pub matches: Vec<SearchMatch>,
    pub files_searched: u64,
    pub files_skipped_binary: u64,
    pub files_skipped_large: u64,
    /// Symlinks, hard links, suspicious names, unreadable files.
    pub files_skipped_policy: u64,
    /// Secret-bearing files (by name or content: `.env`, keys, credentials).
    #[serde(default)]
    pub files_skipped_secret: u64,
    /// The match or byte cap was hit.
    pub truncated: bool,
}

impl ToolOutput for SearchOutput {
    fn truncated(&self) -> bool {
        self.truncated
    }
}

#[derive(Debug, Default)]
struct Shared {
    matches: Mutex<Vec<SearchMatch>>,
    count: AtomicUsize,
    bytes: AtomicUsize,
    searched: AtomicU64,
    binary: AtomicU64,
    large: AtomicU64,
    policy: AtomicU64,
    secret: AtomicU64,
    truncated: AtomicBool,
}

struct Collector<'a> {
    path: &'a str,
    shared: &'a Shared,
    max_matches: usize,
    per_file: usize,
    local: Vec<SearchMatch>,
    binary: bool,
    /// The match cap stopped the search before the end of the file.
    stopped: bool,
}

impl Sink for Collector<'_> {
    type Error = std::io::Error;

    fn matched(&mut self, _searcher: &Searcher, m: &SinkMatch<'_>) -> Result<bool, Self::Error> {
        if self.shared.count.load(Ordering::Relaxed) + self.local.len() >= self.max_matches {
            self.shared.truncated.store(true, Ordering::Relaxed);
            self.stopped = true;
            return Ok(false);
        }
        if self.local.len() >= self.per_file {
            self.stopped = true;
            return Ok(false);
        }
        let bytes = m.bytes();
        let mut cut = bytes.len().min(MAX_LINE_BYTES);
        while cut > 0 && cut < bytes.len() && (bytes[cut] & 0xC0) == 0x80 {
            cut -= 1;
        }
        let line = String::from_utf8_lossy(&bytes[..cut])
            .trim_end_matches(['\n', '\r'])
            .to_owned();
        self.local.push(SearchMatch {
            path: self.path.to_owned(),
            line_number: m.line_number().unwrap_or(0),
            line,
        });
        Ok(true)
    }

    fn binary_data(&mut self, _searcher: &Searcher, _offset: u64) -> Result<bool, Self::Error> {
        self.binary = true;
        Ok(false)
    }
}

pub(crate) fn search(
    root: &WorkspaceRoot,
    limits: &SandboxLimits,
    input: &SearchInput,
) -> Result<SearchOutput, Error> {
    if input.pattern.is_empty()
        || input.pattern.len() > MAX_PATTERN_BYTES
        || input.pattern.contains('\0')
    {
        return Err(Error::InvalidInput(format!(
            "pattern must be 1..={MAX_PATTERN_BYTES} bytes without NUL"
        )));
    }
    let (_, dir) = repo_dir(root, limits, &input.path)?;
    let matcher = RegexMatcherBuilder::new()
        .case_insensitive(input.case_insensitive)
        .fixed_strings(input.literal)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .line_terminator(Some(b'\n'))
        .build(&input.pattern)
        .map_err(|e| Error::InvalidInput(format!("bad pattern: {e}")))?;
    let mut searcher = SearcherBuilder::new()
        .binary_detection(BinaryDetection::quit(0))
        .line_number(true)
        .memory_map(MmapChoice::never())
        .heap_limit(Some(HEAP_LIMIT))
        .build();
    let max_matches = input
        .max_matches
        .unwrap_or(limits.max_matches)
        .clamp(1, limits.max_matches);
    let repo_fd = root.open_repo_dir()?;
    let shared = Shared::default();
    // One walk in path order: with a match cap, which matches are kept
    // depends on the order files are visited, so the same repository and
    // question always give the same matches (and the same ranking).
    let mut builder = walker(&dir, limits.max_depth);
    builder.sort_by_file_path(|a, b| a.cmp(b));
    let (shared_ref, repo_fd_ref) = (&shared, &repo_fd);
    let visit =
        |entry: Result<ignore::DirEntry, ignore::Error>, searcher: &mut Searcher| -> WalkState {
            let (shared, repo_fd) = (shared_ref, repo_fd_ref);
            if shared.truncated.load(Ordering::Relaxed) {
                return WalkState::Quit;
            }
            let Ok(entry) = entry else {
                return WalkState::Continue;
            };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                return WalkState::Continue;
            }
            let Some(rel) = repo_relative(root, limits, entry.path()) else {
                shared.policy.fetch_add(1, Ordering::Relaxed);
                return WalkState::Continue;
            };
            if zopu_secrets::is_secret_file_name(&rel.as_string()) {
                shared.secret.fetch_add(1, Ordering::Relaxed);
                return WalkState::Continue;
            }
            let opened = match open_beneath(repo_fd, &rel, Expect::File) {
                Ok(opened) => opened,
                Err(_) => {
                    shared.policy.fetch_add(1, Ordering::Relaxed);
                    return WalkState::Continue;
                }
            };
            if opened.size > limits.max_file_bytes {
                shared.large.fetch_add(1, Ordering::Relaxed);
                return WalkState::Continue;
            }
            let file = File::from(opened.fd);
            let path = rel.as_string();
            let mut sink = Collector {
                path: &path,
                shared,
                max_matches,
                per_file: input.max_matches_per_file.unwrap_or(usize::MAX).max(1),
                local: Vec::new(),
                binary: false,
                stopped: false,
            };
            shared.searched.fetch_add(1, Ordering::Relaxed);
            if searcher.search_file(&matcher, &file, &mut sink).is_err() {
                shared.large.fetch_add(1, Ordering::Relaxed);
                return WalkState::Continue;
            }
            // Stopped early by the cap: the searcher did not see the rest of
            // the file, so look for a late NUL before trusting the matches.
            if sink.binary || (sink.stopped && has_nul(&file, limits.max_file_bytes)) {
                shared.binary.fetch_add(1, Ordering::Relaxed);
                return WalkState::Continue;
            }
            if sink.local.is_empty() {
                return WalkState::Continue;
            }
            if is_secret_content(&file, limits.max_file_bytes).unwrap_or(true) {
                shared.secret.fetch_add(1, Ordering::Relaxed);
                return WalkState::Continue;
            }
            commit(shared, sink.local, max_matches, limits.max_response_bytes)
        };
    for entry in builder.build() {
        if matches!(visit(entry, &mut searcher), WalkState::Quit) {
            break;
        }
    }

    let mut matches = shared
        .matches
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    matches.sort_by(|a, b| a.path.cmp(&b.path).then(a.line_number.cmp(&b.line_number)));
    Ok(SearchOutput {
        matches,
        files_searched: shared.searched.into_inner(),
        files_skipped_binary: shared.binary.into_inner(),
        files_skipped_large: shared.large.into_inner(),
        files_skipped_policy: shared.policy.into_inner(),
        files_skipped_secret: shared.secret.into_inner(),
        truncated: shared.truncated.into_inner(),
    })
}

fn has_nul(file: &File, max_bytes: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 64 * 1024];
    let mut offset = 0u64;
    while offset < max_bytes {
        match file.read_at(&mut buf, offset) {
            Ok(0) | Err(_) => return false,
            Ok(n) if buf[..n].contains(&0) => return true,
            Ok(n) => offset += n as u64,
        }
    }
    false
}

fn commit(
    shared: &Shared,
    local: Vec<SearchMatch>,
    max_matches: usize,
    max_bytes: usize,
) -> WalkState {
    let mut all = shared
        .matches
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for m in local {
        let cost = m.path.len() + m.line.len() + 32;
        if all.len() >= max_matches || shared.bytes.load(Ordering::Relaxed) + cost > max_bytes {
            shared.truncated.store(true, Ordering::Relaxed);
            return WalkState::Quit;
        }
        shared.bytes.fetch_add(cost, Ordering::Relaxed);
        all.push(m);
    }
    shared.count.store(all.len(), Ordering::Relaxed);
    WalkState::Continue
}
