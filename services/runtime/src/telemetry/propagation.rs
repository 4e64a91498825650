//! W3C trace context across services: an appended event carries the
//! `traceparent` of the span that appended it, and the span that handles
//! the event continues that trace. Without an exporter the current span
//! has no trace context and an event keeps the `traceparent` of its cause,
//! so a chain stays one trace through a service that does not export.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

const TRACEPARENT: &str = "traceparent";

/// The `traceparent` of the current span, when it is exported.
pub fn current_traceparent() -> Option<String> {
    traceparent_of(&tracing::Span::current())
}

/// The `traceparent` of `span`, when it is exported.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// Makes `span` (not entered yet) a child of the span that wrote
/// `traceparent`. An absent or malformed value leaves the span's parent as
/// it is (a new trace, or the current span).
pub fn continue_trace(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent else {
        return;
    };
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let parent = TraceContextPropagator::new().extract(&carrier);
    if parent.span().span_context().is_valid() {
        // Fails only when no exporter is installed or the span was entered
        // already: then there is no trace to continue.
        let _ = span.set_parent(parent);
    }
}
