//! The whole configuration: the shared settings at the top level and one
//! section per service. Every key is documented in README.md
//! ("Configuration"); unknown keys are errors.

use std::path::PathBuf;
use std::time::Duration;

use zopu_runtime::config::{ConfigError, CoreConfig, duration};

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ZopuConfig {
    pub nats_url: String,
    pub data_dir: PathBuf,
    pub stream_replicas: usize,
    #[serde(with = "duration")]
    pub duplicate_window: Duration,
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    pub scale: zopu_runtime::config::ScaleConfig,
    /// Projection snapshots (`[snapshots]`).
    pub snapshots: zopu_runtime::config::SnapshotConfig,
    /// The agents directory (`registry.toml` and knowledge files); unset:
    /// the built-in registry (`ZOPU_AGENTS_DIR`).
    pub agents_dir: Option<PathBuf>,
    /// Where this process serves `GET /metrics` (Prometheus/OpenMetrics
    /// text), e.g. `0.0.0.0:9464`; unset (the default): no listener
    /// (`ZOPU_METRICS_LISTEN`). `zopu dev` uses `127.0.0.1:9464` unless set.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Who runs the CLI, recorded as the author of what it decides or
    /// sends (approvals, messages, the kill switch, memory, environment
    /// values, cancellations): a user id; unset: `$USER`
    /// (`ZOPU_OPERATOR`, or `--as`).
    pub operator: Option<String>,
    /// Where repositories may come from and how large a clone may be
    /// (`[sandbox]`, the one section of these settings): setup and
    /// specialists clone by them, the gateway accepts local paths by
    /// `allow_local_repositories`.
    pub sandbox: zopu_sandbox::clone_settings::CloneSettings,
    pub setup: zopu_setup::Config,
    pub dispatch: zopu_dispatch::Config,
    pub conversation: zopu_conversation::Config,
    pub specialists: zopu_specialists::Config,
    pub artifacts: zopu_artifacts::service::Config,
    pub executor: zopu_executor::Config,
    pub gateway: zopu_gateway::Config,
}

/// The operator as a user id, or the error naming the setting.
pub fn check_operator(operator: &str) -> Result<(), ConfigError> {
    if zopu_core::commands::is_valid_user_id(operator) {
        Ok(())
    } else {
        Err(ConfigError::setting(
            "operator (--as, ZOPU_OPERATOR)",
            format!(
                "{operator:?} is not a user id: 1-{} letters, digits, '.', '_', '@' or '-'",
                zopu_core::commands::USER_ID_MAX_LEN
            ),
        ))
    }
}

impl Default for ZopuConfig {
    fn default() -> Self {
        let core = CoreConfig::default();
        Self {
            nats_url: core.nats_url,
            data_dir: core.data_dir,
            stream_replicas: core.stream_replicas,
            duplicate_window: core.duplicate_window,
            shutdown_grace: core.shutdown_grace,
            scale: core.scale,
            snapshots: core.snapshots,
            agents_dir: None,
            metrics_listen: None,
            operator: None,
            sandbox: Default::default(),
            setup: Default::default(),
            dispatch: Default::default(),
            conversation: Default::default(),
            specialists: Default::default(),
            artifacts: Default::default(),
            executor: Default::default(),
            gateway: Default::default(),
        }
    }
}

impl ZopuConfig {
    pub fn core(&self) -> CoreConfig {
        CoreConfig {
            nats_url: self.nats_url.clone(),
            data_dir: self.data_dir.clone(),
            stream_replicas: self.stream_replicas,
            duplicate_window: self.duplicate_window,
            shutdown_grace: self.shutdown_grace,
            scale: self.scale.clone(),
            snapshots: self.snapshots.clone(),
            clock: zopu_runtime::Clock::system(),
        }
    }

    /// Hands the `[sandbox]` settings to the services that use them.
    pub fn resolved(mut self) -> Self {
        // Services hand paths to child processes (git) that run elsewhere.
        if let Ok(absolute) = std::path::absolute(&self.data_dir) {
            self.data_dir = absolute;
        }
        if let Some(dir) = &self.agents_dir
            && let Ok(absolute) = std::path::absolute(dir)
        {
            self.agents_dir = Some(absolute);
        }
        self.setup.repositories = self.sandbox.clone();
        self.specialists.repositories = self.sandbox.clone();
        self.gateway.allow_local_repositories = self.sandbox.allow_local_repositories;
        // The agent registry: one key, read by every service that runs or
        // checks an agent.
        self.dispatch.agents_dir = self.agents_dir.clone();
        self.conversation.agents_dir = self.agents_dir.clone();
        self.specialists.agents_dir = self.agents_dir.clone();
        self.gateway.agents_dir = self.agents_dir.clone();
        self
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.core().validate()?;
        if let Some(operator) = &self.operator {
            check_operator(operator)?;
        }
        self.setup.validate()?;
        self.dispatch.validate()?;
        self.conversation.validate()?;
        self.specialists.validate()?;
        self.artifacts.validate()?;
        self.executor.validate()?;
        self.gateway.validate()?;
        Ok(())
    }
}
