//! The live timeline: Server-Sent Events of timeline items.
//!
//! Each event's `id:` is the stream sequence of the item; a client that
//! reconnects with `Last-Event-ID` (browsers do this on their own) gets
//! exactly the items after it, because items are read from the projection
//! in sequence order and the cursor only moves past items it sent.
//!
//! Browsers' `EventSource` cannot send headers, and a token in a URL is
//! recorded by proxies and browser history, so this route takes either the
//! bearer header or a single-use ticket (`?ticket=`, from
//! `POST /v1/projects/{id}/events/ticket`; see `tickets`), never a token in
//! the URL: `?token=` is refused. A stream wakes only when its own project
//! changed (`changes`), and counts against the instance's cap and its
//! token's (`gateway.sse_clients_per_token_max`). A stream ends within
//! moments of its token: revoked or deleted on any instance (every
//! instance watches the token bucket, `revocations`), or expired.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use zopu_schema::{OrgId, ProjectId};

use crate::AppState;
use crate::changes::ProjectWatch;
use crate::http::{ApiError, Caller, ErrorBody};
use crate::revocations::Ended;
use crate::tokens::{Scope, TokenStatus};
use crate::views::{TimelineItem, queries};

/// Items read per query while catching up.
const BATCH: usize = 200;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// A single-use ticket from `POST /v1/projects/{id}/events/ticket` (for
    /// clients that cannot send headers, such as `EventSource`).
    pub ticket: Option<String>,
    /// Refused (400): a bearer token never goes in a URL.
    #[param(ignore)]
    pub token: Option<String>,
    /// Start after this sequence when there is no `Last-Event-ID` header (default 0: everything).
    pub after: Option<u64>,
}

/// Live timeline items as Server-Sent Events (`id:` = stream sequence; resume with `Last-Event-ID`).
#[utoipa::path(get, path = "/v1/projects/{id}/events", tag = "timeline",
    params(("id" = String, Path, description = "Project id"), ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this sequence"), EventsQuery),
    responses((status = 200, content_type = "text/event-stream", description = "One `data:` JSON TimelineItem per event"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody), (status = 503, body = ErrorBody)),
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
    if query.token.is_some() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "token_in_url",
            "a bearer token is never accepted in a URL (proxies and browser history record it): send it as `Authorization: Bearer`, or open the stream with a ticket from POST /v1/projects/{id}/events/ticket",
        )
        .field("token"));
    }
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
    let header_token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim().to_owned());
    let (org, token_id, expires_at) = match (header_token, query.ticket) {
        (Some(token), _) => {
            let principal = crate::http::authenticate(&state, &token).await?;
            crate::http::require(&principal, Scope::Read, "following the live timeline")?;
            (principal.org, principal.token_id, principal.expires_at)
        }
        (None, Some(ticket)) => redeem(&state, &id, &ticket).await?,
        (None, None) => return Err(ApiError::unauthorized()),
    };
    // The stream ends when its token does: followed before the token is
    // read once more, so a revocation in between is never missed.
    let ended = state.revocations.follow(&token_id);
    active_token(&state, &org, &token_id).await?;
    let lifetime = (expires_at - state.runtime.clock.now())
        .try_into()
        .unwrap_or(std::time::Duration::ZERO);
    let expires = tokio::time::Instant::now() + lifetime;
    let (project, _) = crate::api::owned_project(&state, &org, &id).await?;
    let guard = ClientGuard::acquire(&state.sse_clients, state.config.sse_clients_max).ok_or_else(
        || {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_streams",
                "too many live connections; try again shortly",
            )
        },
    )?;
    let token_guard = state.quotas.open_stream(&token_id)?;
    let (watch, applied_before) = state.changes.watch(project);
    tracing::debug!(%project, after, "sse client connected");
    let cursor = Cursor {
        state: state.clone(),
        org,
        project,
        after,
        buffer: VecDeque::new(),
        watch,
        committed_needed: applied_before,
        ended,
        expires,
        _guards: (guard, token_guard),
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

/// A ticket for one live stream.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamTicket {
    /// Single use; valid until `expires_at`.
    pub ticket: String,
    /// Unix seconds.
    pub expires_at: i64,
    /// The stream's URL with the ticket (add `&after=N` to resume).
    pub url: String,
}

/// A single-use, short-lived ticket that opens one live stream of the
/// project, for clients that cannot send headers (`EventSource`): the
/// stream's URL then carries the ticket, never the bearer token.
#[utoipa::path(post, path = "/v1/projects/{id}/events/ticket", tag = "timeline",
    params(("id" = String, Path, description = "Project id")),
    responses((status = 201, body = StreamTicket), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn ticket(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read, "following the live timeline")?;
    let (project, _) = crate::api::owned_project(&state, &caller.0.org, &id).await?;
    let issued = tokio::time::timeout(
        state.config.request_timeout,
        state
            .tickets
            .issue(&caller.0.org, &project, &caller.0.token_id),
    )
    .await
    .map_err(|_| ApiError::unavailable("ticket store", "write timed out"))?
    .map_err(|error| ApiError::unavailable("ticket store", error))?;
    let body = StreamTicket {
        ticket: issued.expose().to_owned(),
        expires_at: issued.expires_at.unix_timestamp(),
        url: format!("/v1/projects/{project}/events?ticket={}", issued.expose()),
    };
    Ok((StatusCode::CREATED, axum::Json(body)).into_response())
}

struct Cursor {
    state: AppState,
    org: OrgId,
    project: ProjectId,
    after: u64,
    buffer: VecDeque<TimelineItem>,
    /// Wakes when an event of this project was applied.
    watch: ProjectWatch,
    /// A sequence of this project applied but perhaps not yet committed:
    /// wait for the store to reach it before the next query (0: none).
    committed_needed: u64,
    /// The stream's token was revoked or deleted (on any instance).
    ended: Ended,
    /// The stream's token expires.
    expires: tokio::time::Instant,
    _guards: (ClientGuard, crate::quotas::StreamGuard),
}

/// Resolves when the stream's token ends: revoked, deleted or expired.
async fn token_ends(ended: &mut Ended, expires: tokio::time::Instant) {
    tokio::select! {
        () = ended.wait() => {}
        () = tokio::time::sleep_until(expires) => {}
    }
}

/// The token `token_id` of `org` as it stands now, refused unless active.
async fn active_token(state: &AppState, org: &OrgId, token_id: &str) -> Result<(), ApiError> {
    let timeout = state.config.request_timeout;
    tokio::time::timeout(timeout, state.tokens.info(token_id))
        .await
        .map_err(|_| ApiError::unavailable("token store", "read timed out"))?
        .map_err(|error| ApiError::unavailable("token store", error))?
        .filter(|info| {
            &info.org == org && info.status(state.runtime.clock.now()) == TokenStatus::Active
        })
        .map(|_| ())
        .ok_or_else(ApiError::unauthorized)
}

/// The organization and token id a ticket was issued to, and when the
/// token expires, if it is valid for this project and its token is still
/// active with the `read` scope.
async fn redeem(
    state: &AppState,
    id: &str,
    ticket: &str,
) -> Result<(OrgId, String, time::OffsetDateTime), ApiError> {
    let refused = || {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_ticket",
            "the stream ticket is unknown, expired, already used or for another project; ask for a new one (POST /v1/projects/{id}/events/ticket)",
        )
        .field("ticket")
    };
    let project: ProjectId = id.parse().map_err(|_| ApiError::not_found("project"))?;
    let timeout = state.config.request_timeout;
    let grant = tokio::time::timeout(timeout, state.tickets.redeem(ticket, &project))
        .await
        .map_err(|_| ApiError::unavailable("ticket store", "read timed out"))?
        .map_err(|error| ApiError::unavailable("ticket store", error))?
        .ok_or_else(refused)?;
    // The token may have been revoked since it asked for the ticket.
    let token = tokio::time::timeout(timeout, state.tokens.info(&grant.token_id))
        .await
        .map_err(|_| ApiError::unavailable("token store", "read timed out"))?
        .map_err(|error| ApiError::unavailable("token store", error))?
        .filter(|info| {
            info.org == grant.org && info.status(state.runtime.clock.now()) == TokenStatus::Active
        })
        .ok_or_else(ApiError::unauthorized)?;
    if !token.scopes.contains(Scope::Read) {
        return Err(ApiError::missing_scope(
            Scope::Read,
            "following the live timeline",
        ));
    }
    Ok((grant.org, grant.token_id, token.expires_at))
}

async fn next_event(mut cursor: Cursor) -> Option<(Result<Event, Infallible>, Cursor)> {
    loop {
        if cursor.ended.happened() || tokio::time::Instant::now() >= cursor.expires {
            tracing::debug!(project = %cursor.project, "the stream's token ended; closing it");
            return None;
        }
        if let Some(item) = cursor.buffer.pop_front() {
            cursor.after = item.sequence;
            let data = serde_json::to_string(&item).unwrap_or_else(|_| "{}".to_owned());
            let event = Event::default().id(item.sequence.to_string()).data(data);
            return Some((Ok(event), cursor));
        }
        let store = cursor.state.runtime.store.clone();
        let shutdown = cursor.state.runtime.shutdown.clone();
        if cursor.committed_needed > 0 {
            // Applied is not committed: wait for the batch, without a query.
            tokio::select! {
                () = store.wait_for(cursor.committed_needed) => cursor.committed_needed = 0,
                () = token_ends(&mut cursor.ended, cursor.expires) => return None,
                () = shutdown.cancelled() => return None,
            }
        }
        let (org, project, after) = (cursor.org.clone(), cursor.project, cursor.after);
        let reads = cursor.state.reads.clone();
        cursor.state.sse_reads.fetch_add(1, Ordering::Relaxed);
        let items = tokio::task::spawn_blocking(move || {
            reads.with(|conn| queries::timeline(conn, &org, &project, None, after, BATCH))
        })
        .await;
        match items {
            Ok(Ok(items)) if !items.is_empty() => cursor.buffer.extend(items),
            Ok(Ok(_)) => {
                // Sleep until this project (and only this one) changes.
                tokio::select! {
                    changed = cursor.watch.changed() => match changed {
                        Some(sequence) => cursor.committed_needed = sequence,
                        None => return None,
                    },
                    () = token_ends(&mut cursor.ended, cursor.expires) => return None,
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

/// Counts open streams against the cap, and in the `zopu_sse_clients` gauge.
struct ClientGuard {
    open: Arc<AtomicUsize>,
    _counted: zopu_core::metrics::SseClient,
}

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
                Ok(_) => {
                    return Some(Self {
                        open: counter.clone(),
                        _counted: zopu_core::metrics::SseClient::connected(),
                    });
                }
                Err(actual) => current = actual,
            }
        }
    }
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn open_streams_gauge() -> f64 {
        zopu_core::metrics::declare();
        zopu_runtime::metrics::encode()
            .lines()
            .find_map(|line| line.strip_prefix("zopu_sse_clients "))
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn an_admitted_stream_counts_in_the_gauge_and_a_refused_one_does_not() {
        let open = Arc::new(AtomicUsize::new(0));
        let before = open_streams_gauge();
        let admitted = ClientGuard::acquire(&open, 1).unwrap();
        assert!(ClientGuard::acquire(&open, 1).is_none());
        assert_eq!(open_streams_gauge(), before + 1.0);
        drop(admitted);
        assert_eq!(open_streams_gauge(), before);
        assert_eq!(open.load(Ordering::Acquire), 0);
    }
}
