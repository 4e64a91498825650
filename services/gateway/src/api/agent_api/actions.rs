//! `POST /v1/agent/actions`: one action of an external agent on one of its
//! candidates (reply, comment, open a Work, request a flow, propose an
//! artifact), checked against the agent's definition, capabilities,
//! projects and rate limits, attributed to `external:<agent>` and caused by
//! the candidate (see the parent module for each action).

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use bytes::Bytes;
use zopu_core::delegation::{Delegation, DelegationKeys, delegate};
use zopu_core::registry::RegisteredAgent;
use zopu_runtime::NewEvent;
use zopu_schema::agent_registry::RoutedFlow;
use zopu_schema::{
    ArtifactId, BuildId, Envelope, Event, FlowRunId, ProjectId, ThreadId, WorkId, pb,
};

use crate::api::append::append;
use crate::api::read;

use super::{
    AgentAction, AgentActionAccepted, ProposedArtifact, require, runnable, scoped_project,
};
use crate::AppState;
use crate::http::{AgentCaller, ApiError, ErrorBody, RequestId, body_error, parse_json};
use crate::quotas;
use crate::read_model::{projects, timeline};

/// Longest reply an external agent may post, in characters.
pub const REPLY_MAX_CHARS: usize = 2000;
/// How similar to one of its recent outputs a reply may be.
pub const NEAR_DUPLICATE_THRESHOLD: f64 = 0.85;
/// How many of its recent outputs a reply is compared with.
pub(super) const RECENT_OUTPUTS: usize = 10;

/// Longest title of a Work an external agent opens.
pub const WORK_TITLE_MAX_CHARS: usize = 120;
/// Longest summary of a Work an external agent opens.
pub const WORK_SUMMARY_MAX_CHARS: usize = 500;
/// The version of the flows an external agent requests.
pub const REQUESTED_FLOW_VERSION: u32 = 1;

/// What the answer to an action names of the event it stored.
pub(super) struct StoredAction<'a> {
    event_type: &'a str,
    data: &'a [u8],
    work: Option<WorkId>,
    thread: Option<ThreadId>,
    flow_run: Option<FlowRunId>,
}

impl<'a> StoredAction<'a> {
    fn of_envelope(event: &'a Envelope) -> Self {
        Self {
            event_type: &event.event_type,
            data: &event.data,
            work: event.work_id,
            thread: event.thread_id,
            flow_run: event.flow_run_id,
        }
    }

    fn of_new(event: &'a NewEvent) -> Self {
        Self {
            event_type: event.event_type,
            data: &event.data,
            work: event.context.work_id,
            thread: event.context.thread_id,
            flow_run: event.context.flow_run_id,
        }
    }

    fn answer(
        &self,
        event_id: String,
        sequence: u64,
        duplicate: bool,
        request: &RequestId,
    ) -> AgentActionAccepted {
        use prost::Message;
        let is = |event_type: &str| self.event_type == event_type;
        let artifact_id = is(pb::ArtifactBuildRequested::TYPE)
            .then(|| pb::ArtifactBuildRequested::decode(self.data).ok())
            .flatten()
            .map(|build| build.artifact_id);
        let with_work = is(pb::WorkCreated::TYPE) || is(pb::FlowRequested::TYPE);
        AgentActionAccepted {
            event_id,
            sequence,
            duplicate,
            request_id: request.0.to_string(),
            work_id: self.work.filter(|_| with_work).map(|work| work.to_string()),
            thread_id: self
                .thread
                .filter(|_| is(pb::FlowRequested::TYPE))
                .map(|thread| thread.to_string()),
            flow_run_id: self
                .flow_run
                .filter(|_| is(pb::FlowRequested::TYPE))
                .map(|flow| flow.to_string()),
            artifact_id,
        }
    }
}

/// The agent id an external agent's events carry.
pub fn external_agent_id(agent: &str) -> String {
    format!("{}{agent}", zopu_schema::keys::EXTERNAL_AGENT_PREFIX)
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
    let keys = &state
        .agent_api
        .as_ref()
        .ok_or_else(|| {
            ApiError::unavailable(
                "agent api",
                "this gateway was started without the Agent API",
            )
        })?
        .keys;
    let key_id = caller.0.key_id.clone();
    // The run of rejections is the bucket's, so every instance backs off alike.
    let backoff = keys.backoff(&key_id).await.map_err(|error| {
        ApiError::unavailable(
            "agent keys",
            format!("the back-off could not be read: {error}"),
        )
    })?;
    if let Some(backoff) = backoff
        && let Some(wait) = backoff.remaining(keys.now_unix_ms())
    {
        return Err(crate::quotas::backed_off(backoff.streak, wait));
    }
    match checked_action(&state, &caller, &request, body).await {
        Ok(accepted) => {
            if backoff.is_some_and(|backoff| backoff.streak > 0)
                && let Err(error) = keys.clear_rejections(&key_id).await
            {
                tracing::warn!(key_id = %key_id, %error, "an accepted action did not end the agent's run of rejections");
            }
            Ok((StatusCode::ACCEPTED, axum::Json(accepted)))
        }
        Err(error) => {
            // A refusal of the platform's checks counts towards the back-off;
            // an outage of ours does not.
            if error.status.is_client_error() {
                if let Err(store) = keys.record_rejection(&key_id).await {
                    tracing::warn!(key_id = %key_id, error = %store, "an agent's rejection was not counted");
                }
                tracing::info!(agent = %caller.0.grant.agent, key_id = %key_id, code = error.code, "agent action rejected");
            }
            Err(error)
        }
    }
}

/// What an action does, once its fields are checked.
pub(super) enum Act {
    /// `reply`: an `agent.message` answering the candidate; `comment`: one
    /// in the candidate's Work and Thread that answers nothing, so the
    /// candidate still awaits the agent (`answers` false).
    Reply { text: String, answers: bool },
    /// `open_work`: a `work.created` of the agent, started from the candidate.
    OpenWork { title: String, summary: String },
    /// `request_flow`: a Work (or the candidate's, continued), a Thread,
    /// the `flow.requested` and the handoff to the specialist.
    RequestFlow {
        flow: RoutedFlow,
        text: String,
        title: String,
    },
    /// `propose_artifact`: an `artifact.build.requested` of the agent's manifest.
    ProposeArtifact { artifact: ProposedArtifact },
}

/// `text` trimmed: 1 to `max` characters, and no credential.
pub(super) fn checked_text(
    kind: &str,
    name: &str,
    value: Option<&str>,
    max: usize,
) -> Result<String, ApiError> {
    let text = value.unwrap_or_default().trim().to_owned();
    if text.is_empty() || text.chars().count() > max {
        return Err(ApiError::invalid(
            name,
            format!("{kind} needs `{name}`: 1 to {max} characters"),
        ));
    }
    refuse_credentials(name, &text)?;
    Ok(text)
}

/// 422 when `text` holds what looks like a credential (the message names
/// the rule, never the text).
pub(super) fn refuse_credentials(name: &str, text: &str) -> Result<(), ApiError> {
    match zopu_secrets::scan(text).first() {
        Some(finding) => Err(ApiError::invalid(
            name,
            format!(
                "`{name}` looks like it holds a credential ({}); nothing was stored",
                finding.rule
            ),
        )),
        None => Ok(()),
    }
}

impl Act {
    fn of(action: &AgentAction) -> Result<Self, ApiError> {
        let kind = action.kind.as_str();
        let field = |name: &str, value: &Option<String>, max: usize| {
            checked_text(kind, name, value.as_deref(), max)
        };
        let present = [
            ("text", action.text.is_some()),
            ("title", action.title.is_some()),
            ("summary", action.summary.is_some()),
            ("flow", action.flow.is_some()),
            ("artifact", action.artifact.is_some()),
        ];
        let only = |allowed: &[&str]| match present
            .iter()
            .find(|(name, given)| *given && !allowed.contains(name))
        {
            Some((name, _)) => Err(ApiError::invalid(name, format!("{kind} takes no `{name}`"))),
            None => Ok(()),
        };
        match kind {
            "reply" | "comment" => {
                only(&["text"])?;
                Ok(Act::Reply {
                    text: field("text", &action.text, REPLY_MAX_CHARS)?,
                    answers: kind == "reply",
                })
            }
            "open_work" => {
                only(&["title", "summary"])?;
                let summary = match &action.summary {
                    Some(_) => field("summary", &action.summary, WORK_SUMMARY_MAX_CHARS)?,
                    None => String::new(),
                };
                Ok(Act::OpenWork {
                    title: field("title", &action.title, WORK_TITLE_MAX_CHARS)?,
                    summary,
                })
            }
            "request_flow" => {
                only(&["flow", "text", "title"])?;
                let name = action.flow.as_deref().unwrap_or_default();
                let flow = RoutedFlow::named(name)
                    .filter(|flow| *flow != RoutedFlow::Onboarding)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "flow",
                            format!(
                                "request_flow needs `flow`: explore, issue or check (got {name:?})"
                            ),
                        )
                    })?;
                let text = field("text", &action.text, REPLY_MAX_CHARS)?;
                let title = match &action.title {
                    Some(_) => field("title", &action.title, WORK_TITLE_MAX_CHARS)?,
                    None => zopu_runtime::text::clip_chars(&text, 80),
                };
                Ok(Act::RequestFlow { flow, text, title })
            }
            "propose_artifact" => {
                only(&["artifact"])?;
                let artifact = action.artifact.clone().ok_or_else(|| {
                    ApiError::invalid("artifact", "propose_artifact needs `artifact`")
                })?;
                Ok(Act::ProposeArtifact { artifact })
            }
            other => Err(ApiError::invalid(
                "type",
                format!(
                    "{other:?} is not an Agent API action (known: reply, comment, open_work, request_flow, propose_artifact)"
                ),
            )),
        }
    }

    /// The capability it needs, and the word its idempotency key uses.
    fn capability(&self) -> (&'static str, &'static str) {
        match self {
            Act::Reply { answers: true, .. } => ("post_message", "reply"),
            Act::Reply { answers: false, .. } => ("post_message", "comment"),
            Act::OpenWork { .. } => ("open_work", "work"),
            Act::RequestFlow { .. } => ("request_flow", "flow"),
            Act::ProposeArtifact { .. } => ("propose_artifact", "artifact"),
        }
    }
}

/// The keys of an external agent's flow request: one run per candidate,
/// flow and agent, whichever request asks for it.
pub(super) fn flow_request_keys(agent: &str, candidate: &str, flow: RoutedFlow) -> DelegationKeys {
    let base = format!("agent:{agent}:candidate:{candidate}:flow:{}", flow.as_str());
    DelegationKeys {
        work: format!("{base}:work"),
        work_update: format!("{base}:work-update"),
        thread: format!("{base}:thread"),
        flow: format!("{base}:request"),
        handoff: format!("{base}:handoff"),
    }
}

/// What the checks read of the project for one action.
pub(super) struct ProjectFacts {
    candidate: timeline::ItemRow,
    paused: bool,
    repository_commit: Option<String>,
    recent: Vec<String>,
}

pub(super) async fn checked_action(
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
    let agent = caller.0.grant.agent.clone();
    let project = scoped_project(caller, &action.project)?;
    let target = match &act {
        Act::RequestFlow { flow, .. } => Some(routed_target(state, definition, *flow)?),
        _ => None,
    };
    let org = caller.0.org.clone();
    let author = external_agent_id(&agent);
    let facts = {
        let (org, author, candidate) = (org.clone(), author.clone(), action.candidate.clone());
        read(state, move |conn| {
            let Some(item) = timeline::item_of_event(conn, &org, &project, &candidate)? else {
                return Ok(None);
            };
            if !timeline::awaits(conn, &org, &item, &author)? {
                return Ok(None);
            }
            let row = projects::find(conn, &org, &project)?;
            let paused = row.as_ref().is_some_and(|row| !row.agent_enabled);
            let repository_commit = row.and_then(|row| row.setup.repository_commit);
            let recent = timeline::recent_texts_of(conn, &org, &project, &author, RECENT_OUTPUTS)?;
            Ok(Some(ProjectFacts {
                candidate: item,
                paused,
                repository_commit,
                recent,
            }))
        })
        .await?
        .ok_or_else(|| ApiError::not_found("candidate"))?
    };
    if facts.paused {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "agent_paused",
            "the project's agents are paused (its kill switch); nothing may be posted until it is resumed",
        ));
    }
    let candidate = &facts.candidate;
    // A retried request answers with what the first stored (before the
    // near-duplicate guard, which would see the first's reply).
    let key = match &act {
        Act::RequestFlow { flow, .. } => flow_request_keys(&agent, &candidate.event_id, *flow).flow,
        _ => zopu_schema::keys::user_request(
            &project,
            &request.0,
            &format!("agent:{agent}:{what}:{}", candidate.event_id),
        ),
    };
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
        return Ok(StoredAction::of_envelope(&stored).answer(
            stored.id.to_string(),
            sequence,
            true,
            request,
        ));
    }
    if let Act::Reply { text, .. } = &act
        && let Some((earlier, score)) =
            zopu_core::repetition::near_duplicate(text, &facts.recent, NEAR_DUPLICATE_THRESHOLD)
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "near_duplicate",
            format!(
                "the reply {} of this agent; nothing was posted. Reply with what the user has not been told yet (an answer to this message, a new finding), or leave the message unanswered",
                zopu_core::repetition::describe_repetition(earlier, score, 80)
            ),
        ));
    }
    let needs_commit = matches!(act, Act::RequestFlow { .. } | Act::ProposeArtifact { .. });
    let repository_commit = match (&facts.repository_commit, needs_commit) {
        (Some(commit), _) => commit.clone(),
        (None, false) => String::new(),
        (None, true) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "project_not_ready",
                "the project's repository is not set up yet (no commit to work on); try again once it is ready",
            ));
        }
    };
    state.quotas.admit_for(
        org.as_str(),
        &caller.0.key_id,
        quotas::Action::Message,
        std::time::Instant::now(),
    )?;
    let source = zopu_runtime::publish::get_event(&state.runtime.bus, candidate.sequence)
        .await
        .map_err(|error| ApiError::unavailable("event log", error))?;
    let cause = source.context();
    let id_ms = u64::try_from(zopu_core::memory::unix_ms(source.time)).unwrap_or_default();
    let candidate_work: Option<WorkId> =
        candidate.work_id.as_deref().and_then(|id| id.parse().ok());
    let events = match act {
        Act::Reply { text, answers } => {
            let message = pb::AgentMessage {
                agent_id: author,
                text,
                reply_to_event_id: if answers {
                    candidate.event_id.clone()
                } else {
                    String::new()
                },
                importance: pb::Importance::Normal as i32,
                status: if answers { "done" } else { "comment" }.into(),
                provider: format!("external:{}", caller.0.key_id),
            };
            vec![NewEvent::caused_by(&cause, &message, key.clone())]
        }
        Act::OpenWork { title, summary } => {
            let created = pb::WorkCreated {
                title,
                summary,
                kind: "external".into(),
                agent_id: author,
            };
            // Derived like every other id here: a retried action names the same work.
            let work = WorkId::derived(id_ms, &key);
            vec![NewEvent::caused_by(&cause, &created, key.clone()).with_work(work)]
        }
        Act::RequestFlow { flow, text, title } => {
            let keys = flow_request_keys(&agent, &candidate.event_id, flow);
            let request_id = request.0.to_string();
            let delegation = Delegation {
                agent_id: &author,
                source_agent_key: &agent,
                source_run_id: &request_id,
                target_agent_key: target.as_deref().unwrap_or_default(),
                flow_type: flow.flow_type(),
                flow_version: REQUESTED_FLOW_VERSION,
                title: &title,
                request_text: &text,
                source_event: source.id,
                repository_commit: &repository_commit,
                // An external agent's memory is not the platform's to share.
                preferences: Vec::new(),
                existing_work: candidate_work,
            };
            delegate(&cause, id_ms, &delegation, &keys).events
        }
        Act::ProposeArtifact { artifact } => {
            // The proposal's run of its own, in the candidate's Work and
            // Thread (a Thread only within a Work): the manifest and its
            // request name the same ones, as the artifact pipeline checks.
            let flow_run = FlowRunId::derived(id_ms, &key);
            let work = candidate_work;
            let thread: Option<ThreadId> = candidate
                .thread_id
                .as_deref()
                .and_then(|id| id.parse().ok())
                .filter(|_| work.is_some());
            let manifest = proposed_manifest(
                &artifact,
                &ProposalIds {
                    project,
                    flow_run,
                    work,
                    thread,
                    source: source.id,
                    agent: &agent,
                    repository_commit: &repository_commit,
                },
            )?;
            let requested = pb::ArtifactBuildRequested {
                build_id: BuildId::derived(id_ms, &key).to_string(),
                artifact_id: ArtifactId::derived(id_ms, &format!("{key}:artifact")).to_string(),
                revision: 1,
                manifest: Some(manifest),
            };
            let mut event =
                NewEvent::caused_by(&cause, &requested, key.clone()).with_flow_run(flow_run);
            event.context.work_id = work;
            event.context.thread_id = thread;
            vec![event]
        }
    };
    // In order; each is keyed, so a retry after a partial write stores the
    // rest. The answer names the action's own event (the one keyed `key`).
    let mut answer = None;
    for event in events {
        let built = event.clone();
        let accepted = append(state, event, request).await?;
        if built.idempotency_key == key {
            answer = Some(StoredAction::of_new(&built).answer(
                accepted.event_id,
                accepted.sequence,
                accepted.duplicate,
                request,
            ));
        }
    }
    answer.ok_or_else(|| ApiError::unavailable("agent api", "the action built no event to store"))
}

/// The specialist the registry routes `flow` to, when the agent may ask
/// for it: the flow is among its definition's (403 `flow_outside_routing`)
/// and its mesh rules let it delegate to that specialist (403 `mesh_denied`).
/// Empty when no specialist runs the flow: the specialists then refuse the
/// request visibly, as they do the conversation agent's.
pub(super) fn routed_target(
    state: &AppState,
    definition: &RegisteredAgent,
    flow: RoutedFlow,
) -> Result<String, ApiError> {
    let agent = &definition.definition;
    if !agent.routing.flows.contains(&flow) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "flow_outside_routing",
            format!(
                "agent {:?} may not request {} flows (its definition routes: {})",
                agent.key,
                flow.as_str(),
                agent
                    .routing
                    .flows
                    .iter()
                    .map(|flow| flow.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .field("flow"));
    }
    let target = state
        .agent_api
        .as_ref()
        .and_then(|api| api.registry.routed_specialist(flow.flow_type()))
        .map(|specialist| specialist.definition.key.clone())
        .unwrap_or_default();
    if !target.is_empty() && !agent.mesh.allows(&target) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "mesh_denied",
            format!(
                "agent {:?} may not hand work to {target:?} (its mesh rules)",
                agent.key
            ),
        ));
    }
    Ok(target)
}

/// Where a proposed artifact belongs.
pub(super) struct ProposalIds<'a> {
    project: ProjectId,
    /// The proposal's own run.
    flow_run: FlowRunId,
    /// The candidate's Work and Thread, if it is in one (a Thread only within a Work).
    work: Option<WorkId>,
    thread: Option<ThreadId>,
    source: zopu_schema::EventId,
    agent: &'a str,
    repository_commit: &'a str,
}

/// The manifest of a proposed artifact, checked as every manifest is (422
/// naming the first field at fault, and listing every problem).
pub(super) fn proposed_manifest(
    artifact: &ProposedArtifact,
    ids: &ProposalIds<'_>,
) -> Result<pb::ArtifactManifest, ApiError> {
    let kind = match artifact.kind.as_str() {
        "exploration" => pb::ArtifactKind::Exploration,
        "issue" => pb::ArtifactKind::Issue,
        other => {
            return Err(ApiError::invalid(
                "artifact.kind",
                format!("an artifact is an exploration or an issue (got {other:?})"),
            ));
        }
    };
    let section_texts = artifact.sections.iter().flat_map(|section| {
        [
            section.title.as_str(),
            section.body.as_str(),
            section.current_world.as_str(),
            section.desired_world.as_str(),
        ]
        .into_iter()
        .chain(section.items.iter().map(String::as_str))
        .chain(
            section
                .facts
                .iter()
                .flat_map(|fact| [fact.label.as_str(), fact.value.as_str()]),
        )
        .map(|text| ("artifact.sections", text))
    });
    let texts = [
        ("artifact.title", artifact.title.as_str()),
        ("artifact.summary", artifact.summary.as_str()),
    ]
    .into_iter()
    .chain(section_texts);
    for (name, text) in texts {
        refuse_credentials(name, text)?;
    }
    let fact = |label: &str, value: &str| pb::CardFact {
        label: label.to_owned(),
        value: value.to_owned(),
    };
    let manifest = pb::ArtifactManifest {
        kind: kind as i32,
        title: artifact.title.trim().to_owned(),
        summary: artifact.summary.trim().to_owned(),
        project_id: ids.project.to_string(),
        work_id: ids.work.map(|work| work.to_string()).unwrap_or_default(),
        thread_id: ids
            .thread
            .map(|thread| thread.to_string())
            .unwrap_or_default(),
        flow_run_id: ids.flow_run.to_string(),
        source_event_ids: vec![ids.source.to_string()],
        card: Some(pb::ArtifactCard {
            label: zopu_runtime::text::clip_chars(&format!("Proposed by {}", ids.agent), 60),
            facts: vec![fact("Proposed by", &external_agent_id(ids.agent))],
            actions: Vec::new(),
        }),
        sections: artifact
            .sections
            .iter()
            .map(|section| pb::ArtifactSection {
                kind: section.kind.clone(),
                title: section.title.clone(),
                body: section.body.clone(),
                items: section.items.clone(),
                facts: section
                    .facts
                    .iter()
                    .map(|f| fact(&f.label, &f.value))
                    .collect(),
                current_world: section.current_world.clone(),
                desired_world: section.desired_world.clone(),
                ..Default::default()
            })
            .collect(),
        provider: external_agent_id(ids.agent),
        repository_commit: ids.repository_commit.to_owned(),
        ..Default::default()
    };
    zopu_schema::manifest::validate(&manifest).map_err(|errors| {
        let first = errors.first().map_or_else(
            || "artifact".to_owned(),
            |error| format!("artifact.{}", error.field()),
        );
        let all = errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        ApiError::invalid(&first, format!("the proposed artifact is not valid: {all}"))
    })?;
    Ok(manifest)
}
