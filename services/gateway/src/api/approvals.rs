//! Approvals: list what a project's agent asked to do outside the runtime,
//! and approve or reject it. Deciding takes the `approve` scope; the
//! decision is stored as `approval.granted` / `approval.denied` naming the
//! token's user as the reviewer, under the approval's one decision key, so
//! only the first decision ever counts.

use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use zopu_core::commands::{self, Decision};
use zopu_schema::approval::{self, Status};

use super::append::append;
use super::{invalid, owned_project, query_error, read, requester};
use crate::AppState;
use crate::http::{ApiError, Caller, ErrorBody, RequestId, body_error, parse_optional_json};
use crate::read_model::approvals::{self, ApprovalRow};
use crate::tokens::Scope;

/// An approval as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ApprovalView {
    pub approval_id: String,
    /// What would be done, e.g. `issue.publish`.
    pub action: String,
    pub detail: String,
    /// True when the action, once approved, is only recorded, not carried out.
    pub dry_run: bool,
    /// The stream sequence of the request (its timeline position).
    pub requested_sequence: u64,
    pub requested_at: String,
    /// Past it, nobody can decide it any more (it closes as `expired`).
    pub expires_at: Option<String>,
    /// `pending`, `approved`, `rejected` or `expired`.
    pub status: String,
    /// The reviewer's user id, once decided.
    pub decided_by: Option<String>,
    pub decided_at: Option<String>,
    /// A rejection's reason.
    pub reason: Option<String>,
    /// How the executor carried out an approved action: `dry_run` (recorded,
    /// nothing sent), `created` or `failed`; absent until it did.
    pub execution: Option<String>,
    /// The request a dry run recorded, the created issue's URL, or the
    /// failure's reason.
    pub execution_detail: Option<String>,
    pub executed_at: Option<String>,
}

impl From<ApprovalRow> for ApprovalView {
    fn from(row: ApprovalRow) -> Self {
        Self {
            approval_id: row.approval_id,
            action: row.action,
            detail: row.detail,
            dry_run: row.dry_run,
            requested_sequence: row.requested_sequence,
            requested_at: row.requested_at,
            expires_at: row.expires_at,
            status: row.status,
            decided_by: row.decided_by,
            decided_at: row.decided_at,
            reason: row.reason,
            execution: row.execution,
            execution_detail: row.execution_detail,
            executed_at: row.executed_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ApprovalList {
    pub approvals: Vec<ApprovalView>,
}

/// `GET /v1/projects/{id}/approvals` query.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ApprovalQuery {
    /// Only approvals with this status: `pending`, `approved`, `rejected` or `expired`.
    pub status: Option<String>,
}

/// `POST /v1/projects/{id}/approvals/{approval_id}/reject` body (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rejection {
    /// Why (at most 500 characters).
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ApprovalDecided {
    pub approval_id: String,
    /// `approved` or `rejected`.
    pub status: String,
    pub event_id: String,
    pub sequence: u64,
    /// True when this same request had already decided it (same `X-Request-Id`).
    pub duplicate: bool,
    pub request_id: String,
}

/// The project's approvals, oldest first.
#[utoipa::path(get, path = "/v1/projects/{id}/approvals", tag = "approvals",
    params(("id" = String, Path, description = "Project id"), ApprovalQuery),
    responses((status = 200, body = ApprovalList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_approvals(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<ApprovalQuery>, QueryRejection>,
) -> Result<axum::Json<ApprovalList>, ApiError> {
    caller.require(Scope::Read, "listing approvals")?;
    let Query(query) = query.map_err(query_error)?;
    if let Some(status) = &query.status
        && zopu_schema::approval::Status::parse(status).is_none()
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "status must be pending, approved, rejected or expired",
        )
        .field("status"));
    }
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let org = caller.0.org.clone();
    let rows = read(&state, move |conn| {
        approvals::list(conn, &org, &project, query.status.as_deref())
    })
    .await?;
    Ok(axum::Json(ApprovalList {
        approvals: rows.into_iter().map(ApprovalView::from).collect(),
    }))
}

/// Approve what the agent asked to do (needs the `approve` scope).
#[utoipa::path(post, path = "/v1/projects/{id}/approvals/{approval_id}/approve", tag = "approvals",
    params(("id" = String, Path, description = "Project id"), ("approval_id" = String, Path, description = "Approval id")),
    responses((status = 202, body = ApprovalDecided), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn approve(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path((id, approval_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    decide(state, caller, request, (id, approval_id), Decision::Approve).await
}

/// Reject what the agent asked to do (needs the `approve` scope).
#[utoipa::path(post, path = "/v1/projects/{id}/approvals/{approval_id}/reject", tag = "approvals",
    params(("id" = String, Path, description = "Project id"), ("approval_id" = String, Path, description = "Approval id")),
    request_body(content = Rejection, description = "Optional"),
    responses((status = 202, body = ApprovalDecided), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn reject(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path((id, approval_id)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(body_error)?;
    let rejection: Rejection = parse_optional_json(&body)?;
    let reason = rejection.reason.unwrap_or_default();
    decide(
        state,
        caller,
        request,
        (id, approval_id),
        Decision::Reject { reason },
    )
    .await
}

/// Stores the decision on a pending approval of the caller's project; 409
/// once it is decided (by this read model, or by the stored decision when
/// another reviewer's request got there first).
async fn decide(
    state: AppState,
    caller: Caller,
    request: RequestId,
    (id, approval_id): (String, String),
    decision: Decision,
) -> Result<Response, ApiError> {
    caller.require(Scope::Approve, "deciding an approval")?;
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let event = commands::decide_approval(
        &requester(&caller, &request),
        project,
        &approval_id,
        &decision,
    )
    .map_err(invalid)?;
    let org = caller.0.org.clone();
    let lookup = approval_id.clone();
    let found = read(&state, move |conn| {
        approvals::find(conn, &org, &project, &lookup)
    })
    .await?
    .ok_or_else(|| ApiError::not_found("approval"))?;
    if found.status != Status::Pending.as_str() {
        return Err(decided(&found.approval_id, &found.status));
    }
    let now = state.runtime.clock.now();
    if let Some(expires) = found
        .expires_at
        .as_deref()
        .and_then(zopu_schema::envelope::parse_time)
        && expires <= now
    {
        // Past its expiry, not yet closed by the agent's sweep: refused all the same.
        return Err(decided(&found.approval_id, Status::Expired.as_str()));
    }
    let status = match decision {
        Decision::Approve => Status::Approved,
        Decision::Reject { .. } => Status::Rejected,
    };
    let event_type = event.event_type;
    let accepted = append(&state, event, &request).await?;
    if accepted.duplicate {
        // The decision key was taken: by this request (a retry), or by another.
        let stored = zopu_runtime::publish::get_event(&state.runtime.bus, accepted.sequence)
            .await
            .map_err(|error| ApiError::unavailable("event log", error))?;
        if stored.correlation_id != request.0 || stored.event_type != event_type {
            let stored_status =
                approval::decision_of(&stored).map_or("decided", |decided| decided.status.as_str());
            return Err(decided(&found.approval_id, stored_status));
        }
    }
    let body = ApprovalDecided {
        approval_id: found.approval_id,
        status: status.as_str().to_owned(),
        event_id: accepted.event_id,
        sequence: accepted.sequence,
        duplicate: accepted.duplicate,
        request_id: accepted.request_id,
    };
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

fn decided(approval_id: &str, status: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "approval_decided",
        format!("approval {approval_id} is already {status}"),
    )
}
