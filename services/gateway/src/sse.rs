//! The live timeline: Server-Sent Events of timeline items.
//!
//! Each event's `id:` is the stream sequence of the item; a client that
//! reconnects with `Last-Event-ID` (browsers do this on their own) gets
//! exactly the items after it, because items are read from the projection
//! in sequence order and the cursor only moves past items it sent.
//!
//! Browsers' `EventSource` cannot send headers, so this route (and only
//! this one) also accepts the bearer token as the `token` query parameter.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use zopu_schema::{OrgId, ProjectId};

use crate::AppState;
use crate::http::{ApiError, ErrorBody};
use crate::read_model::{TimelineItem, queries};

/// Items read per query while catching up.
const BATCH: usize = 200;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// The bearer token (only for clients that cannot send headers, such as `EventSource`).
    pub token: Option<String>,
    /// Start after this sequence when there is no `Last-Event-ID` header (default 0: everything).
    pub after: Option<u64>,
}

/// Live timeline items as Server-Sent Events (`id:` = stream sequence; resume with `Last-Event-ID`).
#[utoipa::path(get, path = "/v1/projects/{id}/events", tag = "timeline",
    params(("id" = String, Path, description = "Project id"), ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this sequence"), EventsQuery),
    responses((status = 200, content_type = "text/event-stream", description = "One `data:` JSON TimelineItem per event"),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|rejection| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            rejection.body_text(),
        )
        .field("query")
    })?;
    let header_token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim().to_owned());
    let token = header_token
        .or(query.token)
        .ok_or_else(ApiError::unauthorized)?;
    let principal = crate::http::authenticate(&state, &token).await?;
    let (project, _) = crate::api::owned_project(&state, &principal.org, &id).await?;
    let after = match headers.get("last-event-id") {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_header",
                    "Last-Event-ID must be a sequence number",
                )
                .field("Last-Event-ID")
            })?,
        None => query.after.unwrap_or(0),
    };
    let guard = ClientGuard::acquire(&state.sse_clients, state.config.sse_clients_max).ok_or_else(
        || {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_streams",
                "too many live connections; try again shortly",
            )
        },
    )?;
    tracing::debug!(%project, after, "sse client connected");
    let cursor = Cursor {
        state: state.clone(),
        org: principal.org,
        project,
        after,
        buffer: VecDeque::new(),
        _guard: guard,
    };
    let stream = futures::stream::unfold(cursor, next_event);
    let keepalive = KeepAlive::new().interval(state.config.sse_keepalive);
    let mut response = Sse::new(stream).keep_alive(keepalive).into_response();
    response.headers_mut().insert(
        "x-accel-buffering",
        axum::http::HeaderValue::from_static("no"),
    );
    response.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    Ok(response)
}

struct Cursor {
    state: AppState,
    org: OrgId,
    project: ProjectId,
    after: u64,
    buffer: VecDeque<TimelineItem>,
    _guard: ClientGuard,
}

async fn next_event(mut cursor: Cursor) -> Option<(Result<Event, Infallible>, Cursor)> {
    loop {
        if let Some(item) = cursor.buffer.pop_front() {
            cursor.after = item.sequence;
            let data = serde_json::to_string(&item).unwrap_or_else(|_| "{}".to_owned());
            let event = Event::default().id(item.sequence.to_string()).data(data);
            return Some((Ok(event), cursor));
        }
        let store = cursor.state.runtime.store.clone();
        let shutdown = cursor.state.runtime.shutdown.clone();
        // Read the checkpoint before querying: anything committed later moves it past this value.
        let seen = store.checkpoint();
        let (org, project, after) = (cursor.org.clone(), cursor.project, cursor.after);
        let reads = cursor.state.reads.clone();
        let items = tokio::task::spawn_blocking(move || {
            reads.with(|conn| queries::timeline(conn, &org, &project, None, after, BATCH))
        })
        .await;
        match items {
            Ok(Ok(items)) if !items.is_empty() => cursor.buffer.extend(items),
            Ok(Ok(_)) => {
                tokio::select! {
                    () = store.wait_for(seen + 1) => {}
                    () = shutdown.cancelled() => return None,
                }
            }
            other => {
                tracing::warn!(project = %cursor.project, error = ?other.map(|result| result.map(|items| items.len())), "sse read failed; closing the stream (the client resumes)");
                return None;
            }
        }
    }
}

/// Counts open streams against the cap.
struct ClientGuard(Arc<AtomicUsize>);

impl ClientGuard {
    fn acquire(counter: &Arc<AtomicUsize>, max: usize) -> Option<Self> {
        let mut current = counter.load(Ordering::Relaxed);
        loop {
            if current >= max {
                return None;
            }
            match counter.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(Self(counter.clone())),
                Err(actual) => current = actual,
            }
        }
    }
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
