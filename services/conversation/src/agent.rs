//! The reaction on `dispatch.created`: one turn of the project's conversation
//! agent. I/O only: it reads the state ([`crate::state`]), asks the provider
//! ([`crate::decide`] builds the request and validates the reply), and
//! appends what the pure decisions of [`crate::plan`] return.
//!
//! Every write has a key derived from the dispatch (or the flow run), so a
//! redelivered dispatch writes nothing twice; a model reply is recorded as
//! `agent.llm.completed` before it is acted on and read back on redelivery,
//! so the model is never asked twice for the same step.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use zopu_core::registry::Registry;
use zopu_llm::Provider;
use zopu_runtime::text::clip_chars;
use zopu_runtime::{HandlerError, NewEvent, Reaction, ReactionContext};
use zopu_schema::{DispatchId, Envelope, Event, keys as schema_keys, pb};

use crate::keys;
use crate::plan::{self, failure};
use crate::state::{FlowView, ProjectView};

mod turn;

use turn::Turn;

/// Where a test can make the service stop as if it crashed (the handler
/// returns a fatal error, the message is handed back unacknowledged and the
/// service stops). Fires once per service run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailPoint {
    /// Before the model is called for a decision.
    BeforeLlmCall,
    /// Right after the model's reply was recorded as `agent.llm.completed`.
    AfterLlmRecorded,
    /// After every event of the turn was stored, before the ack.
    BeforeAck,
}

/// The turn settings taken from [`crate::Config`].
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub dry_run: bool,
    pub decision_attempts: u32,
    pub max_tool_calls: usize,
    pub recent_outputs: usize,
    pub similarity_threshold: f64,
    pub rejection_backoff: u32,
    /// Model tokens per organization and UTC day (0: no budget).
    pub daily_model_tokens_per_org: u64,
    /// How long an approval the agent requests stays open.
    pub approval_ttl: std::time::Duration,
    /// When the agent posts its own holding acknowledgement while a model
    /// decides (`Config::acknowledgement_deadline`).
    pub acknowledgement_deadline: std::time::Duration,
    /// Where projects' issues are published (`Config::tracker_host`).
    pub tracker_host: String,
    pub fail_point: Option<FailPoint>,
}

/// How long a turn waits for an earlier turn of its project to end before
/// it ends that turn visibly itself: well past a lease period (the time an
/// instance that lost the partition takes to stop its handler) and below the
/// reaction's handler timeout.
const EARLIER_TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The conversation agent's reaction.
#[derive(Debug, Clone)]
pub struct Agent {
    settings: Arc<Settings>,
    /// The registry: the conversation agent's definition and prompt
    /// package, and the specialists work is handed to.
    registry: Arc<Registry>,
    /// The model, or the offline rules.
    provider: Arc<dyn Provider>,
    fired: Arc<AtomicBool>,
}

impl Agent {
    pub(crate) fn new(
        registry: Arc<Registry>,
        settings: Settings,
        provider: Arc<dyn Provider>,
    ) -> Self {
        Self {
            settings: Arc::new(settings),
            registry,
            provider,
            fired: Arc::new(AtomicBool::new(false)),
        }
    }

    /// One turn per project at a time, decided by the log: returns once
    /// every turn of the project created before this one has ended. A turn
    /// still open is running on an instance that lost this partition and
    /// has not noticed yet (it stops within a lease period), or was left by
    /// a worker that died between its last append and its end: after
    /// [`EARLIER_TURN_WAIT`] it is ended visibly (its `dispatch.failed` and a
    /// failed final answer), never left open.
    async fn earlier_turns_ended(
        &self,
        event: &Envelope,
        ctx: &ReactionContext,
    ) -> Result<(), HandlerError> {
        let deadline = tokio::time::Instant::now() + EARLIER_TURN_WAIT;
        loop {
            let (org, project) = (event.org_id.to_string(), event.project_id.to_string());
            let created = ctx.stream_sequence;
            let open = ctx
                .store
                .query(move |conn| {
                    crate::turns::earliest_open_before(conn, &org, &project, created)
                })
                .await?;
            let Some((earlier, earlier_created)) = open else {
                return Ok(());
            };
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(%earlier, earlier_created, "an earlier turn never ended; ending it visibly before this one starts");
                self.end_abandoned_turn(earlier_created, ctx).await?;
                continue;
            }
            tracing::info!(%earlier, earlier_created, "an earlier turn of the project is still open; waiting for its end");
            let next = ctx.store.checkpoint() + 1;
            tokio::select! {
                () = ctx.store.wait_for(next) => {}
                () = tokio::time::sleep_until(deadline) => {}
                () = ctx.shutdown.cancelled() => return Err(HandlerError::Interrupted),
            }
        }
    }

    /// Ends the turn created at `created_sequence` as given up on: its
    /// dispatch's failure and the failed final answer its user is owed.
    async fn end_abandoned_turn(
        &self,
        created_sequence: u64,
        ctx: &ReactionContext,
    ) -> Result<(), HandlerError> {
        let created =
            zopu_runtime::publish::get_event(ctx.publisher.bus(), created_sequence).await?;
        let reason =
            "its worker stopped before the turn ended; a later turn of the project went on";
        if let Some(failed) = Reaction::failure_event(self, &created, reason) {
            ctx.publisher.append(failed).await?;
        }
        if let Some(notice) = Reaction::failure_notice(self, &created, reason, ctx).await {
            ctx.publisher.append(notice).await?;
        }
        let end = zopu_runtime::publish::last_sequence(ctx.publisher.bus()).await?;
        ctx.caught_up(end).await
    }

    fn fail_point(&self, point: FailPoint, ctx: &ReactionContext) -> Result<(), HandlerError> {
        if self.settings.fail_point == Some(point) && !self.fired.swap(true, Ordering::SeqCst) {
            tracing::warn!(?point, "fail point reached: stopping the service");
            ctx.shutdown.cancel();
            return Err(HandlerError::Fatal(format!("fail point {point:?}")));
        }
        Ok(())
    }
}

impl Reaction for Agent {
    async fn handle(&self, event: &Envelope, ctx: &ReactionContext) -> Result<(), HandlerError> {
        let created = event.decode::<pb::DispatchCreated>()?;
        let dispatch = event.dispatch_id.ok_or_else(|| {
            HandlerError::Permanent("dispatch.created carries no dispatch id".into())
        })?;
        if is_terminal(ctx, &dispatch)? {
            tracing::debug!(%dispatch, "dispatch already ended; nothing to do");
            return Ok(());
        }
        // State up to this dispatch and whatever the project wrote since
        // (earlier turns of this agent, a kill switch flipped meanwhile): the
        // head is read with a direct get, not through the JetStream API, and
        // while the source event is (one round trip before the
        // acknowledgement).
        let head = ctx.publisher.read_head(&event.org_id, &event.project_id);
        let source = async {
            if created.source_stream_sequence == 0 {
                return Err(HandlerError::Permanent(
                    "dispatch.created names no source stream sequence".into(),
                ));
            }
            Ok(zopu_runtime::publish::get_event(
                ctx.publisher.bus(),
                created.source_stream_sequence,
            )
            .await?)
        };
        let (head, source) = tokio::join!(head, source);
        let head = head?.map_or(0, |head| head.sequence);
        ctx.caught_up(head.max(ctx.stream_sequence)).await?;
        self.earlier_turns_ended(event, ctx).await?;
        let (org, project) = (event.org_id.clone(), event.project_id);
        // Memory expires by the dispatch's time, so a redelivery reads the same.
        let at_ms = zopu_core::memory::unix_ms(event.time);
        let view = ctx
            .store
            .query(move |conn| ProjectView::load(conn, &org, &project, u64::MAX, at_ms))
            .await?;
        let turn = Turn {
            agent: self,
            ctx,
            event,
            cause: event.context(),
            dispatch,
            created,
        };
        turn.run(view, source).await?;
        self.fail_point(FailPoint::BeforeAck, ctx)
    }

    async fn already_handled(
        &self,
        event: &Envelope,
        ctx: &ReactionContext,
    ) -> Result<bool, HandlerError> {
        match event.dispatch_id {
            Some(dispatch) => is_terminal(ctx, &dispatch),
            None => Ok(false),
        }
    }

    fn failure_event(&self, event: &Envelope, reason: &str) -> Option<NewEvent> {
        let dispatch = event.dispatch_id?;
        let agent_id = event
            .decode::<pb::DispatchCreated>()
            .map(|created| created.agent_id)
            .unwrap_or_default();
        let failed = pb::DispatchFailed {
            agent_id,
            reason: Some(failure("dispatch.gave_up", &clip_chars(reason, 400), true)),
            attempts: 0,
        };
        Some(
            NewEvent::caused_by(
                &event.context(),
                &failed,
                schema_keys::dispatch_state(&dispatch, "failed"),
            )
            .with_dispatch(dispatch),
        )
    }

    /// A turn given up on still ends the user's message visibly: a failed
    /// final answer to it, under the key the turn's own final would have
    /// used, unless that final is already stored (at most one per message).
    async fn failure_notice(
        &self,
        event: &Envelope,
        reason: &str,
        ctx: &ReactionContext,
    ) -> Option<NewEvent> {
        let dispatch = event.dispatch_id?;
        let created = event.decode::<pb::DispatchCreated>().ok()?;
        let (key, reply_to, flow_run) = match created.source_event_type.as_str() {
            pb::TimelineMessageSent::TYPE => (
                schema_keys::agent_post(&dispatch, "final"),
                created.source_event_id.clone(),
                None,
            ),
            source if is_flow_outcome(source) => {
                let flow_run = event.flow_run_id?;
                let (org, project) = (event.org_id.clone(), event.project_id);
                let flow = ctx
                    .store
                    .query(move |conn| FlowView::load(conn, &org, &project, &flow_run))
                    .await
                    .ok()
                    .flatten()?;
                (
                    keys::flow_final(&flow_run),
                    flow.source_event_id.clone(),
                    Some(flow),
                )
            }
            _ => return None,
        };
        if ctx.store.key_sequence(&key).ok().flatten().is_some() {
            return None;
        }
        let last = pb::AgentFinal {
            agent_id: created.agent_id,
            text: "I could not finish this after several attempts. Please send it again.".into(),
            reply_to_event_id: reply_to,
            artifact_ids: Vec::new(),
            failure: Some(failure("dispatch.gave_up", &clip_chars(reason, 400), true)),
        };
        let notice = NewEvent::caused_by(&event.context(), &last, key).with_dispatch(dispatch);
        Some(match flow_run {
            Some(flow) => plan::with_flow_ids(notice, &flow),
            None => notice,
        })
    }
}

/// Whether a dispatch's source is a specialist's or an artifact's outcome
/// of a flow run the agent requested.
/// Who caused a dispatched event: the author of a message or a card action;
/// `None` for the runtime's own events.
fn author_of(source: &Envelope) -> Option<pb::Actor> {
    if source.is::<pb::TimelineMessageSent>() {
        return source.decode::<pb::TimelineMessageSent>().ok()?.author;
    }
    if source.is::<pb::TimelineActionSent>() {
        return source.decode::<pb::TimelineActionSent>().ok()?.author;
    }
    None
}

fn is_flow_outcome(event_type: &str) -> bool {
    matches!(
        event_type,
        pb::FlowCompleted::TYPE
            | pb::FlowFailed::TYPE
            | pb::FlowCancelled::TYPE
            | pb::ArtifactPublished::TYPE
            | pb::ArtifactFailed::TYPE
    )
}

fn is_terminal(ctx: &ReactionContext, dispatch: &DispatchId) -> Result<bool, HandlerError> {
    for state in ["completed", "failed"] {
        if ctx
            .store
            .key_sequence(&schema_keys::dispatch_state(dispatch, state))?
            .is_some()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A model failure as a stable code and a sentence.
fn llm_failure(error: &zopu_llm::Error) -> pb::FailureReason {
    use zopu_llm::Error as E;
    let code = match error.root() {
        E::Timeout { .. } => "llm.timeout",
        E::Connection { .. } => "llm.unreachable",
        E::Status { status: 429, .. } => "llm.rate_limited",
        E::Status { status, .. } if *status >= 500 => "llm.server_error",
        E::Status { .. } => "llm.rejected",
        E::ResponseTooLarge { .. } => "llm.response_too_large",
        E::MalformedJson { .. } => "llm.malformed_json",
        E::MalformedResponse { .. } | E::MissingChoices => "llm.malformed_response",
        E::TruncatedToolCall { .. } => "llm.truncated_tool_call",
        E::UnknownTool { .. } => "llm.unknown_tool",
        E::Truncated => "llm.truncated",
        E::ContentFiltered { .. } => "llm.content_filtered",
        E::InvalidJsonContent { .. } => "llm.invalid_json_content",
        E::ApiKeyUnavailable { .. } => "llm.no_api_key",
        E::InvalidConfig { .. } | E::InvalidRequest { .. } => "llm.invalid_request",
        _ => "llm.failed",
    };
    failure(
        code,
        &clip_chars(&zopu_secrets::redact(&error.to_string()), 400),
        error.is_retryable(),
    )
}
