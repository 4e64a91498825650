//! The setup service: turns `project.setup.requested` into a ready project
//! (main spec Part IV). For each setup revision it appends, in order,
//! `project.setup.started` → `project.runtime.created` (the workspace) →
//! `project.repository.cloned` (a hardened depth-1 clone of one branch,
//! verified readable) → `project.environment.scanned` (root `.env.example`
//! names) → `agent.registered` (once per project) → `project.ready`, or
//! `project.setup.failed` with a concise, actionable reason.
//!
//! `state` is the pure state machine (fold, `decide`, client status);
//! `failure` classifies errors; `reaction` does the I/O; `projection` keeps
//! revisions, runtimes and agent bindings; `client` is what the CLI and the
//! gateway call.
//!
//! Invariants: every step's event is appended under a deterministic key
//! before the next step runs, and a redelivered request resumes from the
//! recorded steps, so a crash or a repeated request never repeats a step's
//! event; `project.ready` is appended at most once per (project, revision),
//! at the project version the handler last read; no event carries a
//! credential, a URL with userinfo or an environment value that is not a
//! clear placeholder; repository input is validated before git runs and
//! before a request is appended.

pub mod client;
pub mod failure;
pub mod keys;
pub mod projection;
pub mod reaction;
pub mod state;

use std::path::{Path, PathBuf};
use std::time::Duration;

use zopu_core::secret_store::SecretStore;
use zopu_runtime::config::{ConfigError, CoreConfig};
use zopu_runtime::{ReactionConfig, Runtime, Shutdown};
use zopu_sandbox::clone_settings::CloneSettings;
use zopu_sandbox::git::{Git, GitOptions};
use zopu_sandbox::workspace::LocalWorkspaces;
use zopu_schema::{Event, pb, subjects};

pub use client::{RequestError, SetupRequest, StatusWatch, read_setup_status, request_setup};
pub use projection::{AgentBinding, SetupProjection, agent_binding, read_status};
pub use reaction::SetupReaction;
pub use state::{Failure, RevisionState, SetupPhase, SetupStatus, decide, status_from_events};

/// The service name (`zopu run setup`, source `zopu/setup`, store `setup.sqlite`).
pub const SERVICE: &str = "setup";

/// Settings of the setup service (`[setup]`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The deployment's secret-store key (from `ZOPU_SECRETS_KEY`, given by
    /// `zopu run` and `zopu dev`); `None`: https repositories are cloned anonymously.
    /// Not a setting: a secret never comes from a file or a config value.
    #[serde(skip)]
    pub secrets_key: Option<zopu_core::secret_store::SecretKey>,
    /// Directory under which `workspaces/<project>` live; a relative path
    /// is under `data_dir`; empty means `data_dir` itself.
    pub workspace_root: PathBuf,
    /// Where repositories may come from and how large a clone may be: the
    /// `[sandbox]` section's settings, given by the CLI (`zopu run`, `zopu
    /// dev`); never read from this section.
    #[serde(skip)]
    pub repositories: CloneSettings,
    /// Most projects one organization may have (a project counts once its
    /// setup started); the next create fails with `request.project_limit`.
    pub org_projects_max: u32,
    /// Wall-clock limit of one clone.
    #[serde(with = "zopu_runtime::config::duration")]
    pub clone_timeout: Duration,
    /// Wall-clock limit of every other git command.
    #[serde(with = "zopu_runtime::config::duration")]
    pub git_command_timeout: Duration,
    /// How the setup requests are consumed and retried.
    pub reaction: ReactionSettings,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            secrets_key: None,
            workspace_root: PathBuf::new(),
            repositories: CloneSettings::default(),
            org_projects_max: ORG_PROJECTS_MAX_DEFAULT,
            clone_timeout: Duration::from_secs(300),
            git_command_timeout: Duration::from_secs(30),
            reaction: ReactionSettings::default(),
        }
    }
}

/// The consumer settings (`[setup.reaction]`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReactionSettings {
    /// Waits between in-place retries of a transient failure (network,
    /// timeout); when they run out the revision fails as retryable.
    #[serde(with = "zopu_runtime::config::durations")]
    pub retry_delays: Vec<Duration>,
    /// Deliveries (crashes included) before a request is given up.
    pub max_deliver: i64,
    /// Setups in flight across projects (one at a time per project).
    pub max_ack_pending: i64,
    #[serde(with = "zopu_runtime::config::duration")]
    pub ack_wait: Duration,
    /// Upper bound of one attempt of a whole setup (clone included).
    #[serde(with = "zopu_runtime::config::duration")]
    pub handler_timeout: Duration,
}

impl Default for ReactionSettings {
    fn default() -> Self {
        Self {
            retry_delays: vec![
                Duration::from_secs(1),
                Duration::from_secs(5),
                Duration::from_secs(15),
            ],
            max_deliver: 5,
            max_ack_pending: 32,
            ack_wait: Duration::from_secs(30),
            handler_timeout: Duration::from_secs(600),
        }
    }
}

/// Default of [`Config::org_projects_max`].
pub const ORG_PROJECTS_MAX_DEFAULT: u32 = 100;
/// Largest accepted [`Config::org_projects_max`].
const ORG_PROJECTS_LIMIT: u32 = 1_000_000;

/// Most in-place retries of one transient failure.
const RETRIES_MAX: usize = 10;
/// Longest wait between two retries.
const RETRY_DELAY_MAX: Duration = Duration::from_secs(300);

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.clone_timeout < Duration::from_secs(1)
            || self.clone_timeout > Duration::from_secs(3600)
        {
            return Err(ConfigError::setting(
                "setup.clone_timeout",
                "must be between 1s and 1h",
            ));
        }
        self.repositories
            .apply(GitOptions::default())
            .map_err(|problem| {
                ConfigError::setting(format!("sandbox.{}", problem.key), problem.reason)
            })?;
        if !(1..=ORG_PROJECTS_LIMIT).contains(&self.org_projects_max) {
            return Err(ConfigError::setting(
                "setup.org_projects_max",
                format!("must be between 1 and {ORG_PROJECTS_LIMIT}"),
            ));
        }
        if self.git_command_timeout < Duration::from_secs(1)
            || self.git_command_timeout > Duration::from_secs(600)
        {
            return Err(ConfigError::setting(
                "setup.git_command_timeout",
                "must be between 1s and 10m",
            ));
        }
        let reaction = &self.reaction;
        if reaction.retry_delays.len() > RETRIES_MAX
            || reaction
                .retry_delays
                .iter()
                .any(|delay| *delay > RETRY_DELAY_MAX)
        {
            return Err(ConfigError::setting(
                "setup.reaction.retry_delays",
                format!(
                    "at most {RETRIES_MAX} delays of at most {}s each",
                    RETRY_DELAY_MAX.as_secs()
                ),
            ));
        }
        // A setup attempt runs a clone and a handful of short git commands.
        let needed = self.clone_timeout + self.git_command_timeout * 5;
        if reaction.handler_timeout < needed {
            return Err(ConfigError::setting(
                "setup.reaction.handler_timeout",
                format!(
                    "must be at least clone_timeout + 5 × git_command_timeout ({}s)",
                    needed.as_secs()
                ),
            ));
        }
        self.reaction_config().validate("setup.reaction")
    }

    /// The directory handed to the workspace provider.
    pub fn workspace_root(&self, core: &CoreConfig) -> PathBuf {
        if self.workspace_root.as_os_str().is_empty() {
            core.data_dir.clone()
        } else if self.workspace_root.is_absolute() {
            self.workspace_root.clone()
        } else {
            core.data_dir.join(&self.workspace_root)
        }
    }

    /// How git runs. Settings `validate` refuses give the closed defaults
    /// (no local repositories, no allowlist) instead.
    pub fn git_options(&self) -> GitOptions {
        let base = GitOptions {
            clone_timeout: self.clone_timeout,
            command_timeout: self.git_command_timeout,
            ..GitOptions::default()
        };
        self.repositories.apply(base.clone()).unwrap_or(base)
    }

    /// The consumer of `project.setup.requested`.
    pub fn reaction_config(&self) -> ReactionConfig {
        let settings = &self.reaction;
        ReactionConfig {
            retry_delays: settings.retry_delays.clone(),
            max_deliver: settings.max_deliver,
            max_ack_pending: settings.max_ack_pending,
            ack_wait: settings.ack_wait,
            handler_timeout: settings.handler_timeout,
            ..ReactionConfig::new(
                subjects::durable(SERVICE, "requests"),
                vec![subjects::events_of_type(pb::ProjectSetupRequested::TYPE)],
            )
        }
    }
}

/// Errors that stop the service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Runtime(#[from] zopu_runtime::Error),
}

/// The reaction `run` uses, for callers that embed setup differently. No
/// local repository is ever cloned from inside `workspace_root` (other
/// projects' workspaces) or the extra `runtime_directories` (the data
/// directory). `credentials` holds the organizations' repository tokens.
pub fn local_reaction(
    config: &Config,
    workspace_root: &Path,
    runtime_directories: &[PathBuf],
    credentials: Option<SecretStore>,
) -> SetupReaction<LocalWorkspaces> {
    let mut options = config.git_options();
    options.local_repository_excluded = std::iter::once(workspace_root.to_path_buf())
        .chain(runtime_directories.iter().cloned())
        .collect();
    let workspaces = LocalWorkspaces::new(workspace_root).with_git_options(options.clone());
    SetupReaction::new(workspaces, "local", Git::new(options), credentials)
        .with_org_projects_max(config.org_projects_max)
}

/// Runs the setup service until `shutdown`.
pub async fn run(core: CoreConfig, config: Config, shutdown: Shutdown) -> Result<(), Error> {
    config.validate()?;
    let runtime = Runtime::start_with(SERVICE, &core, shutdown.clone(), SetupProjection).await?;
    // Credentials never come from the URL: only from the secret store.
    let credentials = zopu_core::secret_store::open_configured(
        &runtime.bus,
        config.secrets_key.as_ref(),
        "no stored repository credential can be used; https repositories are cloned anonymously",
    )
    .await?;
    let root = config.workspace_root(&core);
    tracing::info!(service = SERVICE, workspace_root = %root.display(), allow_local_repositories = config.repositories.allow_local_repositories, "setup service started");
    runtime.spawn_reaction(
        config.reaction_config(),
        local_reaction(
            &config,
            &root,
            std::slice::from_ref(&core.data_dir),
            credentials,
        ),
    );
    shutdown.cancelled().await;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_settings_are_named() {
        Config::default().validate().unwrap();
        let config = Config {
            clone_timeout: Duration::from_secs(3000),
            ..Config::default()
        };
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("setup.reaction.handler_timeout"), "{error}");
        let mut config = Config::default();
        config.reaction.max_deliver = 0;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("setup.reaction.max_deliver")
        );
        let mut config = Config::default();
        config.reaction.retry_delays = vec![Duration::from_secs(3600)];
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("retry_delays")
        );
    }

    #[test]
    fn settings_load_from_toml_and_workspaces_default_to_the_data_dir() {
        let config: Config = toml::from_str(
            "clone_timeout = \"2m\"\n[reaction]\nretry_delays = [\"100ms\", \"1s\"]\n",
        )
        .unwrap();
        // The repository settings are `[sandbox]`'s, never this section's.
        assert!(toml::from_str::<Config>("allow_local_repositories = true").is_err());
        assert_eq!(config.clone_timeout, Duration::from_secs(120));
        assert_eq!(
            config.reaction_config().retry_delays,
            [Duration::from_millis(100), Duration::from_secs(1)]
        );
        assert!(toml::from_str::<Config>("allow_local = true").is_err());
        let core = CoreConfig {
            data_dir: PathBuf::from("/data"),
            ..CoreConfig::default()
        };
        assert_eq!(
            Config::default().workspace_root(&core),
            PathBuf::from("/data")
        );
        let relative = Config {
            workspace_root: PathBuf::from("ws"),
            ..Config::default()
        };
        assert_eq!(relative.workspace_root(&core), PathBuf::from("/data/ws"));
    }
}
