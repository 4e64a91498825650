//! Idempotent clone (spec section 14 step 2), verification (step 3), the
//! caps on a clone's tree, and the file-system helpers around them.

use std::path::{Path, PathBuf};

use tokio::io::AsyncReadExt;

use crate::egress::Pin;

use super::command::{STDERR_KEPT_BYTES_MAX, kill_group, read_capped};
use super::{
    CloneLimit, CloneSource, Credential, EmptyHome, Error, Git, RepositoryLocation, Target,
    classify_clone_failure, detail, with_credential,
};

/// Tracked files tried when proving the repository is readable.
const READABLE_PROBES_MAX: usize = 64;
/// Prefix of the temporary clone directories next to the destination.
pub(crate) const TEMPORARY_CLONE_PREFIX: &str = ".zopu-clone-";

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

impl Git {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
    fn object_ids_are_full_sha1_or_sha256_hex() {
        assert!(is_object_id(&"a".repeat(40)));
        assert!(is_object_id(&"0".repeat(64)));
        assert!(!is_object_id(&"a".repeat(39)));
        assert!(!is_object_id(&"g".repeat(40)));
    }
}
