//! What the operator allows git to do: local repositories and their roots,
//! the egress policy, and the clone caps and timeouts.

use std::path::PathBuf;
use std::time::Duration;

use crate::egress::Egress;

use super::{Error, LocationProblem, RepositoryLocation};

/// Default of [`GitOptions::clone_bytes_max`]: 1 GiB.
pub const CLONE_BYTES_MAX_DEFAULT: u64 = 1024 * 1024 * 1024;
/// Default of [`GitOptions::clone_files_max`].
pub const CLONE_FILES_MAX_DEFAULT: u64 = 100_000;

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
    /// A PEM bundle of the certificate authorities https remotes are
    /// verified against instead of the system's (a private git server).
    pub repository_ca_file: Option<PathBuf>,
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
            repository_ca_file: None,
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
