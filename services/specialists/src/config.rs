//! The service's settings (config section `specialists`).

use std::path::PathBuf;
use std::time::Duration;

use zopu_core::config::{ConfigError, duration};
use zopu_sandbox::policy::SandboxLimits;

/// Settings of the specialists service. Defaults follow the OSSA lifecycle
/// (init 30s, plan 60s, act 300s, reflect 30s, terminate 15s, 10 iterations,
/// one hour in total).
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub flow: FlowLimits,
    pub provider: ProviderConfig,
    /// Limits of the read-only repository tools.
    pub sandbox: SandboxLimits,
    /// Directory holding `workspaces/<project>/repo` (default: the core data dir).
    pub workspaces_root: Option<PathBuf>,
    /// Deliveries of one `flow.requested` (crashes included) before it is given up.
    pub max_deliver: i64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            flow: FlowLimits::default(),
            provider: ProviderConfig::default(),
            sandbox: SandboxLimits::default(),
            workspaces_root: None,
            max_deliver: 5,
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
        }
    }
}

impl Config {
    /// Checks every setting; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
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
        if !(1..=100).contains(&self.max_deliver) {
            return Err(ConfigError::setting(
                "specialists.max_deliver",
                "must be 1..=100",
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
