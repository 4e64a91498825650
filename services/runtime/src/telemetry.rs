//! Tracing setup: key-value logs to stderr, filtered by `ZOPU_LOG`
//! (or `RUST_LOG`), `info` by default; JSON lines when `json` is set.
//! Short-lived commands pass a quieter default with [`init_with_default`];
//! `zopu dev` sends the full log to a file with [`init_to_file`], so its
//! banner is not buried.
//!
//! OpenTelemetry traces go out over OTLP/HTTP (protobuf) when an endpoint is
//! configured with the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), unless `OTEL_SDK_DISABLED=true`
//! or `OTEL_TRACES_EXPORTER=none`; the SDK reads the rest (sampler, headers,
//! timeout, resource attributes). Only spans of the [`TRACE_TARGET`] target
//! are exported — the handling of an event, each append, each model call,
//! each tool call, each artifact build, each user command — never log
//! lines. Their attributes are identifiers, counts and outcomes; free text
//! from outside (a model's finish reason, a tool's outcome) goes through
//! `zopu_secrets::redact_label` first. [`propagation`] carries the trace across
//! services in each event's `traceparent`; [`otlp_sink`] is an OTLP/HTTP
//! receiver for tests and the benchmark.

pub mod otlp_sink;
pub mod per_service;
pub mod propagation;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// The target of every span exported to OpenTelemetry
/// (`tracing::info_span!(target: TRACE_TARGET, "append", ...)`).
pub const TRACE_TARGET: &str = "zopu::trace";

/// The process's span exporter, when one is configured. Dropping it (or
/// [`Tracing::shutdown`]) flushes the spans not exported yet.
#[derive(Debug, Default)]
pub struct Tracing {
    provider: Option<SdkTracerProvider>,
}

impl Tracing {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the spans still buffered and stops the exporter.
    pub fn shutdown(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "flushing the trace exporter failed; the last spans may be lost");
        }
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Installs the global subscriber once; later calls are no-ops.
pub fn init(json: bool) -> Tracing {
    init_with_default(json, "info,async_nats=warn", &Identity::one("zopu"))
}

/// Whose spans a process exports: the `service.name` of the process
/// (`OTEL_SERVICE_NAME` wins when set), and the services it runs when it
/// runs several (`zopu dev`): their spans are reported as `zopu-<service>`
/// (see [`per_service`]).
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    pub service_name: &'a str,
    pub services: &'a [&'a str],
}

impl<'a> Identity<'a> {
    /// A process that is one service (or a command).
    pub fn one(service_name: &'a str) -> Self {
        Self {
            service_name,
            services: &[],
        }
    }
}

/// [`init`] with another default filter (used when `ZOPU_LOG` is unset)
/// and the identity its spans report.
pub fn init_with_default(json: bool, default_filter: &str, identity: &Identity<'_>) -> Tracing {
    let filter = log_filter(default_filter);
    let (exporter, tracing) = exporter_layer(identity);
    let logs = if json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .compact()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    };
    let layers: Vec<BoxedLayer> = std::iter::once(logs).chain(exporter).collect();
    installed_or_none(
        tracing_subscriber::registry().with(layers).try_init(),
        tracing,
    )
}

/// Installs the global subscriber with the full log (filtered as in
/// [`init_with_default`]) appended to `file`, and errors also on stderr,
/// so a failure is never only in the file.
pub fn init_to_file(file: std::fs::File, default_filter: &str, identity: &Identity<'_>) -> Tracing {
    let filter = log_filter(default_filter);
    let (exporter, tracing) = exporter_layer(identity);
    let to_file = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .with_filter(filter)
        .boxed();
    let errors = tracing_subscriber::fmt::layer()
        .compact()
        .with_writer(std::io::stderr)
        .with_filter(tracing_subscriber::filter::LevelFilter::ERROR)
        .boxed();
    let layers: Vec<BoxedLayer> = [to_file, errors].into_iter().chain(exporter).collect();
    installed_or_none(
        tracing_subscriber::registry().with(layers).try_init(),
        tracing,
    )
}

fn log_filter(default_filter: &str) -> EnvFilter {
    std::env::var("ZOPU_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new(default_filter))
}

/// A second `init` keeps the first subscriber (and its exporter): the new
/// provider is shut down unused.
fn installed_or_none(
    installed: Result<(), tracing_subscriber::util::TryInitError>,
    tracing: Tracing,
) -> Tracing {
    match installed {
        Ok(()) => tracing,
        Err(_) => Tracing::default(),
    }
}

type BoxedLayer = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// The OpenTelemetry layer (only [`TRACE_TARGET`] spans), or nothing when
/// no endpoint is configured or the exporter cannot be built (logged).
fn exporter_layer(identity: &Identity<'_>) -> (Option<BoxedLayer>, Tracing) {
    if !export_requested() {
        return (None, Tracing::default());
    }
    let provider = match build_provider(identity) {
        Ok(provider) => provider,
        Err(error) => {
            eprintln!("warning: traces are not exported: {error}");
            return (None, Tracing::default());
        }
    };
    let tracer = provider.tracer("zopu");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|metadata| {
            metadata.is_span() && metadata.target() == TRACE_TARGET
        }))
        .boxed();
    (
        Some(layer),
        Tracing {
            provider: Some(provider),
        },
    )
}

/// Whether this process's environment asks for trace export (see
/// [`init_with_default`]).
pub fn export_requested() -> bool {
    export_configured(|name| std::env::var(name).ok())
}

/// Whether the environment asks for trace export: an OTLP endpoint is set
/// and neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`.
fn export_configured(variable: impl Fn(&str) -> Option<String>) -> bool {
    let set = |name: &str| variable(name).is_some_and(|value| !value.trim().is_empty());
    let disabled = variable("OTEL_SDK_DISABLED")
        .is_some_and(|value| value.trim().eq_ignore_ascii_case("true"));
    let no_exporter = variable("OTEL_TRACES_EXPORTER")
        .is_some_and(|value| value.trim().eq_ignore_ascii_case("none"));
    !disabled
        && !no_exporter
        && (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

fn build_provider(identity: &Identity<'_>) -> Result<SdkTracerProvider, String> {
    let named_by_environment = std::env::var("OTEL_SERVICE_NAME").is_ok();
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !named_by_environment {
        resource = resource.with_service_name(identity.service_name.to_owned());
    }
    let provider = SdkTracerProvider::builder().with_resource(resource.build());
    let exporter = || {
        opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|error| error.to_string())
    };
    // The blocking HTTP client owns a runtime of its own: build it off any
    // async worker thread (it is used and dropped on the batch processor's
    // thread).
    let built = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                if identity.services.is_empty() || named_by_environment {
                    exporter().map(|exporter| provider.with_batch_exporter(exporter))
                } else {
                    per_service::Routing::new(identity.services, exporter).map(|routing| {
                        provider.with_span_processor(per_service::Attribution::new(
                            opentelemetry_sdk::trace::BatchSpanProcessor::builder(routing).build(),
                        ))
                    })
                }
            })
            .join()
    })
    .map_err(|_| "building the OTLP exporter panicked".to_owned())??;
    Ok(built.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn environment(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
        }
    }

    #[test]
    fn the_model_call_span_is_exported() {
        assert_eq!(zopu_llm::TRACE_TARGET, TRACE_TARGET);
    }

    #[test]
    fn export_needs_an_endpoint_and_honours_the_off_switches() {
        assert!(!export_configured(environment(&[])));
        assert!(export_configured(environment(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4318"
        )])));
        assert!(export_configured(environment(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4318/v1/traces"
        )])));
        assert!(!export_configured(environment(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            " "
        )])));
        assert!(!export_configured(environment(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ])));
        assert!(!export_configured(environment(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ])));
    }
}
