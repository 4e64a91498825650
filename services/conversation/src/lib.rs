//! The conversation service: the project's conversation agent
//! (`conversation:<org>:<project>`), a reaction on `dispatch.created`.
//!
//! One turn per dispatch: `dispatch.accepted` → restore the project's context
//! from this service's projection (binding, ready info, summary, env names,
//! recent timeline, active Work, recent artifacts, kill switch) → decide among
//! respond / clarify / explore / create issue (onboard after `project.ready`)
//! by one provider, the offline rules ([`offline::OfflineRules`]) or an
//! OpenAI-compatible model, through one pipeline → a short visible
//! reply (`agent.acknowledged`, or `agent.message` / `agent.blocked` when the
//! reply is the whole turn) → `agent.decided` → for flow-starting actions
//! `work.created`, `thread.created` and `flow.requested` → `dispatch.completed`.
//! Dispatches of a specialist's outcome or an artifact for a flow it
//! requested end in one concise `agent.final` with the artifact ids (or the
//! visible failure) and Work/Thread updates.
//!
//! Invariants:
//! - Idempotent: every write's key derives from the dispatch or flow run, so
//!   a redelivered dispatch (even beyond JetStream's duplicate window) writes
//!   nothing twice; a dispatch with a terminal state is skipped.
//! - A model reply is recorded (`agent.llm.completed`, or `agent.llm.failed`)
//!   under `dispatch:<id>:llm:<step>:<attempt>` before it is acted on, and a
//!   recorded reply is reused: the model is never asked twice for one step.
//!   The offline rules' replies are deterministic and free, so they are
//!   neither recorded nor counted against the model budget.
//! - Model output is validated strictly (exactly one known tool, exact typed
//!   arguments, short texts, no claims of changed/tested/shipped code);
//!   invalid output gets a bounded number of further calls, then one visible
//!   failure (`agent.final` with the reason and `dispatch.failed`).
//! - Boundary checks before any write: the dispatched agent is the project's
//!   agent, the source event is of the same org/project, the timeline and Work
//!   belong to the project; a failed check is `agent.rejected`, never the write.
//! - Kill switch: a disabled agent completes dispatches as `skipped_disabled`
//!   and tells the user once that it is paused. Guardrails: near-duplicate
//!   outputs are rephrased or dropped (`agent.guardrail.triggered`); one tool
//!   call per reply and `decision_attempts` model calls per dispatch; after
//!   repeated rejections it stays quiet on events nobody asked about.
//! - One turn per project at a time, decided by the log: the core runner's
//!   per-project lanes handle a project's dispatches one by one, in stream
//!   order, and a turn starts only once every turn created before it has
//!   ended (`turns`), waiting for a turn still running elsewhere (an
//!   instance that lost its partition mid-turn) and ending visibly one
//!   whose worker never finished it.

mod agent;
mod approvals;
pub mod client;
pub mod decide;
mod keys;
pub mod offline;
mod plan;
pub mod state;
mod turns;

use std::sync::Arc;
use std::time::Duration;

use zopu_core::registry::{Registry, RegistryError};
use zopu_llm::{KeySource, OpenAiConfig, OpenAiProvider, Provider};
use zopu_runtime::config::{ConfigError, CoreConfig};
use zopu_runtime::{ReactionConfig, Shutdown};
use zopu_schema::{Event, pb, subjects};

pub use agent::{Agent, FailPoint};
pub use client::{Reply, disable_agent, enable_agent, reply_to, send_message, timeline_line};
pub use state::ConversationState;

/// Service name (`zopu/conversation`, `conversation.sqlite`).
pub const SERVICE: &str = "conversation";

/// Which model provider decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Deterministic rules, no model (the default).
    #[default]
    Offline,
    /// An OpenAI-compatible chat-completions endpoint (`[conversation.openai]`).
    Openai,
}

/// `[conversation.openai]`: the OpenAI-compatible endpoint.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OpenAiSettings {
    pub base_url: String,
    pub model: String,
    /// Environment variable holding the API key (read before every call, so
    /// rotating it needs no restart); empty: no key (local endpoints).
    pub api_key_env: String,
    #[serde(with = "zopu_runtime::config::duration")]
    pub request_timeout: Duration,
    /// Retries of one call after a 429/5xx/timeout (honouring Retry-After).
    pub max_retries: u32,
    #[serde(with = "zopu_runtime::config::duration")]
    pub backoff_base: Duration,
    #[serde(with = "zopu_runtime::config::duration")]
    pub backoff_max: Duration,
    pub max_response_bytes: usize,
    /// The model's context window in tokens, which the decision prompt and
    /// its completion budget are fitted to; 0: read it from the server.
    pub context_tokens: u32,
}

impl Default for OpenAiSettings {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".into(),
            model: "gpt-4o-mini".into(),
            api_key_env: "ZOPU_LLM_API_KEY".into(),
            request_timeout: Duration::from_secs(20),
            max_retries: 2,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(10),
            max_response_bytes: 1024 * 1024,
            context_tokens: 0,
        }
    }
}

impl OpenAiSettings {
    fn client_config(&self) -> OpenAiConfig {
        OpenAiConfig {
            base_url: self.base_url.clone(),
            model: self.model.clone(),
            key_source: if self.api_key_env.is_empty() {
                KeySource::Unauthenticated
            } else {
                KeySource::Env(self.api_key_env.clone())
            },
            label: "openai".into(),
            request_timeout: self.request_timeout,
            max_retries: self.max_retries,
            backoff_base: self.backoff_base,
            backoff_max: self.backoff_max,
            max_response_bytes: self.max_response_bytes,
            context_tokens: self.context_tokens,
        }
    }
}

/// Settings of the conversation service (`[conversation]`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub provider: ProviderKind,
    pub openai: OpenAiSettings,
    /// Record, instead of doing, anything that would write outside the runtime.
    pub dry_run: bool,
    /// Model calls per dispatch (the first plus retries of invalid output).
    pub decision_attempts: u32,
    /// Tool calls accepted in one model reply.
    pub max_tool_calls: usize,
    /// Recent agent outputs compared by the near-duplicate guardrail.
    pub recent_outputs: usize,
    /// Similarity (0..1) from which an output counts as a near-duplicate.
    pub similarity_threshold: f64,
    /// Rejections in a row after which the agent backs off.
    pub rejection_backoff: u32,
    /// Turns running at once in one instance (across its projects and
    /// partitions), and dispatches delivered but unsettled per partition.
    pub max_ack_pending: i64,
    /// Deliveries of one dispatch before it is dead-lettered (and failed).
    pub max_deliver: i64,
    /// Upper bound of one turn (model calls included).
    #[serde(with = "zopu_runtime::config::duration")]
    pub handler_timeout: Duration,
    /// How long a model's decision may take before the agent posts a short
    /// holding acknowledgement of its own, so the user is never left waiting
    /// on the model (the model's reply follows; a decision within it is
    /// posted as the model wrote it). Only with a model provider.
    #[serde(with = "zopu_runtime::config::duration")]
    pub acknowledgement_deadline: Duration,
    /// Model tokens (prompt + completion, as the provider reports them, of
    /// the agent's and the specialists' calls) one organization may use per
    /// UTC day. Once used up, a message gets a visible failure
    /// (`budget.exceeded`) instead of a model call. 0: no budget.
    pub daily_model_tokens_per_org: u64,
    /// How long an approval the agent requests (publishing a drafted issue)
    /// stays open; past it, it closes as `approval.expired`.
    #[serde(with = "zopu_runtime::config::duration")]
    pub approval_ttl: Duration,
    /// How often this instance closes approvals past their expiry.
    #[serde(with = "zopu_runtime::config::duration")]
    pub approval_sweep_interval: Duration,
    /// The host whose repositories have a tracker to publish issues to
    /// (`github.com`, or a GitHub Enterprise host): a project whose
    /// repository URL is `https://<tracker_host>/<owner>/<name>` publishes
    /// there; any other project's publish approval names no repository and
    /// fails visibly when executed.
    pub tracker_host: String,
    /// Test-only crash injection; never read from configuration.
    #[serde(skip)]
    pub fail_point: Option<FailPoint>,
    /// The agents directory (the top-level `agents_dir`, given by the
    /// CLI; never read from this section); `None`: the registry built into
    /// the binary.
    #[serde(skip)]
    pub agents_dir: Option<std::path::PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            provider: ProviderKind::Offline,
            openai: OpenAiSettings::default(),
            dry_run: true,
            decision_attempts: 2,
            max_tool_calls: 1,
            recent_outputs: 5,
            similarity_threshold: 0.85,
            rejection_backoff: 3,
            max_ack_pending: 512,
            max_deliver: 5,
            handler_timeout: Duration::from_secs(300),
            acknowledgement_deadline: Duration::from_millis(1500),
            daily_model_tokens_per_org: 2_000_000,
            approval_ttl: Duration::from_secs(72 * 3600),
            approval_sweep_interval: Duration::from_secs(15),
            tracker_host: "github.com".into(),
            fail_point: None,
            agents_dir: None,
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, reason: &str| {
            Err(ConfigError::setting(format!("conversation.{key}"), reason))
        };
        if !(1..=5).contains(&self.decision_attempts) {
            return bad("decision_attempts", "must be 1..=5");
        }
        if !(1..=4).contains(&self.max_tool_calls) {
            return bad("max_tool_calls", "must be 1..=4");
        }
        if !(1..=20).contains(&self.recent_outputs) {
            return bad("recent_outputs", "must be 1..=20");
        }
        if !(0.5..=1.0).contains(&self.similarity_threshold) {
            return bad("similarity_threshold", "must be within 0.5..=1.0");
        }
        if !(1..=100).contains(&self.rejection_backoff) {
            return bad("rejection_backoff", "must be 1..=100");
        }
        if self.daily_model_tokens_per_org > 1_000_000_000_000 {
            return bad(
                "daily_model_tokens_per_org",
                "must be at most 1000000000000 (0 turns the budget off)",
            );
        }
        if self.approval_ttl < Duration::from_secs(1)
            || self.approval_ttl > Duration::from_secs(90 * 24 * 3600)
        {
            return bad("approval_ttl", "must be between 1s and 90d");
        }
        if self.approval_sweep_interval < Duration::from_millis(100)
            || self.approval_sweep_interval > Duration::from_secs(3600)
        {
            return bad("approval_sweep_interval", "must be between 100ms and 1h");
        }
        let host_ok = !self.tracker_host.is_empty()
            && self.tracker_host.len() <= 253
            && self
                .tracker_host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-:".contains(c));
        if !host_ok {
            return bad(
                "tracker_host",
                "must be a host name such as github.com (an optional :port)",
            );
        }
        self.reaction().validate(SERVICE)?;
        if self.handler_timeout < Duration::from_secs(1)
            || self.handler_timeout > Duration::from_secs(3600)
        {
            return bad("handler_timeout", "must be between 1s and 1h");
        }
        if self.acknowledgement_deadline < Duration::from_millis(100)
            || self.acknowledgement_deadline > Duration::from_secs(60)
        {
            return bad("acknowledgement_deadline", "must be between 100ms and 60s");
        }
        if self.provider == ProviderKind::Openai {
            if let Err(zopu_llm::Error::InvalidConfig { field, reason }) =
                self.openai.client_config().validate()
            {
                let key = match field {
                    "key_source" => "api_key_env",
                    other => other,
                };
                return Err(ConfigError::setting(
                    format!("conversation.openai.{key}"),
                    reason,
                ));
            }
            let worst = self
                .openai
                .request_timeout
                .saturating_mul((self.openai.max_retries + 1) * self.decision_attempts);
            if worst >= self.handler_timeout {
                return bad(
                    "handler_timeout",
                    "must exceed request_timeout × (max_retries + 1) × decision_attempts",
                );
            }
        }
        Ok(())
    }

    fn provider(&self) -> Result<Arc<dyn Provider>, Error> {
        match self.provider {
            ProviderKind::Offline => Ok(Arc::new(offline::OfflineRules)),
            ProviderKind::Openai => {
                let provider =
                    OpenAiProvider::new(self.openai.client_config()).map_err(Error::Llm)?;
                Ok(Arc::new(provider))
            }
        }
    }

    /// The agent reaction's consumer settings (benchmarks run the agent
    /// under their own wrapper with these).
    pub fn reaction(&self) -> ReactionConfig {
        ReactionConfig {
            max_ack_pending: self.max_ack_pending,
            max_deliver: self.max_deliver,
            handler_timeout: self.handler_timeout,
            ..ReactionConfig::new(
                subjects::durable(SERVICE, "dispatches"),
                vec![subjects::events_of_type(pb::DispatchCreated::TYPE)],
            )
        }
    }

    /// The agent reaction for these settings under `registry`'s conversation
    /// agent definition (benchmarks and tests run it directly).
    pub fn agent(&self, registry: Arc<Registry>) -> Result<Agent, Error> {
        Ok(Agent::new(
            registry,
            agent::Settings {
                dry_run: self.dry_run,
                decision_attempts: self.decision_attempts,
                max_tool_calls: self.max_tool_calls,
                recent_outputs: self.recent_outputs,
                similarity_threshold: self.similarity_threshold,
                rejection_backoff: self.rejection_backoff,
                daily_model_tokens_per_org: self.daily_model_tokens_per_org,
                approval_ttl: self.approval_ttl,
                acknowledgement_deadline: self.acknowledgement_deadline,
                tracker_host: self.tracker_host.to_ascii_lowercase(),
                fail_point: self.fail_point,
            },
            self.provider()?,
        ))
    }
}

/// What can stop the conversation service, or fail a client call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Core(#[from] zopu_runtime::Error),
    #[error("model provider: {0}")]
    Llm(zopu_llm::Error),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A client request that cannot be stored as given.
    #[error("invalid request: {0}")]
    Invalid(String),
}

/// Runs the conversation service until `shutdown`.
pub async fn run(core: CoreConfig, config: Config, shutdown: Shutdown) -> Result<(), Error> {
    config.validate()?;
    let agent = config.agent(Arc::new(zopu_core::registry::Registry::configured(
        config.agents_dir.as_deref(),
        &core,
    )?))?;
    let runtime =
        zopu_runtime::Runtime::start_with(SERVICE, &core, shutdown.clone(), ConversationState)
            .await?;
    runtime.spawn_reaction(config.reaction(), agent);
    shutdown.spawn(approvals::sweep_expired(
        runtime.clone(),
        config.approval_sweep_interval,
    ));
    tracing::info!(provider = ?config.provider, dry_run = config.dry_run, "conversation agent running");
    shutdown.cancelled().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_are_valid_and_errors_name_the_key() {
        assert!(Config::default().validate().is_ok());
        let error = Config {
            decision_attempts: 0,
            ..Config::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(error.contains("conversation.decision_attempts"), "{error}");
        let openai = Config {
            provider: ProviderKind::Openai,
            openai: OpenAiSettings {
                base_url: "ftp://x".into(),
                ..OpenAiSettings::default()
            },
            ..Config::default()
        };
        let error = openai.validate().unwrap_err().to_string();
        assert!(error.contains("conversation.openai.base_url"), "{error}");
    }

    #[test]
    fn config_parses_from_toml_and_refuses_unknown_keys() {
        let config: Config =
            toml_like("provider = \"openai\"\ndry_run = false\n[openai]\nmodel = \"m\"\n");
        assert_eq!(config.provider, ProviderKind::Openai);
        assert!(!config.dry_run);
        assert_eq!(config.openai.model, "m");
        assert!(serde_json::from_str::<Config>("{\"provder\": \"x\"}").is_err());
    }

    fn toml_like(text: &str) -> Config {
        // serde_json stands in for the loader: same serde attributes.
        let mut value = serde_json::Map::new();
        let mut section: Option<String> = None;
        for line in text.lines() {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = Some(name.to_owned());
                value.insert(name.to_owned(), serde_json::json!({}));
                continue;
            }
            let Some((key, raw)) = line.split_once(" = ") else {
                continue;
            };
            let parsed: serde_json::Value = serde_json::from_str(raw).unwrap();
            match &section {
                Some(name) => {
                    value[name]
                        .as_object_mut()
                        .unwrap()
                        .insert(key.to_owned(), parsed);
                }
                None => {
                    value.insert(key.to_owned(), parsed);
                }
            }
        }
        serde_json::from_value(serde_json::Value::Object(value)).unwrap()
    }
}
