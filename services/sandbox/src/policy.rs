//! Path policy and limits for the agent's repository tools.
//!
//! Every path an agent names is parsed into a [`RelPath`] (relative, no `..`,
//! no NUL, no control/bidi/zero-width characters, bounded length) and opened
//! *relative to a directory file descriptor* of the workspace with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`,
//! falling back to a per-component `openat(O_NOFOLLOW)` walk where `openat2`
//! is unavailable. The rule is deliberately simple: **no symlink is ever
//! traversed**, wherever it points, so symlinks to `/etc/passwd`, to
//! `/proc/self`, or in loops are all refused with [`PolicyError::Symlink`].
//!
//! Decisions documented here:
//! - Hard links: a regular file with `st_nlink > 1` is refused for every read
//!   ([`PolicyError::HardLinked`]): `git clone` never creates hard links in a
//!   work tree, so a hard-linked file was planted and may alias a file outside
//!   the workspace. Listings show such files with `hard_linked: true`; search
//!   skips them.
//! - `.git/` is never exposed by the in-process tools (its objects may be
//!   hard-linked by a local clone and its config is not repository content);
//!   git reads it through `exec_safe`.
//! - Unicode: names are not NFC-normalised (no normalisation crate in the
//!   workspace); instead input paths containing control, bidi-override or
//!   zero-width characters are rejected, and such names found on disk are
//!   flagged `suspicious_name` in listings.
//! - Files are opened with `O_NONBLOCK` so a planted FIFO cannot hang a read;
//!   anything that is not a regular file is refused for reads.
//!
//! Invariant: no function in this module returns a descriptor for an object
//! outside the directory it was given.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

/// Name of the generated-files directory under the workspace root.
pub const GENERATED_DIR: &str = ".zopu";
/// Name of the clone directory under the workspace root.
pub const REPO_DIR: &str = "repo";

/// A path refused by the policy, or an I/O failure while resolving one.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("path contains a NUL byte")]
    NulByte,
    #[error("absolute paths are not allowed: {0:?}")]
    Absolute(String),
    #[error("`..` components are not allowed: {0:?}")]
    ParentTraversal(String),
    #[error("path is {len} bytes, the limit is {max}")]
    PathTooLong { len: usize, max: usize },
    #[error("a path component is {len} bytes, the limit is {max}")]
    ComponentTooLong { len: usize, max: usize },
    #[error("path contains the control, bidi or zero-width character U+{0:04X}")]
    ForbiddenCharacter(u32),
    #[error("the .git directory is not exposed by this tool: {0:?}")]
    GitDirectory(String),
    #[error("secret-bearing file (credentials, keys or .env values) is not exposed: {0:?}")]
    SecretFile(String),
    #[error("path traverses or names a symlink: {0:?}")]
    Symlink(String),
    #[error("not a regular file: {0:?}")]
    NotRegularFile(String),
    #[error("not a directory: {0:?}")]
    NotDirectory(String),
    #[error(
        "file has {links} hard links (refused, it may alias a file outside the workspace): {path:?}"
    )]
    HardLinked { path: String, links: u64 },
    #[error("no such file or directory: {0:?}")]
    NotFound(String),
    #[error("already exists (generated files are never overwritten): {0:?}")]
    AlreadyExists(String),
    #[error("path resolves outside the workspace: {0:?}")]
    Escape(String),
    #[error("{GENERATED_DIR} is a symlink or not a directory")]
    GeneratedDirNotDirectory,
    #[error("invalid workspace root {path:?}: {reason}")]
    InvalidWorkspace { path: PathBuf, reason: String },
    #[error("I/O error on {path:?}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl PolicyError {
    fn io(path: &str, errno: Errno) -> Self {
        Self::Io {
            path: path.to_owned(),
            source: errno.into(),
        }
    }

    /// A short stable code for the denial, for records and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NulByte => "nul_byte",
            Self::Absolute(_) => "absolute_path",
            Self::ParentTraversal(_) => "parent_traversal",
            Self::PathTooLong { .. } => "path_too_long",
            Self::ComponentTooLong { .. } => "component_too_long",
            Self::ForbiddenCharacter(_) => "forbidden_character",
            Self::GitDirectory(_) => "git_directory",
            Self::SecretFile(_) => "secret_file",
            Self::Symlink(_) => "symlink",
            Self::NotRegularFile(_) => "not_regular_file",
            Self::NotDirectory(_) => "not_directory",
            Self::HardLinked { .. } => "hard_linked",
            Self::NotFound(_) => "not_found",
            Self::AlreadyExists(_) => "already_exists",
            Self::Escape(_) => "escape",
            Self::GeneratedDirNotDirectory => "generated_dir_not_directory",
            Self::InvalidWorkspace { .. } => "invalid_workspace",
            Self::Io { .. } => "io",
        }
    }
}

/// An invalid `sandbox.*` setting; the message names the key.
#[derive(Debug, thiserror::Error)]
#[error("invalid setting sandbox.{key}: {reason}")]
pub struct LimitsError {
    pub key: &'static str,
    pub reason: String,
}

/// Limits for the tools and the confined child processes (config section
/// `sandbox`, environment `ZOPU_SANDBOX__*`). Defaults are safe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxLimits {
    /// Largest file `read_file` reads from and `search` searches.
    pub max_file_bytes: u64,
    /// Largest serialized-content budget of one tool response.
    pub max_response_bytes: usize,
    /// Most entries one listing returns (and walks, for `describe`).
    pub max_list_entries: usize,
    /// Deepest directory level walked.
    pub max_depth: usize,
    /// Most matches `search` returns.
    pub max_matches: usize,
    /// Longest path accepted, in bytes.
    pub max_path_bytes: usize,
    /// Longest single path component accepted, in bytes.
    pub max_component_bytes: usize,
    /// Wall-clock limit of one `exec_safe` command.
    pub exec_timeout_ms: u64,
    /// Cap on captured stdout and on captured stderr of one command.
    pub exec_output_bytes: usize,
    /// RLIMIT_AS of a confined child.
    pub memory_bytes: u64,
    /// RLIMIT_CPU of a confined child.
    pub cpu_seconds: u64,
    /// RLIMIT_NOFILE of a confined child.
    pub open_files: u64,
    /// RLIMIT_FSIZE of a confined child.
    pub file_size_bytes: u64,
    /// Largest file `write_generated_file` writes.
    pub max_write_bytes: usize,
    /// Run programs even when no kernel confinement layer is available.
    pub allow_unconfined_exec: bool,
    /// Use bubblewrap even when landlock is available.
    pub prefer_bubblewrap: bool,
    /// Wall-clock limit of a check (the project's test command, `run_check`).
    pub check_timeout_ms: u64,
    /// RLIMIT_CPU of a check's processes (each process; tests need more
    /// than a read-only tool).
    pub check_cpu_seconds: u64,
    /// The most bytes of a check's output (standard output and error
    /// together, redacted) its result keeps: the tail, where failures show.
    pub check_output_tail_bytes: usize,
    /// Largest repository tree a check copies into its scratch directory.
    pub check_copy_bytes: u64,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            max_file_bytes: 4 * 1024 * 1024,
            max_response_bytes: 256 * 1024,
            max_list_entries: 5_000,
            max_depth: 64,
            max_matches: 500,
            max_path_bytes: 1_024,
            max_component_bytes: 255,
            exec_timeout_ms: 10_000,
            exec_output_bytes: 256 * 1024,
            memory_bytes: 1024 * 1024 * 1024,
            cpu_seconds: 10,
            open_files: 256,
            file_size_bytes: 16 * 1024 * 1024,
            max_write_bytes: 4 * 1024 * 1024,
            allow_unconfined_exec: false,
            prefer_bubblewrap: false,
            check_timeout_ms: 300_000,
            check_cpu_seconds: 300,
            check_output_tail_bytes: 6 * 1024,
            check_copy_bytes: 512 * 1024 * 1024,
        }
    }
}

impl SandboxLimits {
    /// Checks every limit is within its sane range; the error names the key.
    pub fn validate(&self) -> Result<(), LimitsError> {
        fn range(key: &'static str, value: u64, min: u64, max: u64) -> Result<(), LimitsError> {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(LimitsError {
                    key,
                    reason: format!("{value} is outside {min}..={max}"),
                })
            }
        }
        const GIB: u64 = 1024 * 1024 * 1024;
        range("max_file_bytes", self.max_file_bytes, 1, GIB)?;
        range(
            "max_response_bytes",
            self.max_response_bytes as u64,
            1_024,
            64 * 1024 * 1024,
        )?;
        range(
            "max_list_entries",
            self.max_list_entries as u64,
            1,
            1_000_000,
        )?;
        range("max_depth", self.max_depth as u64, 1, 512)?;
        range("max_matches", self.max_matches as u64, 1, 100_000)?;
        range("max_path_bytes", self.max_path_bytes as u64, 16, 4_096)?;
        range(
            "max_component_bytes",
            self.max_component_bytes as u64,
            1,
            255,
        )?;
        range("exec_timeout_ms", self.exec_timeout_ms, 10, 600_000)?;
        range(
            "exec_output_bytes",
            self.exec_output_bytes as u64,
            1_024,
            64 * 1024 * 1024,
        )?;
        range(
            "memory_bytes",
            self.memory_bytes,
            64 * 1024 * 1024,
            64 * GIB,
        )?;
        range("cpu_seconds", self.cpu_seconds, 1, 3_600)?;
        range("open_files", self.open_files, 16, 65_536)?;
        range("file_size_bytes", self.file_size_bytes, 0, 16 * GIB)?;
        range(
            "max_write_bytes",
            self.max_write_bytes as u64,
            1,
            256 * 1024 * 1024,
        )?;
        range("check_timeout_ms", self.check_timeout_ms, 1_000, 3_600_000)?;
        range("check_cpu_seconds", self.check_cpu_seconds, 1, 3_600)?;
        range(
            "check_output_tail_bytes",
            self.check_output_tail_bytes as u64,
            256,
            1024 * 1024,
        )?;
        range("check_copy_bytes", self.check_copy_bytes, 1024, 16 * GIB)?;
        Ok(())
    }
}

/// Which directory of the workspace a path is relative to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Area {
    /// `<workspace>/repo/`, the clone.
    #[default]
    Repo,
    /// `<workspace>/.zopu/`, generated files.
    Generated,
}

/// A validated workspace root: canonicalized once, with `repo/` checked to be
/// a real directory (not a symlink).
#[derive(Debug, Clone)]
pub struct WorkspaceRoot {
    root: PathBuf,
    repo: PathBuf,
}

impl WorkspaceRoot {
    /// Validates `path` (operator-controlled) as a workspace root.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, PolicyError> {
        let path = path.as_ref();
        let invalid = |reason: &str| PolicyError::InvalidWorkspace {
            path: path.to_owned(),
            reason: reason.to_owned(),
        };
        let root = path.canonicalize().map_err(|e| invalid(&e.to_string()))?;
        if !root.is_dir() {
            return Err(invalid("not a directory"));
        }
        let repo = root.join(REPO_DIR);
        let meta = std::fs::symlink_metadata(&repo).map_err(|e| invalid(&format!("repo/: {e}")))?;
        if !meta.file_type().is_dir() {
            return Err(invalid("repo/ is not a directory (or is a symlink)"));
        }
        Ok(Self { root, repo })
    }

    /// The canonical workspace root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/repo`.
    pub fn repo(&self) -> &Path {
        &self.repo
    }

    /// `<root>/.zopu` (may not exist yet).
    pub fn generated(&self) -> PathBuf {
        self.root.join(GENERATED_DIR)
    }

    fn open_root(&self) -> Result<OwnedFd, PolicyError> {
        rustix::fs::open(&self.root, dir_flags(), Mode::empty())
            .map_err(|e| PolicyError::io(&self.root.to_string_lossy(), e))
    }

    /// Opens `repo/` as a directory descriptor, refusing a symlink.
    pub fn open_repo_dir(&self) -> Result<OwnedFd, PolicyError> {
        let root = self.open_root()?;
        rustix::fs::openat(&root, REPO_DIR, dir_flags(), Mode::empty()).map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR => PolicyError::Symlink(REPO_DIR.to_owned()),
            e => PolicyError::io(REPO_DIR, e),
        })
    }

    /// Opens `.zopu/`, creating it (mode 0700) when `create`; refuses when it
    /// is a symlink or not a directory.
    pub fn open_generated_dir(&self, create: bool) -> Result<OwnedFd, PolicyError> {
        let root = self.open_root()?;
        if create {
            match rustix::fs::mkdirat(&root, GENERATED_DIR, Mode::RWXU) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(PolicyError::io(GENERATED_DIR, e)),
            }
        }
        rustix::fs::openat(&root, GENERATED_DIR, dir_flags(), Mode::empty()).map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR => PolicyError::GeneratedDirNotDirectory,
            Errno::NOENT => PolicyError::NotFound(GENERATED_DIR.to_owned()),
            e => PolicyError::io(GENERATED_DIR, e),
        })
    }

    /// Opens the directory of `area`.
    pub fn open_area(&self, area: Area) -> Result<OwnedFd, PolicyError> {
        match area {
            Area::Repo => self.open_repo_dir(),
            Area::Generated => self.open_generated_dir(false),
        }
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// A validated relative path: no `..`, no absolute, no NUL, bounded, no
/// control/bidi/zero-width characters. The empty path names the base itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelPath {
    components: Vec<String>,
}

/// Whether `c` is a control, bidi-control or invisible formatting character.
pub fn is_forbidden_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{115F}'
                | '\u{1160}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2069}'
                | '\u{3164}'
                | '\u{FE00}'..='\u{FE0F}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF9}'..='\u{FFFB}'
        )
}

impl RelPath {
    /// Parses an agent-supplied path.
    pub fn parse(input: &str, limits: &SandboxLimits) -> Result<Self, PolicyError> {
        if input.contains('\0') {
            return Err(PolicyError::NulByte);
        }
        if input.len() > limits.max_path_bytes {
            return Err(PolicyError::PathTooLong {
                len: input.len(),
                max: limits.max_path_bytes,
            });
        }
        if let Some(c) = input.chars().find(|c| is_forbidden_char(*c)) {
            return Err(PolicyError::ForbiddenCharacter(c as u32));
        }
        if input.starts_with('/') || input.starts_with('~') {
            return Err(PolicyError::Absolute(input.to_owned()));
        }
        let mut components = Vec::new();
        for part in input.split('/') {
            match part {
                "" | "." => {}
                ".." => return Err(PolicyError::ParentTraversal(input.to_owned())),
                part => {
                    if part.len() > limits.max_component_bytes {
                        return Err(PolicyError::ComponentTooLong {
                            len: part.len(),
                            max: limits.max_component_bytes,
                        });
                    }
                    components.push(part.to_owned());
                }
            }
        }
        Ok(Self { components })
    }

    /// The base directory itself.
    pub fn base() -> Self {
        Self {
            components: Vec::new(),
        }
    }

    /// Components in order.
    pub fn components(&self) -> &[String] {
        &self.components
    }

    /// Whether this names the base directory.
    pub fn is_base(&self) -> bool {
        self.components.is_empty()
    }

    /// Whether the first component is `.git`.
    pub fn is_in_git_dir(&self) -> bool {
        self.components.first().is_some_and(|c| c == ".git")
    }

    /// The path joined with `/` (`.` for the base).
    pub fn as_string(&self) -> String {
        if self.components.is_empty() {
            ".".to_owned()
        } else {
            self.components.join("/")
        }
    }

    /// A relative `Path` (`.` for the base).
    pub fn to_path_buf(&self) -> PathBuf {
        PathBuf::from(self.as_string())
    }
}

/// What `open_beneath` must find at the end of the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// A regular file with a single link.
    File,
    /// A directory.
    Directory,
}

/// The opened object and its metadata.
#[derive(Debug)]
pub struct Opened {
    pub fd: OwnedFd,
    pub size: u64,
    pub nlink: u64,
}

/// Opens `rel` beneath the directory `base` without traversing any symlink.
pub fn open_beneath(base: &OwnedFd, rel: &RelPath, expect: Expect) -> Result<Opened, PolicyError> {
    let name = rel.as_string();
    let mut flags =
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
    if expect == Expect::Directory {
        flags |= OFlags::DIRECTORY;
    }
    let fd = if rel.is_base() {
        rustix::fs::openat(base, ".", flags, Mode::empty())
            .map_err(|e| PolicyError::io(&name, e))?
    } else {
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        match rustix::fs::openat2(base, rel.to_path_buf(), flags, Mode::empty(), resolve) {
            Ok(fd) => fd,
            Err(Errno::NOSYS | Errno::AGAIN | Errno::PERM) => walk_components(base, rel, flags)?,
            Err(Errno::LOOP | Errno::NOTDIR) => {
                // Find out which component is the symlink for the reason; the
                // walk fails closed either way.
                walk_components(base, rel, flags)?;
                return Err(PolicyError::Symlink(name));
            }
            Err(Errno::XDEV) => return Err(PolicyError::Escape(name)),
            Err(Errno::NOENT) => return Err(PolicyError::NotFound(name)),
            Err(Errno::NAMETOOLONG) => {
                return Err(PolicyError::PathTooLong {
                    len: name.len(),
                    max: name.len(),
                });
            }
            Err(e) => return Err(PolicyError::io(&name, e)),
        }
    };
    check_opened(fd, &name, expect)
}

fn check_opened(fd: OwnedFd, name: &str, expect: Expect) -> Result<Opened, PolicyError> {
    let st = rustix::fs::fstat(&fd).map_err(|e| PolicyError::io(name, e))?;
    let kind = FileType::from_raw_mode(st.st_mode);
    let nlink = st.st_nlink as u64;
    match expect {
        Expect::File if kind != FileType::RegularFile => {
            Err(PolicyError::NotRegularFile(name.to_owned()))
        }
        Expect::File if nlink > 1 => Err(PolicyError::HardLinked {
            path: name.to_owned(),
            links: nlink,
        }),
        Expect::Directory if kind != FileType::Directory => {
            Err(PolicyError::NotDirectory(name.to_owned()))
        }
        _ => Ok(Opened {
            fd,
            size: u64::try_from(st.st_size).unwrap_or(0),
            nlink,
        }),
    }
}

/// The portable fallback: one `openat(O_NOFOLLOW)` per component, checking
/// with `lstat` semantics which component is a symlink.
fn walk_components(
    base: &OwnedFd,
    rel: &RelPath,
    last_flags: OFlags,
) -> Result<OwnedFd, PolicyError> {
    let mut current: Option<OwnedFd> = None;
    let n = rel.components().len();
    for (i, comp) in rel.components().iter().enumerate() {
        let prefix = rel.components()[..=i].join("/");
        let dir = current.as_ref().unwrap_or(base);
        let st = rustix::fs::statat(dir, comp.as_str(), AtFlags::SYMLINK_NOFOLLOW).map_err(
            |e| match e {
                Errno::NOENT => PolicyError::NotFound(prefix.clone()),
                e => PolicyError::io(&prefix, e),
            },
        )?;
        let kind = FileType::from_raw_mode(st.st_mode);
        if kind == FileType::Symlink {
            return Err(PolicyError::Symlink(prefix));
        }
        let last = i + 1 == n;
        if !last && kind != FileType::Directory {
            return Err(PolicyError::NotDirectory(prefix));
        }
        let flags = if last { last_flags } else { dir_flags() };
        let fd =
            rustix::fs::openat(dir, comp.as_str(), flags, Mode::empty()).map_err(|e| match e {
                Errno::LOOP => PolicyError::Symlink(prefix.clone()),
                Errno::NOTDIR => PolicyError::NotDirectory(prefix.clone()),
                Errno::NOENT => PolicyError::NotFound(prefix.clone()),
                e => PolicyError::io(&prefix, e),
            })?;
        current = Some(fd);
    }
    current.ok_or_else(|| PolicyError::NotFound(rel.as_string()))
}

/// Whether an on-disk name should be flagged: not UTF-8, or containing a
/// forbidden character.
pub fn is_suspicious_name(name: &OsStr) -> bool {
    match std::str::from_utf8(name.as_bytes()) {
        Ok(s) => s.chars().any(is_forbidden_char),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rejects_escapes() {
        let l = SandboxLimits::default();
        assert!(matches!(
            RelPath::parse("../x", &l),
            Err(PolicyError::ParentTraversal(_))
        ));
        assert!(matches!(
            RelPath::parse("a/../../x", &l),
            Err(PolicyError::ParentTraversal(_))
        ));
        assert!(matches!(
            RelPath::parse("/etc/passwd", &l),
            Err(PolicyError::Absolute(_))
        ));
        assert!(matches!(
            RelPath::parse("a\0b", &l),
            Err(PolicyError::NulByte)
        ));
        assert!(matches!(
            RelPath::parse("a\u{202E}b", &l),
            Err(PolicyError::ForbiddenCharacter(0x202E))
        ));
        assert!(matches!(
            RelPath::parse("a\u{200B}b", &l),
            Err(PolicyError::ForbiddenCharacter(0x200B))
        ));
        assert!(matches!(
            RelPath::parse(&"a".repeat(300), &l),
            Err(PolicyError::ComponentTooLong { .. })
        ));
        assert!(matches!(
            RelPath::parse(&"a/".repeat(600), &l),
            Err(PolicyError::PathTooLong { .. })
        ));
        assert_eq!(
            RelPath::parse("./a//b/", &l).map(|p| p.as_string()).ok(),
            Some("a/b".to_owned())
        );
        assert!(RelPath::parse("", &l).map(|p| p.is_base()).unwrap_or(false));
    }

    #[test]
    fn validate_names_the_key() {
        let limits = SandboxLimits {
            max_depth: 0,
            ..SandboxLimits::default()
        };
        let err = limits.validate().err().map(|e| e.key);
        assert_eq!(err, Some("max_depth"));
        assert!(SandboxLimits::default().validate().is_ok());
    }
}
