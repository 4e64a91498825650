//! Why an event happened: `GET /v1/projects/{id}/events/{event_id}/why`,
//! the causation chain of one of the project's events back to the user
//! action or external trigger that started it, its consequences, and its
//! correlation's whole tree for a waterfall ([`zopu_core::causality`], as
//! `zopu why` prints it). Read from the project's events in the log; each
//! step carries only ids, types, services and times, no content.

use axum::extract::{Path, State};
use zopu_core::causality::{self, Why};
use zopu_schema::{EventId, subjects};

use super::owned_project;
use crate::AppState;
use crate::http::{ApiError, Caller, ErrorBody};
use crate::tokens::Scope;

/// The causation chain, consequences and correlation tree of one event of
/// the project (`{event: Step, causes: [Step], missing_cause, consequences:
/// [Step], correlation: [Step], correlation_id}`; a step is `{sequence, id,
/// event_type, source, time, offset_ms, after_cause_ms, depth}`).
#[utoipa::path(get, path = "/v1/projects/{id}/events/{event_id}/why", tag = "timeline",
    params(("id" = String, Path, description = "Project id"), ("event_id" = String, Path, description = "One of the project's events (a timeline item's `event_id`)")),
    responses((status = 200, body = Object, description = "The explanation: causes back to the root, consequences, the correlation's tree"),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn why(
    State(state): State<AppState>,
    caller: Caller,
    Path((id, event_id)): Path<(String, String)>,
) -> Result<axum::Json<Why>, ApiError> {
    caller.require(Scope::Read, "reading why an event happened")?;
    let event: EventId = event_id.parse().map_err(|_| {
        ApiError::invalid("event_id", format!("{event_id:?} is not an event id (a UUID)"))
    })?;
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let history = zopu_core::log::events(
        &state.runtime.bus,
        subjects::project_events(&caller.0.org, &project),
    )
    .await
    .map_err(|error| ApiError::unavailable("event log", error))?;
    causality::explain(&history, event)
        .map(axum::Json)
        .ok_or_else(|| ApiError::not_found("event in this project"))
}
