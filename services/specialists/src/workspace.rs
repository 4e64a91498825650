//! This instance's project workspaces (issue 13: no shared volume).
//!
//! A specialists instance keeps its own `<root>/workspaces/<project>/repo`.
//! Before a flow opens it, [`Workspaces::prepare`] makes sure it holds the
//! commit the flow is about: the request's `repository_commit`, else the
//! latest commit the stream recorded for the project. A workspace that is
//! missing, or at another commit, is materialized from the repository the
//! stream recorded (`project.setup.requested` / `project.repository.cloned`)
//! through the sandbox's hardened checkout (`Git::ensure_commit`), whose
//! `HEAD` is checked against the commit before any tool runs. With nothing
//! recorded, a workspace at the right commit (or any, when the request names
//! none) is used as it is and anything else is refused with the reason.
//!
//! Invariants: one lock per project on this instance — preparing takes it
//! exclusively (so concurrent flows never clone twice), and the prepared
//! workspace holds it shared until the flow ends (so no flow's tree is
//! replaced under it); credentials come from the credential store by the
//! recorded connection id and reach only git's environment; errors carry no
//! URL and no credential.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedRwLockReadGuard, RwLock};
use zopu_core::secret_store::SecretStore;
use zopu_sandbox::checkout::{self, CommitId, Method};
use zopu_sandbox::git::{CloneSource, Git, GitOptions};
use zopu_sandbox::workspace::{self as sandbox_workspace, LocalWorkspaces, ProjectId};
use zopu_schema::OrgId;

use crate::state::RecordedRepository;

/// Project locks kept before idle ones are dropped.
const IDLE_LOCKS_MAX: usize = 1024;

/// Why a workspace could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing on disk fits and nothing recorded says where to get it.
    #[error("{0}")]
    Unavailable(String),
    /// The organization's repository credentials could not be read.
    #[error("the stored repository credentials could not be read: {0}")]
    Credentials(String),
    #[error(transparent)]
    Workspace(#[from] sandbox_workspace::Error),
    #[error(transparent)]
    Checkout(#[from] checkout::Error),
}

impl Error {
    /// True when the same flow may succeed later (network, timeout, disk).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Unavailable(_) => false,
            Self::Credentials(_) => true,
            Self::Workspace(error) => error.is_retryable(),
            Self::Checkout(error) => error.is_retryable(),
        }
    }
}

/// What to do with a project's workspace (pure; see [`plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Use the checkout as it is.
    Use,
    /// Check out `commit` from the recorded repository (reusing the
    /// directory when it already is at `commit`).
    Materialize { commit: String },
    /// Refuse, with the reason shown in `flow.failed`.
    Refuse(String),
}

/// Decides from the checkout's `HEAD` (`None`: no checkout), the commit the
/// request names (may be empty) and the recorded repository.
pub fn plan(
    head: Option<&str>,
    requested_commit: &str,
    recorded: Option<&RecordedRepository>,
) -> Plan {
    let commit = if requested_commit.is_empty() {
        recorded.map_or("", |r| r.commit.as_str())
    } else {
        requested_commit
    };
    match (head, recorded) {
        (Some(head), _) if commit.is_empty() || head == commit => Plan::Use,
        (_, Some(_)) if !commit.is_empty() => Plan::Materialize {
            commit: commit.to_owned(),
        },
        (_, Some(_)) => Plan::Refuse(
            "the project's workspace is missing on this instance and no commit is recorded for its repository yet".to_owned(),
        ),
        (None, None) => Plan::Refuse(
            "the project's workspace is missing on this instance and the stream records no repository to materialize it from".to_owned(),
        ),
        (Some(head), None) => Plan::Refuse(format!(
            "the project's workspace is at commit {head}, not {commit}, and the stream records no repository to materialize it from"
        )),
    }
}

/// A prepared workspace. Holds the project's lock shared until dropped.
#[derive(Debug)]
pub struct Prepared {
    /// `<root>/workspaces/<project>` (holding `repo/` and `.zopu/`).
    pub path: PathBuf,
    /// The checkout's `HEAD`, when known.
    pub commit: Option<String>,
    /// What materializing did, for the flow's progress (`None`: nothing).
    pub note: Option<String>,
    _lock: OwnedRwLockReadGuard<()>,
}

/// This instance's workspaces.
pub struct Workspaces {
    local: LocalWorkspaces,
    git: Git,
    /// The organizations' repository tokens (`None`: no secrets key).
    credentials: Option<SecretStore>,
    locks: Mutex<HashMap<ProjectId, Arc<RwLock<()>>>>,
}

impl std::fmt::Debug for Workspaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspaces")
            .field("root", &self.local.root)
            .field("git", &self.git)
            .finish_non_exhaustive()
    }
}

impl Workspaces {
    /// Workspaces under `root`; git runs with `options`; a clone of a
    /// repository host the organization stored a token for uses it.
    pub fn new(root: PathBuf, options: GitOptions, credentials: Option<SecretStore>) -> Self {
        Self {
            local: LocalWorkspaces::new(root).with_git_options(options.clone()),
            git: Git::new(options),
            credentials,
            locks: Mutex::new(HashMap::new()),
        }
    }

    fn lock_of(&self, project: ProjectId) -> Arc<RwLock<()>> {
        let mut locks = self
            .locks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if locks.len() >= IDLE_LOCKS_MAX {
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        }
        locks.entry(project).or_default().clone()
    }

    /// The project's workspace at the commit the flow needs (module docs).
    pub async fn prepare(
        &self,
        org: &OrgId,
        project_id: &str,
        requested_commit: &str,
        recorded: Option<RecordedRepository>,
    ) -> Result<Prepared, Error> {
        let project = ProjectId::parse(project_id)?;
        let exclusive = self.lock_of(project).write_owned().await;
        let handle = self.local.handle(project, true);
        let repository = &handle.repository_path;
        let head = if repository.join(".git").is_dir() {
            // An unreadable HEAD is no checkout: materialized again below.
            self.git.head_commit(repository).await.ok().flatten()
        } else {
            None
        };
        let (commit, note) = match plan(head.as_deref(), requested_commit, recorded.as_ref()) {
            Plan::Use => (head, None),
            Plan::Refuse(reason) => return Err(Error::Unavailable(reason)),
            Plan::Materialize { commit } => {
                let Some(recorded) = recorded else {
                    return Err(Error::Unavailable("no recorded repository".to_owned()));
                };
                let commit = CommitId::parse(&commit)?;
                let mut source = CloneSource::parse(
                    &recorded.repository_url,
                    &recorded.branch,
                    None,
                    self.git.options(),
                )
                .map_err(checkout::Error::from)?;
                if let (Some(store), Some(host)) =
                    (&self.credentials, source.location.credential_host())
                {
                    source.credential = store
                        .repository_credential(org, &host)
                        .await
                        .map_err(|error| Error::Credentials(error.to_string()))?
                        .map(|(credential, _)| credential);
                }
                let workspace =
                    sandbox_workspace::WorkspaceProvider::ensure(&self.local, project_id).await?;
                let checkout = self
                    .git
                    .ensure_commit(&source, &commit, &workspace.repository_path)
                    .await?;
                let note = checkout.method.map(|method| {
                    let how = match method {
                        Method::FetchedCommit => "fetched by commit id".to_owned(),
                        Method::ClonedBranch => format!("cloned from branch '{}'", source.branch),
                    };
                    match &checkout.replaced_commit {
                        Some(old) => format!(
                            "Workspace re-materialized at commit {commit} ({how}); it was at {old}"
                        ),
                        None => format!("Workspace materialized at commit {commit} ({how})"),
                    }
                });
                if let Some(note) = &note {
                    tracing::info!(project = %project, %commit, note, "workspace materialized");
                }
                (Some(checkout.repository.commit), note)
            }
        };
        Ok(Prepared {
            path: handle.workspace_path,
            commit,
            note,
            _lock: exclusive.downgrade(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(commit: &str) -> RecordedRepository {
        RecordedRepository {
            setup_revision: 1,
            repository_url: "https://example.com/o/r.git".into(),
            branch: "main".into(),
            connection_id: String::new(),
            commit: commit.into(),
        }
    }

    #[test]
    fn plans() {
        let (a, b) = ("a".repeat(40), "b".repeat(40));
        let materialize = |commit: &str| Plan::Materialize {
            commit: commit.to_owned(),
        };
        // At the commit: used as it is, recorded or not.
        assert_eq!(plan(Some(&a), &a, None), Plan::Use);
        assert_eq!(plan(Some(&a), &a, Some(&recorded(&b))), Plan::Use);
        // The request's commit wins over the recorded one.
        assert_eq!(plan(Some(&b), &a, Some(&recorded(&b))), materialize(&a));
        assert_eq!(plan(None, &a, Some(&recorded(&b))), materialize(&a));
        // No commit in the request: the recorded one.
        assert_eq!(plan(Some(&a), "", Some(&recorded(&b))), materialize(&b));
        assert_eq!(plan(None, "", Some(&recorded(&b))), materialize(&b));
        // Nothing to compare against: an existing checkout is used.
        assert_eq!(plan(Some(&a), "", None), Plan::Use);
        assert_eq!(plan(Some(&a), "", Some(&recorded(""))), Plan::Use);
        // Nothing recorded to fix what is wrong or missing.
        for (head, requested, record) in [
            (Some(b.as_str()), a.as_str(), None),
            (None, a.as_str(), None),
            (None, "", None),
            (None, "", Some(recorded(""))),
        ] {
            assert!(
                matches!(plan(head, requested, record.as_ref()), Plan::Refuse(_)),
                "{head:?} {requested:?} {record:?}"
            );
        }
        let Plan::Refuse(reason) = plan(Some(&b), &a, None) else {
            panic!("refused");
        };
        assert!(reason.contains(&a) && reason.contains(&b), "{reason}");
    }

    #[test]
    fn only_transient_failures_are_retryable() {
        assert!(!Error::Unavailable("x".into()).is_retryable());
        assert!(!Error::Checkout(checkout::Error::InvalidCommit).is_retryable());
        assert!(
            Error::Checkout(checkout::Error::Git(zopu_sandbox::git::Error::TimedOut {
                operation: "fetch",
                after: std::time::Duration::from_secs(1),
            }))
            .is_retryable()
        );
    }
}
