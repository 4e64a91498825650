//! Trace context on appends: the span of one append, and the
//! `traceparent` an appended event carries (its span's, or its cause's),
//! checked before the append (`invariant::TRACE_CONTEXT`).

use super::NewEvent;
use crate::invariant;
use crate::telemetry::{TRACE_TARGET, propagation};

/// `event`, carrying the current span's trace context when it is exported
/// (otherwise the `traceparent` of its cause, if any). A root event (a user
/// command) appended outside any trace starts one: its append span's.
pub(super) fn in_current_trace(mut event: NewEvent, append: &tracing::Span) -> NewEvent {
    let traceparent = propagation::current_traceparent().or_else(|| {
        event
            .root
            .then(|| propagation::traceparent_of(append))
            .flatten()
    });
    let inherited = event.context.traceparent.is_some();
    if let Some(traceparent) = traceparent {
        event.context.traceparent = Some(traceparent);
    }
    // What every reader's decode accepts, and the trace goes on: a span's or
    // the cause's context is carried, a malformed one never written.
    let carried = event.context.traceparent.as_deref();
    let held = carried.map_or(!inherited, zopu_schema::envelope::is_traceparent);
    if !invariant::holds(invariant::TRACE_CONTEXT, held, || {
        format!("an append would carry the trace context {carried:?}")
    }) {
        event.context.traceparent = None;
    }
    event
}

/// The span of one append by `source` (`zopu/<service>`): its subject
/// and type, then its result.
pub(super) fn append_span(source: &str, event: &NewEvent) -> tracing::Span {
    tracing::info_span!(
        target: TRACE_TARGET,
        "append",
        service = source.strip_prefix("zopu/").unwrap_or(source),
        subject = %zopu_schema::subjects::event(&event.context.org_id, &event.context.project_id, event.event_type),
        event_type = event.event_type,
        result = tracing::field::Empty,
    )
}
