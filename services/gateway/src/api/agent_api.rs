//! The Agent API for external agents (`/v1/agent/...`, authenticated with
//! an agent key `zak_...`, never a user token): `GET /v1/agent/config`
//! says what the key's agent may do — its capabilities (the key's, within
//! the registry definition's), projects, flows, rate limits and whether the
//! registry lets it run — `GET /v1/agent/candidates` pages the user
//! messages of its projects it has not answered yet (the `read_candidates`
//! capability), and `POST
//! /v1/agent/actions` performs one action on a candidate: a `reply`
//! (`post_message`), stored as an `agent.message`, or `open_work`
//! (`open_work`), stored as a `work.created` of kind `external` — each
//! attributed to the agent (`external:<agent>`) and caused by the candidate.
//!
//! Every action passes the platform's checks, the ones the built-in agent's
//! writes pass: the registry lets the agent run (403 `agent_disabled`), the
//! project's kill switch is off (403 `agent_paused`), the capability (403
//! `capability_missing`) and the project (403 `project_outside_scope`) are
//! the key's, the candidate is a user message of that project (404), the
//! text is short and holds no secret (422), it is not a near-duplicate of
//! the agent's recent outputs there (409 `near_duplicate`), and the rate
//! limit holds (429). After three rejections in a row the key is backed
//! off — 429 `backed_off` with `Retry-After`, 30 s doubling up to 10 min —
//! until an accepted action; the counters are this gateway instance's.
//!
//! Every call checks the agent against the registry this gateway loaded: an
//! agent that is not registered as `external` is refused (403
//! `agent_not_registered`), a disabled one too (403 `agent_disabled`), so
//! disabling it in the registry stops its runtime at its next call.

use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use zopu_core::registry::RegisteredAgent;
use zopu_schema::ProjectId;
use zopu_schema::agent_registry::AgentKind;

use super::append::append;
use super::{query_error, read};
use crate::AppState;
use crate::http::{AgentCaller, ApiError, ErrorBody, RequestId, body_error, parse_json};
use crate::quotas;
use crate::read_model::timeline;
use crate::views::queries;

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

/// The user messages of the agent's projects after a cursor that it has not answered.
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
    let replier = external_agent_id(&caller.0.grant.agent);
    let mut rows = read(&state, move |conn| {
        timeline::unanswered_messages(conn, &org, &projects, &replier, after, limit as usize + 1)
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

/// Longest reply an external agent may post, in characters.
pub const REPLY_MAX_CHARS: usize = 2000;
/// How similar to one of its recent outputs a reply may be.
pub const NEAR_DUPLICATE_THRESHOLD: f64 = 0.85;
/// How many of its recent outputs a reply is compared with.
const RECENT_OUTPUTS: usize = 10;

/// Longest title of a Work an external agent opens.
pub const WORK_TITLE_MAX_CHARS: usize = 120;
/// Longest summary of a Work an external agent opens.
pub const WORK_SUMMARY_MAX_CHARS: usize = 500;

/// `POST /v1/agent/actions` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentAction {
    /// `reply` (the `post_message` capability) or `open_work` (`open_work`).
    #[serde(rename = "type")]
    pub kind: String,
    /// One of the key's projects.
    pub project: String,
    /// The candidate's event id (`GET /v1/agent/candidates`).
    pub candidate: String,
    /// `reply`: 1 to 2000 characters, no credentials.
    #[serde(default)]
    pub text: Option<String>,
    /// `open_work`: the Work's title, 1 to 120 characters.
    #[serde(default)]
    pub title: Option<String>,
    /// `open_work`: an optional summary, at most 500 characters.
    #[serde(default)]
    pub summary: Option<String>,
}

/// An action the platform accepted.
#[derive(Debug, Serialize, ToSchema)]
pub struct AgentActionAccepted {
    /// The stored event's id and stream sequence.
    pub event_id: String,
    pub sequence: u64,
    /// True when the same request (`X-Request-Id`) was already stored.
    pub duplicate: bool,
    pub request_id: String,
    /// `open_work`: the Work it opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_id: Option<String>,
}

/// The agent id an external agent's events carry.
pub fn external_agent_id(agent: &str) -> String {
    format!("external:{agent}")
}

/// Perform one action on a candidate, within the agent's capabilities.
#[utoipa::path(post, path = "/v1/agent/actions", tag = "agent-api",
    request_body = AgentAction,
    responses((status = 202, body = AgentActionAccepted), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody, description = "Disabled, paused, without the capability, or a project outside the key"),
        (status = 404, body = ErrorBody, description = "No such candidate in the project"),
        (status = 409, body = ErrorBody, description = "A near-duplicate of the agent's recent output"),
        (status = 422, body = ErrorBody), (status = 429, body = ErrorBody, description = "Rate limited, or backed off after repeated rejections")),
    security(("agent_key" = [])))]
pub async fn agent_action(
    State(state): State<AppState>,
    caller: AgentCaller,
    request: RequestId,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, axum::Json<AgentActionAccepted>), ApiError> {
    let key_id = caller.0.key_id.clone();
    state
        .quotas
        .agent_backoff(&key_id, std::time::Instant::now())?;
    match checked_action(&state, &caller, &request, body).await {
        Ok(accepted) => {
            state.quotas.agent_accepted(&key_id);
            Ok((StatusCode::ACCEPTED, axum::Json(accepted)))
        }
        Err(error) => {
            // A refusal of the platform's checks counts towards the back-off;
            // an outage of ours does not.
            if error.status.is_client_error() {
                state
                    .quotas
                    .agent_rejected(&key_id, std::time::Instant::now());
                tracing::info!(agent = %caller.0.grant.agent, key_id = %key_id, code = error.code, "agent action rejected");
            }
            Err(error)
        }
    }
}

/// What an action does, once its fields are checked.
enum Act {
    /// `reply`: an `agent.message` answering the candidate.
    Reply { text: String },
    /// `open_work`: a `work.created` of the agent, started from the candidate.
    OpenWork { title: String, summary: String },
}

impl Act {
    fn of(action: &AgentAction) -> Result<Self, ApiError> {
        let field = |name: &str, value: &Option<String>, max: usize| {
            let text = value.as_deref().unwrap_or_default().trim().to_owned();
            if text.is_empty() || text.chars().count() > max {
                return Err(ApiError::invalid(
                    name,
                    format!("{} needs `{name}`: 1 to {max} characters", action.kind),
                ));
            }
            if let Some(finding) = zopu_secrets::scan(&text).first() {
                return Err(ApiError::invalid(
                    name,
                    format!(
                        "`{name}` looks like it holds a credential ({}); nothing was stored",
                        finding.rule
                    ),
                ));
            }
            Ok(text)
        };
        let unused = |name: &str, value: &Option<String>| match value {
            Some(_) => Err(ApiError::invalid(
                name,
                format!("{} takes no `{name}`", action.kind),
            )),
            None => Ok(()),
        };
        match action.kind.as_str() {
            "reply" => {
                unused("title", &action.title)?;
                unused("summary", &action.summary)?;
                Ok(Act::Reply {
                    text: field("text", &action.text, REPLY_MAX_CHARS)?,
                })
            }
            "open_work" => {
                unused("text", &action.text)?;
                let summary = match &action.summary {
                    Some(_) => field("summary", &action.summary, WORK_SUMMARY_MAX_CHARS)?,
                    None => String::new(),
                };
                Ok(Act::OpenWork {
                    title: field("title", &action.title, WORK_TITLE_MAX_CHARS)?,
                    summary,
                })
            }
            other => Err(ApiError::invalid(
                "type",
                format!(
                    "{other:?} is not an action the Agent API performs yet (known: reply, open_work)"
                ),
            )),
        }
    }

    /// The capability it needs, and the word its idempotency key uses.
    fn capability(&self) -> (&'static str, &'static str) {
        match self {
            Act::Reply { .. } => ("post_message", "reply"),
            Act::OpenWork { .. } => ("open_work", "work"),
        }
    }
}

async fn checked_action(
    state: &AppState,
    caller: &AgentCaller,
    request: &RequestId,
    body: Result<Bytes, BytesRejection>,
) -> Result<AgentActionAccepted, ApiError> {
    let body = body.map_err(body_error)?;
    let action: AgentAction = parse_json(&body)?;
    let definition = runnable(state, caller)?;
    let act = Act::of(&action)?;
    let (capability, what) = act.capability();
    require(caller, definition, capability)?;
    let project = action
        .project
        .parse::<ProjectId>()
        .ok()
        .filter(|project| caller.0.grant.projects.contains(project))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::FORBIDDEN,
                "project_outside_scope",
                format!("this agent key does not cover project {:?}", action.project),
            )
            .field("project")
        })?;
    let org = caller.0.org.clone();
    let author = external_agent_id(&caller.0.grant.agent);
    let (candidate, paused, recent) = {
        let (org, author, candidate) = (org.clone(), author.clone(), action.candidate.clone());
        read(state, move |conn| {
            let item = timeline::item_of_event(conn, &org, &project, &candidate)?;
            let paused =
                queries::project(conn, &org, &project)?.is_some_and(|view| !view.agent_enabled);
            let recent = timeline::recent_texts_of(conn, &org, &project, &author, RECENT_OUTPUTS)?;
            Ok((item, paused, recent))
        })
        .await?
    };
    let candidate = candidate
        .filter(|item| item.kind == timeline::ItemKind::UserMessage)
        .ok_or_else(|| ApiError::not_found("candidate"))?;
    if paused {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "agent_paused",
            "the project's agents are paused (its kill switch); nothing may be posted until it is resumed",
        ));
    }
    // A retried request answers with what the first stored (before the
    // near-duplicate guard, which would see the first's reply).
    let key = zopu_schema::keys::user_request(
        &project,
        &request.0,
        &format!(
            "agent:{}:{what}:{}",
            caller.0.grant.agent, candidate.event_id
        ),
    );
    if let Some(stored) = state
        .runtime
        .publisher
        .recorded(&key)
        .await
        .map_err(|error| ApiError::unavailable("event log", error))?
    {
        let sequence = state
            .runtime
            .store
            .key_sequence(&key)
            .ok()
            .flatten()
            .unwrap_or(0);
        return Ok(AgentActionAccepted {
            event_id: stored.id.to_string(),
            sequence,
            duplicate: true,
            request_id: request.0.to_string(),
            work_id: stored.work_id.map(|work| work.to_string()),
        });
    }
    if let Act::Reply { text } = &act
        && let Some((earlier, score)) =
            zopu_core::text::near_duplicate(text, &recent, NEAR_DUPLICATE_THRESHOLD)
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "near_duplicate",
            format!(
                "the reply is {:.0}% like this agent's earlier \"{}\"; say something new",
                score * 100.0,
                zopu_core::text::clip_chars(earlier, 80)
            ),
        ));
    }
    state.quotas.admit_for(
        org.as_str(),
        &caller.0.key_id,
        quotas::Action::Message,
        std::time::Instant::now(),
    )?;
    let source = zopu_core::publish::get_event(&state.runtime.bus, candidate.sequence)
        .await
        .map_err(|error| ApiError::unavailable("event log", error))?;
    let (event, work_id) = match act {
        Act::Reply { text } => {
            let message = zopu_schema::pb::AgentMessage {
                agent_id: author,
                text,
                reply_to_event_id: candidate.event_id.clone(),
                importance: zopu_schema::pb::Importance::Normal as i32,
                status: "done".into(),
                provider: format!("external:{}", caller.0.key_id),
            };
            (
                zopu_core::NewEvent::caused_by(&source.context(), &message, key),
                None,
            )
        }
        Act::OpenWork { title, summary } => {
            let work = zopu_schema::WorkId::new();
            let created = zopu_schema::pb::WorkCreated {
                title,
                summary,
                kind: "external".into(),
                agent_id: author,
            };
            let event =
                zopu_core::NewEvent::caused_by(&source.context(), &created, key).with_work(work);
            (event, Some(work.to_string()))
        }
    };
    let accepted = append(state, event, request).await?;
    Ok(AgentActionAccepted {
        event_id: accepted.event_id,
        sequence: accepted.sequence,
        duplicate: accepted.duplicate,
        request_id: accepted.request_id,
        work_id,
    })
}
