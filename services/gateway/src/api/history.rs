//! The project's history, read from its events in the log:
//! - why an event happened: `GET /v1/projects/{id}/events/{event_id}/why`,
//!   the causation chain of one of the project's events back to the user
//!   action or external trigger that started it, its consequences, and its
//!   correlation's whole tree for a waterfall ([`zopu_runtime::causality`], as
//!   `zopu why` prints it; each step carries only ids, types, services and
//!   times, no content);
//! - the project as it was: `GET /v1/projects/{id}/history?at=SEQ|TIME`
//!   ([`crate::history`], as `zopu history --at` prints it), the web's
//!   history slider.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use utoipa::IntoParams;
use zopu_runtime::causality::{self, Why};
use zopu_schema::{EventId, subjects};

use super::{owned_project, query_error};
use crate::AppState;
use crate::history::{Cut, HistoryError, PastState};
use crate::http::{ApiError, Caller, ErrorBody};
use crate::tokens::Scope;

/// The causation chain, consequences and correlation tree of one event of
/// the project (`{event: Step, causes: [Step], missing_cause, consequences:
/// [Step], correlation: [Step], correlation_id}`; a step is `{sequence, id,
/// event_type, source, time, offset_ms, after_cause_ms, depth}`).
#[utoipa::path(get, path = "/v1/projects/{id}/events/{event_id}/why", tag = "timeline",
    params(("id" = String, Path, description = "Project id"), ("event_id" = String, Path, description = "One of the project's events (a timeline item's `event_id`)")),
    responses((status = 200, body = Object, description = "The explanation: causes back to the root, consequences, the correlation's tree"),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody), (status = 429, body = ErrorBody, description = "gateway.history_reads_max reads of a project's history run already")),
    security(("bearer" = [])))]
pub async fn why(
    State(state): State<AppState>,
    caller: Caller,
    Path((id, event_id)): Path<(String, String)>,
) -> Result<axum::Json<Why>, ApiError> {
    caller.require(Scope::Read, "reading why an event happened")?;
    let event: EventId = event_id.parse().map_err(|_| {
        ApiError::invalid(
            "event_id",
            format!("{event_id:?} is not an event id (a UUID)"),
        )
    })?;
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let _reading = state.quotas.read_history()?;
    let history = zopu_runtime::log::events(
        &state.runtime.bus,
        subjects::project_events(&caller.0.org, &project),
    )
    .await
    .map_err(|error| ApiError::unavailable("event log", error))?;
    causality::explain(&history, event)
        .map(axum::Json)
        .ok_or_else(|| ApiError::not_found("event in this project"))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    /// A stream sequence (`N` or `#N`) or an RFC 3339 time: the state after
    /// the project's last event at or before it.
    pub at: String,
}

/// The project as it was at a stream sequence or a time, rebuilt from its
/// events: the project, its Works and threads, its timeline (up to 10,000
/// items) and what its agent remembered then (`{at_sequence, first_sequence,
/// last_sequence, last_event_time, last_event_type, project, works,
/// timeline, memory}`).
#[utoipa::path(get, path = "/v1/projects/{id}/history", tag = "timeline",
    params(("id" = String, Path, description = "Project id"), HistoryQuery),
    responses((status = 200, body = Object, description = "The project's state as of the cut"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody), (status = 429, body = ErrorBody, description = "gateway.history_reads_max reads of a project's history run already")),
    security(("bearer" = [])))]
pub async fn project_at(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<HistoryQuery>, QueryRejection>,
) -> Result<axum::Json<PastState>, ApiError> {
    caller.require(Scope::Read, "reading a project's history")?;
    let Query(query) = query.map_err(query_error)?;
    let cut: Cut = query
        .at
        .parse()
        .map_err(|error| ApiError::invalid("at", error))?;
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let _reading = state.quotas.read_history()?;
    match crate::history::state_at(&state.runtime.bus, Some(&caller.0.org), project, cut).await {
        Ok(past) => Ok(axum::Json(past)),
        Err(error @ HistoryError::NotYet { .. }) => Err(ApiError::invalid("at", error.to_string())),
        Err(HistoryError::NoEvents(_)) => Err(ApiError::not_found("project")),
        Err(error) => Err(ApiError::unavailable("event log", error)),
    }
}
