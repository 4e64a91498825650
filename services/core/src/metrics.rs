//! The domain's metric families: model calls and their tokens, specialist
//! flows, artifact builds and validations, open live-timeline streams. They
//! enter the process's one registry through `zopu_runtime::metrics::register`
//! the first time anything here records, or when a process [`declare`]s them
//! at start-up (so a scrape shows every family before its first sample).
//!
//! Invariant (as for the runtime's families): labels take only values from
//! bounded sets — provider, flow type, artifact kind, fixed outcome words —
//! never an organization, project, user text or id.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Unit;
use zopu_runtime::metrics::{HistogramFamily, register};

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

/// 10 ms to 82 s.
fn model_call_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

/// 100 ms to 14 min.
fn flow_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 2.0, 14))
}

/// The domain's families, registered once.
struct DomainMetrics {
    model_calls: Family<ModelCallLabels, Counter>,
    model_tokens: Family<ModelTokenLabels, Counter>,
    model_call_duration: HistogramFamily<ProviderLabels>,
    flow_duration: HistogramFamily<FlowLabels>,
    artifact_builds: Family<ArtifactBuildLabels, Counter>,
    artifact_validation_failures: Family<ArtifactValidationLabels, Counter>,
    sse_clients: Gauge,
}

static METRICS: LazyLock<DomainMetrics> = LazyLock::new(DomainMetrics::register);

impl DomainMetrics {
    fn register() -> Self {
        let metrics = Self {
            model_calls: Family::default(),
            model_tokens: Family::default(),
            model_call_duration: HistogramFamily::new_with_constructor(model_call_buckets),
            flow_duration: HistogramFamily::new_with_constructor(flow_buckets),
            artifact_builds: Family::default(),
            artifact_validation_failures: Family::default(),
            sse_clients: Gauge::default(),
        };
        register(
            "model_calls",
            "Model calls (the offline provider's decisions included), by provider and outcome (ok, error)",
            None,
            metrics.model_calls.clone(),
        );
        register(
            "model_tokens",
            "Model tokens as the provider reported them, by provider and direction (input: prompt, output: completion)",
            None,
            metrics.model_tokens.clone(),
        );
        register(
            "model_call_duration",
            "One model call, its retries included, by provider",
            Some(Unit::Seconds),
            metrics.model_call_duration.clone(),
        );
        register(
            "flow_duration",
            "A specialist flow run from flow.started to its terminal event, by flow type and outcome (completed, failed, cancelled)",
            Some(Unit::Seconds),
            metrics.flow_duration.clone(),
        );
        register(
            "artifact_builds",
            "Artifact builds, by artifact kind and outcome (published, failed)",
            None,
            metrics.artifact_builds.clone(),
        );
        register(
            "artifact_validation_failures",
            "Rendered artifact pages that failed validation, by kind and stage (first_render: repaired once; after_repair: the build failed)",
            None,
            metrics.artifact_validation_failures.clone(),
        );
        register(
            "sse_clients",
            "Live-timeline (SSE) streams open on this gateway",
            None,
            metrics.sse_clients.clone(),
        );
        metrics
    }
}

/// Registers the domain's families now, before anything records into them:
/// every process that runs a service calls it at start-up.
pub fn declare() {
    LazyLock::force(&METRICS);
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use zopu_runtime::metrics::{encode, exported_sample_names, sample, sample_names};

    use super::*;

    #[test]
    fn every_family_is_declared_before_anything_is_recorded() {
        declare();
        let names = exported_sample_names();
        for name in [
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
    }

    #[test]
    fn an_sse_client_counts_while_it_is_open() {
        let value = || sample(&encode(), "zopu_sse_clients ").unwrap();
        declare();
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
}
