//! Hardened shallow clone and verification of a project's repository.
//!
//! User-supplied repository locations and branch names are validated before
//! git runs ([`CloneSource::parse`], with the one validation of
//! [`zopu_schema::repository`]); only `https://` URLs without userinfo are
//! accepted, plus existing absolute local repositories when the operator
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
//! Credentials come with the [`CloneSource`] (its caller resolves them), are
//! held in a [`Secret`] that never prints, and reach git only through `GIT_CONFIG_*` environment
//! variables (an `http.<origin>.extraHeader`), never argv or the URL. Error
//! messages never contain the user input verbatim nor credentials; git's
//! stderr is passed through `zopu_secrets::redact` and truncated.
//!
//! Cloning is idempotent (spec section 14 step 2): absent → clone into a
//! temporary sibling directory and rename; the expected repository → verify
//! and reuse; anything else → [`Error::Mismatched`] or [`Error::Corrupt`],
//! which only an explicit [`Git::repair`] fixes.

//!
//! The module's rooms: [`credentials`] (secrets and the basic-auth header
//! handed to git), [`command`] (THE git command builder and the watched
//! runner), [`clone`] (idempotent clone, verification, tree caps),
//! [`failure`] (git's stderr classified into [`Error`]), and [`options`]
//! (what the operator allows).

use std::path::{Path, PathBuf};
use std::time::Duration;

mod clone;
pub(crate) mod command;
mod credentials;
pub(crate) mod failure;
mod options;

pub use clone::{CloneOutcome, VerifiedRepository};
pub(crate) use clone::{
    TEMPORARY_CLONE_PREFIX, is_object_id, open_no_follow, remove_path, remove_stale_temporaries,
};
pub(crate) use command::{EmptyHome, Target};
pub(crate) use credentials::with_credential;
pub use credentials::{Credential, Secret};
pub(crate) use failure::{classify_clone_failure, detail};
pub use options::{CLONE_BYTES_MAX_DEFAULT, CLONE_FILES_MAX_DEFAULT, GitOptions};
pub use zopu_schema::repository::{BranchName, BranchProblem, LocationProblem, RepositoryLocation};

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

    pub(crate) fn io(operation: &'static str, path: &Path, source: std::io::Error) -> Self {
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
        let location = RepositoryLocation::parse(location, options.allow_local_repositories)
            .map_err(Error::InvalidLocation)?;
        options.check_location(&location)?;
        Ok(Self {
            location,
            branch: BranchName::parse(branch).map_err(Error::InvalidBranch)?,
            credential,
        })
    }
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
}
