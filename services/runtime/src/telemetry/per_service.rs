//! One process, several services (`zopu dev`): each span is reported under
//! the `service.name` of the service it ran in (`zopu-dispatch`, ...), as if
//! every service ran alone. A span knows its service from its own `service`
//! attribute (the handling and append spans carry one) or from its local
//! parent; [`Attribution`] writes it as `zopu_service`, and [`Routing`]
//! exports each span with the resource of that service (spans of no service
//! keep the process's resource).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use opentelemetry::trace::{Span as _, SpanId, TraceContextExt as _};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

/// The span attribute naming the service a span ran in.
pub const SERVICE_ATTRIBUTE: &str = "zopu_service";
/// The field the handling and append spans name their service with.
const SERVICE_FIELD: &str = "service";

/// Notes each span's service (its own `service` field, or its local
/// parent's) before handing it to `inner`.
#[derive(Debug)]
pub struct Attribution<P> {
    inner: P,
    live: Mutex<HashMap<SpanId, Value>>,
}

impl<P> Attribution<P> {
    pub fn new(inner: P) -> Self {
        Self {
            inner,
            live: Mutex::new(HashMap::new()),
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<SpanId, Value>> {
        self.live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<P: SpanProcessor> SpanProcessor for Attribution<P> {
    fn on_start(&self, span: &mut Span, parent: &Context) {
        let parent_span = parent.span();
        let parent_context = parent_span.span_context();
        // A remote parent (an event's traceparent) may be another service
        // of this process: only a local parent passes its service on.
        let inherited = (parent_context.is_valid() && !parent_context.is_remote())
            .then(|| self.live().get(&parent_context.span_id()).cloned())
            .flatten();
        let service = inherited.or_else(|| {
            span.exported_data().and_then(|data| {
                data.attributes
                    .into_iter()
                    .find(|attribute| attribute.key.as_str() == SERVICE_FIELD)
                    .map(|attribute| attribute.value)
            })
        });
        if let Some(service) = service {
            span.set_attribute(KeyValue::new(SERVICE_ATTRIBUTE, service.clone()));
            self.live().insert(span.span_context().span_id(), service);
        }
        self.inner.on_start(span, parent);
    }

    fn on_end(&self, span: SpanData) {
        self.live().remove(&span.span_context.span_id());
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Exports each span through the exporter of its service (`zopu_service`),
/// whose resource names it `zopu-<service>`; other spans through `fallback`.
#[derive(Debug)]
pub struct Routing<E> {
    by_service: HashMap<String, E>,
    fallback: E,
}

impl<E: SpanExporter> Routing<E> {
    /// `exporter` builds one exporter per service and the fallback.
    pub fn new<Error>(
        services: &[&str],
        mut exporter: impl FnMut() -> Result<E, Error>,
    ) -> Result<Self, Error> {
        let mut by_service = HashMap::new();
        for service in services {
            by_service.insert((*service).to_owned(), exporter()?);
        }
        Ok(Self {
            by_service,
            fallback: exporter()?,
        })
    }

    fn exporter_of(&self, span: &SpanData) -> &E {
        span.attributes
            .iter()
            .find(|attribute| attribute.key.as_str() == SERVICE_ATTRIBUTE)
            .and_then(|attribute| self.by_service.get(attribute.value.as_str().as_ref()))
            .unwrap_or(&self.fallback)
    }
}

impl<E: SpanExporter> SpanExporter for Routing<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut groups: Vec<(&E, Vec<SpanData>)> = Vec::new();
        for span in batch {
            let exporter = self.exporter_of(&span);
            match groups
                .iter_mut()
                .find(|(known, _)| std::ptr::eq(*known, exporter))
            {
                Some((_, spans)) => spans.push(span),
                None => groups.push((exporter, vec![span])),
            }
        }
        let mut outcome = Ok(());
        for (exporter, spans) in groups {
            if let Err(error) = exporter.export(spans).await {
                outcome = Err(error);
            }
        }
        outcome
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let mut outcome = self.fallback.shutdown_with_timeout(timeout);
        for exporter in self.by_service.values() {
            if let Err(error) = exporter.shutdown_with_timeout(timeout) {
                outcome = Err(error);
            }
        }
        outcome
    }

    fn force_flush(&self) -> OTelSdkResult {
        let mut outcome = self.fallback.force_flush();
        for exporter in self.by_service.values() {
            if let Err(error) = exporter.force_flush() {
                outcome = Err(error);
            }
        }
        outcome
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.fallback.set_resource(resource);
        for (service, exporter) in &mut self.by_service {
            let named = Resource::builder_empty()
                .with_attributes(
                    resource
                        .iter()
                        .map(|(key, value)| KeyValue::new(key.clone(), value.clone())),
                )
                .with_service_name(format!("zopu-{service}"))
                .build();
            exporter.set_resource(&named);
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider};
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;
    use crate::telemetry::otlp_sink::{OtlpSink, Retention};
    use crate::telemetry::propagation;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_span_reports_the_service_it_ran_in() {
        let sink = OtlpSink::start(Retention::Keep).await.expect("sink");
        let endpoint = format!("{}/v1/traces", sink.endpoint());
        // The blocking exporters are built, used and shut down off the runtime.
        let provider = tokio::task::spawn_blocking(move || {
            let routing = Routing::new(&["dispatch", "conversation"], || {
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_endpoint(endpoint.clone())
                    .build()
            })
            .expect("exporters");
            SdkTracerProvider::builder()
                .with_resource(Resource::builder().with_service_name("zopu-dev").build())
                .with_span_processor(Attribution::new(
                    BatchSpanProcessor::builder(routing).build(),
                ))
                .build()
        })
        .await
        .expect("provider");
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let dispatch = tracing::info_span!("handle", service = "dispatch");
            let traceparent = dispatch.in_scope(|| {
                tracing::info_span!("chat").in_scope(propagation::current_traceparent)
            });
            // The next service of the same process continues the trace from
            // the event's traceparent: its own service, not its parent's.
            let conversation =
                tracing::info_span!(parent: None, "handle", service = "conversation");
            propagation::continue_trace(&conversation, traceparent.as_deref());
            conversation.in_scope(|| tracing::info_span!("append").in_scope(|| {}));
            drop(conversation);
            drop(dispatch);
            tracing::info_span!(parent: None, "unattributed").in_scope(|| {});
        });
        tokio::task::spawn_blocking(move || provider.shutdown())
            .await
            .expect("shutdown")
            .expect("flushed");
        let spans = sink.spans();
        let service_of = |name: &str, service: Option<&str>| {
            spans
                .iter()
                .filter(|span| span.name == name)
                .find(|span| {
                    service.is_none_or(|service| {
                        span.attribute(SERVICE_ATTRIBUTE)
                            == Some(&crate::telemetry::otlp_sink::AttributeValue::Text(
                                service.to_owned(),
                            ))
                    })
                })
                .map(|span| span.service_name.clone())
        };
        assert_eq!(
            service_of("chat", None).as_deref(),
            Some("zopu-dispatch"),
            "{spans:?}"
        );
        assert_eq!(
            service_of("handle", Some("conversation")).as_deref(),
            Some("zopu-conversation")
        );
        assert_eq!(
            service_of("append", None).as_deref(),
            Some("zopu-conversation")
        );
        assert_eq!(
            service_of("unattributed", None).as_deref(),
            Some("zopu-dev")
        );
        let trace_of = |name: &str| {
            spans
                .iter()
                .find(|span| span.name == name)
                .map(|span| span.trace_id.clone())
        };
        assert_eq!(
            trace_of("chat"),
            trace_of("append"),
            "one trace across both services"
        );
    }
}
