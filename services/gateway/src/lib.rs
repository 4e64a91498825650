//! The gateway: the only crate that speaks HTTP to users.
//!
//! It serves the versioned public API under `/v1/` (create a project from a
//! repository, setup status and retry, timeline messages and card actions,
//! the global and Work timelines, Works and Threads, artifacts, the project
//! summary, the agent kill switch), a live timeline over Server-Sent Events,
//! `/openapi.json` generated from the handlers themselves, and a small web
//! timeline (server-rendered shell + one hand-written script).
//!
//! Invariants: the gateway appends only root events a user asked for
//! (`project.setup.requested`, `timeline.message.sent`, `timeline.action.sent`,
//! `agent.disabled` / `agent.enabled`), each built by `zopu_core::commands`
//! (as the CLI's are) with the request id as its correlation id and an
//! idempotency key derived from project and request id. The routes live in
//! `api`, one module per resource.
//! Everything it reads comes from its own projection (rebuilt from the
//! stream) or the artifact object store (digest verified before serving).
//! Every request is authenticated by an operator-issued bearer token,
//! needs the token's `read`, `write` or `admin` scope (403 naming it
//! otherwise), is held to per-token and per-organization quotas (429 with
//! `Retry-After`), and is scoped to the token's organization: another organization's project, Work,
//! Thread or artifact is a 404, indistinguishable from one that does not
//! exist. Tokens are stored hashed in a replicated key-value bucket, outside
//! the event log, and never logged. No instance keeps state another needs:
//! tokens live in that bucket and the key of signed artifact links comes
//! from the environment, so any number of gateways serve the same users.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use zopu_runtime::config::{ConfigError, CoreConfig, duration};
use zopu_runtime::{Runtime, Shutdown};

pub mod agent_keys;
pub mod api;
pub mod changes;
pub mod history;
pub mod http;
pub mod links;
pub mod quotas;
pub mod read_model;
pub mod revocations;
pub mod sse;
pub mod tickets;
pub mod tokens;
pub mod views;
pub mod web;

pub use api::router;
pub use links::LinkKey;
pub use tokens::TokenStore;

/// Gateway settings (`[gateway]`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The deployment's secret-store key (from `ZOPU_SECRETS_KEY`, given by
    /// `zopu run` and `zopu dev`); `None`: environment values and repository credentials cannot be stored.
    /// Not a setting: a secret never comes from a file or a config value.
    #[serde(skip)]
    pub secrets_key: Option<zopu_core::secret_store::SecretKey>,
    /// Address the HTTP server listens on.
    pub listen: SocketAddr,
    /// Largest accepted request body; larger bodies get 413.
    pub body_max_bytes: usize,
    /// Interval of SSE keep-alive comments.
    #[serde(with = "duration")]
    pub sse_keepalive: Duration,
    /// Most concurrent SSE connections; more get 503.
    pub sse_clients_max: usize,
    /// Most concurrent SSE connections of one token; more get 429.
    pub sse_clients_per_token_max: usize,
    /// Timeline messages and card actions one token may send per minute (burst up to it).
    pub messages_per_minute_per_token: u32,
    /// Timeline messages and card actions one organization may send per minute, all tokens together.
    pub messages_per_minute_per_org: u32,
    /// Projects one token may create per hour.
    pub projects_per_hour_per_token: u32,
    /// Projects one organization may create per hour, all tokens together.
    pub projects_per_hour_per_org: u32,
    /// Most items one timeline page (or SSE batch) returns.
    pub timeline_page_max: usize,
    /// Reads of a project's history (`/events/{id}/why`, `/history`) this
    /// instance runs at once, each a replay of the project's events; more
    /// get 429 with `Retry-After`.
    pub history_reads_max: usize,
    /// Origins allowed by CORS; empty (the default) turns CORS off.
    pub cors_allowed_origins: Vec<String>,
    /// Accept absolute local repository paths in `POST /v1/projects` (dev
    /// only): `sandbox.allow_local_repositories`, given by the CLI; never
    /// read from this section.
    #[serde(skip)]
    pub allow_local_repositories: bool,
    /// Largest artifact or summary blob served.
    pub artifact_max_bytes: u64,
    /// Lifetime of a signed artifact link (`GET /v1/artifacts/{id}/link`).
    #[serde(with = "duration")]
    pub artifact_link_ttl: Duration,
    /// Environment variable holding the key that signs artifact links (at
    /// least 32 bytes, the same on every gateway instance). Required: the
    /// gateway does not start without it (`zopu dev` generates one).
    pub link_key_env: String,
    /// Limit on waiting for NATS (appends, object reads) within one request.
    #[serde(with = "duration")]
    pub request_timeout: Duration,
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
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            body_max_bytes: 64 * 1024,
            sse_keepalive: Duration::from_secs(15),
            sse_clients_max: 1000,
            sse_clients_per_token_max: 10,
            messages_per_minute_per_token: 60,
            messages_per_minute_per_org: 300,
            projects_per_hour_per_token: 30,
            projects_per_hour_per_org: 100,
            timeline_page_max: 500,
            history_reads_max: 4,
            cors_allowed_origins: Vec::new(),
            allow_local_repositories: false,
            artifact_max_bytes: 8 * 1024 * 1024,
            artifact_link_ttl: Duration::from_secs(300),
            link_key_env: links::DEFAULT_LINK_KEY_ENV.to_owned(),
            request_timeout: Duration::from_secs(10),
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1024..=16 * 1024 * 1024).contains(&self.body_max_bytes) {
            return Err(ConfigError::setting(
                "gateway.body_max_bytes",
                "must be between 1024 and 16777216",
            ));
        }
        if self.sse_keepalive < Duration::from_secs(1)
            || self.sse_keepalive > Duration::from_secs(300)
        {
            return Err(ConfigError::setting(
                "gateway.sse_keepalive",
                "must be between 1s and 300s",
            ));
        }
        if self.sse_clients_max == 0 {
            return Err(ConfigError::setting(
                "gateway.sse_clients_max",
                "must be at least 1",
            ));
        }
        if !(1..=self.sse_clients_max).contains(&self.sse_clients_per_token_max) {
            return Err(ConfigError::setting(
                "gateway.sse_clients_per_token_max",
                "must be between 1 and gateway.sse_clients_max",
            ));
        }
        for (key, value) in [
            (
                "gateway.messages_per_minute_per_token",
                self.messages_per_minute_per_token,
            ),
            (
                "gateway.messages_per_minute_per_org",
                self.messages_per_minute_per_org,
            ),
            (
                "gateway.projects_per_hour_per_token",
                self.projects_per_hour_per_token,
            ),
            (
                "gateway.projects_per_hour_per_org",
                self.projects_per_hour_per_org,
            ),
        ] {
            if !(1..=1_000_000).contains(&value) {
                return Err(ConfigError::setting(key, "must be between 1 and 1000000"));
            }
        }
        if !(1..=256).contains(&self.history_reads_max) {
            return Err(ConfigError::setting(
                "gateway.history_reads_max",
                "must be between 1 and 256",
            ));
        }
        if !(1..=10_000).contains(&self.timeline_page_max) {
            return Err(ConfigError::setting(
                "gateway.timeline_page_max",
                "must be between 1 and 10000",
            ));
        }
        if self.artifact_max_bytes == 0 || self.artifact_max_bytes > 64 * 1024 * 1024 {
            return Err(ConfigError::setting(
                "gateway.artifact_max_bytes",
                "must be between 1 and 67108864",
            ));
        }
        if self.artifact_link_ttl < Duration::from_secs(10)
            || self.artifact_link_ttl > Duration::from_secs(3600)
        {
            return Err(ConfigError::setting(
                "gateway.artifact_link_ttl",
                "must be between 10s and 1h",
            ));
        }
        let env_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
        if self.link_key_env.is_empty()
            || !self.link_key_env.chars().all(env_name)
            || self.link_key_env.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(ConfigError::setting(
                "gateway.link_key_env",
                "must name an environment variable (letters, digits and '_')",
            ));
        }
        if self.link_key_env.starts_with("ZOPU_")
            && !zopu_runtime::config::NON_SETTING_VARIABLES.contains(&self.link_key_env.as_str())
        {
            return Err(ConfigError::setting(
                "gateway.link_key_env",
                format!(
                    "{} would be read as a ZOPU_ setting: use {} or a name without the ZOPU_ prefix",
                    self.link_key_env,
                    links::DEFAULT_LINK_KEY_ENV
                ),
            ));
        }
        if self.request_timeout < Duration::from_millis(100) {
            return Err(ConfigError::setting(
                "gateway.request_timeout",
                "must be at least 100ms",
            ));
        }
        for origin in &self.cors_allowed_origins {
            if axum::http::HeaderValue::from_str(origin).is_err()
                || !(origin.starts_with("http://") || origin.starts_with("https://"))
            {
                return Err(ConfigError::setting(
                    "gateway.cors_allowed_origins",
                    format!("{origin:?} is not an http(s) origin"),
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Core(#[from] zopu_runtime::Error),
    #[error(transparent)]
    Tokens(#[from] tokens::TokenError),
    #[error(transparent)]
    LinkKey(#[from] links::LinkKeyError),
    #[error(transparent)]
    AgentKeys(#[from] agent_keys::AgentKeyError),
    #[error(transparent)]
    Registry(#[from] zopu_core::registry::RegistryError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP server: {0}")]
    Serve(std::io::Error),
}

/// Everything a request handler needs. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub runtime: Runtime,
    pub reads: read_model::ReadPool,
    /// The artifact bucket, opened once (opening it is a server request).
    pub artifacts: ArtifactBucket,
    pub tokens: TokenStore,
    pub tickets: tickets::TicketStore,
    pub config: Arc<Config>,
    /// Rate limits and per-token stream caps of this instance.
    pub quotas: Arc<quotas::Quotas>,
    /// Which project the projection just changed (wakes its live streams only).
    pub changes: changes::ProjectChanges,
    /// Read-model queries the live streams of this instance ran (a measure
    /// of how often streams wake).
    pub sse_reads: Arc<std::sync::atomic::AtomicU64>,
    /// The key of signed artifact links, shared by every gateway instance.
    pub(crate) link_key: LinkKey,
    /// The secret store of environment values; `None` when the process has
    /// no `ZOPU_SECRETS_KEY` (the environment routes answer 503, naming it).
    pub secrets: Option<zopu_core::secret_store::SecretStore>,
    /// The Agent API's keys and the registry its agents are defined in;
    /// `None` in a state built without them (its routes answer 503).
    pub agent_api: Option<AgentApi>,
    /// The tokens with open live streams here, ended when a token is revoked.
    pub revocations: revocations::Revocations,
    sse_clients: Arc<AtomicUsize>,
}

/// What the Agent API (`/v1/agent/...`) checks its callers against.
#[derive(Debug, Clone)]
pub struct AgentApi {
    pub keys: agent_keys::AgentKeyStore,
    /// The agent registry as this gateway loaded it at start.
    pub registry: Arc<zopu_core::registry::Registry>,
}

/// The opened `zopu-artifacts` object store.
#[derive(Clone)]
pub struct ArtifactBucket(pub async_nats::jetstream::object_store::ObjectStore);

impl std::fmt::Debug for ArtifactBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(zopu_schema::subjects::ARTIFACTS_BUCKET)
    }
}

impl AppState {
    pub fn new(
        runtime: Runtime,
        artifacts: ArtifactBucket,
        tokens: TokenStore,
        tickets: tickets::TicketStore,
        changes: changes::ProjectChanges,
        link_key: LinkKey,
        config: Config,
    ) -> Self {
        let reads = read_model::ReadPool::new(runtime.store.path(), 64);
        Self {
            runtime,
            reads,
            artifacts,
            tokens,
            tickets,
            quotas: Arc::new(quotas::Quotas::new(&config)),
            changes,
            sse_reads: Arc::default(),
            config: Arc::new(config),
            link_key,
            secrets: None,
            agent_api: None,
            revocations: revocations::Revocations::default(),
            sse_clients: Arc::new(AtomicUsize::new(0)),
        }
    }
}

/// Starts the gateway's runtime and projection and opens the token bucket
/// and the artifact bucket; does not listen yet (see [`serve`]).
pub async fn start(
    core: &CoreConfig,
    config: Config,
    link_key: LinkKey,
    shutdown: Shutdown,
) -> Result<AppState, Error> {
    config.validate()?;
    let changes = changes::ProjectChanges::default();
    let projection = changes::NotifyingProjection::new(changes.clone());
    let runtime = Runtime::start_with("gateway", core, shutdown, projection).await?;
    let tokens = TokenStore::open(&runtime.bus.jetstream)
        .await?
        .with_clock(runtime.clock.clone());
    let tickets = tickets::TicketStore::open(&runtime.bus.jetstream)
        .await?
        .with_clock(runtime.clock.clone());
    let artifacts = zopu_runtime::nats::object_store(
        &runtime.bus.jetstream,
        zopu_schema::subjects::ARTIFACTS_BUCKET,
    )
    .await
    .map_err(|error| zopu_runtime::Error::jetstream("open the artifact bucket", error))?;
    let secrets = zopu_core::secret_store::open_configured(
        &runtime.bus,
        config.secrets_key.as_ref(),
        "environment values and repository credentials cannot be stored (their routes answer 503)",
    )
    .await?;
    let mut state = AppState::new(
        runtime,
        ArtifactBucket(artifacts),
        tokens,
        tickets,
        changes,
        link_key,
        config,
    );
    state.secrets = secrets;
    let registry = zopu_core::registry::Registry::load(state.config.agents_dir.as_deref(), None)?;
    let keys = agent_keys::AgentKeyStore::open(&state.runtime.bus.jetstream)
        .await?
        .with_clock(state.runtime.clock.clone());
    state.agent_api = Some(AgentApi {
        keys,
        registry: Arc::new(registry),
    });
    let shutdown = state.runtime.shutdown.clone();
    shutdown.spawn(revocations::run(
        state.tokens.clone(),
        state.revocations.clone(),
        shutdown.clone(),
    ));
    Ok(state)
}

/// Serves the router on `listener` until shutdown (open SSE streams end on shutdown).
pub async fn serve(state: AppState, listener: tokio::net::TcpListener) -> Result<(), Error> {
    let shutdown = state.runtime.shutdown.clone();
    let address = listener.local_addr().ok();
    tracing::info!(address = ?address, "gateway listening");
    let app = router(state);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move { shutdown.cancelled().await })
    .await
    .map_err(Error::Serve)
}

/// Runs the gateway until `shutdown`, with the link key from the
/// environment variable `gateway.link_key_env` names (an error naming the
/// variable if it is not set, before anything connects).
pub async fn run(core: CoreConfig, config: Config, shutdown: Shutdown) -> Result<(), Error> {
    config.validate()?;
    let link_key = LinkKey::from_env(&config.link_key_env)?;
    run_with(core, config, link_key, shutdown).await
}

/// Runs the gateway until `shutdown` with the given link key.
pub async fn run_with(
    core: CoreConfig,
    config: Config,
    link_key: LinkKey,
    shutdown: Shutdown,
) -> Result<(), Error> {
    let listen = config.listen;
    let state = start(&core, config, link_key, shutdown.clone()).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| Error::Bind {
            addr: listen,
            source,
        })?;
    serve(state, listener).await?;
    shutdown.cancelled().await;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid_and_bad_values_are_named() {
        Config::default().validate().unwrap();
        let bad = Config {
            body_max_bytes: 10,
            ..Config::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("gateway.body_max_bytes")
        );
        let bad = Config {
            cors_allowed_origins: vec!["nope".into()],
            ..Config::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("gateway.cors_allowed_origins")
        );
        for name in ["NOT-A-VARIABLE", "", "ZOPU_GATEWAY__KEY"] {
            let bad = Config {
                link_key_env: name.into(),
                ..Config::default()
            };
            assert!(
                bad.validate()
                    .unwrap_err()
                    .to_string()
                    .contains("gateway.link_key_env"),
                "{name}"
            );
        }
        let custom = Config {
            link_key_env: "GATEWAY_LINK_KEY".into(),
            ..Config::default()
        };
        custom.validate().unwrap();
    }
}
