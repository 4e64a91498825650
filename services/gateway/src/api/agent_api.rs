//! The Agent API for external agents (`/v1/agent/...`, authenticated with
//! an agent key `zak_...`, never a user token): `GET /v1/agent/config`
//! says what the key's agent may do — its capabilities (the key's, within
//! the registry definition's), projects, flows, rate limits and whether the
//! registry lets it run — and `GET /v1/agent/candidates` pages the user
//! messages of its projects (the `read_candidates` capability).
//!
//! Every call checks the agent against the registry this gateway loaded: an
//! agent that is not registered as `external` is refused (403
//! `agent_not_registered`), a disabled one too (403 `agent_disabled`), so
//! disabling it in the registry stops its runtime at its next call.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use zopu_core::registry::RegisteredAgent;
use zopu_schema::ProjectId;
use zopu_schema::agent_registry::AgentKind;

use super::{query_error, read};
use crate::AppState;
use crate::http::{AgentCaller, ApiError, ErrorBody};
use crate::read_model::timeline;

/// Most candidates one page returns.
pub const CANDIDATES_LIMIT_MAX: u32 = 200;
const CANDIDATES_LIMIT_DEFAULT: u32 = 50;

/// `GET /v1/agent/config`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AgentConfig {
    /// The agent's registry key.
    pub agent: String,
    pub org: String,
    /// The key's id (not secret).
    pub key_id: String,
    /// Whether the registry lets the agent run (false: every other call is refused).
    pub enabled: bool,
    /// What it may do: the key's capabilities that its definition also has.
    pub capabilities: Vec<String>,
    /// The projects it may act in.
    pub projects: Vec<String>,
    /// The flows it may request (its definition's routing).
    pub flows: Vec<String>,
    pub rate_limits: AgentRateLimits,
    /// When the key stops being accepted (RFC 3339).
    pub key_expires_at: String,
}

/// The limits the platform holds the agent to.
#[derive(Debug, Serialize, ToSchema)]
pub struct AgentRateLimits {
    /// Writes per minute per key (the gateway's per-token message limit).
    pub actions_per_minute: u32,
    /// Candidates one page returns at most.
    pub candidates_per_page: u32,
}

/// `GET /v1/agent/candidates` query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct CandidatesQuery {
    /// One of the key's projects (default: all of them).
    pub project: Option<String>,
    /// The cursor: candidates stored after this stream sequence (`next_after` of the last page).
    #[serde(default)]
    pub after: u64,
    /// At most this many (1 to 200, default 50).
    pub limit: Option<u32>,
}

/// One user message an external agent may answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Candidate {
    pub project_id: String,
    /// The message's event id (what an action names as its candidate).
    pub event_id: String,
    pub sequence: u64,
    pub time: String,
    pub text: String,
    pub author: Option<String>,
    pub work_id: Option<String>,
    pub thread_id: Option<String>,
}

/// `GET /v1/agent/candidates`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Candidates {
    pub candidates: Vec<Candidate>,
    /// The cursor of the next page (`after`).
    pub next_after: u64,
    /// Whether more are stored after this page.
    pub more: bool,
}

/// The caller's registry definition: 403 unless it is an external agent.
fn definition<'a>(
    state: &'a AppState,
    caller: &AgentCaller,
) -> Result<&'a RegisteredAgent, ApiError> {
    let api = state.agent_api.as_ref().ok_or_else(|| {
        ApiError::unavailable(
            "agent api",
            "this gateway was started without the Agent API",
        )
    })?;
    let agent = &caller.0.grant.agent;
    api.registry
        .agent(agent)
        .filter(|registered| registered.definition.kind == AgentKind::External)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::FORBIDDEN,
                "agent_not_registered",
                format!("{agent:?} is not an external agent of the registry"),
            )
        })
}

/// The caller's definition, if the registry lets it run (403 `agent_disabled` if not).
fn runnable<'a>(
    state: &'a AppState,
    caller: &AgentCaller,
) -> Result<&'a RegisteredAgent, ApiError> {
    let definition = definition(state, caller)?;
    if !definition.definition.enabled {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "agent_disabled",
            format!(
                "agent {:?} is disabled in the registry; it may not act",
                caller.0.grant.agent
            ),
        ));
    }
    Ok(definition)
}

/// The key's capabilities its definition also grants.
fn capabilities(caller: &AgentCaller, definition: &RegisteredAgent) -> Vec<String> {
    caller
        .0
        .grant
        .capabilities
        .iter()
        .filter(|capability| definition.definition.capabilities.contains(capability))
        .cloned()
        .collect()
}

fn require(
    caller: &AgentCaller,
    definition: &RegisteredAgent,
    capability: &str,
) -> Result<(), ApiError> {
    if capabilities(caller, definition)
        .iter()
        .any(|c| c == capability)
    {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "capability_missing",
        format!(
            "agent {:?} may not {capability} (its key and definition grant: {})",
            caller.0.grant.agent,
            capabilities(caller, definition).join(", ")
        ),
    ))
}

/// What the calling agent may do.
#[utoipa::path(get, path = "/v1/agent/config", tag = "agent-api",
    responses((status = 200, body = AgentConfig), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("agent_key" = [])))]
pub async fn agent_config(
    State(state): State<AppState>,
    caller: AgentCaller,
) -> Result<axum::Json<AgentConfig>, ApiError> {
    let definition = definition(&state, &caller)?;
    let key = match state.agent_api.as_ref() {
        Some(api) => api.keys.info(&caller.0.key_id).await.ok().flatten(),
        None => None,
    };
    Ok(axum::Json(AgentConfig {
        agent: caller.0.grant.agent.clone(),
        org: caller.0.org.to_string(),
        key_id: caller.0.key_id.clone(),
        enabled: definition.definition.enabled,
        capabilities: capabilities(&caller, definition),
        projects: caller
            .0
            .grant
            .projects
            .iter()
            .map(ToString::to_string)
            .collect(),
        flows: definition
            .definition
            .routing
            .flows
            .iter()
            .map(|flow| flow.as_str().to_owned())
            .collect(),
        rate_limits: AgentRateLimits {
            actions_per_minute: state.config.messages_per_minute_per_token,
            candidates_per_page: CANDIDATES_LIMIT_MAX,
        },
        key_expires_at: key
            .map(|key| zopu_schema::envelope::format_time(key.expires_at))
            .unwrap_or_default(),
    }))
}

/// The user messages of the agent's projects after a cursor.
#[utoipa::path(get, path = "/v1/agent/candidates", tag = "agent-api",
    params(CandidatesQuery),
    responses((status = 200, body = Candidates), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody, description = "Disabled, unregistered, without read_candidates, or a project outside the key")),
    security(("agent_key" = [])))]
pub async fn agent_candidates(
    State(state): State<AppState>,
    caller: AgentCaller,
    query: Result<Query<CandidatesQuery>, QueryRejection>,
) -> Result<axum::Json<Candidates>, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let definition = runnable(&state, &caller)?;
    require(&caller, definition, "read_candidates")?;
    let limit = query.limit.unwrap_or(CANDIDATES_LIMIT_DEFAULT);
    if !(1..=CANDIDATES_LIMIT_MAX).contains(&limit) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("limit must be 1 to {CANDIDATES_LIMIT_MAX}"),
        )
        .field("limit"));
    }
    let granted = &caller.0.grant.projects;
    let projects: Vec<ProjectId> = match query.project.as_deref() {
        None => granted.clone(),
        Some(text) => {
            let project = text
                .parse::<ProjectId>()
                .ok()
                .filter(|p| granted.contains(p));
            vec![project.ok_or_else(|| {
                ApiError::new(
                    StatusCode::FORBIDDEN,
                    "project_outside_scope",
                    format!("this agent key does not cover project {text:?}"),
                )
                .field("project")
            })?]
        }
    };
    let org = caller.0.org.clone();
    let after = query.after;
    let mut rows = read(&state, move |conn| {
        timeline::user_messages(conn, &org, &projects, after, limit as usize + 1)
    })
    .await?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next_after = rows.last().map_or(after, |row| row.sequence);
    let candidates = rows
        .into_iter()
        .map(|row| Candidate {
            project_id: row.project_id,
            event_id: row.event_id,
            sequence: row.sequence,
            time: row.time,
            text: row.text.unwrap_or_default(),
            author: row.author,
            work_id: row.work_id,
            thread_id: row.thread_id,
        })
        .collect();
    Ok(axum::Json(Candidates {
        candidates,
        next_after,
        more,
    }))
}
