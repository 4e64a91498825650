//! Hardened shallow clone and verification of a project's repository.
//!
//! User-supplied repository locations and branch names are validated before
//! git runs ([`CloneSource::parse`]); only `https://` URLs without userinfo
//! are accepted, plus existing absolute local repositories when the operator
//! enables them ([`GitOptions::allow_local_repositories`], dev and tests),
//! and then only under the configured roots and outside the runtime's own
//! directories ([`GitOptions::local_repository_roots`],
//! [`GitOptions::local_repository_excluded`]).
//!
//! Before git connects anywhere the host is resolved once and checked by
//! [`crate::egress`] (no loopback, private, link-local, unique-local,
//! multicast or metadata address unless the operator allowlisted the host),
//! and git is pinned to the accepted address (`http.curloptResolve`) with
//! redirects off, so neither DNS rebinding nor a redirect moves it. Every
//! refused, unresolvable, unreachable or silent host is the same
//! [`Error::Unreachable`] to the user, so failures are no port-scan oracle.
//! A clone is capped in bytes (watched while git fetches) and in files and
//! bytes of the tree (counted before anything is checked out); exceeding a
//! cap is [`Error::TooLarge`] and leaves nothing behind.
//!
//! Every git invocation (clone, rev-parse, ls-files, config) is built by one
//! function, [`Git::command`]: cleared environment, minimal `PATH`, an empty
//! temporary `HOME`, no system or global config, no terminal prompts, hooks
//! and fsmonitor disabled, pager/askpass/credential helpers neutralised,
//! `file`/`ext`/`ssh` transports refused (file only when local repositories
//! are allowed), stdin closed, a wall-clock timeout with the child killed. A
//! repository whose `.git/config` sets hooks, fsmonitor, a pager or
//! `core.sshCommand` therefore runs none of them.
//!
//! Credentials come from a [`CredentialStore`], are held in a [`Secret`] that
//! never prints, and reach git only through `GIT_CONFIG_*` environment
//! variables (an `http.<origin>.extraHeader`), never argv or the URL. Error
//! messages never contain the user input verbatim nor credentials; git's
//! stderr is passed through `zopu_secrets::redact` and truncated.
//!
//! Cloning is idempotent (spec section 14 step 2): absent → clone into a
//! temporary sibling directory and rename; the expected repository → verify
//! and reuse; anything else → [`Error::Mismatched`] or [`Error::Corrupt`],
//! which only an explicit [`Git::repair`] fixes.

use std::collections::HashMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

use crate::egress::{Egress, Pin};

/// Longest repository location accepted, in bytes.
const LOCATION_LENGTH_MAX: usize = 2048;
/// Longest branch name accepted, in bytes.
const BRANCH_LENGTH_MAX: usize = 255;
/// Bytes of git's stdout kept in memory (records beyond it are only counted).
const STDOUT_KEPT_BYTES_MAX: usize = 1024 * 1024;
/// Bytes of git's stderr kept for classification and error details.
const STDERR_KEPT_BYTES_MAX: usize = 16 * 1024;
/// Characters of git's stderr quoted in an error.
const DETAIL_CHARS_MAX: usize = 400;
/// Tracked files tried when proving the repository is readable.
const READABLE_PROBES_MAX: usize = 64;
/// Prefix of the temporary clone directories next to the destination.
pub(crate) const TEMPORARY_CLONE_PREFIX: &str = ".zopu-clone-";
/// The only `PATH` git sees.
const MINIMAL_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What was wrong with a repository location. Never includes the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocationProblem {
    /// Empty or only whitespace.
    Empty,
    /// Longer than the accepted maximum.
    TooLong,
    /// Contains a control character.
    ControlCharacter,
    /// Contains whitespace.
    Whitespace,
    /// Starts with `-` (would be read as a git option).
    LeadingDash,
    /// A `<transport>::<address>` remote helper such as `ext::`.
    RemoteHelper,
    /// Plain `http://` (credentials and content would travel unencrypted).
    InsecureHttp,
    /// `file://` URLs are not accepted; local paths need the operator opt-in.
    FileScheme,
    /// `ssh://`, `git+ssh://` and similar.
    Ssh,
    /// scp-like `user@host:path` syntax (ssh).
    ScpLike,
    /// `git://` (unauthenticated, unencrypted).
    GitProtocol,
    /// Another scheme (named when it is a plain word).
    UnsupportedScheme(String),
    /// `user[:password]@` in the URL; credentials come from a connection.
    Userinfo,
    /// The host is missing or not a valid host name.
    InvalidHost,
    /// The port is not a number in range.
    InvalidPort,
    /// The path contains characters git URLs should not carry.
    InvalidPath,
    /// A local path was given but local repositories are disabled.
    LocalNotAllowed,
    /// A local path that is not absolute.
    LocalNotAbsolute,
    /// A local path that does not exist or is not a directory.
    LocalNotADirectory,
    /// A local directory that holds no git repository.
    LocalNotARepository,
    /// A local path with characters outside `[A-Za-z0-9/._+~@-]`.
    LocalUnsupportedCharacters,
    /// A local path outside every configured repository root.
    LocalOutsideRoots,
    /// A local path inside the runtime's own directories (workspaces, data).
    LocalInsideRuntime,
}

impl std::fmt::Display for LocationProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            Self::Empty => "the repository location is empty",
            Self::TooLong => "the repository location is too long",
            Self::ControlCharacter => "the repository location contains a control character",
            Self::Whitespace => "the repository location contains whitespace",
            Self::LeadingDash => "the repository location starts with '-'",
            Self::RemoteHelper => "remote-helper transports such as 'ext::' are not allowed",
            Self::InsecureHttp => "plain http:// is not allowed; use https://",
            Self::FileScheme => "file:// URLs are not allowed; use https://",
            Self::Ssh => "ssh URLs are not supported; use https://",
            Self::ScpLike => "scp-like 'user@host:path' locations are not supported; use https://",
            Self::GitProtocol => "git:// is not allowed; use https://",
            Self::UnsupportedScheme(scheme) => {
                return write!(f, "the '{scheme}' scheme is not supported; use https://");
            }
            Self::Userinfo => {
                "credentials or a user name in the URL are not accepted; \
                 connect the repository with a stored credential instead"
            }
            Self::InvalidHost => "the URL has no valid host",
            Self::InvalidPort => "the URL has an invalid port",
            Self::InvalidPath => "the URL path contains unsupported characters",
            Self::LocalNotAllowed => "local repository paths are disabled; use an https:// URL",
            Self::LocalNotAbsolute => "local repository paths must be absolute",
            Self::LocalNotADirectory => "the local repository path is not an existing directory",
            Self::LocalNotARepository => "the local directory is not a git repository",
            Self::LocalUnsupportedCharacters => {
                "the local repository path has unsupported characters"
            }
            Self::LocalOutsideRoots => {
                "the local repository path is not under a directory the operator allows \
                 (sandbox.local_repository_roots)"
            }
            Self::LocalInsideRuntime => {
                "the local repository path is inside the runtime's own data or workspaces"
            }
        };
        f.write_str(text)
    }
}

/// What was wrong with a branch name. Never includes the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchProblem {
    /// Empty.
    Empty,
    /// Longer than the accepted maximum.
    TooLong,
    /// Starts with `-` (would be read as a git option).
    LeadingDash,
    /// Contains a control character, space or one of `~^:?*[\;` and similar.
    ForbiddenCharacter,
    /// Contains `..`, `@{`, `//`, or a component starting with `.`.
    ForbiddenSequence,
    /// Starts or ends with `/`, ends with `.` or `.lock`, or is `@`.
    ForbiddenShape,
}

impl std::fmt::Display for BranchProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Empty => "the branch name is empty",
            Self::TooLong => "the branch name is too long",
            Self::LeadingDash => "the branch name starts with '-'",
            Self::ForbiddenCharacter => {
                "the branch name contains a character git refs do not allow \
                 (control characters, space, ~ ^ : ? * [ \\ ; and similar)"
            }
            Self::ForbiddenSequence => {
                "the branch name contains '..', '@{', '//' or a component starting with '.'"
            }
            Self::ForbiddenShape => {
                "the branch name starts or ends with '/', ends with '.' or '.lock', or is '@'"
            }
        })
    }
}

/// Errors of the git layer. [`Error::is_retryable`] says whether the same
/// request may succeed later without anyone changing anything.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The repository location was rejected before git ran.
    #[error("invalid repository location: {0}")]
    InvalidLocation(LocationProblem),
    /// The branch name was rejected before git ran.
    #[error("invalid branch name: {0}")]
    InvalidBranch(BranchProblem),
    /// The host did not resolve, is not allowed (a special address range
    /// not in the allowlist), refused or dropped the connection, or failed
    /// on the server side; retry with backoff. One message for all of them,
    /// so the outcome tells nothing about hosts a user may not reach; the
    /// detail is for the operator's log only (`Debug`).
    #[error("the repository host could not be reached")]
    Unreachable {
        /// Redacted, truncated git output or the refusal's reason.
        detail: String,
    },
    /// The clone exceeded a configured cap; nothing was kept.
    #[error("the repository exceeds the clone limit of {limit}")]
    TooLarge {
        /// The cap that was exceeded.
        limit: CloneLimit,
    },
    /// Git did not finish in time and was killed; retry with backoff.
    #[error("git {operation} did not finish within {after:?} and was stopped")]
    TimedOut {
        /// The git subcommand.
        operation: &'static str,
        /// The timeout that expired.
        after: Duration,
    },
    /// The branch does not exist in the repository (permanent).
    #[error("branch '{branch}' was not found in the repository; choose an existing branch")]
    BranchNotFound {
        /// The (validated) branch name.
        branch: String,
    },
    /// The host wants credentials or refused the ones given (permanent).
    #[error(
        "the repository requires authentication or access was denied; check the repository connection"
    )]
    AuthenticationRequired,
    /// The host says there is no such repository (permanent).
    #[error("the repository was not found (or the connection has no access to it)")]
    RepositoryNotFound,
    /// The directory holds a different repository or branch.
    #[error(
        "the existing repository at {path} does not match the request ({reason}); repair to re-clone"
    )]
    Mismatched {
        /// The repository directory.
        path: PathBuf,
        /// What differs (origin or branch), without credentials.
        reason: String,
    },
    /// The directory exists but is not a usable git repository.
    #[error("the repository at {path} is corrupt ({reason}); repair to re-clone")]
    Corrupt {
        /// The repository directory.
        path: PathBuf,
        /// What check failed.
        reason: String,
    },
    /// The clone exists but could not be read (spec section 14 step 3).
    #[error("the repository at {path} is not readable: {reason}")]
    Unreadable {
        /// The repository directory.
        path: PathBuf,
        /// What check failed.
        reason: String,
    },
    /// Git failed in a way not classified above (permanent).
    #[error("git {operation} failed: {detail}")]
    GitFailed {
        /// The git subcommand.
        operation: &'static str,
        /// Redacted, truncated git output.
        detail: String,
    },
    /// The git program could not be started.
    #[error("could not run git: {0}")]
    Spawn(#[source] std::io::Error),
    /// A filesystem operation around git failed.
    #[error("{operation} {path}: {source}")]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// True for failures that may go away on their own (network, timeout,
    /// local I/O); false for ones that need a changed request or a repair.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Unreachable { .. } | Self::TimedOut { .. } | Self::Spawn(_) | Self::Io { .. }
        )
    }

    fn io(operation: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            operation,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A cap on clones ([`GitOptions::clone_bytes_max`],
/// [`GitOptions::clone_files_max`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneLimit {
    /// Bytes fetched, or bytes of the tree's files.
    Bytes(u64),
    /// Files in the tree.
    Files(u64),
}

impl std::fmt::Display for CloneLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bytes(bytes) => write!(f, "{bytes} bytes"),
            Self::Files(files) => write!(f, "{files} files"),
        }
    }
}

/// A string that never prints: `Debug` and `Display` show `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value; call only where it is handed to its consumer.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// HTTP basic credentials for a repository host (for GitHub tokens the user
/// name is `x-access-token`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// User name (not secret).
    pub username: String,
    /// Password or token.
    pub password: Secret,
}

/// Resolves a repository connection id to its credential.
pub trait CredentialStore: Send + Sync {
    /// The credential of `connection_id`, if the store has one.
    fn resolve(&self, connection_id: &str) -> Option<Credential>;
}

/// A [`CredentialStore`] held in memory (tests, dev, or filled at startup
/// from a protected configuration).
#[derive(Debug, Default, Clone)]
pub struct InMemoryCredentialStore {
    credentials: HashMap<String, Credential>,
}

impl InMemoryCredentialStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces the credential of `connection_id`.
    pub fn insert(&mut self, connection_id: impl Into<String>, credential: Credential) {
        self.credentials.insert(connection_id.into(), credential);
    }
}

impl CredentialStore for InMemoryCredentialStore {
    fn resolve(&self, connection_id: &str) -> Option<Credential> {
        self.credentials.get(connection_id).cloned()
    }
}

/// A validated repository location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepositoryLocation {
    /// An `https://host[:port]/path` URL without userinfo.
    Https {
        /// The URL as passed to git.
        url: String,
        /// `https://host[:port]/`, the scope of the credential header.
        origin: String,
        /// The host (lowercase), resolved and checked before git connects.
        host: String,
        /// The port git connects to (443 unless given).
        port: u16,
    },
    /// An existing local repository (only with the operator opt-in).
    Local {
        /// Canonical absolute path.
        path: PathBuf,
        /// The `file://` URL passed to git (so `--depth` is honoured).
        url: String,
    },
}

impl RepositoryLocation {
    /// Validates a user-supplied location. Runs no git; for local paths it
    /// only inspects the filesystem when `allow_local_repositories` is true.
    pub fn parse(input: &str, allow_local_repositories: bool) -> Result<Self, Error> {
        let problem = Error::InvalidLocation;
        if input.trim().is_empty() {
            return Err(problem(LocationProblem::Empty));
        }
        if input.len() > LOCATION_LENGTH_MAX {
            return Err(problem(LocationProblem::TooLong));
        }
        if input.chars().any(char::is_control) {
            return Err(problem(LocationProblem::ControlCharacter));
        }
        if input.starts_with('-') {
            return Err(problem(LocationProblem::LeadingDash));
        }
        if input.chars().any(char::is_whitespace) {
            // Checked after the transport so `ext::sh -c ...` names the real problem.
            if input.contains("::") {
                return Err(problem(LocationProblem::RemoteHelper));
            }
            return Err(problem(LocationProblem::Whitespace));
        }
        if let Some((scheme, rest)) = input.split_once("://") {
            if scheme.contains("::") {
                return Err(problem(LocationProblem::RemoteHelper));
            }
            return match scheme.to_ascii_lowercase().as_str() {
                "https" => parse_https(rest),
                "http" => Err(problem(LocationProblem::InsecureHttp)),
                "file" => Err(problem(LocationProblem::FileScheme)),
                "ssh" | "git+ssh" | "ssh+git" => Err(problem(LocationProblem::Ssh)),
                "git" => Err(problem(LocationProblem::GitProtocol)),
                other => {
                    let shown = if !other.is_empty()
                        && other.len() <= 16
                        && other
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
                    {
                        other.to_owned()
                    } else {
                        "unknown".to_owned()
                    };
                    Err(problem(LocationProblem::UnsupportedScheme(shown)))
                }
            };
        }
        if input.contains("::") {
            return Err(problem(LocationProblem::RemoteHelper));
        }
        if input.starts_with('/') {
            return parse_local(input, allow_local_repositories);
        }
        if let Some(colon) = input.find(':')
            && !input[..colon].contains('/')
        {
            return Err(problem(LocationProblem::ScpLike));
        }
        if allow_local_repositories {
            Err(problem(LocationProblem::LocalNotAbsolute))
        } else {
            Err(problem(LocationProblem::LocalNotAllowed))
        }
    }

    /// The URL handed to git.
    pub fn url(&self) -> &str {
        match self {
            Self::Https { url, .. } | Self::Local { url, .. } => url,
        }
    }

    pub(crate) fn is_local(&self) -> bool {
        matches!(self, Self::Local { .. })
    }
}

fn parse_https(rest: &str) -> Result<RepositoryLocation, Error> {
    let problem = Error::InvalidLocation;
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    if authority.contains('@') {
        return Err(problem(LocationProblem::Userinfo));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && !host.starts_with(['.', '-'])
        && !host.ends_with('-')
        && !host.contains("..")
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
    // A host whose last label is numeric is an address: only the plain
    // dotted quad, never `127.1`, `0x7f.1` or `2130706433`, which resolvers
    // and curl read as other addresses than they appear to be.
    let numeric = host
        .trim_end_matches('.')
        .rsplit('.')
        .next()
        .is_some_and(|last| last.chars().all(|c| c.is_ascii_digit()));
    if !host_ok || (numeric && host.parse::<std::net::Ipv4Addr>().is_err()) {
        return Err(problem(LocationProblem::InvalidHost));
    }
    if let Some(port) = port
        && !(!port.is_empty()
            && port.len() <= 5
            && port.chars().all(|c| c.is_ascii_digit())
            && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p)))
    {
        return Err(problem(LocationProblem::InvalidPort));
    }
    let path_ok = path
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._~-%+=,!$&()*;:".contains(c));
    if !path_ok {
        return Err(problem(LocationProblem::InvalidPath));
    }
    let host = host.to_ascii_lowercase();
    let authority = match port {
        Some(port) => format!("{host}:{port}"),
        None => host.clone(),
    };
    Ok(RepositoryLocation::Https {
        url: format!("https://{authority}{path}"),
        origin: format!("https://{authority}/"),
        host,
        port: port.and_then(|port| port.parse().ok()).unwrap_or(443),
    })
}

fn parse_local(input: &str, allow_local_repositories: bool) -> Result<RepositoryLocation, Error> {
    let problem = Error::InvalidLocation;
    if !allow_local_repositories {
        return Err(problem(LocationProblem::LocalNotAllowed));
    }
    let path = Path::new(input);
    if !path.is_absolute() {
        return Err(problem(LocationProblem::LocalNotAbsolute));
    }
    let canonical = std::fs::canonicalize(path)
        .ok()
        .filter(|p| p.is_dir())
        .ok_or(problem(LocationProblem::LocalNotADirectory))?;
    let text = canonical
        .to_str()
        .filter(|t| {
            t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._+~@-".contains(c))
        })
        .ok_or(problem(LocationProblem::LocalUnsupportedCharacters))?
        .to_owned();
    let is_work_tree = canonical.join(".git").exists();
    let is_bare = canonical.join("HEAD").is_file() && canonical.join("objects").is_dir();
    if !is_work_tree && !is_bare {
        return Err(problem(LocationProblem::LocalNotARepository));
    }
    Ok(RepositoryLocation::Local {
        path: canonical,
        url: format!("file://{text}"),
    })
}

/// A branch name validated against git's ref rules (and stricter: no
/// leading `-`, no shell metacharacters).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BranchName(String);

impl BranchName {
    /// Validates `name` (`git check-ref-format --branch` rules, stricter).
    pub fn parse(name: &str) -> Result<Self, Error> {
        let problem = Error::InvalidBranch;
        if name.is_empty() {
            return Err(problem(BranchProblem::Empty));
        }
        if name.len() > BRANCH_LENGTH_MAX {
            return Err(problem(BranchProblem::TooLong));
        }
        if name.starts_with('-') {
            return Err(problem(BranchProblem::LeadingDash));
        }
        const FORBIDDEN: &str = " ~^:?*[\\;&|<>$`'\"!#(){}";
        if name
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || FORBIDDEN.contains(c) || c == '\u{7f}')
        {
            return Err(problem(BranchProblem::ForbiddenCharacter));
        }
        if name.contains("..")
            || name.contains("@{")
            || name.contains("//")
            || name.split('/').any(|component| component.starts_with('.'))
        {
            return Err(problem(BranchProblem::ForbiddenSequence));
        }
        if name.starts_with('/')
            || name.ends_with('/')
            || name.ends_with('.')
            || name.ends_with(".lock")
            || name
                .split('/')
                .any(|component| component.ends_with(".lock"))
            || name == "@"
        {
            return Err(problem(BranchProblem::ForbiddenShape));
        }
        Ok(Self(name.to_owned()))
    }

    /// The branch name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for BranchName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated clone request: where from, which branch, with what credential.
#[derive(Debug, Clone)]
pub struct CloneSource {
    /// The repository location.
    pub location: RepositoryLocation,
    /// The branch to clone.
    pub branch: BranchName,
    /// Credential for an https host (ignored for local repositories).
    pub credential: Option<Credential>,
}

impl CloneSource {
    /// Validates user input; runs no git and creates nothing.
    pub fn parse(
        location: &str,
        branch: &str,
        credential: Option<Credential>,
        options: &GitOptions,
    ) -> Result<Self, Error> {
        let location = RepositoryLocation::parse(location, options.allow_local_repositories)?;
        options.check_location(&location)?;
        Ok(Self {
            location,
            branch: BranchName::parse(branch)?,
            credential,
        })
    }
}

/// Default of [`GitOptions::clone_bytes_max`]: 1 GiB.
pub const CLONE_BYTES_MAX_DEFAULT: u64 = 1024 * 1024 * 1024;
/// Default of [`GitOptions::clone_files_max`].
pub const CLONE_FILES_MAX_DEFAULT: u64 = 100_000;
/// How often the size of a clone in progress is measured.
const CLONE_WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// How git is run. Filled from the sandbox policy by the caller.
#[derive(Debug, Clone)]
pub struct GitOptions {
    /// Accept existing absolute local repositories (dev and tests only).
    pub allow_local_repositories: bool,
    /// Directories local repositories must be inside (at least one is
    /// needed when local repositories are allowed).
    pub local_repository_roots: Vec<PathBuf>,
    /// Directories no local repository may be inside, even under a root:
    /// the runtime's data directory and workspaces (other projects' clones).
    pub local_repository_excluded: Vec<PathBuf>,
    /// Which hosts a clone may connect to (public addresses and the
    /// allowlist).
    pub egress: Egress,
    /// Most bytes a clone may fetch, and most bytes of its tree's files.
    pub clone_bytes_max: u64,
    /// Most files in a clone's tree.
    pub clone_files_max: u64,
    /// Wall-clock limit for a clone.
    pub clone_timeout: Duration,
    /// Wall-clock limit for every other git command.
    pub command_timeout: Duration,
    /// The git program, looked up in the minimal `PATH` when relative.
    pub program: PathBuf,
}

impl Default for GitOptions {
    fn default() -> Self {
        Self {
            allow_local_repositories: false,
            local_repository_roots: Vec::new(),
            local_repository_excluded: Vec::new(),
            egress: Egress::default(),
            clone_bytes_max: CLONE_BYTES_MAX_DEFAULT,
            clone_files_max: CLONE_FILES_MAX_DEFAULT,
            clone_timeout: Duration::from_secs(300),
            command_timeout: Duration::from_secs(30),
            program: PathBuf::from("git"),
        }
    }
}

impl GitOptions {
    /// Whether `location` may be cloned with these options: a local path
    /// only when local repositories are allowed, inside one of the roots
    /// and outside the excluded directories (all compared canonically).
    pub fn check_location(&self, location: &RepositoryLocation) -> Result<(), Error> {
        let RepositoryLocation::Local { path, .. } = location else {
            return Ok(());
        };
        let refused = |problem| Err(Error::InvalidLocation(problem));
        if !self.allow_local_repositories {
            return refused(LocationProblem::LocalNotAllowed);
        }
        // The location was canonicalized when parsed; canonicalize it again
        // so a parsed value built by hand cannot carry `..` or a link.
        let Ok(path) = std::fs::canonicalize(path) else {
            return refused(LocationProblem::LocalNotADirectory);
        };
        let inside = |directories: &[PathBuf]| {
            directories.iter().any(|directory| {
                std::fs::canonicalize(directory).is_ok_and(|directory| path.starts_with(directory))
            })
        };
        if inside(&self.local_repository_excluded) {
            return refused(LocationProblem::LocalInsideRuntime);
        }
        if !inside(&self.local_repository_roots) {
            return refused(LocationProblem::LocalOutsideRoots);
        }
        Ok(())
    }
}

/// A verified clone (spec section 14 step 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedRepository {
    /// The repository directory.
    pub path: PathBuf,
    /// `git rev-parse HEAD`.
    pub commit: String,
    /// Number of tracked files (`git ls-files`).
    pub tracked_files: usize,
}

/// Result of [`Git::ensure_clone`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneOutcome {
    /// True when an existing matching clone was reused.
    pub reused: bool,
    /// The verification of the clone.
    pub repository: VerifiedRepository,
}

/// Output of one git invocation.
#[derive(Debug)]
pub(crate) struct GitOutput {
    pub(crate) status: ExitStatus,
    /// The first [`STDOUT_KEPT_BYTES_MAX`] bytes of stdout.
    pub(crate) stdout: Vec<u8>,
    /// NUL bytes seen on stdout (records of `-z` output), all of it.
    pub(crate) stdout_nul_count: usize,
    /// The first [`STDERR_KEPT_BYTES_MAX`] bytes of stderr, lossily decoded.
    pub(crate) stderr: String,
}

/// An empty, private, per-invocation `HOME`, removed on drop.
#[derive(Debug)]
pub(crate) struct EmptyHome(PathBuf);

impl EmptyHome {
    pub(crate) fn create() -> Result<Self, Error> {
        let path = std::env::temp_dir().join(format!("zopu-git-home-{}", uuid::Uuid::now_v7()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| Error::io("create git home", &path, e))?;
        Ok(Self(path))
    }
}

impl Drop for EmptyHome {
    fn drop(&mut self) {
        // Best effort: an empty directory in the temp dir is harmless.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where a command runs: nowhere in particular (clone) or in a repository
/// whose git directory is given explicitly, so no discovery walks upwards.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target<'a> {
    None,
    Repository(&'a Path),
}

/// Runs hardened git. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Git {
    options: GitOptions,
}

impl Git {
    /// A runner with the given options.
    pub fn new(options: GitOptions) -> Self {
        Self { options }
    }

    /// The options in use.
    pub fn options(&self) -> &GitOptions {
        &self.options
    }

    /// THE git command builder: every invocation of this module goes through
    /// it. `allow_file` enables the `file` transport (local clones only).
    pub(crate) fn command(
        &self,
        home: &EmptyHome,
        target: Target<'_>,
        allow_file: bool,
    ) -> Command {
        let mut command = Command::new(&self.options.program);
        command
            .env_clear()
            .env("PATH", MINIMAL_PATH)
            .env("HOME", &home.0)
            .env("XDG_CONFIG_HOME", &home.0)
            .env("LC_ALL", "C")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_ASKPASS", "")
            .env("SSH_ASKPASS", "")
            .env("GIT_PAGER", "cat")
            .env("PAGER", "cat")
            .env("GIT_EDITOR", "true")
            .env("GIT_NO_REPLACE_OBJECTS", "1")
            .env("GIT_OPTIONAL_LOCKS", "0")
            .env("GIT_PROTOCOL_FROM_USER", "0")
            .env(
                "GIT_ALLOW_PROTOCOL",
                if allow_file { "https:file" } else { "https" },
            )
            .env("GIT_SSH_COMMAND", "false");
        if let Target::Repository(path) = target {
            command
                .env("GIT_DIR", path.join(".git"))
                .env("GIT_WORK_TREE", path)
                .env(
                    "GIT_CEILING_DIRECTORIES",
                    path.parent().unwrap_or(Path::new("/")),
                )
                .current_dir(path);
        } else {
            command.current_dir(&home.0);
        }
        let file_policy = if allow_file { "always" } else { "never" };
        let settings: [(&str, &str); 23] = [
            ("core.hooksPath", "/dev/null"),
            ("core.fsmonitor", "false"),
            ("core.untrackedCache", "false"),
            ("core.pager", "cat"),
            ("core.editor", "true"),
            ("core.askPass", ""),
            ("core.sshCommand", "false"),
            ("core.gitProxy", ""),
            ("core.symlinks", "true"),
            ("credential.helper", ""),
            ("protocol.allow", "never"),
            ("protocol.https.allow", "always"),
            ("protocol.file.allow", file_policy),
            ("protocol.ext.allow", "never"),
            ("protocol.ssh.allow", "never"),
            ("protocol.git.allow", "never"),
            ("submodule.recurse", "false"),
            ("init.templateDir", ""),
            ("advice.detachedHead", "false"),
            // A redirect could lead to a host nobody checked.
            ("http.followRedirects", "false"),
            ("http.proxy", ""),
            // One pack file, whose growth the clone watch measures.
            ("fetch.unpackLimit", "1"),
            ("transfer.unpackLimit", "1"),
        ];
        command.arg("--no-pager");
        for (key, value) in settings {
            command.arg("-c").arg(format!("{key}={value}"));
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a stop also stops the helpers git
            // starts (remote-https, index-pack).
            .process_group(0)
            .kill_on_drop(true);
        command
    }

    /// Pins the command's connections for `pin`'s host to its address
    /// (before the subcommand: it adds a `-c`).
    pub(crate) fn pinned(command: &mut Command, pin: Option<&Pin>) {
        if let Some(pin) = pin {
            command
                .arg("-c")
                .arg(format!("http.curloptResolve={}", pin.curl_resolve()));
        }
    }

    /// Runs a prepared command with a timeout, killing it when it expires.
    pub(crate) async fn run(
        &self,
        command: Command,
        operation: &'static str,
        timeout: Duration,
    ) -> Result<GitOutput, Error> {
        self.run_watched(command, operation, timeout, None).await
    }

    /// [`Git::run`] that also stops git (with [`Error::TooLarge`]) as soon
    /// as `watch` (a directory git writes into) holds more than
    /// [`GitOptions::clone_bytes_max`] bytes.
    pub(crate) async fn run_watched(
        &self,
        mut command: Command,
        operation: &'static str,
        timeout: Duration,
        watch: Option<&Path>,
    ) -> Result<GitOutput, Error> {
        let mut child = command.spawn().map_err(Error::Spawn)?;
        let group = child.id();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let collect = async {
            let (stdout, stderr) = tokio::join!(
                read_capped(stdout, STDOUT_KEPT_BYTES_MAX),
                read_capped(stderr, STDERR_KEPT_BYTES_MAX),
            );
            let status = child.wait().await;
            (stdout, stderr, status)
        };
        let bytes_max = self.options.clone_bytes_max;
        let outgrown = async {
            let Some(directory) = watch else {
                return std::future::pending().await;
            };
            let mut interval = tokio::time::interval(CLONE_WATCH_INTERVAL);
            loop {
                interval.tick().await;
                let directory = directory.to_path_buf();
                let size =
                    tokio::task::spawn_blocking(move || directory_bytes(&directory, bytes_max))
                        .await
                        .unwrap_or(0);
                if size > bytes_max {
                    return;
                }
            }
        };
        let stopped = tokio::select! {
            result = tokio::time::timeout(timeout, collect) => match result {
                Ok(((stdout, stdout_nul_count), (stderr, _), status)) => {
                    return Ok(GitOutput {
                        status: status.map_err(Error::Spawn)?,
                        stdout,
                        stdout_nul_count,
                        stderr: String::from_utf8_lossy(&stderr).into_owned(),
                    });
                }
                Err(_) => Error::TimedOut {
                    operation,
                    after: timeout,
                },
            },
            () = outgrown => Error::TooLarge {
                limit: CloneLimit::Bytes(bytes_max),
            },
        };
        kill_group(group);
        Err(stopped)
    }

    /// Counts the files and bytes of the tree of `revision` (`HEAD` or a
    /// validated object id) in `repository` without checking anything out,
    /// stopping git at the first cap exceeded.
    pub(crate) async fn check_tree_size(
        &self,
        repository: &Path,
        revision: &str,
    ) -> Result<(), Error> {
        let home = EmptyHome::create()?;
        let mut command = self.command(&home, Target::Repository(repository), false);
        command
            .args([
                "ls-tree",
                "-r",
                "-z",
                "-l",
                "--full-tree",
                "--end-of-options",
            ])
            .arg(revision);
        let mut child = command.spawn().map_err(Error::Spawn)?;
        let group = child.id();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let (files_max, bytes_max) = (self.options.clone_files_max, self.options.clone_bytes_max);
        let count = async {
            let mut tally = TreeTally::default();
            if let Some(mut stdout) = stdout {
                let mut buffer = [0u8; 8192];
                loop {
                    match stdout.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => tally.feed(&buffer[..n]),
                    }
                    if tally.files > files_max || tally.bytes > bytes_max {
                        return Ok(tally);
                    }
                }
            }
            let (stderr, _) = read_capped(stderr, STDERR_KEPT_BYTES_MAX).await;
            match child.wait().await {
                Ok(status) if status.success() => Ok(tally),
                Ok(_) => Err(Error::Corrupt {
                    path: repository.to_path_buf(),
                    reason: format!(
                        "git ls-tree HEAD failed: {}",
                        detail(&String::from_utf8_lossy(&stderr))
                    ),
                }),
                Err(error) => Err(Error::Spawn(error)),
            }
        };
        let tally = match tokio::time::timeout(self.options.command_timeout, count).await {
            Ok(tally) => tally,
            Err(_) => Err(Error::TimedOut {
                operation: "ls-tree",
                after: self.options.command_timeout,
            }),
        };
        kill_group(group);
        let tally = tally?;
        if tally.files > files_max {
            return Err(Error::TooLarge {
                limit: CloneLimit::Files(files_max),
            });
        }
        if tally.bytes > bytes_max {
            return Err(Error::TooLarge {
                limit: CloneLimit::Bytes(bytes_max),
            });
        }
        Ok(())
    }

    /// Checks `repository`'s tree against the caps, then checks `HEAD` out
    /// into its (empty) work tree.
    pub(crate) async fn checkout_within_limits(&self, repository: &Path) -> Result<(), Error> {
        self.check_tree_size(repository, "HEAD").await?;
        let output = self
            .run_in(repository, "reset", &["reset", "--quiet", "--hard", "HEAD"])
            .await?;
        if output.status.success() {
            Ok(())
        } else {
            Err(Error::GitFailed {
                operation: "reset",
                detail: detail(&output.stderr),
            })
        }
    }

    /// Runs `args` in `repository` and returns its output if git succeeded.
    async fn run_in(
        &self,
        repository: &Path,
        operation: &'static str,
        args: &[&str],
    ) -> Result<GitOutput, Error> {
        let home = EmptyHome::create()?;
        let mut command = self.command(&home, Target::Repository(repository), false);
        command.args(args);
        self.run(command, operation, self.options.command_timeout)
            .await
    }

    /// Idempotent clone (spec section 14 step 2): clones when `destination`
    /// is absent, verifies and reuses a matching clone, and fails with
    /// [`Error::Mismatched`] or [`Error::Corrupt`] otherwise.
    pub async fn ensure_clone(
        &self,
        source: &CloneSource,
        destination: &Path,
    ) -> Result<CloneOutcome, Error> {
        self.check_source(source)?;
        match std::fs::symlink_metadata(destination) {
            Ok(_) => {
                self.check_existing(source, destination).await?;
                let repository = self.verify(destination).await?;
                Ok(CloneOutcome {
                    reused: true,
                    repository,
                })
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                self.clone_fresh(source, destination).await?;
                let repository = self.verify(destination).await?;
                Ok(CloneOutcome {
                    reused: false,
                    repository,
                })
            }
            Err(error) => Err(Error::io("inspect", destination, error)),
        }
    }

    /// Explicit repair for a retry after `Mismatched`/`Corrupt`: removes
    /// `destination` and clones again.
    pub async fn repair(
        &self,
        source: &CloneSource,
        destination: &Path,
    ) -> Result<CloneOutcome, Error> {
        self.check_source(source)?;
        remove_path(destination)?;
        self.ensure_clone(source, destination).await
    }

    /// Validates, then clones. Convenience over [`CloneSource::parse`] and
    /// [`Git::ensure_clone`]; nothing is created when validation fails.
    pub async fn ensure_clone_from(
        &self,
        location: &str,
        branch: &str,
        credential: Option<Credential>,
        destination: &Path,
    ) -> Result<CloneOutcome, Error> {
        let source = CloneSource::parse(location, branch, credential, &self.options)?;
        self.ensure_clone(&source, destination).await
    }

    /// Spec section 14 step 3: the path exists, `git rev-parse HEAD`
    /// succeeds, the root can be listed and a tracked file can be read.
    pub async fn verify(&self, repository: &Path) -> Result<VerifiedRepository, Error> {
        let unreadable = |reason: &str| Error::Unreadable {
            path: repository.to_path_buf(),
            reason: reason.to_owned(),
        };
        let corrupt = |reason: String| Error::Corrupt {
            path: repository.to_path_buf(),
            reason,
        };
        let metadata = std::fs::symlink_metadata(repository)
            .map_err(|_| unreadable("the repository path does not exist"))?;
        if !metadata.is_dir() {
            return Err(corrupt("the repository path is not a directory".to_owned()));
        }
        if !repository.join(".git").is_dir() {
            return Err(corrupt("the .git directory is missing".to_owned()));
        }
        let head = self
            .run_in(
                repository,
                "rev-parse",
                &["rev-parse", "--verify", "HEAD^{commit}"],
            )
            .await?;
        let commit = String::from_utf8_lossy(&head.stdout).trim().to_owned();
        if !head.status.success() || !is_object_id(&commit) {
            return Err(corrupt(format!(
                "git rev-parse HEAD failed: {}",
                detail(&head.stderr)
            )));
        }
        let mut entries = std::fs::read_dir(repository)
            .map_err(|_| unreadable("the repository root cannot be listed"))?;
        if entries.next().is_none() {
            return Err(unreadable("the repository root is empty"));
        }
        let files = self
            .run_in(
                repository,
                "ls-files",
                &["ls-files", "-z", "--cached", "--full-name"],
            )
            .await?;
        if !files.status.success() {
            return Err(corrupt(format!(
                "git ls-files failed: {}",
                detail(&files.stderr)
            )));
        }
        let tracked_files = files.stdout_nul_count;
        if tracked_files == 0 {
            return Err(unreadable("the branch has no tracked files"));
        }
        let readable = files
            .stdout
            .split(|&b| b == 0)
            .filter(|name| !name.is_empty())
            .take(READABLE_PROBES_MAX)
            .any(|name| is_readable_regular_file(repository, name));
        if !readable {
            return Err(unreadable("no tracked file could be read"));
        }
        Ok(VerifiedRepository {
            path: repository.to_path_buf(),
            commit,
            tracked_files,
        })
    }

    /// `git rev-parse HEAD` of `repository`, or `None` when it fails.
    pub async fn head_commit(&self, repository: &Path) -> Result<Option<String>, Error> {
        let head = self
            .run_in(
                repository,
                "rev-parse",
                &["rev-parse", "--verify", "HEAD^{commit}"],
            )
            .await?;
        let commit = String::from_utf8_lossy(&head.stdout).trim().to_owned();
        Ok((head.status.success() && is_object_id(&commit)).then_some(commit))
    }

    pub(crate) fn check_source(&self, source: &CloneSource) -> Result<(), Error> {
        self.options.check_location(&source.location)
    }

    /// Resolves an https source's host and checks it against the egress
    /// policy: the address git must be pinned to, or (refused, unresolved)
    /// the generic [`Error::Unreachable`]. `None` for local sources. Runs
    /// before any git command that connects.
    pub(crate) async fn pin(&self, source: &CloneSource) -> Result<Option<Pin>, Error> {
        let RepositoryLocation::Https { host, port, .. } = &source.location else {
            return Ok(None);
        };
        match self.options.egress.pin(host, *port).await {
            Ok(pin) => Ok(Some(pin)),
            Err(refusal) => {
                tracing::info!(%refusal, "repository host refused before connecting");
                Err(Error::Unreachable {
                    detail: refusal.to_string(),
                })
            }
        }
    }

    /// Is the existing directory the clone `source` describes?
    async fn check_existing(&self, source: &CloneSource, destination: &Path) -> Result<(), Error> {
        let corrupt = |reason: &str| Error::Corrupt {
            path: destination.to_path_buf(),
            reason: reason.to_owned(),
        };
        let metadata = std::fs::symlink_metadata(destination)
            .map_err(|e| Error::io("inspect", destination, e))?;
        if !metadata.is_dir() {
            return Err(corrupt("the repository path is not a directory"));
        }
        let git_dir = std::fs::symlink_metadata(destination.join(".git"));
        if !git_dir.is_ok_and(|m| m.is_dir()) {
            return Err(corrupt("the .git directory is missing"));
        }
        let origin = self
            .run_in(
                destination,
                "config",
                &["config", "--local", "--get", "remote.origin.url"],
            )
            .await?;
        if !origin.status.success() {
            return Err(corrupt("the repository has no readable origin"));
        }
        if String::from_utf8_lossy(&origin.stdout).trim() != source.location.url() {
            return Err(Error::Mismatched {
                path: destination.to_path_buf(),
                reason: "it was cloned from a different origin".to_owned(),
            });
        }
        let branch = self
            .run_in(
                destination,
                "symbolic-ref",
                &["symbolic-ref", "--quiet", "--short", "HEAD"],
            )
            .await?;
        if !branch.status.success() {
            return Err(corrupt("HEAD is not on a branch"));
        }
        if String::from_utf8_lossy(&branch.stdout).trim() != source.branch.as_str() {
            return Err(Error::Mismatched {
                path: destination.to_path_buf(),
                reason: "a different branch is checked out".to_owned(),
            });
        }
        Ok(())
    }

    /// Clones into a temporary sibling of `destination`, then renames it.
    async fn clone_fresh(&self, source: &CloneSource, destination: &Path) -> Result<(), Error> {
        let parent = destination
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .ok_or_else(|| {
                Error::io(
                    "clone into",
                    destination,
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, "no parent directory"),
                )
            })?;
        remove_stale_temporaries(parent)?;
        let temporary = parent.join(format!("{TEMPORARY_CLONE_PREFIX}{}", uuid::Uuid::now_v7()));
        let result = self.clone_into(source, &temporary).await;
        let result = result.and_then(|()| {
            std::fs::rename(&temporary, destination)
                .map_err(|e| Error::io("move clone to", destination, e))
        });
        if result.is_err() {
            // Best effort; stale temporaries are also removed by the next attempt.
            let _ = std::fs::remove_dir_all(&temporary);
        }
        result
    }

    pub(crate) async fn clone_into(
        &self,
        source: &CloneSource,
        directory: &Path,
    ) -> Result<(), Error> {
        let pin = self.pin(source).await?;
        let home = EmptyHome::create()?;
        let mut command = self.command(&home, Target::None, source.location.is_local());
        Self::pinned(&mut command, pin.as_ref());
        with_credential(&mut command, source);
        // Absolute, so it can neither look like an option nor resolve
        // against the temporary HOME git runs in.
        let directory =
            std::path::absolute(directory).map_err(|e| Error::io("resolve", directory, e))?;
        command
            .args([
                "clone",
                "--quiet",
                "--no-checkout",
                "--depth",
                "1",
                "--single-branch",
                "--no-tags",
                "--no-recurse-submodules",
                "--template=",
                "--branch",
            ])
            .arg(source.branch.as_str())
            .arg("--end-of-options")
            .arg(source.location.url())
            .arg(&directory);
        let output = self
            .run_watched(
                command,
                "clone",
                self.options.clone_timeout,
                Some(&directory),
            )
            .await?;
        if !output.status.success() {
            return Err(classify_clone_failure(&output.stderr, &source.branch));
        }
        self.checkout_within_limits(&directory).await
    }
}

/// Hands `source`'s credential (https only) to git through `GIT_CONFIG_*`
/// environment variables: never argv, never the URL.
pub(crate) fn with_credential(command: &mut Command, source: &CloneSource) {
    if let (Some(credential), RepositoryLocation::Https { origin, .. }) =
        (&source.credential, &source.location)
    {
        let token = base64_encode(
            format!("{}:{}", credential.username, credential.password.expose()).as_bytes(),
        );
        command
            .env("GIT_CONFIG_COUNT", "1")
            .env("GIT_CONFIG_KEY_0", format!("http.{origin}.extraHeader"))
            .env(
                "GIT_CONFIG_VALUE_0",
                format!("Authorization: Basic {token}"),
            );
    }
}

/// Maps git's (C-locale) clone stderr to a typed error.
pub(crate) fn classify_clone_failure(stderr: &str, branch: &BranchName) -> Error {
    let lower = stderr.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| lower.contains(n));
    if has(&["remote branch", "not found in upstream"]) && lower.contains("not found") {
        return Error::BranchNotFound {
            branch: branch.as_str().to_owned(),
        };
    }
    if has(&[
        "authentication failed",
        "could not read username",
        "could not read password",
        "terminal prompts disabled",
        "the requested url returned error: 401",
        "the requested url returned error: 403",
        "permission denied",
    ]) {
        return Error::AuthenticationRequired;
    }
    if has(&[
        "repository not found",
        "the requested url returned error: 404",
        "does not appear to be a git repository",
        "does not exist",
    ]) {
        return Error::RepositoryNotFound;
    }
    if has(&[
        "could not resolve host",
        "failed to connect",
        "couldn't connect",
        "connection refused",
        "connection timed out",
        "connection reset",
        "operation timed out",
        "network is unreachable",
        "no route to host",
        "temporary failure in name resolution",
        "early eof",
        "rpc failed",
        "the remote end hung up",
        "ssl",
        "tls",
        "gnutls",
        "the requested url returned error: 5",
        "the requested url returned error: 429",
    ]) {
        return Error::Unreachable {
            detail: detail(stderr),
        };
    }
    Error::GitFailed {
        operation: "clone",
        detail: detail(stderr),
    }
}

/// Stops a git process group (ESRCH, already gone, is the normal case).
fn kill_group(group: Option<u32>) {
    if let Some(pid) = group
        .and_then(|id| i32::try_from(id).ok())
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// Bytes of the regular files under `directory` (not following links),
/// counting stops once past `stop_after`.
fn directory_bytes(directory: &Path, stop_after: u64) -> u64 {
    let mut total = 0u64;
    let mut pending = vec![directory.to_path_buf()];
    while let Some(current) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&current) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            if metadata.is_dir() {
                pending.push(entry.path());
            } else if metadata.is_file() {
                total = total.saturating_add(metadata.len());
                if total > stop_after {
                    return total;
                }
            }
        }
    }
    total
}

/// Files and bytes of `git ls-tree -r -z -l` output, fed in chunks:
/// records are `<mode> <type> <object> <size>\t<path>\0`.
#[derive(Debug, Default)]
struct TreeTally {
    files: u64,
    bytes: u64,
    /// The current record's text before the tab (bounded).
    header: Vec<u8>,
    in_path: bool,
}

impl TreeTally {
    /// Longest record header kept (mode, type, object id and size fit).
    const HEADER_MAX: usize = 160;

    fn feed(&mut self, chunk: &[u8]) {
        for &byte in chunk {
            match byte {
                0 => {
                    self.files += 1;
                    self.in_path = false;
                    self.header.clear();
                }
                _ if self.in_path => {}
                b'\t' => {
                    self.in_path = true;
                    // Submodule entries have `-` as size: they add no bytes.
                    let size = self
                        .header
                        .rsplit(|b| *b == b' ')
                        .next()
                        .and_then(|size| std::str::from_utf8(size).ok())
                        .and_then(|size| size.parse::<u64>().ok())
                        .unwrap_or(0);
                    self.bytes = self.bytes.saturating_add(size);
                }
                _ if self.header.len() < Self::HEADER_MAX => self.header.push(byte),
                _ => {}
            }
        }
    }
}

/// Git output fit for an error: redacted, one line, truncated.
pub(crate) fn detail(stderr: &str) -> String {
    let redacted = zopu_secrets::redact(stderr);
    let mut line: String = redacted
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    if line.chars().count() > DETAIL_CHARS_MAX {
        line = line.chars().take(DETAIL_CHARS_MAX).collect::<String>() + "…";
    }
    if line.is_empty() {
        "no output".to_owned()
    } else {
        line
    }
}

pub(crate) fn is_object_id(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.chars().all(|c| c.is_ascii_hexdigit())
}

/// A tracked path that is a regular file (not a symlink) inside the
/// repository and yields its first byte (or is empty).
fn is_readable_regular_file(repository: &Path, name: &[u8]) -> bool {
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    let relative = Path::new(std::ffi::OsStr::from_bytes(name));
    if relative.is_absolute()
        || relative
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return false;
    }
    let path = repository.join(relative);
    // Every parent must be a real directory so no symlink leads outside.
    let mut current = repository.to_path_buf();
    for component in relative.parent().into_iter().flat_map(Path::components) {
        current.push(component);
        if !std::fs::symlink_metadata(&current).is_ok_and(|m| m.is_dir()) {
            return false;
        }
    }
    if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
        return false;
    }
    let Ok(mut file) = open_no_follow(&path) else {
        return false;
    };
    let mut first = [0u8; 1];
    file.read(&mut first).is_ok()
}

/// Opens a file for reading without following a final symlink and without
/// blocking on a FIFO.
pub(crate) fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// Reads a pipe to its end, keeping at most `kept_max` bytes and counting
/// NUL bytes over all of it.
async fn read_capped<R: tokio::io::AsyncRead + Unpin>(
    reader: Option<R>,
    kept_max: usize,
) -> (Vec<u8>, usize) {
    let mut kept = Vec::new();
    let mut nul_count = 0usize;
    let Some(mut reader) = reader else {
        return (kept, nul_count);
    };
    let mut buffer = [0u8; 8192];
    loop {
        match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let chunk = &buffer[..n];
                nul_count += chunk.iter().filter(|&&b| b == 0).count();
                let room = kept_max.saturating_sub(kept.len());
                kept.extend_from_slice(&chunk[..room.min(n)]);
            }
        }
    }
    (kept, nul_count)
}

pub(crate) fn remove_path(path: &Path) -> Result<(), Error> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.is_dir() => {
            std::fs::remove_dir_all(path).map_err(|e| Error::io("remove", path, e))
        }
        Ok(_) => std::fs::remove_file(path).map_err(|e| Error::io("remove", path, e)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(Error::io("inspect", path, error)),
    }
}

/// Removes temporary clones left by an interrupted earlier attempt.
pub(crate) fn remove_stale_temporaries(parent: &Path) -> Result<(), Error> {
    let entries = std::fs::read_dir(parent).map_err(|e| Error::io("list", parent, e))?;
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with(TEMPORARY_CLONE_PREFIX))
        {
            remove_path(&entry.path())?;
        }
    }
    Ok(())
}

/// Standard base64 with padding (for the basic-auth header).
fn base64_encode(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn location_problem(input: &str, allow_local: bool) -> LocationProblem {
        match RepositoryLocation::parse(input, allow_local) {
            Err(Error::InvalidLocation(problem)) => problem,
            other => panic!("{input:?} was not rejected: {other:?}"),
        }
    }

    #[test]
    fn https_urls_are_accepted_and_normalised() {
        let location =
            RepositoryLocation::parse("https://GitHub.com/owner/repo.git", false).unwrap();
        assert_eq!(location.url(), "https://github.com/owner/repo.git");
        let RepositoryLocation::Https { origin, .. } = location else {
            panic!("not https");
        };
        assert_eq!(origin, "https://github.com/");
        assert!(RepositoryLocation::parse("https://127.0.0.1:1/x.git", false).is_ok());
    }

    #[test]
    fn hostile_locations_are_rejected_with_the_reason() {
        use LocationProblem as P;
        let cases = [
            ("ext::sh -c touch% /tmp/pwned", P::RemoteHelper),
            ("ext::sh", P::RemoteHelper),
            ("fd::17", P::RemoteHelper),
            ("file:///etc", P::FileScheme),
            ("http://example.com/r.git", P::InsecureHttp),
            ("https://user:pass@example.com/r.git", P::Userinfo),
            ("https://token@example.com/r.git", P::Userinfo),
            ("ssh://-oProxyCommand=x/r", P::Ssh),
            ("git@github.com:owner/repo.git", P::ScpLike),
            ("git://example.com/r.git", P::GitProtocol),
            ("-uhttps://x", P::LeadingDash),
            ("--upload-pack=touch /tmp/x", P::LeadingDash),
            ("https://exa\u{7}mple.com/r", P::ControlCharacter),
            ("https://example.com/r\n", P::ControlCharacter),
            ("https://example.com/a b", P::Whitespace),
            ("https:///r.git", P::InvalidHost),
            ("https://-x.com/r.git", P::InvalidHost),
            ("https://example.com:99999/r.git", P::InvalidPort),
            ("https://127.1/r.git", P::InvalidHost),
            ("https://2130706433/r.git", P::InvalidHost),
            ("https://0x7f.0.0.1/r.git", P::InvalidHost),
            ("https://0177.0.0.1/r.git", P::InvalidHost),
            ("https://10.0.0.1./r.git", P::InvalidHost),
            ("https://example.com/r\\x", P::InvalidPath),
            ("/tmp", P::LocalNotAllowed),
            ("relative/path", P::LocalNotAllowed),
            ("", P::Empty),
        ];
        for (input, expected) in cases {
            assert_eq!(location_problem(input, false), expected, "{input:?}");
        }
        assert_eq!(location_problem("relative/path", true), P::LocalNotAbsolute);
        assert_eq!(
            location_problem("/nonexistent/zopu/x", true),
            P::LocalNotADirectory
        );
    }

    #[test]
    fn location_errors_never_echo_credentials() {
        let error = RepositoryLocation::parse("https://alice:hunter2@example.com/r.git", false)
            .unwrap_err();
        let text = format!("{error} {error:?}");
        assert!(
            !text.contains("hunter2") && !text.contains("alice"),
            "{text}"
        );
    }

    #[test]
    fn branches() {
        for ok in ["main", "feature/x-1", "release-2024.1", "v1.2.3", "a@b"] {
            assert!(BranchName::parse(ok).is_ok(), "{ok}");
        }
        use BranchProblem as P;
        let cases = [
            ("--upload-pack=x", P::LeadingDash),
            ("-c", P::LeadingDash),
            ("a;b", P::ForbiddenCharacter),
            ("a b", P::ForbiddenCharacter),
            ("a\u{7}b", P::ForbiddenCharacter),
            ("a~1", P::ForbiddenCharacter),
            ("a:b", P::ForbiddenCharacter),
            ("$(x)", P::ForbiddenCharacter),
            ("a/../b", P::ForbiddenSequence),
            ("..", P::ForbiddenSequence),
            ("a@{1}", P::ForbiddenCharacter),
            ("a//b", P::ForbiddenSequence),
            (".hidden", P::ForbiddenSequence),
            ("a/.b", P::ForbiddenSequence),
            ("a.lock", P::ForbiddenShape),
            ("a.lock/b", P::ForbiddenShape),
            ("a/", P::ForbiddenShape),
            ("a.", P::ForbiddenShape),
            ("@", P::ForbiddenShape),
            ("", P::Empty),
        ];
        for (input, expected) in cases {
            match BranchName::parse(input) {
                Err(Error::InvalidBranch(problem)) => assert_eq!(problem, expected, "{input:?}"),
                other => panic!("{input:?} accepted: {other:?}"),
            }
        }
    }

    #[test]
    fn secret_never_prints() {
        let credential = Credential {
            username: "x-access-token".to_owned(),
            password: Secret::new("hunter2-token"),
        };
        let text = format!("{credential:?} {}", credential.password);
        assert!(!text.contains("hunter2"));
        let mut store = InMemoryCredentialStore::new();
        store.insert("conn-1", credential.clone());
        assert_eq!(store.resolve("conn-1"), Some(credential));
        assert_eq!(store.resolve("conn-2"), None);
        assert!(!format!("{store:?}").contains("hunter2"));
    }

    #[test]
    fn tree_tallies_count_files_and_sizes_across_chunks() {
        let listing = b"100644 blob 3f5e2a9c1b7d4e8f0a6b2c9d1e3f5a7b9c0d2e4f     120\tREADME.md\0\
160000 commit 3f5e2a9c1b7d4e8f0a6b2c9d1e3f5a7b9c0d2e4f       -\tvendor/sub\0\
120000 blob 3f5e2a9c1b7d4e8f0a6b2c9d1e3f5a7b9c0d2e4f       7\tlink with\ttab\0\
100755 blob 3f5e2a9c1b7d4e8f0a6b2c9d1e3f5a7b9c0d2e4f 1048576\tbin/tool\0";
        for split in [1, 3, 50, listing.len()] {
            let mut tally = TreeTally::default();
            for chunk in listing.chunks(split) {
                tally.feed(chunk);
            }
            assert_eq!(
                (tally.files, tally.bytes),
                (4, 120 + 7 + 1_048_576),
                "{split}"
            );
        }
    }

    #[test]
    fn base64() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(b"user:pass"), "dXNlcjpwYXNz");
    }

    #[test]
    fn clone_failures_are_classified() {
        let branch = BranchName::parse("feature").unwrap();
        let error = classify_clone_failure(
            "warning: Could not find remote branch feature to clone.\nfatal: Remote branch feature not found in upstream origin\n",
            &branch,
        );
        assert!(matches!(error, Error::BranchNotFound { ref branch } if branch == "feature"));
        let error = classify_clone_failure(
            "fatal: unable to access 'https://127.0.0.1:1/x.git/': Failed to connect to 127.0.0.1 port 1 after 0 ms: Couldn't connect to server\n",
            &branch,
        );
        assert!(error.is_retryable(), "{error:?}");
        let error = classify_clone_failure(
            "fatal: could not read Username for 'https://github.com': terminal prompts disabled\n",
            &branch,
        );
        assert!(matches!(error, Error::AuthenticationRequired));
        assert!(!error.is_retryable());
        let error = classify_clone_failure(
            "remote: Repository not found.\nfatal: repository 'https://github.com/a/b/' not found\n",
            &branch,
        );
        assert!(matches!(error, Error::RepositoryNotFound));
    }
}
