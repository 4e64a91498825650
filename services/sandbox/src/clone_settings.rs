//! The clone settings of the deployment's `[sandbox]` section, the one
//! place they are set, used by every cloning service (setup, specialists):
//! where repositories may come from and how large a clone may be.
//!
//! One validation for all of them ([`CloneSettings::apply`]), so a bad
//! allowlist entry, a relative root or a cap out of range fails at start
//! with the key named, in every service alike.

use std::path::PathBuf;

use crate::egress::Egress;
use crate::git::{CLONE_BYTES_MAX_DEFAULT, CLONE_FILES_MAX_DEFAULT, GitOptions};

/// Smallest accepted `clone_bytes_max` (1 MiB).
const CLONE_BYTES_MIN: u64 = 1024 * 1024;
/// Largest accepted `clone_bytes_max` (1 TiB).
const CLONE_BYTES_LIMIT: u64 = 1024 * 1024 * 1024 * 1024;
/// Largest accepted `clone_files_max`.
const CLONE_FILES_LIMIT: u64 = 10_000_000;
/// Most local repository roots.
const ROOTS_MAX: usize = 64;

/// A setting that does not validate: its key inside the service's section
/// and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct SettingProblem {
    /// The key, e.g. `allowed_repository_hosts`.
    pub key: &'static str,
    /// What is wrong, naming the offending value when it is operator input.
    pub reason: String,
}

/// The deployment's clone settings: the `[sandbox]` section, the one place
/// they are set; the CLI hands them to setup and specialists (and
/// `allow_local_repositories` to the gateway).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CloneSettings {
    /// Accept absolute local repository paths (dev and tests).
    pub allow_local_repositories: bool,
    /// Absolute directories local repositories must be inside; at least one
    /// when local repositories are allowed.
    pub local_repository_roots: Vec<PathBuf>,
    /// Hosts on internal addresses a clone may connect to (`host`,
    /// `host:port`, `10.0.0.5`, `[fd00::5]:443`).
    pub allowed_repository_hosts: Vec<String>,
    /// Most bytes a clone may fetch, and most bytes of its tree's files.
    pub clone_bytes_max: u64,
    /// Most files in a clone's tree.
    pub clone_files_max: u64,
    /// An absolute path to a PEM bundle of the certificate authorities
    /// https repositories are verified against instead of the system's.
    pub repository_ca_file: Option<PathBuf>,
}

impl Default for CloneSettings {
    fn default() -> Self {
        Self {
            allow_local_repositories: false,
            local_repository_roots: Vec::new(),
            allowed_repository_hosts: Vec::new(),
            clone_bytes_max: CLONE_BYTES_MAX_DEFAULT,
            clone_files_max: CLONE_FILES_MAX_DEFAULT,
            repository_ca_file: None,
        }
    }
}

impl CloneSettings {
    /// Checks the settings and sets them on `options`.
    pub fn apply(&self, options: GitOptions) -> Result<GitOptions, SettingProblem> {
        let problem = |key, reason: String| SettingProblem { key, reason };
        if self.allow_local_repositories && self.local_repository_roots.is_empty() {
            return Err(problem(
                "local_repository_roots",
                "name at least one directory local repositories may be cloned from \
                 when local repositories are allowed"
                    .to_owned(),
            ));
        }
        if self.local_repository_roots.len() > ROOTS_MAX {
            return Err(problem(
                "local_repository_roots",
                format!("at most {ROOTS_MAX} directories"),
            ));
        }
        if let Some(root) = self
            .local_repository_roots
            .iter()
            .find(|root| !root.is_absolute())
        {
            return Err(problem(
                "local_repository_roots",
                format!("'{}' is not an absolute path", root.display()),
            ));
        }
        let egress = Egress::new(&self.allowed_repository_hosts)
            .map_err(|error| problem("allowed_repository_hosts", error.to_string()))?;
        if !(CLONE_BYTES_MIN..=CLONE_BYTES_LIMIT).contains(&self.clone_bytes_max) {
            return Err(problem(
                "clone_bytes_max",
                format!(
                    "must be between {CLONE_BYTES_MIN} (1 MiB) and {CLONE_BYTES_LIMIT} (1 TiB)"
                ),
            ));
        }
        if !(1..=CLONE_FILES_LIMIT).contains(&self.clone_files_max) {
            return Err(problem(
                "clone_files_max",
                format!("must be between 1 and {CLONE_FILES_LIMIT}"),
            ));
        }
        if let Some(bundle) = &self.repository_ca_file {
            check_ca_file(bundle).map_err(|reason| problem("repository_ca_file", reason))?;
        }
        Ok(GitOptions {
            repository_ca_file: self.repository_ca_file.clone(),
            allow_local_repositories: self.allow_local_repositories,
            local_repository_roots: self.local_repository_roots.clone(),
            egress,
            clone_bytes_max: self.clone_bytes_max,
            clone_files_max: self.clone_files_max,
            ..options
        })
    }
}

/// A CA bundle must be an absolute path to a readable file that holds a
/// PEM certificate: a typo fails at start, not at the first clone.
fn check_ca_file(path: &std::path::Path) -> Result<(), String> {
    if !path.is_absolute() {
        return Err(format!("'{}' is not an absolute path", path.display()));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("'{}' cannot be read: {error}", path.display()))?;
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(format!(
            "'{}' holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_and_bad_settings_name_their_key() {
        let options = CloneSettings::default()
            .apply(GitOptions::default())
            .unwrap();
        assert_eq!(options.clone_bytes_max, CLONE_BYTES_MAX_DEFAULT);
        assert!(!options.allow_local_repositories);
        let cases = [
            (
                CloneSettings {
                    allow_local_repositories: true,
                    ..CloneSettings::default()
                },
                "local_repository_roots",
            ),
            (
                CloneSettings {
                    allow_local_repositories: true,
                    local_repository_roots: vec![PathBuf::from("relative")],
                    ..CloneSettings::default()
                },
                "local_repository_roots",
            ),
            (
                CloneSettings {
                    allowed_repository_hosts: vec!["git.internal:http".to_owned()],
                    ..CloneSettings::default()
                },
                "allowed_repository_hosts",
            ),
            (
                CloneSettings {
                    clone_bytes_max: 10,
                    ..CloneSettings::default()
                },
                "clone_bytes_max",
            ),
            (
                CloneSettings {
                    clone_files_max: 0,
                    ..CloneSettings::default()
                },
                "clone_files_max",
            ),
            (
                CloneSettings {
                    repository_ca_file: Some(PathBuf::from("ca.pem")),
                    ..CloneSettings::default()
                },
                "repository_ca_file",
            ),
            (
                CloneSettings {
                    repository_ca_file: Some(PathBuf::from("/nonexistent/zopu/ca.pem")),
                    ..CloneSettings::default()
                },
                "repository_ca_file",
            ),
        ];
        for (settings, key) in cases {
            let error = settings.apply(GitOptions::default()).unwrap_err();
            assert_eq!(error.key, key, "{error}");
        }
        let error = CloneSettings {
            allowed_repository_hosts: vec!["git.internal:http".to_owned()],
            ..CloneSettings::default()
        }
        .apply(GitOptions::default())
        .unwrap_err();
        assert!(error.reason.contains("git.internal:http"), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let (empty, bundle) = (dir.path().join("empty.pem"), dir.path().join("ca.pem"));
        std::fs::write(&empty, "not a certificate\n").unwrap();
        std::fs::write(
            &bundle,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let with = |path: &PathBuf| CloneSettings {
            repository_ca_file: Some(path.clone()),
            ..CloneSettings::default()
        };
        assert!(
            with(&empty)
                .apply(GitOptions::default())
                .unwrap_err()
                .reason
                .contains("no PEM")
        );
        let options = with(&bundle).apply(GitOptions::default()).unwrap();
        assert_eq!(options.repository_ca_file, Some(bundle));
    }
}
