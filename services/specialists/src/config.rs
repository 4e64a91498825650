//! The service's settings (config section `specialists`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use zopu_runtime::config::{ConfigError, duration};
use zopu_sandbox::clone_settings::CloneSettings;
use zopu_sandbox::git::GitOptions;
use zopu_sandbox::policy::SandboxLimits;

/// Settings of the specialists service. Defaults follow the OSSA lifecycle
/// (init 30s, plan 60s, act 300s, reflect 30s, terminate 15s, 10 iterations,
/// one hour in total).
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The deployment's secret-store key (from `ZOPU_SECRETS_KEY`, given by
    /// `zopu run` and `zopu dev`); `None`: https repositories are fetched anonymously.
    /// Not a setting: a secret never comes from a file or a config value.
    #[serde(skip)]
    pub secrets_key: Option<zopu_core::secret_store::SecretKey>,
    pub flow: FlowLimits,
    pub provider: ProviderConfig,
    /// Limits of the read-only repository tools.
    pub sandbox: SandboxLimits,
    /// Directory holding this instance's `workspaces/<project>/repo`
    /// (default: `<data_dir>/specialists`; a relative path is under
    /// `data_dir`). Never shared with setup or another instance: a missing
    /// or stale workspace is materialized from the repository and commit
    /// recorded on the stream.
    pub workspaces_root: Option<PathBuf>,
    /// Where repositories may come from and how large a clone may be: the
    /// `[sandbox]` section's settings, given by the CLI (`zopu run`, `zopu
    /// dev`); never read from this section.
    #[serde(skip)]
    pub repositories: CloneSettings,
    /// Wall-clock limit of one fetch or clone when materializing a workspace.
    #[serde(with = "duration")]
    pub clone_timeout: Duration,
    /// Wall-clock limit of every other git command.
    #[serde(with = "duration")]
    pub git_command_timeout: Duration,
    /// Deliveries of one `flow.requested` (crashes included) before it is given up.
    pub max_deliver: i64,
    /// Model tokens (prompt + completion, as recorded in `agent.llm.completed`
    /// by the agent and the specialists) one organization may use per UTC
    /// day; once used up, a run's next model call is not made and the run
    /// falls back to its offline result, with a visible note naming the
    /// budget. Set it like `conversation.daily_model_tokens_per_org`.
    /// 0: no budget.
    pub daily_model_tokens_per_org: u64,
    /// The agents directory (the top-level `agents_dir`, given by the
    /// CLI; never read from this section); `None`: the registry built into
    /// the binary.
    #[serde(skip)]
    pub agents_dir: Option<std::path::PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            agents_dir: None,
            secrets_key: None,
            flow: FlowLimits::default(),
            provider: ProviderConfig::default(),
            sandbox: SandboxLimits::default(),
            workspaces_root: None,
            repositories: CloneSettings::default(),
            clone_timeout: Duration::from_secs(300),
            git_command_timeout: Duration::from_secs(30),
            max_deliver: 5,
            daily_model_tokens_per_org: 2_000_000,
        }
    }
}

/// Per-phase timeouts and run bounds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlowLimits {
    #[serde(with = "duration")]
    pub init_timeout: Duration,
    #[serde(with = "duration")]
    pub plan_timeout: Duration,
    /// Limit of one act phase (one iteration).
    #[serde(with = "duration")]
    pub act_timeout: Duration,
    #[serde(with = "duration")]
    pub reflect_timeout: Duration,
    #[serde(with = "duration")]
    pub terminate_timeout: Duration,
    /// Limit of a whole run, counted from its `flow.started`.
    #[serde(with = "duration")]
    pub total_timeout: Duration,
    /// Most plan-act-reflect cycles (model turns) of one run.
    pub max_iterations: u32,
    /// Limit of one tool call.
    #[serde(with = "duration")]
    pub tool_timeout: Duration,
    /// Limit of one model call (retries included).
    #[serde(with = "duration")]
    pub llm_timeout: Duration,
    /// Interval of `flow.progress` heartbeats while a step waits.
    #[serde(with = "duration")]
    pub heartbeat_interval: Duration,
}

impl Default for FlowLimits {
    fn default() -> Self {
        Self {
            init_timeout: Duration::from_secs(30),
            plan_timeout: Duration::from_secs(60),
            act_timeout: Duration::from_secs(300),
            reflect_timeout: Duration::from_secs(30),
            terminate_timeout: Duration::from_secs(15),
            total_timeout: Duration::from_secs(3600),
            max_iterations: 10,
            tool_timeout: Duration::from_secs(60),
            llm_timeout: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(30),
        }
    }
}

/// Which model drives the flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// Deterministic heuristics; no model.
    #[default]
    Offline,
    /// An OpenAI-compatible chat-completions endpoint with tool calling.
    Openai,
}

/// Model provider settings. The key is read from the environment variable
/// named by `api_key_env` (empty: no `Authorization`, for local endpoints).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    pub base_url: String,
    pub model: String,
    pub api_key_env: String,
    #[serde(with = "duration")]
    pub request_timeout: Duration,
    pub max_retries: u32,
    /// Completion budget of one model call.
    pub max_tokens: u32,
    /// The model's context window in tokens, which prompts and completion
    /// budgets are fitted to; 0: read it from the server.
    pub context_tokens: u32,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        Self {
            kind: ProviderKind::Offline,
            base_url: "https://api.openai.com/v1".to_owned(),
            model: "gpt-4o-mini".to_owned(),
            api_key_env: "ZOPU_LLM_API_KEY".to_owned(),
            request_timeout: Duration::from_secs(60),
            max_retries: 2,
            max_tokens: 4096,
            context_tokens: 0,
        }
    }
}

impl Config {
    /// Checks every setting; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.repositories
            .apply(GitOptions::default())
            .map_err(|problem| {
                ConfigError::setting(format!("sandbox.{}", problem.key), problem.reason)
            })?;
        let flow = &self.flow;
        let within = |key: &str, value: Duration, min: Duration, max: Duration| {
            if value < min || value > max {
                Err(ConfigError::setting(
                    format!("specialists.flow.{key}"),
                    format!(
                        "must be within {}..={}",
                        duration::format(&min),
                        duration::format(&max)
                    ),
                ))
            } else {
                Ok(())
            }
        };
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        within("init_timeout", flow.init_timeout, ms(100), s(3600))?;
        within("plan_timeout", flow.plan_timeout, ms(100), s(3600))?;
        within("act_timeout", flow.act_timeout, ms(100), s(3600))?;
        within("reflect_timeout", flow.reflect_timeout, ms(100), s(3600))?;
        within(
            "terminate_timeout",
            flow.terminate_timeout,
            ms(100),
            s(3600),
        )?;
        within("total_timeout", flow.total_timeout, s(1), s(24 * 3600))?;
        within("tool_timeout", flow.tool_timeout, ms(100), s(600))?;
        within("llm_timeout", flow.llm_timeout, ms(100), s(600))?;
        within(
            "heartbeat_interval",
            flow.heartbeat_interval,
            ms(100),
            s(600),
        )?;
        if !(1..=100).contains(&flow.max_iterations) {
            return Err(ConfigError::setting(
                "specialists.flow.max_iterations",
                "must be 1..=100",
            ));
        }
        if self.clone_timeout < s(1) || self.clone_timeout > s(3600) {
            return Err(ConfigError::setting(
                "specialists.clone_timeout",
                "must be between 1s and 1h",
            ));
        }
        if self.git_command_timeout < s(1) || self.git_command_timeout > s(600) {
            return Err(ConfigError::setting(
                "specialists.git_command_timeout",
                "must be between 1s and 10m",
            ));
        }
        if !(1..=100).contains(&self.max_deliver) {
            return Err(ConfigError::setting(
                "specialists.max_deliver",
                "must be 1..=100",
            ));
        }
        if self.daily_model_tokens_per_org > 1_000_000_000_000 {
            return Err(ConfigError::setting(
                "specialists.daily_model_tokens_per_org",
                "must be at most 1000000000000 (0 turns the budget off)",
            ));
        }
        self.sandbox.validate().map_err(|error| {
            ConfigError::setting(format!("specialists.sandbox.{}", error.key), error.reason)
        })?;
        let provider = &self.provider;
        if provider.kind == ProviderKind::Openai {
            if !(provider.base_url.starts_with("http://")
                || provider.base_url.starts_with("https://"))
            {
                return Err(ConfigError::setting(
                    "specialists.provider.base_url",
                    "must be an http(s) URL",
                ));
            }
            if provider.model.trim().is_empty() {
                return Err(ConfigError::setting(
                    "specialists.provider.model",
                    "must not be empty",
                ));
            }
            if provider.request_timeout.is_zero() || provider.request_timeout > s(600) {
                return Err(ConfigError::setting(
                    "specialists.provider.request_timeout",
                    "must be within 1ms..=600s",
                ));
            }
            if provider.max_retries > 10 {
                return Err(ConfigError::setting(
                    "specialists.provider.max_retries",
                    "must be at most 10",
                ));
            }
            if !(256..=32_768).contains(&provider.max_tokens) {
                return Err(ConfigError::setting(
                    "specialists.provider.max_tokens",
                    "must be 256..=32768",
                ));
            }
        }
        Ok(())
    }

    /// This instance's workspaces root for the core `data_dir`.
    pub fn workspaces_root(&self, data_dir: &Path) -> PathBuf {
        match &self.workspaces_root {
            Some(root) if root.is_absolute() => root.clone(),
            Some(root) => data_dir.join(root),
            None => data_dir.join(crate::SERVICE),
        }
    }

    /// How git runs when a workspace is materialized. Settings `validate`
    /// refuses give the closed defaults (no local repositories, no
    /// allowlist) instead.
    pub fn git_options(&self) -> GitOptions {
        let base = GitOptions {
            clone_timeout: self.clone_timeout,
            command_timeout: self.git_command_timeout,
            ..GitOptions::default()
        };
        self.repositories.apply(base.clone()).unwrap_or(base)
    }

    /// Longest a flow waits for its workspace: a fetch or clone and a
    /// handful of short git commands (init, config, reset, verify).
    pub fn materialize_timeout(&self) -> Duration {
        self.clone_timeout + self.git_command_timeout * 8
    }

    /// `provider` label recorded in results: `offline` or `openai:<model>`.
    pub fn provider_label(&self) -> String {
        match self.provider.kind {
            ProviderKind::Offline => "offline".to_owned(),
            ProviderKind::Openai => format!("openai:{}", self.provider.model),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_key() {
        assert!(Config::default().validate().is_ok());
        let mut config = Config::default();
        config.flow.max_iterations = 0;
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("specialists.flow.max_iterations"), "{error}");
        let mut config = Config::default();
        config.provider.kind = ProviderKind::Openai;
        config.provider.base_url = "ftp://x".into();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("specialists.provider.base_url"), "{error}");
    }

    #[test]
    fn workspaces_live_in_the_instance_data_dir_unless_configured() {
        let data = Path::new("/data");
        let mut config = Config::default();
        assert_eq!(config.workspaces_root(data), Path::new("/data/specialists"));
        config.workspaces_root = Some("ws".into());
        assert_eq!(config.workspaces_root(data), Path::new("/data/ws"));
        config.workspaces_root = Some("/srv/ws".into());
        assert_eq!(config.workspaces_root(data), Path::new("/srv/ws"));
        let mut config: Config =
            toml::from_str("clone_timeout = \"2m\"\ngit_command_timeout = \"5s\"\n").unwrap();
        // The repository settings are `[sandbox]`'s, never this section's.
        assert!(toml::from_str::<Config>("allow_local_repositories = true").is_err());
        config.repositories = CloneSettings {
            allow_local_repositories: true,
            local_repository_roots: vec!["/repos".into()],
            ..CloneSettings::default()
        };
        let options = config.git_options();
        assert!(options.allow_local_repositories);
        assert_eq!(options.clone_timeout, Duration::from_secs(120));
        assert_eq!(options.command_timeout, Duration::from_secs(5));
        let config = Config {
            clone_timeout: Duration::ZERO,
            ..Config::default()
        };
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("specialists.clone_timeout"), "{error}");
    }

    #[test]
    fn config_parses_from_toml_with_durations() {
        let config: Config = toml::from_str(
            "[flow]\nact_timeout = \"2s\"\nmax_iterations = 3\n[provider]\nkind = \"openai\"\nmodel = \"m\"\n",
        )
        .unwrap();
        assert_eq!(config.flow.act_timeout, Duration::from_secs(2));
        assert_eq!(config.provider.kind, ProviderKind::Openai);
        assert!(toml::from_str::<Config>("[flow]\nbogus = 1\n").is_err());
    }
}
