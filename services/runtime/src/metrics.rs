//! The process's Prometheus metrics: one registry per process (`zopu dev`
//! runs every service in one process, so one endpoint shows them all), the
//! recording functions the services call, and the `/metrics` listener
//! (`metrics_listen`, services/cli/README.md "Configuration").
//!
//! The runtime's own families (consumers, handlers, dead letters, chain
//! refusals, invariants, appends) are defined here; the domain kernel and
//! the services add theirs through [`register`] (`zopu_core::metrics`).
//!
//! Invariants: every metric is named `zopu_<what>_<unit>` and enters the
//! process's one registry through this module, under a name no other
//! family has; labels take only values from bounded sets (service
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

use crate::shutdown::Shutdown;
use crate::{Error, invariant};

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

/// A family of histograms that share one bucket layout (its constructor):
/// how every histogram family of the process is declared.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// 1 ms to 33 s.
fn handler_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// 0.5 ms to 4 s.
fn append_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

/// A JetStream consumer whose state the scrape reads.
struct WatchedConsumer {
    stream: async_nats::jetstream::stream::Stream,
    durable: String,
}

/// Every metric of the process.
struct Metrics {
    /// The process's registry: the runtime's families, and those the
    /// domain and the services add through [`register`].
    declared: Mutex<Declared>,
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
    /// Registers `metric` as `zopu_<name>[_<unit>]`, or names the sample
    /// already taken (two families under one name would expose it twice).
    fn register<M: Metric + TypedMetric>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        metric: M,
    ) -> Result<(), String> {
        let full = match &unit {
            Some(unit) => format!("{PREFIX}_{name}_{}", unit.as_str()),
            None => format!("{PREFIX}_{name}"),
        };
        let samples: Vec<String> = sample_suffixes(M::TYPE)
            .iter()
            .map(|suffix| format!("{full}{suffix}"))
            .collect();
        if let Some(taken) = samples.iter().find(|sample| self.samples.contains(*sample)) {
            return Err(taken.clone());
        }
        self.samples.extend(samples);
        match unit {
            Some(unit) => self.registry.register_with_unit(name, help, unit, metric),
            None => self.registry.register(name, help, metric),
        }
        Ok(())
    }

    /// Registers one of the runtime's own families (unique names, checked
    /// by this module's tests).
    fn own<M: Metric + TypedMetric>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        metric: M,
    ) {
        let registered = self.register(name, help, unit, metric);
        debug_assert!(registered.is_ok(), "{registered:?}");
    }
}

/// Adds `metric` to the process's registry as `zopu_<name>[_<unit>]`: how
/// the domain kernel and the services declare their own families (model
/// calls, flows, artifacts, ...) beside the runtime's. `metric` is a handle
/// (`Family`, `Counter`, ...: clones share their values); keep a clone to
/// record into. Register each family once (a `LazyLock` of its module) and
/// have the process declare it at start-up, so a scrape shows it before its
/// first sample. A name already taken is refused
/// ([`invariant::METRIC_NAME_UNIQUE`]): the first family keeps it.
pub fn register<M: Metric + TypedMetric>(name: &str, help: &str, unit: Option<Unit>, metric: M) {
    let registered = METRICS.declared().register(name, help, unit, metric);
    if let Err(taken) = registered {
        invariant::holds(invariant::METRIC_NAME_UNIQUE, false, || {
            format!("{taken} is registered twice")
        });
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
        declared.own(
            "consumer_pending_messages",
            "Messages of the stream matching a durable consumer's filter and not yet delivered to it, read from JetStream at scrape time",
            None,
            consumer_pending.clone(),
        );
        let consumer_ack_pending = Family::<DurableLabels, Gauge>::default();
        declared.own(
            "consumer_ack_pending_messages",
            "Messages delivered to a durable consumer and not yet acknowledged, read from JetStream at scrape time",
            None,
            consumer_ack_pending.clone(),
        );
        let consumer_redelivered = Family::<DurableLabels, Gauge>::default();
        declared.own(
            "consumer_redelivered_messages",
            "Messages of a durable consumer delivered more than once and still unacknowledged, read from JetStream at scrape time",
            None,
            consumer_redelivered.clone(),
        );
        let handler_duration =
            HistogramFamily::<HandlerLabels>::new_with_constructor(handler_buckets);
        declared.own(
            "handler_duration",
            "One run of a reaction's handler on one message, by consumer, event type and outcome (ok, transient, permanent, fatal, interrupted)",
            Some(Unit::Seconds),
            handler_duration.clone(),
        );
        let dead_letters = Family::<DeadLetterLabels, Counter>::default();
        declared.own(
            "dead_letters",
            "Messages a reaction gave up on and recorded as runtime.deadletter.recorded, by reason (decode, invalid, handler, chain)",
            None,
            dead_letters.clone(),
        );
        let chain_refusals = Family::<ServiceLabels, Counter>::default();
        declared.own(
            "chain_refusals",
            "Events a service's projections refused because they do not extend their project's version/hash chain (a forgery stored without the expected sequence), counted once per service's store",
            None,
            chain_refusals.clone(),
        );
        let invariant_violations = Family::<InvariantLabels, Counter>::default();
        declared.own(
            "invariant_violations",
            "Checks of a runtime invariant that failed in a release build (debug builds assert), by invariant (e.g. reaction.partition_ownership)",
            None,
            invariant_violations.clone(),
        );
        let appends = Family::<AppendLabels, Counter>::default();
        declared.own(
            "appends",
            "Appends through the publisher, by event type and outcome (stored, duplicate, failed)",
            None,
            appends.clone(),
        );
        let append_conflict_retries = Family::<ServiceLabels, Counter>::default();
        declared.own(
            "append_conflict_retries",
            "Appends refused by the per-project optimistic-concurrency check and retried on the re-read head",
            None,
            append_conflict_retries.clone(),
        );
        let append_duration =
            HistogramFamily::<ServiceLabels>::new_with_constructor(append_buckets);
        declared.own(
            "append_duration",
            "One append through the publisher, from the call to JetStream's acknowledgement, retries included",
            Some(Unit::Seconds),
            append_duration.clone(),
        );
        Self {
            declared: Mutex::new(declared),
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
            watched: Mutex::new(HashMap::new()),
        }
    }

    fn declared(&self) -> std::sync::MutexGuard<'_, Declared> {
        self.declared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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
    let _ = prometheus_client::encoding::text::encode(&mut text, &METRICS.declared().registry);
    text
}

/// The names of every sample the process exports (`zopu_appends_total`,
/// `zopu_handler_duration_seconds_bucket`, ...), whether or not a sample
/// was recorded yet: what a dashboard may query.
pub fn exported_sample_names() -> BTreeSet<String> {
    METRICS.declared().samples.clone()
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
        ] {
            assert!(names.contains(name), "{name} missing from {names:?}");
        }
    }

    #[test]
    fn recorded_values_appear_with_their_labels_and_declared_names() {
        dead_letter("unit-test", "unit-test-consumer", "decode");
        dead_letter("unit-test", "unit-test-consumer", "decode");
        let text = encode();
        assert_eq!(
            sample(
                &text,
                r#"zopu_dead_letters_total{service="unit-test",consumer="unit-test-consumer",reason="decode"}"#
            ),
            Some(2.0)
        );
        assert!(text.ends_with("# EOF\n"));
        assert!(sample_names(&text).is_subset(&exported_sample_names()));
    }

    #[test]
    fn a_family_from_outside_is_exposed_and_its_name_is_its_own() {
        let outside = Counter::<u64>::default();
        register(
            "unit_test_outside",
            "A family registered from outside",
            None,
            outside.clone(),
        );
        outside.inc_by(3);
        assert_eq!(
            sample(&encode(), "zopu_unit_test_outside_total "),
            Some(3.0)
        );
        assert!(exported_sample_names().contains("zopu_unit_test_outside_total"));
        let mut declared = METRICS.declared();
        let again = declared.register(
            "unit_test_outside",
            "again",
            None,
            Counter::<u64>::default(),
        );
        assert_eq!(again, Err("zopu_unit_test_outside_total".to_owned()));
        let runtime_name = declared.register("appends", "again", None, Counter::<u64>::default());
        assert_eq!(runtime_name, Err("zopu_appends_total".to_owned()));
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
