//! The Agent API for external agents (`/v1/agent/...`, authenticated with
//! an agent key `zak_...`, never a user token): `GET /v1/agent/config`
//! says what the key's agent may do — its capabilities (the key's, within
//! the registry definition's), projects, flows, rate limits and whether the
//! registry lets it run; `GET /v1/agent/timeline` (`read_timeline`) reads a
//! project's timeline; `GET /v1/agent/candidates` (`read_candidates`) pages
//! what awaits it: the users' messages it has not answered and the endings
//! of the flows it requested; and `POST /v1/agent/actions` performs one
//! action on a candidate, attributed to the agent (`external:<agent>`) and
//! caused by the candidate:
//! - `reply` (`post_message`): an `agent.message` answering the candidate;
//!   `comment` (`post_message`): one in the candidate's Work and Thread
//!   that answers nothing, so the candidate still awaits the agent;
//! - `open_work` (`open_work`): a `work.created` of kind `external`;
//! - `request_flow` (`request_flow`): the Work (the candidate's, continued,
//!   or a new one), Thread, `flow.requested` and handoff the conversation
//!   agent would write ([`zopu_core::delegation`]), for a flow its
//!   definition routes and a specialist its mesh rules allow. One run per
//!   candidate, flow and agent: its keys do not depend on the request, and
//!   the specialists key its run apart from the conversation agent's
//!   ([`zopu_schema::keys::requested_flow_run`]);
//! - `propose_artifact` (`propose_artifact`): an `artifact.build.requested`
//!   of a manifest built from the agent's typed content, checked as every
//!   manifest is, in a run of its own within the candidate's Work and
//!   Thread; the artifact pipeline renders, validates and publishes it.
//!
//! Every action passes the platform's checks, the ones the built-in agent's
//! writes pass: the registry lets the agent run (403 `agent_disabled`), the
//! project's kill switch is off (403 `agent_paused`), the capability (403
//! `capability_missing`) and the project (403 `project_outside_scope`) are
//! the key's, the candidate awaits the agent in that project (404), the
//! text is short and holds no secret (422), it is not a near-duplicate of
//! the agent's recent outputs there (409 `near_duplicate`), and the rate
//! limit holds (429). After three rejections in a row the key is backed
//! off — 429 `backed_off` with `Retry-After`, 30 s doubling up to 10 min —
//! until an accepted action; the run of rejections lives in the tokens
//! bucket beside the key, so every gateway instance backs the agent off
//! alike (the rate limit's token bucket is this instance's, as every
//! gateway quota is).
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

use super::timeline::{TimelinePage, TimelineQuery, timeline_page};
use super::{owned_project, query_error, read};
use crate::AppState;
use crate::http::{AgentCaller, ApiError, ErrorBody};
use crate::read_model::timeline;

pub(super) mod actions;

use actions::external_agent_id;

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
#[into_params(parameter_in = Query)]
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

/// What awaits an external agent: a user's message it has not answered, or
/// the ending of a flow it requested (its Thread's result) that it has not
/// answered either.
#[derive(Debug, Serialize, ToSchema)]
pub struct Candidate {
    /// `message` or `flow_ended`.
    pub kind: String,
    pub project_id: String,
    /// The event id (what an action names as its candidate).
    pub event_id: String,
    pub sequence: u64,
    pub time: String,
    /// The message; for a flow ending its summary, or why it failed or was cancelled.
    pub text: String,
    /// The message's author.
    pub author: Option<String>,
    pub work_id: Option<String>,
    pub thread_id: Option<String>,
    /// A flow ending: its run, flow type and state (`completed`, `failed`, `cancelled`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow_run_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow_state: Option<String>,
}

impl Candidate {
    fn of(row: timeline::ItemRow) -> Self {
        let flow = row.flow;
        let kind = if flow.is_some() {
            "flow_ended"
        } else {
            "message"
        };
        let text = match &flow {
            Some(flow) => flow
                .note
                .clone()
                .or_else(|| row.failure.as_ref().map(|failure| failure.message.clone()))
                .unwrap_or_default(),
            None => row.text.unwrap_or_default(),
        };
        Self {
            kind: kind.to_owned(),
            project_id: row.project_id,
            event_id: row.event_id,
            sequence: row.sequence,
            time: row.time,
            text,
            author: if flow.is_some() { None } else { row.author },
            work_id: row.work_id,
            thread_id: row.thread_id,
            flow_run_id: flow.as_ref().map(|flow| flow.flow_run_id.clone()),
            flow_type: flow.as_ref().map(|flow| flow.flow_type.clone()),
            flow_state: flow.map(|flow| flow.state),
        }
    }
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

/// The project named `text`, if the key covers it (403 `project_outside_scope`).
fn scoped_project(caller: &AgentCaller, text: &str) -> Result<ProjectId, ApiError> {
    text.parse::<ProjectId>()
        .ok()
        .filter(|project| caller.0.grant.projects.contains(project))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::FORBIDDEN,
                "project_outside_scope",
                format!("this agent key does not cover project {text:?}"),
            )
            .field("project")
        })
}

/// `GET /v1/agent/timeline` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AgentTimelineQuery {
    /// One of the key's projects.
    pub project: String,
    /// Items after this stream sequence (exclusive); absent: from the start.
    pub after: Option<u64>,
    /// Most items to return (default and maximum: the gateway's page size).
    pub limit: Option<usize>,
}

/// A project's timeline as its users see it: messages, agent posts, Work
/// cards, flow states (a flow request names its requester) and artifact
/// cards, paged by cursor (the `read_timeline` capability).
#[utoipa::path(get, path = "/v1/agent/timeline", tag = "agent-api",
    params(AgentTimelineQuery),
    responses((status = 200, body = TimelinePage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody, description = "Disabled, unregistered, without read_timeline, or a project outside the key"),
        (status = 404, body = ErrorBody, description = "No such project")),
    security(("agent_key" = [])))]
pub async fn agent_timeline(
    State(state): State<AppState>,
    caller: AgentCaller,
    query: Result<Query<AgentTimelineQuery>, QueryRejection>,
) -> Result<axum::Json<TimelinePage>, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let definition = runnable(&state, &caller)?;
    require(&caller, definition, "read_timeline")?;
    let project = scoped_project(&caller, &query.project)?;
    let (project, view) = owned_project(&state, &caller.0.org, &project.to_string()).await?;
    let page = TimelineQuery {
        after: query.after,
        limit: query.limit,
    };
    timeline_page(&state, &caller.0.org, project, view.running, None, page).await
}

/// What awaits the agent in its projects after a cursor: the users'
/// messages it has not answered, and the endings of the flows it requested
/// that it has not answered either.
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
    let projects: Vec<ProjectId> = match query.project.as_deref() {
        None => caller.0.grant.projects.clone(),
        Some(text) => vec![scoped_project(&caller, text)?],
    };
    let org = caller.0.org.clone();
    let after = query.after;
    let replier = external_agent_id(&caller.0.grant.agent);
    let mut rows = read(&state, move |conn| {
        timeline::awaiting(conn, &org, &projects, &replier, after, limit as usize + 1)
    })
    .await?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next_after = rows.last().map_or(after, |row| row.sequence);
    let candidates = rows.into_iter().map(Candidate::of).collect();
    Ok(axum::Json(Candidates {
        candidates,
        next_after,
        more,
    }))
}

/// `POST /v1/agent/actions` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentAction {
    /// `reply` or `comment` (the `post_message` capability), `open_work` (`open_work`),
    /// `request_flow` (`request_flow`) or `propose_artifact` (`propose_artifact`).
    #[serde(rename = "type")]
    pub kind: String,
    /// One of the key's projects.
    pub project: String,
    /// The candidate's event id (`GET /v1/agent/candidates`).
    pub candidate: String,
    /// `reply`, `comment`: 1 to 2000 characters, no credentials. `request_flow`: what
    /// the specialist is asked, 1 to 2000 characters.
    #[serde(default)]
    pub text: Option<String>,
    /// `open_work`: the Work's title, 1 to 120 characters. `request_flow`:
    /// optional, the Work's and Thread's title (default: the text's start).
    #[serde(default)]
    pub title: Option<String>,
    /// `open_work`: an optional summary, at most 500 characters.
    #[serde(default)]
    pub summary: Option<String>,
    /// `request_flow`: `explore` or `issue`, one of the flows the agent's
    /// definition routes (`GET /v1/agent/config` `flows`).
    #[serde(default)]
    pub flow: Option<String>,
    /// `propose_artifact`: the artifact's content, built into validated
    /// static HTML by the artifact pipeline.
    #[serde(default)]
    pub artifact: Option<ProposedArtifact>,
}

/// An artifact an external agent proposes: its typed content, which the
/// platform renders with its own kit and validates like every artifact.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProposedArtifact {
    /// `exploration` or `issue`.
    pub kind: String,
    pub title: String,
    pub summary: String,
    /// At least one; an issue needs a `current_desired` section.
    pub sections: Vec<ProposedSection>,
}

/// One section of a proposed artifact.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProposedSection {
    /// `prose`, `facts`, `checklist`, `list`, `files`, `risks`, `commands` or `current_desired`.
    pub kind: String,
    #[serde(default)]
    pub title: String,
    /// Paragraph text for `prose`; an introduction for the others.
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub items: Vec<String>,
    #[serde(default)]
    pub facts: Vec<ProposedFact>,
    /// `current_desired`: the world today and the one wanted.
    #[serde(default)]
    pub current_world: String,
    #[serde(default)]
    pub desired_world: String,
}

/// A label and its value.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProposedFact {
    pub label: String,
    pub value: String,
}

/// An action the platform accepted.
#[derive(Debug, Serialize, ToSchema)]
pub struct AgentActionAccepted {
    /// The stored event's id and stream sequence (`request_flow`: the
    /// `flow.requested`; `propose_artifact`: the `artifact.build.requested`).
    pub event_id: String,
    pub sequence: u64,
    /// True when the same request was already stored: the same
    /// `X-Request-Id`, or for `request_flow` the same flow of the same
    /// candidate (one run per candidate, flow and agent).
    pub duplicate: bool,
    pub request_id: String,
    /// `open_work`, `request_flow`: the Work it opened (or continued).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_id: Option<String>,
    /// `request_flow`: the Thread and the flow run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow_run_id: Option<String>,
    /// `propose_artifact`: the artifact, whose card appears once it is built.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub artifact_id: Option<String>,
}
