//! Appending a command's event for a request: with the request timeout, and
//! reporting a repeated request (same `X-Request-Id`) as the stored event.

use serde::Serialize;
use utoipa::ToSchema;
use zopu_runtime::NewEvent;
use zopu_schema::{OrgId, ProjectId, subjects};

use crate::AppState;
use crate::http::{ApiError, RequestId};

/// What an append returned to the caller.
#[derive(Debug, Serialize, ToSchema)]
pub struct Accepted {
    /// The stored event's id.
    pub event_id: String,
    /// Its stream sequence (the timeline cursor).
    pub sequence: u64,
    /// True when the same request was already stored (same `X-Request-Id`).
    pub duplicate: bool,
    pub request_id: String,
}

pub(super) async fn append(
    state: &AppState,
    event: NewEvent,
    request: &RequestId,
) -> Result<Accepted, ApiError> {
    let event_type = event.event_type;
    let appended = tokio::time::timeout(
        state.config.request_timeout,
        state.runtime.publisher.append(event),
    )
    .await
    .map_err(|_| ApiError::unavailable("event log", format!("append of {event_type} timed out")))?
    .map_err(|error| ApiError::unavailable("event log", error))?;
    let mut event_id = appended.event_id;
    if appended.duplicate {
        // A root event's id depends on when it was requested: report the stored one.
        if let Ok(stored) =
            zopu_runtime::publish::get_event(&state.runtime.bus, appended.sequence).await
        {
            event_id = stored.id;
        }
    }
    tracing::info!(event_type, event_id = %event_id, sequence = appended.sequence, duplicate = appended.duplicate, correlation_id = %request.0, "appended");
    Ok(Accepted {
        event_id: event_id.to_string(),
        sequence: appended.sequence,
        duplicate: appended.duplicate,
        request_id: request.0.to_string(),
    })
}

/// Appends a project's first event only if the project has none yet. If it
/// has, the request that made it is this one (the project id is derived
/// from it; checked against the stored correlation id), so the stored event
/// is reported as a duplicate. Unlike `Nats-Msg-Id` deduplication, this
/// holds beyond the duplicate window and does not depend on the projection.
pub(super) async fn append_first(
    state: &AppState,
    event: NewEvent,
    request: &RequestId,
) -> Result<Accepted, ApiError> {
    use zopu_runtime::publish::AppendAtError;
    let (org, project, event_type) = (
        event.context.org_id.clone(),
        event.context.project_id,
        event.event_type,
    );
    let appended = tokio::time::timeout(
        state.config.request_timeout,
        state.runtime.publisher.append_at(event, 0),
    )
    .await
    .map_err(|_| ApiError::unavailable("event log", format!("append of {event_type} timed out")))?;
    let (sequence, stored) = match appended {
        Ok(appended) if !appended.duplicate => {
            tracing::info!(event_type, event_id = %appended.event_id, sequence = appended.sequence, correlation_id = %request.0, "appended");
            return Ok(Accepted {
                event_id: appended.event_id.to_string(),
                sequence: appended.sequence,
                duplicate: false,
                request_id: request.0.to_string(),
            });
        }
        Ok(appended) => (
            appended.sequence,
            stored_event(state, appended.sequence).await?,
        ),
        Err(AppendAtError::Conflict { .. }) => {
            first_event_of_type(state, &org, &project, event_type)
                .await?
                .ok_or_else(|| {
                    ApiError::conflict(format!("project {project} exists; use another request id"))
                })?
        }
        Err(AppendAtError::Failed(error)) => return Err(ApiError::unavailable("event log", error)),
    };
    if stored.correlation_id != request.0 {
        return Err(ApiError::conflict(format!(
            "project {project} was created by another request; use another request id"
        )));
    }
    tracing::info!(event_type, event_id = %stored.id, sequence, correlation_id = %request.0, "already stored");
    Ok(Accepted {
        event_id: stored.id.to_string(),
        sequence,
        duplicate: true,
        request_id: request.0.to_string(),
    })
}

async fn stored_event(state: &AppState, sequence: u64) -> Result<zopu_schema::Envelope, ApiError> {
    tokio::time::timeout(
        state.config.request_timeout,
        zopu_runtime::publish::get_event(&state.runtime.bus, sequence),
    )
    .await
    .map_err(|_| ApiError::unavailable("event log", "read timed out"))?
    .map_err(|error| ApiError::unavailable("event log", error))
}

/// The first stored event of `event_type` of a project, with its sequence.
async fn first_event_of_type(
    state: &AppState,
    org: &OrgId,
    project: &ProjectId,
    event_type: &str,
) -> Result<Option<(u64, zopu_schema::Envelope)>, ApiError> {
    use async_nats::jetstream::stream::DirectGetErrorKind;
    let read = async {
        let stream = state
            .runtime
            .bus
            .jetstream
            .get_stream_no_info(subjects::EVENTS_STREAM)
            .await
            .map_err(|error| ApiError::unavailable("event log", error))?;
        match stream
            .direct_get_first_for_subject(subjects::event(org, project, event_type))
            .await
        {
            Ok(message) => Ok(Some(message.sequence)),
            Err(error) if error.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(error) => Err(ApiError::unavailable("event log", error)),
        }
    };
    let sequence = tokio::time::timeout(state.config.request_timeout, read)
        .await
        .map_err(|_| ApiError::unavailable("event log", "read timed out"))??;
    match sequence {
        Some(sequence) => Ok(Some((sequence, stored_event(state, sequence).await?))),
        None => Ok(None),
    }
}
