//! The workspace runtime: one private directory per project.
//!
//! [`WorkspaceProvider`] is the seam where an AgentOS/VM provider plugs in
//! later; [`LocalWorkspaces`] is the local implementation. A project's
//! workspace is `<root>/workspaces/<project_id>/` holding `repo/` (the clone,
//! made by [`crate::git`]) and `.zopu/` (generated files).
//!
//! Invariants: project ids are validated as UUIDs (and rendered in canonical
//! form) before any path is built; every directory this module creates is
//! mode 0700; [`WorkspaceProvider::ensure`] is idempotent by project id (a
//! retry reuses the directory, the runtime id is deterministic); symlinks are
//! never followed, neither to reach the workspace nor while measuring it.

use std::future::Future;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::git::{self, Git, GitOptions};

/// Directory holding the clone, inside a workspace.
pub const REPOSITORY_DIRECTORY: &str = "repo";
/// Directory holding generated files, inside a workspace.
pub const GENERATED_DIRECTORY: &str = ".zopu";
/// Entries visited when measuring sizes before giving up (reported).
const SIZE_ENTRIES_MAX: usize = 500_000;

/// Errors of the workspace runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The project id is not a UUID.
    #[error("invalid project id: expected a UUID")]
    InvalidProjectId,
    /// A path that must be a real directory is a symlink or a file.
    #[error("{path} exists but is not a directory (symlinks are not followed)")]
    NotADirectory {
        /// The offending path.
        path: PathBuf,
    },
    /// A filesystem operation failed.
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
    /// Inspecting the repository failed.
    #[error(transparent)]
    Git(#[from] git::Error),
}

impl Error {
    /// True when retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Io { .. } => true,
            Self::Git(error) => error.is_retryable(),
            Self::InvalidProjectId | Self::NotADirectory { .. } => false,
        }
    }
}

/// A validated project id (a UUID, canonical hyphenated lowercase form).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProjectId(uuid::Uuid);

impl ProjectId {
    /// Parses and validates a project id.
    pub fn parse(input: &str) -> Result<Self, Error> {
        uuid::Uuid::try_parse(input)
            .map(Self)
            .map_err(|_| Error::InvalidProjectId)
    }
}

impl std::fmt::Display for ProjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.hyphenated())
    }
}

/// Where a project's workspace lives (spec section 14 step 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceHandle {
    /// Deterministic runtime id, e.g. `local:<project_id>`.
    pub runtime_id: String,
    /// `<root>/workspaces/<project_id>`.
    pub workspace_path: PathBuf,
    /// `<workspace>/repo` (may not exist yet: cloning creates it).
    pub repository_path: PathBuf,
    /// `<workspace>/.zopu`.
    pub generated_path: PathBuf,
    /// True when the workspace already existed.
    pub reused: bool,
}

/// A snapshot of a workspace for the `describe` tool and setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceDescription {
    /// The handle's paths and runtime id (`reused` is true).
    pub handle: WorkspaceHandle,
    /// `git rev-parse HEAD`, when the repository is cloned.
    pub commit: Option<String>,
    /// Tracked files, when the repository is cloned.
    pub tracked_files: Option<usize>,
    /// Bytes of regular files under `repo/` (symlinks not followed).
    pub repository_bytes: u64,
    /// Bytes of regular files under `.zopu/`.
    pub generated_bytes: u64,
    /// True when measuring stopped at the entry limit.
    pub sizes_truncated: bool,
}

/// Creates and describes project workspaces. Implemented locally by
/// [`LocalWorkspaces`]; an AgentOS/VM provider implements the same trait.
pub trait WorkspaceProvider: Send + Sync {
    /// Creates the workspace of `project_id`, or reuses it (idempotent).
    fn ensure(
        &self,
        project_id: &str,
    ) -> impl Future<Output = Result<WorkspaceHandle, Error>> + Send;

    /// Paths, commit, sizes and tracked file count of an existing workspace.
    fn describe(
        &self,
        project_id: &str,
    ) -> impl Future<Output = Result<WorkspaceDescription, Error>> + Send;
}

/// Workspaces as directories under `root` on this machine.
#[derive(Debug, Clone)]
pub struct LocalWorkspaces {
    /// Directory under which `workspaces/` lives.
    pub root: PathBuf,
    git: Git,
}

impl LocalWorkspaces {
    /// Workspaces under `root`, inspected with default git options.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            git: Git::default(),
        }
    }

    /// Uses `options` for the git commands run by `describe`.
    pub fn with_git_options(mut self, options: GitOptions) -> Self {
        self.git = Git::new(options);
        self
    }

    /// The handle of `project_id` without touching the filesystem.
    pub fn handle(&self, project_id: ProjectId, reused: bool) -> WorkspaceHandle {
        let workspace_path = self.root.join("workspaces").join(project_id.to_string());
        WorkspaceHandle {
            runtime_id: format!("local:{project_id}"),
            repository_path: workspace_path.join(REPOSITORY_DIRECTORY),
            generated_path: workspace_path.join(GENERATED_DIRECTORY),
            workspace_path,
            reused,
        }
    }

    fn ensure_blocking(&self, project_id: ProjectId) -> Result<WorkspaceHandle, Error> {
        let workspaces = self.root.join("workspaces");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&workspaces)
            .map_err(|e| io_error("create", &workspaces, e))?;
        require_directory(&workspaces)?;
        let handle = self.handle(project_id, false);
        let reused = create_private_directory(&handle.workspace_path)?;
        create_private_directory(&handle.generated_path)?;
        if std::fs::symlink_metadata(&handle.repository_path).is_ok() {
            require_directory(&handle.repository_path)?;
        }
        Ok(WorkspaceHandle { reused, ..handle })
    }
}

impl WorkspaceProvider for LocalWorkspaces {
    async fn ensure(&self, project_id: &str) -> Result<WorkspaceHandle, Error> {
        let project_id = ProjectId::parse(project_id)?;
        self.ensure_blocking(project_id)
    }

    async fn describe(&self, project_id: &str) -> Result<WorkspaceDescription, Error> {
        let project_id = ProjectId::parse(project_id)?;
        let handle = self.handle(project_id, true);
        require_directory(&handle.workspace_path)?;
        let repository_exists = std::fs::symlink_metadata(&handle.repository_path).is_ok();
        let (commit, tracked_files) = if repository_exists {
            let verified = self.git.verify(&handle.repository_path).await?;
            (Some(verified.commit), Some(verified.tracked_files))
        } else {
            (None, None)
        };
        let repository = handle.repository_path.clone();
        let generated = handle.generated_path.clone();
        let sizes = tokio::task::spawn_blocking(move || {
            let mut budget = SIZE_ENTRIES_MAX;
            let repository_bytes = measure(&repository, &mut budget);
            let generated_bytes = measure(&generated, &mut budget);
            (repository_bytes, generated_bytes, budget == 0)
        })
        .await;
        let (repository_bytes, generated_bytes, sizes_truncated) = sizes
            .map_err(|e| io_error("measure", &handle.workspace_path, std::io::Error::other(e)))?;
        Ok(WorkspaceDescription {
            handle,
            commit,
            tracked_files,
            repository_bytes,
            generated_bytes,
            sizes_truncated,
        })
    }
}

fn io_error(operation: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        operation,
        path: path.to_path_buf(),
        source,
    }
}

/// Fails unless `path` is a real directory (not a symlink to one).
fn require_directory(path: &Path) -> Result<(), Error> {
    let metadata = std::fs::symlink_metadata(path).map_err(|e| io_error("inspect", path, e))?;
    if metadata.is_dir() {
        Ok(())
    } else {
        Err(Error::NotADirectory {
            path: path.to_path_buf(),
        })
    }
}

/// Creates `path` with mode 0700; returns true when it already existed.
fn create_private_directory(path: &Path) -> Result<bool, Error> {
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(false),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            require_directory(path)?;
            Ok(true)
        }
        Err(error) => Err(io_error("create", path, error)),
    }
}

/// Sums regular-file sizes under `root` without following symlinks,
/// visiting at most `budget` entries.
fn measure(root: &Path, budget: &mut usize) -> u64 {
    let mut total = 0u64;
    let mut pending = vec![root.to_path_buf()];
    while let Some(directory) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&directory) else {
            continue;
        };
        for entry in entries.flatten() {
            if *budget == 0 {
                return total;
            }
            *budget -= 1;
            let Ok(file_type) = entry.file_type() else {
                continue;
            };
            if file_type.is_dir() {
                pending.push(entry.path());
            } else if file_type.is_file() {
                total += entry.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    total
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn project_ids_are_validated_and_canonical() {
        assert!(matches!(
            ProjectId::parse("../etc"),
            Err(Error::InvalidProjectId)
        ));
        assert!(matches!(ProjectId::parse(""), Err(Error::InvalidProjectId)));
        let id = ProjectId::parse("0191E2A4-5B6C-7D8E-9F00-112233445566").unwrap();
        assert_eq!(id.to_string(), "0191e2a4-5b6c-7d8e-9f00-112233445566");
    }

    #[test]
    fn handle_paths_are_deterministic() {
        let workspaces = LocalWorkspaces::new("/srv/zopu");
        let id = ProjectId::parse("0191e2a4-5b6c-7d8e-9f00-112233445566").unwrap();
        let handle = workspaces.handle(id, false);
        assert_eq!(
            handle.runtime_id,
            "local:0191e2a4-5b6c-7d8e-9f00-112233445566"
        );
        assert_eq!(
            handle.repository_path,
            Path::new("/srv/zopu/workspaces/0191e2a4-5b6c-7d8e-9f00-112233445566/repo")
        );
    }
}
