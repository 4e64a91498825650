//! `describe`, `list_files` and `read_file`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use ignore::WalkBuilder;
use serde::{Deserialize, Serialize};

use super::{Error, ToolOutput};
use crate::policy::{
    Area, Expect, PolicyError, RelPath, SandboxLimits, WorkspaceRoot, is_suspicious_name,
    open_beneath,
};

/// Most top-level entries `describe` returns.
const DESCRIBE_TOP_LEVEL_MAX: usize = 200;
/// Most languages `describe` returns.
const DESCRIBE_LANGUAGES_MAX: usize = 25;
/// `describe` walks at most this many times `max_list_entries` entries.
const DESCRIBE_WALK_FACTOR: usize = 20;
/// Read chunk size.
const CHUNK: usize = 64 * 1024;

/// Kind of a directory entry (symlinks are never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    Other,
}

impl EntryKind {
    fn of(file_type: Option<std::fs::FileType>) -> Self {
        match file_type {
            Some(t) if t.is_symlink() => Self::Symlink,
            Some(t) if t.is_dir() => Self::Directory,
            Some(t) if t.is_file() => Self::File,
            _ => Self::Other,
        }
    }
}

/// Builds the repository walker: gitignore-aware (repository files only,
/// never the operator's global excludes or parents above the repo), hidden
/// files shown, `.git` skipped, symlinks never followed, one filesystem.
pub(crate) fn walker(dir: &Path, max_depth: usize) -> WalkBuilder {
    let mut builder = WalkBuilder::new(dir);
    builder
        .hidden(false)
        .parents(false)
        .git_global(false)
        .git_exclude(false)
        .require_git(false)
        .follow_links(false)
        .same_file_system(true)
        .max_depth(Some(max_depth))
        .filter_entry(|entry| entry.file_name() != ".git");
    builder
}

/// A walked entry's path relative to the repository, if it parses as one
/// the policy accepts.
pub(crate) fn repo_relative(
    root: &WorkspaceRoot,
    limits: &SandboxLimits,
    path: &Path,
) -> Option<RelPath> {
    path.strip_prefix(root.repo())
        .ok()
        .and_then(|p| p.to_str())
        .and_then(|p| RelPath::parse(p, limits).ok())
}

/// Opens the directory `path` of the repository (validated, no symlinks) and
/// returns its absolute path for the walker.
pub(crate) fn repo_dir(
    root: &WorkspaceRoot,
    limits: &SandboxLimits,
    path: &str,
) -> Result<(RelPath, std::path::PathBuf), Error> {
    let rel = RelPath::parse(path, limits)?;
    if rel.is_in_git_dir() {
        return Err(PolicyError::GitDirectory(rel.as_string()).into());
    }
    let repo = root.open_repo_dir()?;
    open_beneath(&repo, &rel, Expect::Directory)?;
    let dir = if rel.is_base() {
        root.repo().to_path_buf()
    } else {
        root.repo().join(rel.to_path_buf())
    };
    Ok((rel, dir))
}

/// Input of `describe`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescribeInput {}

/// One top-level entry of the repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopLevelEntry {
    pub name: String,
    pub kind: EntryKind,
}

/// Files per language.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LanguageCount {
    pub language: String,
    pub files: u64,
}

/// Output of `describe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeOutput {
    pub top_level: Vec<TopLevelEntry>,
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    pub languages: Vec<LanguageCount>,
    /// The walk or the top-level list hit a cap: counts are lower bounds.
    pub truncated: bool,
}

impl ToolOutput for DescribeOutput {
    fn truncated(&self) -> bool {
        self.truncated
    }
}

fn language_of(extension: &str) -> Option<&'static str> {
    Some(match extension.to_ascii_lowercase().as_str() {
        "rs" => "Rust",
        "go" => "Go",
        "py" => "Python",
        "js" | "mjs" | "cjs" | "jsx" => "JavaScript",
        "ts" | "tsx" => "TypeScript",
        "java" => "Java",
        "kt" | "kts" => "Kotlin",
        "c" | "h" => "C",
        "cc" | "cpp" | "cxx" | "hpp" | "hh" => "C++",
        "cs" => "C#",
        "rb" => "Ruby",
        "php" => "PHP",
        "swift" => "Swift",
        "scala" => "Scala",
        "sh" | "bash" | "zsh" => "Shell",
        "md" | "markdown" => "Markdown",
        "toml" => "TOML",
        "yaml" | "yml" => "YAML",
        "json" => "JSON",
        "html" | "htm" => "HTML",
        "css" | "scss" => "CSS",
        "sql" => "SQL",
        "proto" => "Protocol Buffers",
        "ex" | "exs" => "Elixir",
        "hs" => "Haskell",
        "lua" => "Lua",
        "zig" => "Zig",
        "dart" => "Dart",
        "vue" => "Vue",
        "svelte" => "Svelte",
        "tf" => "Terraform",
        _ => return None,
    })
}

pub(crate) fn describe(
    root: &WorkspaceRoot,
    limits: &SandboxLimits,
    _input: &DescribeInput,
) -> Result<DescribeOutput, Error> {
    let (_, dir) = repo_dir(root, limits, "")?;
    let mut truncated = false;
    let mut top_level = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let entry = entry?;
        if entry.file_name() == ".git" {
            continue;
        }
        if top_level.len() == DESCRIBE_TOP_LEVEL_MAX {
            truncated = true;
            break;
        }
        top_level.push(TopLevelEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            kind: EntryKind::of(entry.file_type().ok()),
        });
    }
    top_level.sort_by(|a, b| a.name.cmp(&b.name));

    let walk_max = limits.max_list_entries.saturating_mul(DESCRIBE_WALK_FACTOR);
    let (mut files, mut directories, mut symlinks, mut seen) = (0u64, 0u64, 0u64, 0usize);
    let mut languages: BTreeMap<&'static str, u64> = BTreeMap::new();
    for entry in walker(&dir, limits.max_depth).build() {
        let Ok(entry) = entry else { continue };
        if entry.depth() == 0 {
            continue;
        }
        seen += 1;
        if seen > walk_max {
            truncated = true;
            break;
        }
        match EntryKind::of(entry.file_type()) {
            EntryKind::File => {
                files += 1;
                if let Some(lang) = entry
                    .path()
                    .extension()
                    .and_then(|e| e.to_str())
                    .and_then(language_of)
                {
                    *languages.entry(lang).or_default() += 1;
                }
            }
            EntryKind::Directory => directories += 1,
            EntryKind::Symlink => symlinks += 1,
            EntryKind::Other => {}
        }
    }
    let mut languages: Vec<LanguageCount> = languages
        .into_iter()
        .map(|(language, files)| LanguageCount {
            language: language.to_owned(),
            files,
        })
        .collect();
    languages.sort_by(|a, b| {
        b.files
            .cmp(&a.files)
            .then_with(|| a.language.cmp(&b.language))
    });
    languages.truncate(DESCRIBE_LANGUAGES_MAX);
    Ok(DescribeOutput {
        top_level,
        files,
        directories,
        symlinks,
        languages,
        truncated,
    })
}

/// Input of `list_files`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListFilesInput {
    /// Directory relative to the repository root (empty: the root).
    #[serde(default)]
    pub path: String,
    /// Depth below `path` (capped by `sandbox.max_depth`).
    #[serde(default)]
    pub max_depth: Option<usize>,
    /// Most entries (capped by `sandbox.max_list_entries`).
    #[serde(default)]
    pub max_entries: Option<usize>,
}

/// One listed entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedEntry {
    /// Path relative to the repository root (lossy if not UTF-8).
    pub path: String,
    pub kind: EntryKind,
    pub size_bytes: u64,
    /// A regular file with more than one link (reads are refused).
    pub hard_linked: bool,
    /// The name is not UTF-8 or holds control/bidi/zero-width characters.
    pub suspicious_name: bool,
}

/// Output of `list_files`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListFilesOutput {
    pub entries: Vec<ListedEntry>,
    /// The entry cap was hit.
    pub truncated: bool,
    /// Directories exist below the depth limit.
    pub depth_limited: bool,
    /// Entries that could not be read.
    pub errors: u64,
}

impl ToolOutput for ListFilesOutput {
    fn truncated(&self) -> bool {
        self.truncated || self.depth_limited
    }
}

pub(crate) fn list_files(
    root: &WorkspaceRoot,
    limits: &SandboxLimits,
    input: &ListFilesInput,
) -> Result<ListFilesOutput, Error> {
    let (_, dir) = repo_dir(root, limits, &input.path)?;
    let max_depth = input
        .max_depth
        .unwrap_or(limits.max_depth)
        .clamp(1, limits.max_depth);
    let max_entries = input
        .max_entries
        .unwrap_or(limits.max_list_entries)
        .clamp(1, limits.max_list_entries);
    let mut out = ListFilesOutput {
        entries: Vec::new(),
        truncated: false,
        depth_limited: false,
        errors: 0,
    };
    let mut budget = limits.max_response_bytes;
    let mut builder = walker(&dir, max_depth);
    builder.sort_by_file_name(|a, b| a.cmp(b));
    for entry in builder.build() {
        let entry = match entry {
            Ok(entry) => entry,
            Err(_) => {
                out.errors += 1;
                continue;
            }
        };
        if entry.depth() == 0 {
            continue;
        }
        let kind = EntryKind::of(entry.file_type());
        if kind == EntryKind::Directory && entry.depth() == max_depth {
            out.depth_limited = true;
        }
        if out.entries.len() == max_entries {
            out.truncated = true;
            break;
        }
        // `metadata()` is lstat here: the walker never follows links.
        let (size_bytes, nlink) = entry
            .metadata()
            .map(|m| (m.len(), std::os::unix::fs::MetadataExt::nlink(&m)))
            .unwrap_or((0, 1));
        let path = entry
            .path()
            .strip_prefix(root.repo())
            .unwrap_or(entry.path())
            .to_string_lossy()
            .into_owned();
        let cost = path.len() + 64;
        if cost > budget {
            out.truncated = true;
            break;
        }
        budget -= cost;
        out.entries.push(ListedEntry {
            path,
            kind,
            size_bytes,
            hard_linked: kind == EntryKind::File && nlink > 1,
            suspicious_name: is_suspicious_name(entry.file_name()),
        });
    }
    Ok(out)
}

/// Input of `read_file`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadFileInput {
    /// Path relative to the area's root.
    pub path: String,
    /// `repo` (default) or `generated` (`.zopu/`).
    #[serde(default)]
    pub area: Area,
    /// First line, 1-based (default 1).
    #[serde(default)]
    pub start_line: Option<u64>,
    /// Last line, inclusive (default: as far as the caps allow).
    #[serde(default)]
    pub end_line: Option<u64>,
}

/// Output of `read_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadFileOutput {
    pub path: String,
    pub size_bytes: u64,
    pub start_line: u64,
    /// Last line (partly) returned; `start_line - 1` when none.
    pub end_line: u64,
    /// The text; empty for binary files.
    pub content: String,
    /// A cap (file bytes or response bytes) cut the range short.
    pub truncated: bool,
    /// A NUL byte was found in the bytes read.
    pub binary: bool,
    /// Invalid UTF-8 was replaced by U+FFFD.
    pub invalid_utf8: bool,
}

impl ToolOutput for ReadFileOutput {
    fn truncated(&self) -> bool {
        self.truncated
    }
}

pub(crate) fn read_file(
    root: &WorkspaceRoot,
    limits: &SandboxLimits,
    input: &ReadFileInput,
) -> Result<ReadFileOutput, Error> {
    let rel = RelPath::parse(&input.path, limits)?;
    if input.area == Area::Repo && rel.is_in_git_dir() {
        return Err(PolicyError::GitDirectory(rel.as_string()).into());
    }
    if zopu_secrets::is_secret_file_name(&rel.as_string()) {
        return Err(PolicyError::SecretFile(rel.as_string()).into());
    }
    let start_line = input.start_line.unwrap_or(1);
    let end_line = input.end_line.unwrap_or(u64::MAX);
    if start_line == 0 || end_line < start_line {
        return Err(Error::InvalidInput(format!(
            "bad line range {start_line}..={end_line} (lines are 1-based)"
        )));
    }
    let base = root.open_area(input.area)?;
    let opened = open_beneath(&base, &rel, Expect::File)?;
    let mut file = File::from(opened.fd);
    // Judged on the whole file (up to the cap), not the range asked for: a
    // key's body must not come out a few lines at a time.
    if is_secret_content(&file, limits.max_file_bytes)? {
        return Err(PolicyError::SecretFile(rel.as_string()).into());
    }
    let mut out = ReadFileOutput {
        path: rel.as_string(),
        size_bytes: opened.size,
        start_line,
        end_line: start_line - 1,
        content: String::new(),
        truncated: false,
        binary: false,
        invalid_utf8: false,
    };
    let budget = limits.max_response_bytes;
    let mut content: Vec<u8> = Vec::new();
    let mut line = 1u64;
    let mut total = 0u64;
    let mut buf = vec![0u8; CHUNK];
    'read: loop {
        if total >= limits.max_file_bytes {
            out.truncated = true;
            break;
        }
        let want = usize::try_from(limits.max_file_bytes - total)
            .unwrap_or(CHUNK)
            .min(CHUNK);
        let n = file.read(&mut buf[..want])?;
        if n == 0 {
            break;
        }
        total += n as u64;
        let chunk = &buf[..n];
        if chunk.contains(&0) {
            out.binary = true;
            break;
        }
        for &byte in chunk {
            if line > end_line {
                break 'read;
            }
            if line >= start_line {
                // Past the response budget, keep scanning (up to
                // max_file_bytes) so a late NUL still marks the file binary.
                if content.len() < budget {
                    content.push(byte);
                    out.end_line = line;
                } else {
                    out.truncated = true;
                }
            }
            if byte == b'\n' {
                line += 1;
            }
        }
    }
    if out.binary {
        out.end_line = start_line - 1;
        return Ok(out);
    }
    // Drop a character cut in half by a cap before judging UTF-8 validity.
    if out.truncated
        && let Err(e) = std::str::from_utf8(&content)
        && e.error_len().is_none()
    {
        content.truncate(e.valid_up_to());
    }
    match String::from_utf8(content) {
        Ok(text) => out.content = text,
        Err(e) => {
            out.invalid_utf8 = true;
            out.content = String::from_utf8_lossy(e.as_bytes()).into_owned();
        }
    }
    Ok(out)
}

/// Whether the file's text (up to `max_bytes`, read by offset so the caller's
/// position is untouched) is secret-bearing as a whole.
pub(crate) fn is_secret_content(file: &File, max_bytes: u64) -> Result<bool, Error> {
    use std::os::unix::fs::FileExt;
    let mut text = Vec::new();
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    while offset < max_bytes {
        let want = usize::try_from(max_bytes - offset)
            .unwrap_or(CHUNK)
            .min(CHUNK);
        let n = file.read_at(&mut buf[..want], offset)?;
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
        offset += n as u64;
    }
    Ok(zopu_secrets::is_secret_file_content(
        &String::from_utf8_lossy(&text),
    ))
}
