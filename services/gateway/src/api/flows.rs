//! Cancelling a running specialist flow: `POST
//! /v1/projects/{id}/flows/{flow}/cancel` stores one `flow.cancel.requested`
//! per flow (the flow's one cancel key), which the specialist running it
//! turns into `flow.cancelled` — aborting its model call and killing its
//! tool program. A retried or repeated cancel stores nothing new; a flow
//! that already ended is refused with 409 and left as it is.

use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use zopu_core::commands;
use zopu_schema::FlowRunId;

use super::append::append;
use super::{invalid, owned_project, read, requester};
use crate::AppState;
use crate::http::{ApiError, Caller, ErrorBody, RequestId, body_error, parse_optional_json};
use crate::read_model::runs;
use crate::tokens::Scope;

/// `POST /v1/projects/{id}/flows/{flow}/cancel` body (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelFlow {
    /// Why (shown with the cancellation; at most 500 characters).
    #[serde(default)]
    pub reason: Option<String>,
}

/// The stored cancel request.
#[derive(Debug, Serialize, ToSchema)]
pub struct FlowCancelAccepted {
    pub flow_run_id: String,
    /// `cancel_requested` (the flow stops within a second) or `cancelled`
    /// (it had stopped already; nothing was stored).
    pub status: String,
    /// The stored `flow.cancel.requested` (absent when nothing was stored).
    pub event_id: Option<String>,
    pub sequence: Option<u64>,
    /// True when this flow's cancel request was already stored (a retry, or another caller's).
    pub duplicate: bool,
    pub request_id: String,
}

/// Cancel a running flow of the project (its model call is aborted and its tool killed).
#[utoipa::path(post, path = "/v1/projects/{id}/flows/{flow}/cancel", tag = "flows",
    params(("id" = String, Path, description = "Project id"), ("flow" = String, Path, description = "Flow run id")),
    request_body(content = CancelFlow, description = "Optional"),
    responses((status = 202, body = FlowCancelAccepted), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "The flow already completed or failed"),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel_flow(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path((id, flow)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Write, "cancelling a flow")?;
    let body = body.map_err(body_error)?;
    let cancel: CancelFlow = parse_optional_json(&body)?;
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let flow_run: FlowRunId = flow.parse().map_err(|_| ApiError::not_found("flow"))?;
    let event = commands::cancel_flow(
        &requester(&caller, &request),
        project,
        flow_run,
        &cancel.reason.unwrap_or_default(),
    )
    .map_err(invalid)?;
    let org = caller.0.org.clone();
    let run = read(&state, move |conn| {
        runs::get(conn, &org, &flow_run.to_string())
    })
    .await?
    .filter(|run| run.kind == runs::FLOW && run.project_id == project.to_string())
    .ok_or_else(|| ApiError::not_found("flow"))?;
    let accepted = match run.status.as_str() {
        runs::RUNNING => {
            let accepted = append(&state, event, &request).await?;
            FlowCancelAccepted {
                flow_run_id: run.run_id,
                status: "cancel_requested".to_owned(),
                event_id: Some(accepted.event_id),
                sequence: Some(accepted.sequence),
                duplicate: accepted.duplicate,
                request_id: accepted.request_id,
            }
        }
        runs::CANCELLED => FlowCancelAccepted {
            flow_run_id: run.run_id,
            status: runs::CANCELLED.to_owned(),
            event_id: None,
            sequence: None,
            duplicate: true,
            request_id: request.0.to_string(),
        },
        ended => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "flow_ended",
                format!("flow {} already {ended}; nothing to cancel", run.run_id),
            ));
        }
    };
    Ok((StatusCode::ACCEPTED, axum::Json(accepted)).into_response())
}
