//! A checkout of one recorded commit: how an instance that never saw the
//! setup service's clone gets the same tree (issue 13: no shared volume).
//!
//! [`Git::ensure_commit`] makes a directory a verified checkout of exactly
//! the commit the stream recorded. It reuses the directory when its `HEAD`
//! already is that commit; otherwise it builds a new checkout in a temporary
//! sibling and swaps it in. The new checkout is a shallow fetch of the commit
//! by id; a remote that refuses to serve a commit by id gets a depth-1 clone
//! of the recorded branch instead, which is kept only when its `HEAD` is the
//! recorded commit. Either way the result's `HEAD` is checked against the
//! commit before it is returned, so no caller ever reads another tree.
//!
//! Invariants: every git command is the hardened one of [`crate::git`]
//! (cleared environment, no hooks, no submodules, validated location and
//! branch, refs after `--end-of-options`, credentials only through the
//! environment, the host resolved, checked and pinned before the fetch,
//! the same byte and file caps as a clone); the commit id is validated
//! (full 40/64 hex) before git runs; errors carry no URL and no credential.

use std::path::Path;

use crate::git::{
    self, CloneSource, EmptyHome, Git, TEMPORARY_CLONE_PREFIX, Target, VerifiedRepository,
};

/// Errors of [`Git::ensure_commit`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The recorded commit is not a full object id.
    #[error("invalid commit id: expected 40 or 64 hexadecimal characters")]
    InvalidCommit,
    /// The commit could not be obtained from the remote (permanent until
    /// someone changes the repository or the record).
    #[error("commit {commit} is not available from the repository: {reason}")]
    CommitUnavailable {
        /// The recorded commit.
        commit: String,
        /// Why, without URL or credential.
        reason: String,
    },
    /// Cloning, fetching or verifying failed.
    #[error(transparent)]
    Git(#[from] git::Error),
}

impl Error {
    /// True when retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Git(error) => error.is_retryable(),
            Self::InvalidCommit | Self::CommitUnavailable { .. } => false,
        }
    }
}

/// A validated full commit id (40 or 64 hex characters, lowercase).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CommitId(String);

impl CommitId {
    /// Validates `text` as a full object id.
    pub fn parse(text: &str) -> Result<Self, Error> {
        if git::is_object_id(text) {
            Ok(Self(text.to_ascii_lowercase()))
        } else {
            Err(Error::InvalidCommit)
        }
    }

    /// The id as hex.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for CommitId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a new checkout got its commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// A shallow fetch of the commit by id.
    FetchedCommit,
    /// A depth-1 clone of the branch, whose `HEAD` was the commit.
    ClonedBranch,
}

/// Result of [`Git::ensure_commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkout {
    /// `None` when the existing directory was already at the commit.
    pub method: Option<Method>,
    /// What was there before when it was replaced (its `HEAD`, if readable).
    pub replaced_commit: Option<String>,
    /// The verified checkout; its `commit` is the requested one.
    pub repository: VerifiedRepository,
}

/// What a failed fetch by id means for the next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchRefusal {
    /// The remote will not serve that object by id (not advertised, not
    /// allowed, unknown): try the branch.
    ByIdRefused,
    /// Anything else (network, authentication, missing repository): report.
    Other,
}

/// Classifies git's (C-locale) stderr of a failed `fetch <commit>`.
pub fn classify_fetch_failure(stderr: &str) -> FetchRefusal {
    let lower = stderr.to_ascii_lowercase();
    let refused = [
        "not our ref",
        "unadvertised object",
        "couldn't find remote ref",
        "no such remote ref",
        "could not find remote ref",
    ];
    if refused.iter().any(|needle| lower.contains(needle)) {
        FetchRefusal::ByIdRefused
    } else {
        FetchRefusal::Other
    }
}

impl Git {
    /// Makes `destination` a verified checkout of exactly `commit` of
    /// `source` (see the module documentation). `destination`'s parent must
    /// exist; temporary siblings start with `.zopu-clone-`.
    pub async fn ensure_commit(
        &self,
        source: &CloneSource,
        commit: &CommitId,
        destination: &Path,
    ) -> Result<Checkout, Error> {
        self.check_source(source)?;
        let replaced_commit = match std::fs::symlink_metadata(destination) {
            Ok(metadata) if metadata.is_dir() && destination.join(".git").is_dir() => {
                // An unreadable HEAD counts as "another commit": replaced below.
                let head = self.head_commit(destination).await.ok().flatten();
                if head.as_deref() == Some(commit.as_str()) {
                    let repository = self.verify(destination).await?;
                    return Ok(Checkout {
                        method: None,
                        replaced_commit: None,
                        repository,
                    });
                }
                head
            }
            Ok(_) => None,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                return Err(git::Error::Io {
                    operation: "inspect",
                    path: destination.to_path_buf(),
                    source: error,
                }
                .into());
            }
        };
        let parent = destination
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .ok_or_else(|| git::Error::Io {
                operation: "check out into",
                path: destination.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "no parent directory",
                ),
            })?;
        git::remove_stale_temporaries(parent)?;
        let temporary = parent.join(format!("{TEMPORARY_CLONE_PREFIX}{}", uuid::Uuid::now_v7()));
        let result = self.checkout_into(source, commit, &temporary).await;
        let result = match result {
            Ok(method) => {
                self.verify(&temporary)
                    .await
                    .map_err(Error::from)
                    .and_then(|repository| {
                        if repository.commit == commit.as_str() {
                            Ok((method, repository))
                        } else {
                            Err(Error::CommitUnavailable {
                                commit: commit.to_string(),
                                reason: format!(
                                    "the checkout's HEAD is {} after checking it out",
                                    repository.commit
                                ),
                            })
                        }
                    })
            }
            Err(error) => Err(error),
        };
        let (method, repository) = match result {
            Ok(done) => done,
            Err(error) => {
                // Best effort; stale temporaries are also removed next time.
                let _ = git::remove_path(&temporary);
                return Err(error);
            }
        };
        let swapped = git::remove_path(destination).and_then(|()| {
            std::fs::rename(&temporary, destination).map_err(|e| git::Error::Io {
                operation: "move checkout to",
                path: destination.to_path_buf(),
                source: e,
            })
        });
        if let Err(error) = swapped {
            let _ = git::remove_path(&temporary);
            return Err(error.into());
        }
        Ok(Checkout {
            method: Some(method),
            replaced_commit,
            repository: VerifiedRepository {
                path: destination.to_path_buf(),
                ..repository
            },
        })
    }

    /// Fills the absent `directory` with `commit`: a fetch by id, or the
    /// branch when the remote refuses that.
    async fn checkout_into(
        &self,
        source: &CloneSource,
        commit: &CommitId,
        directory: &Path,
    ) -> Result<Method, Error> {
        let directory = std::path::absolute(directory).map_err(|e| git::Error::Io {
            operation: "resolve",
            path: directory.to_path_buf(),
            source: e,
        })?;
        match self.fetch_commit(source, commit, &directory).await {
            Ok(()) => return Ok(Method::FetchedCommit),
            Err(FetchFailed::Refused(detail)) => {
                tracing::info!(%commit, %detail, "the remote refused a fetch by commit id; cloning the recorded branch");
            }
            Err(FetchFailed::Error(error)) => return Err(error),
        }
        git::remove_path(&directory)?;
        self.clone_into(source, &directory).await?;
        let head = self.head_commit(&directory).await?;
        if head.as_deref() == Some(commit.as_str()) {
            Ok(Method::ClonedBranch)
        } else {
            Err(Error::CommitUnavailable {
                commit: commit.to_string(),
                reason: format!(
                    "the remote does not serve commits by id and branch '{}' is now at {}",
                    source.branch,
                    head.as_deref().unwrap_or("an unreadable commit")
                ),
            })
        }
    }

    /// `git init`, `origin` set to the location, a depth-1 fetch of the
    /// commit and a checkout of it on the recorded branch.
    async fn fetch_commit(
        &self,
        source: &CloneSource,
        commit: &CommitId,
        directory: &Path,
    ) -> Result<(), FetchFailed> {
        let allow_file = source.location.is_local();
        let home = EmptyHome::create()?;
        let mut init = self.command(&home, Target::None, false);
        init.args(["init", "--quiet", "--template="])
            .arg("--end-of-options")
            .arg(directory);
        self.succeed(init, "init").await?;
        let head = format!("refs/heads/{}", source.branch);
        let steps: [(&'static str, &[&str]); 2] = [
            ("symbolic-ref", &["symbolic-ref", "HEAD", &head]),
            (
                "config",
                &[
                    "config",
                    "--local",
                    "remote.origin.url",
                    source.location.url(),
                ],
            ),
        ];
        for (operation, args) in steps {
            let mut command = self.command(&home, Target::Repository(directory), false);
            command.args(args);
            self.succeed(command, operation).await?;
        }
        let pin = self.pin(source).await?;
        let mut fetch = self.command(&home, Target::Repository(directory), allow_file);
        Git::pinned(&mut fetch, pin.as_ref());
        git::with_credential(&mut fetch, source);
        fetch
            .args([
                "fetch",
                "--quiet",
                "--depth",
                "1",
                "--no-tags",
                "--no-recurse-submodules",
                "--no-write-fetch-head",
                "origin",
                "--end-of-options",
            ])
            .arg(commit.as_str());
        let output = self
            .run_watched(
                fetch,
                "fetch",
                self.options().clone_timeout,
                Some(directory),
            )
            .await?;
        if !output.status.success() {
            return Err(match classify_fetch_failure(&output.stderr) {
                FetchRefusal::ByIdRefused => FetchFailed::Refused(git::detail(&output.stderr)),
                FetchRefusal::Other => FetchFailed::Error(
                    git::classify_clone_failure(&output.stderr, &source.branch).into(),
                ),
            });
        }
        self.check_tree_size(directory, commit.as_str()).await?;
        let mut checkout = self.command(&home, Target::Repository(directory), false);
        // Not `--end-of-options`: git before 2.43 (Debian bookworm's 2.39,
        // the images' git) refuses it in `reset`. A `CommitId` is hex, never
        // an option, and the trailing `--` keeps it from naming a path.
        checkout.args(["reset", "--quiet", "--hard", commit.as_str(), "--"]);
        self.succeed(checkout, "reset").await?;
        Ok(())
    }

    /// Runs a local command that must succeed.
    async fn succeed(
        &self,
        command: tokio::process::Command,
        operation: &'static str,
    ) -> Result<(), git::Error> {
        let output = self
            .run(command, operation, self.options().command_timeout)
            .await?;
        if output.status.success() {
            Ok(())
        } else {
            Err(git::Error::GitFailed {
                operation,
                detail: git::detail(&output.stderr),
            })
        }
    }
}

/// Why a fetch by id did not produce the commit.
enum FetchFailed {
    /// The remote would not serve the object by id (git's redacted words).
    Refused(String),
    Error(Error),
}

impl From<git::Error> for FetchFailed {
    fn from(error: git::Error) -> Self {
        Self::Error(error.into())
    }
}

impl From<FetchFailed> for Error {
    fn from(failed: FetchFailed) -> Self {
        match failed {
            FetchFailed::Refused(detail) => Error::Git(git::Error::GitFailed {
                operation: "fetch",
                detail,
            }),
            FetchFailed::Error(error) => error,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn commit_ids_are_full_hex() {
        let sha1 = "3f5e2a9c1b7d4e8f0a6b2c9d1e3f5a7b9c0d2e4f";
        assert_eq!(CommitId::parse(sha1).unwrap().as_str(), sha1);
        assert_eq!(
            CommitId::parse(&sha1.to_ascii_uppercase())
                .unwrap()
                .as_str(),
            sha1
        );
        let sha256 = "a".repeat(64);
        assert!(CommitId::parse(&sha256).is_ok());
        for bad in [
            "",
            "3f5e2a9",
            "--upload-pack=x",
            "HEAD",
            "main",
            &"g".repeat(40),
            &"a".repeat(41),
            &format!("{sha1}\n"),
        ] {
            assert!(
                matches!(CommitId::parse(bad), Err(Error::InvalidCommit)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn refusals_to_serve_a_commit_by_id_fall_back_to_the_branch() {
        for stderr in [
            "error: Server does not allow request for unadvertised object 3f5e2a9c1b7d4e8f0a6b2c9d1e3f5a7b9c0d2e4f\n",
            "fatal: remote error: upload-pack: not our ref 3f5e2a9c1b7d4e8f0a6b2c9d1e3f5a7b9c0d2e4f\n",
            "fatal: couldn't find remote ref 3f5e2a9c1b7d4e8f0a6b2c9d1e3f5a7b9c0d2e4f\n",
        ] {
            assert_eq!(classify_fetch_failure(stderr), FetchRefusal::ByIdRefused);
        }
        for stderr in [
            "fatal: unable to access 'https://127.0.0.1:1/x.git/': Failed to connect to 127.0.0.1 port 1\n",
            "fatal: could not read Username for 'https://github.com': terminal prompts disabled\n",
            "remote: Repository not found.\nfatal: repository 'https://github.com/a/b/' not found\n",
        ] {
            assert_eq!(classify_fetch_failure(stderr), FetchRefusal::Other);
        }
    }

    #[test]
    fn only_git_failures_that_may_pass_are_retryable() {
        assert!(!Error::InvalidCommit.is_retryable());
        assert!(
            !Error::CommitUnavailable {
                commit: "a".repeat(40),
                reason: "gone".into()
            }
            .is_retryable()
        );
        assert!(
            Error::Git(git::Error::Unreachable {
                detail: String::new()
            })
            .is_retryable()
        );
    }
}
