//! How workspace and git errors become setup outcomes (pure).
//!
//! A transient failure (network, timeout, local I/O) is retried in place by
//! the reaction runner with bounded backoff; when the retries run out the
//! same [`Failure`] is recorded. Anything else ends the revision at once.
//! Messages are written here, never copied from git: they name what to do
//! and carry no path, URL or credential.

use zopu_sandbox::git;
use zopu_sandbox::workspace;

use crate::state::{Failure, step};

/// A failed step, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Retry in place; record `Failure` if the retries run out.
    Transient(Failure),
    /// Record `Failure` now.
    Terminal(Failure),
}

impl Outcome {
    pub fn failure(&self) -> &Failure {
        match self {
            Self::Transient(failure) | Self::Terminal(failure) => failure,
        }
    }
}

/// A request whose repository location or branch does not validate.
pub fn invalid_request(error: &git::Error) -> Failure {
    let (code, what) = match error {
        git::Error::InvalidBranch(problem) => (
            "request.invalid_branch",
            format!("The branch name was rejected: {problem}."),
        ),
        git::Error::InvalidLocation(problem) => (
            "request.invalid_location",
            format!("The repository location was rejected: {problem}."),
        ),
        other => (
            "request.invalid",
            format!("The request was rejected: {other}."),
        ),
    };
    Failure::new(
        step::CLONE,
        code,
        format!("{what} Create the project again with a valid repository and branch."),
        false,
    )
}

/// A new project beyond its organization's project limit.
pub fn project_limit(max: u32) -> Failure {
    Failure::new(
        step::WORKSPACE,
        "request.project_limit",
        format!(
            "This organization already has {max} projects, the most it may have. \
             Ask the operator to raise setup.org_projects_max, then retry."
        ),
        true,
    )
}

/// A request with setup revision 0.
pub fn invalid_revision() -> Failure {
    Failure::new(
        step::WORKSPACE,
        "request.invalid_revision",
        "The setup request has no revision (it must be 1 or more).",
        false,
    )
}

/// A workspace that could not be created or reused.
pub fn workspace(error: &workspace::Error) -> Outcome {
    match error {
        workspace::Error::InvalidProjectId => Outcome::Terminal(Failure::new(
            step::WORKSPACE,
            "workspace.invalid_project",
            "The project id cannot name a workspace.",
            false,
        )),
        workspace::Error::NotADirectory { .. } => Outcome::Terminal(Failure::new(
            step::WORKSPACE,
            "workspace.corrupt",
            "The project's workspace is damaged (a file or link sits where a directory belongs). Ask the operator to remove it, then retry.",
            true,
        )),
        workspace::Error::Io { .. } => Outcome::Transient(Failure::new(
            step::WORKSPACE,
            "workspace.unavailable",
            "The workspace could not be created on the setup host (storage error). Retry; if it persists, ask the operator to check the data directory.",
            true,
        )),
        workspace::Error::Git(error) => clone(error, "", &Access::Anonymous { host: None }),
    }
}

/// What a user reads for every host that could not be used.
const UNREACHABLE_MESSAGE: &str = "The repository host could not be reached in time, or is not one this runtime may connect to. Check the repository URL, then retry; a server on an internal network must be allowed by the operator (setup.allowed_repository_hosts).";

/// How a clone authenticated to its repository host: what an
/// authentication failure tells the user to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// This instance has no secret store (no `ZOPU_SECRETS_KEY`): no stored
    /// credential can be used.
    NoStore { host: String },
    /// A local repository (no host), or no credential stored for the host.
    Anonymous { host: Option<String> },
    /// The organization's stored credential for the host, at `version`.
    Stored { host: String, version: u64 },
}

/// How a user stores a token for `host`.
fn store_token_hint(host: &str) -> String {
    format!(
        "store a token for {host} (PUT /v1/repository-credentials/{host}, or `zopu credentials set {host}` with the token on standard input)"
    )
}

/// The organization's stored credentials could not be read.
pub fn credentials_unavailable() -> Outcome {
    Outcome::Transient(Failure::new(
        step::CLONE,
        "clone.credentials_unavailable",
        "The organization's stored repository credentials could not be read. Retry; if it persists, ask the operator to check the secret store (ZOPU_SECRETS_KEY, the zopu-secrets bucket).",
        true,
    ))
}

/// What a repository that refused access tells the user.
fn authentication_failure(access: &Access) -> Failure {
    let (code, message) = match access {
        Access::Stored { host, version } => (
            "clone.credential_refused",
            format!(
                "The repository host {host} refused the organization's stored token (version {version}): it is wrong, expired or lacks read access to this repository. Replace it — {} — then retry.",
                store_token_hint(host)
            ),
        ),
        Access::Anonymous { host: Some(host) } => (
            "clone.authentication_required",
            format!(
                "The repository is private or refused anonymous access. To clone it, {}, then retry.",
                store_token_hint(host)
            ),
        ),
        Access::NoStore { host } => (
            "clone.authentication_required",
            format!(
                "The repository on {host} is private or refused anonymous access, and this runtime has no secret store for repository tokens. Ask the operator to set ZOPU_SECRETS_KEY on the setup and gateway services, then {}, and retry.",
                store_token_hint(host)
            ),
        ),
        Access::Anonymous { host: None } => (
            "clone.authentication_required",
            "The repository requires authentication or refused access. Check the repository, then retry.".to_owned(),
        ),
    };
    Failure::new(step::CLONE, code, message, true)
}

/// A clone (or its verification) that failed. `branch` was validated;
/// `access` says how the clone authenticated.
pub fn clone(error: &git::Error, branch: &str, access: &Access) -> Outcome {
    use git::Error as E;
    let terminal = |step: &str, code: &str, message: String| {
        Outcome::Terminal(Failure::new(step, code, message, true))
    };
    let transient = |code: &str, message: &str| {
        Outcome::Transient(Failure::new(step::CLONE, code, message, true))
    };
    match error {
        E::InvalidLocation(_) | E::InvalidBranch(_) => Outcome::Terminal(invalid_request(error)),
        // One code and message for a host that is refused (internal
        // address), unknown, unreachable or silent: no port-scan oracle.
        E::Unreachable { .. } | E::TimedOut { .. } => transient(
            "clone.unreachable",
            UNREACHABLE_MESSAGE,
        ),
        E::TooLarge { limit } => terminal(
            step::CLONE,
            "clone.too_large",
            format!(
                "The repository is larger than this runtime accepts (at most {}). Choose a smaller repository or branch, or ask the operator to raise setup.clone_bytes_max or setup.clone_files_max, then retry.",
                match limit {
                    git::CloneLimit::Bytes(bytes) => format!("{} MiB", bytes.div_ceil(1024 * 1024)),
                    git::CloneLimit::Files(files) => format!("{files} files"),
                }
            ),
        ),
        E::Spawn(_) => transient("clone.git_unavailable", "git could not be started on the setup host. Ask the operator to install git, then retry."),
        E::Io { .. } => transient(
            "clone.storage",
            "The clone could not be written on the setup host (storage error). Retry; if it persists, ask the operator to check the data directory.",
        ),
        E::BranchNotFound { .. } => terminal(
            step::CLONE,
            "clone.branch_not_found",
            format!("Branch '{branch}' does not exist in the repository. Push it (or retry with an existing branch)."),
        ),
        E::AuthenticationRequired => Outcome::Terminal(authentication_failure(access)),
        E::RepositoryNotFound => terminal(
            step::CLONE,
            "clone.repository_not_found",
            match access {
                // Hosts answer "not found" to a private repository asked for anonymously.
                Access::Anonymous { host: Some(host) } => format!(
                    "The repository was not found. Check the URL; if the repository is private, {}, then retry.",
                    store_token_hint(host)
                ),
                _ => "The repository was not found, or the stored token has no access to it. Check the URL and the organization's repository credentials, then retry.".to_owned(),
            },
        ),
        E::Mismatched { .. } => terminal(
            step::CLONE,
            "workspace.mismatched",
            "The project's workspace holds a different repository or branch. Retry to replace it with a fresh clone.".to_owned(),
        ),
        E::Corrupt { .. } => terminal(
            step::CLONE,
            "workspace.corrupt",
            "The project's workspace holds a damaged clone. Retry to replace it with a fresh clone.".to_owned(),
        ),
        E::Unreadable { reason, .. } => terminal(
            step::VERIFY,
            "verify.unreadable",
            format!("The cloned repository could not be read ({reason}). Check that the branch has files, then retry."),
        ),
        E::GitFailed { operation, .. } => terminal(
            step::CLONE,
            "clone.failed",
            format!("git {operation} failed. Retry; if it keeps failing, check the repository."),
        ),
    }
}

/// True for errors an explicit retry repairs by cloning afresh.
pub fn needs_repair(error: &git::Error) -> bool {
    matches!(
        error,
        git::Error::Mismatched { .. } | git::Error::Corrupt { .. }
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;

    const ANONYMOUS: Access = Access::Anonymous { host: None };

    #[test]
    fn an_authentication_failure_says_how_to_store_or_replace_the_token() {
        let refused = git::Error::AuthenticationRequired;
        let host = "git.example.com".to_owned();
        let failure = |access: Access| clone(&refused, "main", &access).failure().clone();
        let missing = failure(Access::Anonymous {
            host: Some(host.clone()),
        });
        assert_eq!(missing.code, "clone.authentication_required");
        assert!(
            missing
                .message
                .contains("zopu credentials set git.example.com"),
            "{}",
            missing.message
        );
        assert!(
            missing
                .message
                .contains("/v1/repository-credentials/git.example.com")
        );
        let stale = failure(Access::Stored {
            host: host.clone(),
            version: 7,
        });
        assert_eq!(stale.code, "clone.credential_refused");
        assert!(stale.message.contains("version 7") && stale.message.contains("Replace it"));
        let no_store = failure(Access::NoStore { host });
        assert!(
            no_store.message.contains("ZOPU_SECRETS_KEY"),
            "{}",
            no_store.message
        );
        assert!(missing.retryable && stale.retryable && no_store.retryable);
    }

    #[test]
    fn network_failures_are_transient_and_the_rest_terminal() {
        let unreachable = git::Error::Unreachable {
            detail: "connection refused".into(),
        };
        assert!(
            matches!(clone(&unreachable, "main", &ANONYMOUS), Outcome::Transient(f) if f.code == "clone.unreachable" && f.retryable)
        );
        let timeout = git::Error::TimedOut {
            operation: "clone",
            after: Duration::from_secs(300),
        };
        assert_eq!(
            clone(&timeout, "main", &ANONYMOUS),
            clone(&unreachable, "main", &ANONYMOUS)
        );
        let refused = git::Error::Unreachable {
            detail: "the host resolves only to private addresses".into(),
        };
        assert_eq!(
            clone(&refused, "main", &ANONYMOUS),
            clone(&unreachable, "main", &ANONYMOUS)
        );
        let too_large = git::Error::TooLarge {
            limit: git::CloneLimit::Files(10),
        };
        assert!(
            matches!(clone(&too_large, "main", &ANONYMOUS), Outcome::Terminal(f) if f.code == "clone.too_large" && f.message.contains("10 files"))
        );
        let missing = git::Error::BranchNotFound {
            branch: "dev".into(),
        };
        assert!(
            matches!(clone(&missing, "dev", &ANONYMOUS), Outcome::Terminal(f) if f.code == "clone.branch_not_found" && f.message.contains("'dev'") && f.retryable)
        );
        let corrupt = git::Error::Corrupt {
            path: PathBuf::from("/secret/place"),
            reason: "x".into(),
        };
        let outcome = clone(&corrupt, "main", &ANONYMOUS);
        assert!(
            matches!(&outcome, Outcome::Terminal(f) if f.retryable && !f.message.contains("/secret"))
        );
        assert!(needs_repair(&corrupt));
        let unreadable = git::Error::Unreadable {
            path: PathBuf::from("/w"),
            reason: "the branch has no tracked files".into(),
        };
        assert_eq!(
            clone(&unreadable, "main", &ANONYMOUS).failure().step,
            step::VERIFY
        );
    }

    #[test]
    fn invalid_requests_are_not_retryable() {
        let bad = git::Error::InvalidLocation(git::LocationProblem::Userinfo);
        let failure = invalid_request(&bad);
        assert!(!failure.retryable);
        assert_eq!(failure.code, "request.invalid_location");
        assert!(
            matches!(workspace(&workspace::Error::InvalidProjectId), Outcome::Terminal(f) if !f.retryable)
        );
    }
}
