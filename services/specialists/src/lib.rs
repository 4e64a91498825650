//! The specialists service: the flows a project agent hands work to —
//! onboarding exploration (after `project.ready`), repository exploration,
//! issue definition (main spec Part VIII, sections 29–31) and checks (the
//! project's verified test command run confined with its environment values,
//! section 62).
//!
//! It consumes `flow.requested` and emits `flow.started`, `flow.progress`
//! (phases, tool calls, heartbeats, halts), `flow.completed` / `flow.failed`
//! / `flow.cancelled`, `context.published` (summary.md) and
//! `artifact.build.requested` (a manifest for the artifact pipeline).
//! Exploration with no model, the port every flow calls its tools and model
//! through, evidence grounding and the result types are the offline
//! answerer's (`zopu-answerer`); this crate runs the flows, records and
//! replays their steps, and owns onboarding, issues, checks and the model
//! loop.
//!
//! Invariants:
//! - One source event starts at most one run per flow type and handler
//!   version; every event of a run has a deterministic key
//!   (`flow:<flowRunId>:step:<step>`), so a run interrupted by a restart
//!   resumes from its record and never repeats a completed tool or model call.
//! - Every run goes through init → plan → act → reflect → terminate within
//!   per-phase timeouts, an iteration bound and a total timeout; the kill
//!   switch (`agent.disabled`) is checked before every step.
//! - Repository content is untrusted data: tools are read-only and
//!   allowlisted, paths stay inside the workspace, refused attempts are
//!   recorded as `agent.guardrail.triggered`, and everything emitted is
//!   passed through secret redaction.
//! - Evidence is checked against the workspace before it is presented as
//!   fact; results say which provider produced them.
//! - An instance never reads another's disk: each keeps its own workspaces
//!   and materializes a missing or stale one from the repository and commit
//!   recorded on the stream (`workspace`), checking `HEAD` before any tool
//!   runs.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod check;
pub mod config;
pub mod guard;
pub mod issue;
pub mod manifest;
pub mod model;
pub mod onboarding;
pub mod runner;
pub mod stack;
pub mod state;
pub mod workspace;

use std::sync::Arc;

pub use config::Config;
use zopu_runtime::config::{ConfigError, CoreConfig};
use zopu_runtime::{ReactionConfig, Runtime, Shutdown};
use zopu_schema::{Event, pb, subjects};

/// Why the service could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("model provider: {0}")]
    Provider(#[from] zopu_llm::Error),
    #[error(transparent)]
    Runtime(#[from] zopu_runtime::Error),
    #[error(transparent)]
    Registry(#[from] zopu_core::registry::RegistryError),
}

/// The service's name (store file, durable consumer, event source).
pub const SERVICE: &str = "specialists";

/// Builds the configured model provider (`None` for offline).
pub fn provider(config: &Config) -> Result<Option<Arc<dyn zopu_llm::Provider>>, Error> {
    match config.provider.kind {
        config::ProviderKind::Offline => Ok(None),
        config::ProviderKind::Openai => {
            let settings = &config.provider;
            let key_source = if settings.api_key_env.is_empty() {
                zopu_llm::KeySource::Unauthenticated
            } else {
                zopu_llm::KeySource::Env(settings.api_key_env.clone())
            };
            let openai = zopu_llm::OpenAiProvider::new(zopu_llm::OpenAiConfig {
                base_url: settings.base_url.clone(),
                model: settings.model.clone(),
                key_source,
                label: "openai".to_owned(),
                // One attempt never outlasts the flow's limit of the whole call.
                request_timeout: settings.request_timeout.min(config.flow.llm_timeout),
                max_retries: settings.max_retries,
                context_tokens: settings.context_tokens,
                ..Default::default()
            })?;
            Ok(Some(Arc::new(openai)))
        }
    }
}

/// The consumer of `flow.requested` for these settings.
pub fn reaction_config(config: &Config) -> ReactionConfig {
    let mut reaction = ReactionConfig::new(
        subjects::durable(SERVICE, "flows"),
        vec![subjects::events_of_type(pb::FlowRequested::TYPE)],
    );
    reaction.max_deliver = config.max_deliver;
    // The flow enforces its own total timeout; the runner's is a backstop.
    reaction.handler_timeout = config.flow.total_timeout + std::time::Duration::from_secs(60);
    reaction.max_ack_pending = 64;
    reaction
}

/// Runs the service until `shutdown`.
pub async fn run(core: CoreConfig, config: Config, shutdown: Shutdown) -> Result<(), Error> {
    config.validate()?;
    let provider = provider(&config)?;
    let registry = Arc::new(zopu_core::registry::Registry::configured(
        config.agents_dir.as_deref(),
        &core,
    )?);
    let runtime = Runtime::start_with(SERVICE, &core, shutdown.clone(), state::State).await?;
    let reaction = reaction_config(&config);
    // Which kernel layers confine programs the tools run, reported once at start.
    let confinement = zopu_sandbox::confine::Confinement::probe(&config.sandbox);
    let report = confinement.report();
    tracing::info!(
        layers = ?report.active_layers(),
        mode = ?report.mode,
        denies_network = report.denies_network(),
        "sandbox confinement"
    );
    tracing::info!(provider = %config.provider_label(), "specialists starting");
    // As in setup: credentials come from the secret store, never a URL.
    let credentials = zopu_core::secret_store::open_configured(
        &runtime.bus,
        config.secrets_key.as_ref(),
        "no stored repository credential can be used; https repositories are fetched anonymously",
    )
    .await?;
    tracing::info!(
        workspaces_root = %config.workspaces_root(&core.data_dir).display(),
        allow_local_repositories = config.repositories.allow_local_repositories,
        "specialists workspaces"
    );
    runtime.spawn_reaction(
        reaction,
        runner::FlowRunner::new(
            config,
            registry,
            core.data_dir.clone(),
            provider,
            credentials,
        ),
    );
    shutdown.cancelled().await;
    Ok(())
}
