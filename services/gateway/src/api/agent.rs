//! The agent's kill switch: disable and enable a project's conversation agent.

use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use zopu_core::commands;

use super::append::append;
use super::{invalid, owned_project, project_id, requester};
use crate::AppState;
use crate::http::body_error;
use crate::http::{ApiError, Caller, ErrorBody, RequestId, parse_optional_json};
use crate::tokens::Scope;

/// `POST /v1/projects/{id}/agent/disable` body (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentSwitch {
    /// Why (shown on the timeline; at most 500 characters).
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AgentSwitched {
    pub agent_id: String,
    pub enabled: bool,
    pub event_id: String,
    pub sequence: u64,
    pub request_id: String,
}

async fn switch_agent(
    state: AppState,
    caller: Caller,
    request: RequestId,
    id: String,
    body: Result<Bytes, BytesRejection>,
    enable: bool,
) -> Result<Response, ApiError> {
    caller.require(
        Scope::Admin,
        if enable {
            "enabling the agent"
        } else {
            "disabling the agent (the kill switch)"
        },
    )?;
    let body = body.map_err(body_error)?;
    let switch: AgentSwitch = parse_optional_json(&body)?;
    let project = project_id(&id)?;
    let requester = requester(&caller, &request);
    let event = if enable {
        commands::enable_agent(&requester, project)
    } else {
        commands::disable_agent(&requester, project, &switch.reason.unwrap_or_default())
    }
    .map_err(invalid)?;
    owned_project(&state, &caller.0.org, &id).await?;
    let agent = zopu_schema::AgentId::conversation(&caller.0.org, &project);
    let accepted = append(&state, event, &request).await?;
    let body = AgentSwitched {
        agent_id: agent.to_string(),
        enabled: enable,
        event_id: accepted.event_id,
        sequence: accepted.sequence,
        request_id: accepted.request_id,
    };
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

/// Disable the project's agent (kill switch; respected mid-run).
#[utoipa::path(post, path = "/v1/projects/{id}/agent/disable", tag = "agent", params(("id" = String, Path, description = "Project id")),
    request_body(content = AgentSwitch, description = "Optional"),
    responses((status = 202, body = AgentSwitched), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn disable_agent(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    switch_agent(state, caller, request, id, body, false).await
}

/// Enable the project's agent again.
#[utoipa::path(post, path = "/v1/projects/{id}/agent/enable", tag = "agent", params(("id" = String, Path, description = "Project id")),
    request_body(content = AgentSwitch, description = "Optional"),
    responses((status = 202, body = AgentSwitched), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn enable_agent(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    switch_agent(state, caller, request, id, body, true).await
}
