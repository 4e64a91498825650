//! The process's Prometheus metrics: one registry per process (`zopu dev`
//! runs every service in one process, so one endpoint shows them all), the
//! recording functions the services call, and the `/metrics` listener
//! (`metrics_listen`, services/cli/README.md "Configuration").
//!
//! Invariants: every metric is named `zopu_<what>_<unit>` and registered
//! here, nowhere else; labels take only values from bounded sets (service
//! and durable names, catalogue event types, provider, flow and artifact
//! kinds, fixed outcome words) — never an organization, project, user text
//! or id; the JetStream consumer gauges are read from the server when
//! scraped, so they are never older than the scrape.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry, Unit};

use crate::Error;
use crate::shutdown::Shutdown;

/// Every metric's name starts with `zopu_`.
const PREFIX: &str = "zopu";

/// The path operators scrape.
pub const PATH: &str = "/metrics";

/// The exposition's content type (OpenMetrics text, which Prometheus reads).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long a scrape waits for one consumer's info from the server.
const CONSUMER_INFO_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurableLabels {
    durable: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandlerLabels {
    service: String,
    consumer: String,
    event_type: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeadLetterLabels {
    service: String,
    consumer: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InvariantLabels {
    invariant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AppendLabels {
    service: String,
    event_type: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    service: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelCallLabels {
    provider: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelTokenLabels {
    provider: String,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlowLabels {
    flow_type: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ArtifactBuildLabels {
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ArtifactValidationLabels {
    kind: &'static str,
    stage: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// 1 ms to 33 s.
fn handler_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// 0.5 ms to 4 s.
fn append_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

/// 10 ms to 82 s.
fn model_call_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

/// 100 ms to 14 min.
fn flow_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 2.0, 14))
}

/// A JetStream consumer whose state the scrape reads.
struct WatchedConsumer {
    stream: async_nats::jetstream::stream::Stream,
    durable: String,
}

/// Every metric of the process.
struct Metrics {
    registry: Registry,
    /// Every sample name the registry can expose (see [`exported_sample_names`]).
    samples: BTreeSet<String>,
    consumer_pending: Family<DurableLabels, Gauge>,
    consumer_ack_pending: Family<DurableLabels, Gauge>,
    consumer_redelivered: Family<DurableLabels, Gauge>,
    handler_duration: HistogramFamily<HandlerLabels>,
    dead_letters: Family<DeadLetterLabels, Counter>,
    chain_refusals: Family<ServiceLabels, Counter>,
    invariant_violations: Family<InvariantLabels, Counter>,
    appends: Family<AppendLabels, Counter>,
    append_conflict_retries: Family<ServiceLabels, Counter>,
    append_duration: HistogramFamily<ServiceLabels>,
    model_calls: Family<ModelCallLabels, Counter>,
    model_tokens: Family<ModelTokenLabels, Counter>,
    model_call_duration: HistogramFamily<ProviderLabels>,
    flow_duration: HistogramFamily<FlowLabels>,
    artifact_builds: Family<ArtifactBuildLabels, Counter>,
    artifact_validation_failures: Family<ArtifactValidationLabels, Counter>,
    sse_clients: Gauge,
    watched: Mutex<HashMap<u64, WatchedConsumer>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// The registry being filled, and the sample names each registration
/// declares (an empty family exposes nothing, yet a dashboard may query it).
struct Declared {
    registry: Registry,
    samples: BTreeSet<String>,
}

impl Default for Declared {
    fn default() -> Self {
        Self {
            registry: Registry::with_prefix(PREFIX),
            samples: BTreeSet::new(),
        }
    }
}

impl Declared {
    fn register<M: Metric + TypedMetric>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        metric: M,
    ) {
        let full = match &unit {
            Some(unit) => format!("{PREFIX}_{name}_{}", unit.as_str()),
            None => format!("{PREFIX}_{name}"),
        };
        for suffix in sample_suffixes(M::TYPE) {
            self.samples.insert(format!("{full}{suffix}"));
        }
        match unit {
            Some(unit) => self.registry.register_with_unit(name, help, unit, metric),
            None => self.registry.register(name, help, metric),
        }
    }
}

/// The suffixes of the samples a metric of `kind` exposes.
fn sample_suffixes(kind: MetricType) -> &'static [&'static str] {
    match kind {
        MetricType::Counter => &["_total"],
        MetricType::Histogram => &["_bucket", "_sum", "_count"],
        MetricType::Info => &["_info"],
        MetricType::Gauge | MetricType::Unknown => &[""],
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

static NEXT_WATCH: AtomicU64 = AtomicU64::new(1);

impl Metrics {
    fn new() -> Self {
        let mut declared = Declared::default();
        let consumer_pending = Family::<DurableLabels, Gauge>::default();
        declared.register(
            "consumer_pending_messages",
            "Messages of the stream matching a durable consumer's filter and not yet delivered to it, read from JetStream at scrape time",
            None,
            consumer_pending.clone(),
        );
        let consumer_ack_pending = Family::<DurableLabels, Gauge>::default();
        declared.register(
            "consumer_ack_pending_messages",
            "Messages delivered to a durable consumer and not yet acknowledged, read from JetStream at scrape time",
            None,
            consumer_ack_pending.clone(),
        );
        let consumer_redelivered = Family::<DurableLabels, Gauge>::default();
        declared.register(
            "consumer_redelivered_messages",
            "Messages of a durable consumer delivered more than once and still unacknowledged, read from JetStream at scrape time",
            None,
            consumer_redelivered.clone(),
        );
        let handler_duration =
            HistogramFamily::<HandlerLabels>::new_with_constructor(handler_buckets);
        declared.register(
            "handler_duration",
            "One run of a reaction's handler on one message, by consumer, event type and outcome (ok, transient, permanent, fatal, interrupted)",
            Some(Unit::Seconds),
            handler_duration.clone(),
        );
        let dead_letters = Family::<DeadLetterLabels, Counter>::default();
        declared.register(
            "dead_letters",
            "Messages a reaction gave up on and recorded as runtime.deadletter.recorded, by reason (decode, invalid, handler, chain)",
            None,
            dead_letters.clone(),
        );
        let chain_refusals = Family::<ServiceLabels, Counter>::default();
        declared.register(
            "chain_refusals",
            "Events a service's projections refused because they do not extend their project's version/hash chain (a forgery stored without the expected sequence), counted once per service's store",
            None,
            chain_refusals.clone(),
        );
        let invariant_violations = Family::<InvariantLabels, Counter>::default();
        declared.register(
            "invariant_violations",
            "Checks of a runtime invariant that failed in a release build (debug builds assert), by invariant (e.g. reaction.partition_ownership)",
            None,
            invariant_violations.clone(),
        );
        let appends = Family::<AppendLabels, Counter>::default();
        declared.register(
            "appends",
            "Appends through the publisher, by event type and outcome (stored, duplicate, failed)",
            None,
            appends.clone(),
        );
        let append_conflict_retries = Family::<ServiceLabels, Counter>::default();
        declared.register(
            "append_conflict_retries",
            "Appends refused by the per-project optimistic-concurrency check and retried on the re-read head",
            None,
            append_conflict_retries.clone(),
        );
        let append_duration =
            HistogramFamily::<ServiceLabels>::new_with_constructor(append_buckets);
        declared.register(
            "append_duration",
            "One append through the publisher, from the call to JetStream's acknowledgement, retries included",
            Some(Unit::Seconds),
            append_duration.clone(),
        );
        let model_calls = Family::<ModelCallLabels, Counter>::default();
        declared.register(
            "model_calls",
            "Model calls (the offline provider's decisions included), by provider and outcome (ok, error)",
            None,
            model_calls.clone(),
        );
        let model_tokens = Family::<ModelTokenLabels, Counter>::default();
        declared.register(
            "model_tokens",
            "Model tokens as the provider reported them, by provider and direction (input: prompt, output: completion)",
            None,
            model_tokens.clone(),
        );
        let model_call_duration =
            HistogramFamily::<ProviderLabels>::new_with_constructor(model_call_buckets);
        declared.register(
            "model_call_duration",
            "One model call, its retries included, by provider",
            Some(Unit::Seconds),
            model_call_duration.clone(),
        );
        let flow_duration = HistogramFamily::<FlowLabels>::new_with_constructor(flow_buckets);
        declared.register(
            "flow_duration",
            "A specialist flow run from flow.started to its terminal event, by flow type and outcome (completed, failed, cancelled)",
            Some(Unit::Seconds),
            flow_duration.clone(),
        );
        let artifact_builds = Family::<ArtifactBuildLabels, Counter>::default();
        declared.register(
            "artifact_builds",
            "Artifact builds, by artifact kind and outcome (published, failed)",
            None,
            artifact_builds.clone(),
        );
        let artifact_validation_failures = Family::<ArtifactValidationLabels, Counter>::default();
        declared.register(
            "artifact_validation_failures",
            "Rendered artifact pages that failed validation, by kind and stage (first_render: repaired once; after_repair: the build failed)",
            None,
            artifact_validation_failures.clone(),
        );
        let sse_clients = Gauge::default();
        declared.register(
            "sse_clients",
            "Live-timeline (SSE) streams open on this gateway",
            None,
            sse_clients.clone(),
        );
        Self {
            registry: declared.registry,
            samples: declared.samples,
            consumer_pending,
            consumer_ack_pending,
            consumer_redelivered,
            handler_duration,
            dead_letters,
            chain_refusals,
            invariant_violations,
            appends,
            append_conflict_retries,
            append_duration,
            model_calls,
            model_tokens,
            model_call_duration,
            flow_duration,
            artifact_builds,
            artifact_validation_failures,
            sse_clients,
            watched: Mutex::new(HashMap::new()),
        }
    }

    fn watched(&self) -> std::sync::MutexGuard<'_, HashMap<u64, WatchedConsumer>> {
        self.watched
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How one handler run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerOutcome {
    Ok,
    Transient,
    Permanent,
    Fatal,
    Interrupted,
}

impl HandlerOutcome {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Transient => "transient",
            Self::Permanent => "permanent",
            Self::Fatal => "fatal",
            Self::Interrupted => "interrupted",
        }
    }
}

/// One handler run of `consumer` (the reaction's durable, without partition)
/// on an event of `event_type`.
pub fn handler_finished(
    service: &str,
    consumer: &str,
    event_type: &str,
    outcome: HandlerOutcome,
    elapsed: Duration,
) {
    METRICS
        .handler_duration
        .get_or_create(&HandlerLabels {
            service: service.to_owned(),
            consumer: consumer.to_owned(),
            event_type: event_type.to_owned(),
            outcome: outcome.label(),
        })
        .observe(elapsed.as_secs_f64());
}

/// A message `consumer` gave up on; `reason` is the dead letter's kind
/// (`decode`, `invalid`, `handler`, `chain`).
pub fn dead_letter(service: &str, consumer: &str, reason: &str) {
    METRICS
        .dead_letters
        .get_or_create(&DeadLetterLabels {
            service: service.to_owned(),
            consumer: consumer.to_owned(),
            reason: reason.to_owned(),
        })
        .inc();
}

/// An event the projections of `service`'s store refused: it does not
/// extend its project's chain ([`crate::ledger`]).
pub fn chain_refused(service: &str) {
    METRICS
        .chain_refusals
        .get_or_create(&ServiceLabels {
            service: service.to_owned(),
        })
        .inc();
}

/// A runtime invariant that did not hold (`invariant` names it): counted,
/// so a release build that cannot stop on it still shows it.
pub fn invariant_violated(invariant: &str) {
    METRICS
        .invariant_violations
        .get_or_create(&InvariantLabels {
            invariant: invariant.to_owned(),
        })
        .inc();
}

/// How an append ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendOutcome {
    /// Stored as a new event.
    Stored,
    /// Its idempotency key was already stored: nothing written.
    Duplicate,
    Failed,
}

/// One append of `event_type` by `service`, from call to outcome.
pub fn append_finished(
    service: &str,
    event_type: &'static str,
    outcome: AppendOutcome,
    elapsed: Duration,
) {
    let outcome = match outcome {
        AppendOutcome::Stored => "stored",
        AppendOutcome::Duplicate => "duplicate",
        AppendOutcome::Failed => "failed",
    };
    METRICS
        .appends
        .get_or_create(&AppendLabels {
            service: service.to_owned(),
            event_type,
            outcome,
        })
        .inc();
    METRICS
        .append_duration
        .get_or_create(&ServiceLabels {
            service: service.to_owned(),
        })
        .observe(elapsed.as_secs_f64());
}

/// An append lost the per-project optimistic-concurrency race and is retried.
pub fn append_conflict_retried(service: &str) {
    METRICS
        .append_conflict_retries
        .get_or_create(&ServiceLabels {
            service: service.to_owned(),
        })
        .inc();
}

/// What a model call cost, as the provider reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelTokens {
    pub input: u64,
    pub output: u64,
}

/// One model call of `provider` (`offline`, `openai`): `Ok` with its
/// tokens, or `Err(())` when it failed.
pub fn model_call(provider: &str, result: Result<ModelTokens, ()>, elapsed: Duration) {
    let outcome = if result.is_ok() { "ok" } else { "error" };
    METRICS
        .model_calls
        .get_or_create(&ModelCallLabels {
            provider: provider.to_owned(),
            outcome,
        })
        .inc();
    METRICS
        .model_call_duration
        .get_or_create(&ProviderLabels {
            provider: provider.to_owned(),
        })
        .observe(elapsed.as_secs_f64());
    if let Ok(tokens) = result {
        for (direction, count) in [("input", tokens.input), ("output", tokens.output)] {
            METRICS
                .model_tokens
                .get_or_create(&ModelTokenLabels {
                    provider: provider.to_owned(),
                    direction,
                })
                .inc_by(count);
        }
    }
}

/// A flow run of `flow_type` ended with `outcome` (`completed`, `failed`,
/// `cancelled`) after `elapsed` since its `flow.started`.
pub fn flow_finished(flow_type: &'static str, outcome: &'static str, elapsed: Duration) {
    METRICS
        .flow_duration
        .get_or_create(&FlowLabels { flow_type, outcome })
        .observe(elapsed.as_secs_f64());
}

/// An artifact build of `kind` ended with `outcome` (`published`, `failed`).
pub fn artifact_build(kind: &'static str, outcome: &'static str) {
    METRICS
        .artifact_builds
        .get_or_create(&ArtifactBuildLabels { kind, outcome })
        .inc();
}

/// A rendered page of `kind` failed validation at `stage` (`first_render`,
/// `after_repair`).
pub fn artifact_validation_failed(kind: &'static str, stage: &'static str) {
    METRICS
        .artifact_validation_failures
        .get_or_create(&ArtifactValidationLabels { kind, stage })
        .inc();
}

/// One open live-timeline stream; the gauge counts it until dropped.
#[derive(Debug)]
pub struct SseClient(());

impl SseClient {
    pub fn connected() -> Self {
        METRICS.sse_clients.inc();
        Self(())
    }
}

impl Drop for SseClient {
    fn drop(&mut self) {
        METRICS.sse_clients.dec();
    }
}

/// Durable consumers whose pending, ack-pending and redelivered counts the
/// scrape reads, for as long as this value lives (a reaction holds it while
/// it runs).
#[derive(Debug)]
pub struct ConsumerWatch {
    ids: Vec<u64>,
}

/// Watches `durables` of `stream` until the returned value is dropped.
pub fn watch_consumers(
    stream: &async_nats::jetstream::stream::Stream,
    durables: impl IntoIterator<Item = String>,
) -> ConsumerWatch {
    let mut watched = METRICS.watched();
    let ids = durables
        .into_iter()
        .map(|durable| {
            let id = NEXT_WATCH.fetch_add(1, Ordering::Relaxed);
            watched.insert(
                id,
                WatchedConsumer {
                    stream: stream.clone(),
                    durable,
                },
            );
            id
        })
        .collect();
    ConsumerWatch { ids }
}

impl Drop for ConsumerWatch {
    fn drop(&mut self) {
        let mut watched = METRICS.watched();
        for id in &self.ids {
            let Some(gone) = watched.remove(id) else {
                continue;
            };
            if !watched.values().any(|other| other.durable == gone.durable) {
                let labels = DurableLabels {
                    durable: gone.durable,
                };
                METRICS.consumer_pending.remove(&labels);
                METRICS.consumer_ack_pending.remove(&labels);
                METRICS.consumer_redelivered.remove(&labels);
            }
        }
    }
}

/// Reads every watched consumer's state from JetStream into the gauges. A
/// consumer that does not answer in time (or does not exist yet: a
/// partition nobody worked) keeps its last values.
async fn refresh_consumers() {
    let watched: Vec<(async_nats::jetstream::stream::Stream, String)> = METRICS
        .watched()
        .values()
        .map(|consumer| (consumer.stream.clone(), consumer.durable.clone()))
        .collect();
    let reads = watched.into_iter().map(|(stream, durable)| async move {
        let info =
            tokio::time::timeout(CONSUMER_INFO_TIMEOUT, stream.consumer_info(&durable)).await;
        (durable, info)
    });
    for (durable, info) in futures::future::join_all(reads).await {
        match info {
            Ok(Ok(info)) => {
                let labels = DurableLabels { durable };
                METRICS
                    .consumer_pending
                    .get_or_create(&labels)
                    .set(gauge_value(info.num_pending));
                METRICS
                    .consumer_ack_pending
                    .get_or_create(&labels)
                    .set(gauge_value(info.num_ack_pending as u64));
                METRICS
                    .consumer_redelivered
                    .get_or_create(&labels)
                    .set(gauge_value(info.num_redelivered as u64));
            }
            Ok(Err(error)) => tracing::debug!(%durable, %error, "consumer info not readable"),
            Err(_) => tracing::debug!(%durable, "consumer info timed out"),
        }
    }
}

fn gauge_value(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// The exposition of every metric of the process (OpenMetrics text), with
/// the consumer gauges read from JetStream first.
pub async fn render() -> String {
    refresh_consumers().await;
    encode()
}

/// The exposition as the registry holds it now, the consumer gauges as last
/// read.
pub fn encode() -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &METRICS.registry);
    text
}

/// The names of every sample the process exports (`zopu_appends_total`,
/// `zopu_handler_duration_seconds_bucket`, ...), whether or not a sample
/// was recorded yet: what a dashboard may query.
pub fn exported_sample_names() -> BTreeSet<String> {
    METRICS.samples.clone()
}

/// Sample names declared by the `# TYPE` lines of an exposition.
pub fn sample_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        let Some(declaration) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = declaration.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        let kind = match kind {
            "counter" => MetricType::Counter,
            "histogram" => MetricType::Histogram,
            "info" => MetricType::Info,
            "gauge" => MetricType::Gauge,
            _ => MetricType::Unknown,
        };
        for suffix in sample_suffixes(kind) {
            names.insert(format!("{name}{suffix}"));
        }
    }
    names
}

/// The value of the first sample of an exposition whose line starts with
/// `series` (a name, with its labels for an exact series:
/// `zopu_append_conflict_retries_total{service="dispatch"}`).
pub fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// A bound `/metrics` listener.
#[derive(Debug)]
pub struct Server {
    listener: tokio::net::TcpListener,
}

impl Server {
    /// Binds `address` (port 0 picks a free one).
    pub async fn bind(address: SocketAddr) -> Result<Self, Error> {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|source| Error::MetricsListen { address, source })?;
        Ok(Self { listener })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> Result<SocketAddr, Error> {
        self.listener
            .local_addr()
            .map_err(|source| Error::MetricsListen {
                address: SocketAddr::from(([0, 0, 0, 0], 0)),
                source,
            })
    }

    /// Serves `GET /metrics` until shutdown.
    pub async fn serve(self, shutdown: Shutdown) -> Result<(), Error> {
        let address = self.local_addr()?;
        tracing::info!(%address, path = PATH, "metrics listening");
        let app = axum::Router::new().route(PATH, axum::routing::get(scrape));
        axum::serve(self.listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
            .map_err(|source| Error::MetricsListen { address, source })
    }
}

async fn scrape() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)],
        render().await,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_declared_before_anything_is_recorded() {
        let names = exported_sample_names();
        for name in [
            "zopu_consumer_pending_messages",
            "zopu_consumer_ack_pending_messages",
            "zopu_consumer_redelivered_messages",
            "zopu_handler_duration_seconds_bucket",
            "zopu_handler_duration_seconds_count",
            "zopu_dead_letters_total",
            "zopu_chain_refusals_total",
            "zopu_invariant_violations_total",
            "zopu_appends_total",
            "zopu_append_conflict_retries_total",
            "zopu_append_duration_seconds_sum",
            "zopu_model_calls_total",
            "zopu_model_tokens_total",
            "zopu_model_call_duration_seconds_bucket",
            "zopu_flow_duration_seconds_count",
            "zopu_artifact_builds_total",
            "zopu_artifact_validation_failures_total",
            "zopu_sse_clients",
        ] {
            assert!(names.contains(name), "{name} missing from {names:?}");
        }
    }

    #[test]
    fn recorded_values_appear_with_their_labels() {
        model_call(
            "unit-test-provider",
            Ok(ModelTokens {
                input: 120,
                output: 30,
            }),
            Duration::from_millis(40),
        );
        model_call("unit-test-provider", Err(()), Duration::from_millis(5));
        let text = encode();
        assert_eq!(
            sample(
                &text,
                r#"zopu_model_calls_total{provider="unit-test-provider",outcome="ok"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"zopu_model_calls_total{provider="unit-test-provider",outcome="error"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"zopu_model_tokens_total{provider="unit-test-provider",direction="input"}"#
            ),
            Some(120.0)
        );
        assert_eq!(
            sample(
                &text,
                r#"zopu_model_call_duration_seconds_count{provider="unit-test-provider"}"#
            ),
            Some(2.0)
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn an_sse_client_counts_while_it_is_open() {
        let value = || sample(&encode(), "zopu_sse_clients ").unwrap();
        let before = value();
        let client = SseClient::connected();
        assert_eq!(value(), before + 1.0);
        drop(client);
        assert_eq!(value(), before);
    }

    #[test]
    fn the_declared_names_are_what_the_exposition_shows_once_recorded() {
        flow_finished("unit_test_flow", "completed", Duration::from_secs(3));
        let exposed = sample_names(&encode());
        assert!(exposed.contains("zopu_flow_duration_seconds_bucket"));
        assert!(exposed.is_subset(&exported_sample_names()), "{exposed:?}");
    }

    #[test]
    fn sample_names_follow_the_type_declarations() {
        let names =
            sample_names("# TYPE a counter\n# TYPE b histogram\n# TYPE c gauge\n# HELP d x\nd 1\n");
        let expected: Vec<&str> = vec!["a_total", "b_bucket", "b_count", "b_sum", "c"];
        assert_eq!(
            names.iter().map(String::as_str).collect::<Vec<_>>(),
            expected
        );
    }
}
