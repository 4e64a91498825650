//! The flow runner: one `FlowRun` per `flow.requested` (per source event,
//! flow type and handler version), driven through init → plan → act →
//! reflect → terminate with per-phase timeouts, an iteration bound and a
//! total timeout.
//!
//! Every phase, tool call, model call, heartbeat and halt is an event whose
//! idempotency key is `flow:<flowRunId>:step:<step>`. Before a step runs,
//! the runner looks for its recorded event: a recorded tool call is replayed
//! from the output cache (checked against the digest on the event), a
//! recorded model reply is read back from its `agent.llm.completed`. So a run
//! interrupted by a restart resumes where it stopped without repeating
//! completed tool or model calls. Before every step the kill switch (the
//! agent's `agent.disabled`) is checked; a halt ends the run with
//! `flow.cancelled`, a timeout or the iteration bound with `flow.failed`.
//!
//! The runner's rooms, each knowing one thing: `lifecycle` (starting or
//! resuming a run, phases, deadlines, halts and the terminal events),
//! `recording` (the recording [`Port`]: every step is looked up before it
//! runs, model replies are recorded and read back), `tools` (tool calls and
//! their output cache), `flows` (which flow runs: the workspace, the model
//! and the offline paths) and `handoff` (summary.md, the context document
//! and the manifest handed to the artifact pipeline). Their decisions are
//! pure functions, unit-tested without NATS.

mod flows;
mod handoff;
mod lifecycle;
mod recording;
mod tools;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use zopu_runtime::text::clip_chars;

use tokio::time::Instant;
use zopu_core::metrics;
use zopu_core::registry::{NotRunnable, RegisteredAgent, Registry};
use zopu_core::secret_store::SecretStore;
use zopu_llm::Provider;
use zopu_runtime::{HandlerError, NewEvent, Reaction, ReactionContext, invariant};
use zopu_sandbox::tools::Sandbox;
use zopu_schema::envelope::EventContext;
use zopu_schema::pb::{self, FlowPhase, FlowType};
use zopu_schema::{Envelope, EventId, FlowRunId, keys};

use crate::config::Config;
use crate::workspace::{Prepared, Workspaces};
use zopu_answerer::port::FlowError;

pub use handoff::test_command;
use lifecycle::{Ending, Start};

/// The handler version of the flows (part of the run key).
pub const HANDLER_VERSION: u32 = 1;
/// The context document kind onboarding publishes.
pub const SUMMARY_KIND: &str = "repository_summary";
/// The provider label of what the offline heuristics produce.
pub(crate) const OFFLINE_PROVIDER: &str = "offline";
/// Longest wait for the projection to apply the stream's end before a run decides.
const CATCH_UP_MAX: Duration = Duration::from_secs(30);

fn unix_ms_of(id: &EventId) -> Option<u64> {
    id.as_uuid().get_timestamp().map(|ts| {
        let (secs, nanos) = ts.to_unix();
        secs * 1000 + u64::from(nanos) / 1_000_000
    })
}

/// The identity of one run, derived only from the request.
#[derive(Debug, Clone)]
pub struct RunIds {
    pub flow_type: FlowType,
    pub version: u32,
    pub source_event: EventId,
    /// `keys::flow_run`: the key of the run's `flow.started`.
    pub run_key: String,
    pub flow_run_id: FlowRunId,
}

impl RunIds {
    pub fn of(event: &Envelope, request: &pb::FlowRequested) -> Self {
        let flow_type = FlowType::try_from(request.flow_type).unwrap_or(FlowType::Unspecified);
        let version = if request.flow_version > 0 {
            request.flow_version
        } else {
            HANDLER_VERSION
        };
        let source_event = request
            .source_event_id
            .parse::<EventId>()
            .unwrap_or(event.id);
        let run_key =
            keys::requested_flow_run(&source_event, flow_type, version, &request.agent_id);
        let source_ms = unix_ms_of(&source_event).unwrap_or(event.context().cause_unix_ms);
        let flow_run_id = event
            .flow_run_id
            .unwrap_or_else(|| FlowRunId::derived(source_ms, &run_key));
        Self {
            flow_type,
            version,
            source_event,
            run_key,
            flow_run_id,
        }
    }

    pub fn step_key(&self, step: &str) -> String {
        keys::flow_step(&self.flow_run_id, step)
    }
}

/// A flow request (`flow.requested`) is keyed by its requester, never with
/// the run key: the specialists' `flow.started` alone carries that
/// (`schema::keys::requested_flow_run`), so every run records its start.
pub const FLOW_REQUEST_KEYED_BY_REQUESTER: &str = "specialists.flow_request_keyed_by_requester";

/// What every run shares.
#[derive(Debug)]
struct Shared {
    config: Config,
    /// Which specialist runs which flow, with what tools and knowledge.
    registry: Arc<Registry>,
    workspaces: Arc<Workspaces>,
    cache_root: PathBuf,
    provider: Option<Arc<dyn Provider>>,
    /// The organizations' secrets: the project's environment values a
    /// check's program gets (`None` without `ZOPU_SECRETS_KEY`).
    secrets: Option<SecretStore>,
}

/// The `flow.requested` reaction.
#[derive(Debug, Clone)]
pub struct FlowRunner {
    shared: Arc<Shared>,
}

impl FlowRunner {
    /// `data_dir` holds the tool-output cache and, unless configured
    /// elsewhere, this instance's `specialists/workspaces/<project>`;
    /// `credentials` holds the organizations' repository tokens.
    pub fn new(
        config: Config,
        registry: Arc<Registry>,
        data_dir: PathBuf,
        provider: Option<Arc<dyn Provider>>,
        credentials: Option<SecretStore>,
    ) -> Self {
        // No local repository is read from this instance's own directories
        // (other projects' workspaces, the data directory).
        let mut options = config.git_options();
        options.local_repository_excluded =
            vec![config.workspaces_root(&data_dir), data_dir.clone()];
        let secrets = credentials.clone();
        let workspaces = Workspaces::new(config.workspaces_root(&data_dir), options, credentials);
        let cache_root = data_dir.join("specialists-cache");
        Self {
            shared: Arc::new(Shared {
                config,
                registry,
                workspaces: Arc::new(workspaces),
                cache_root,
                provider,
                secrets,
            }),
        }
    }
}

impl Reaction for FlowRunner {
    async fn handle(&self, event: &Envelope, ctx: &ReactionContext) -> Result<(), HandlerError> {
        let request: pb::FlowRequested = event.decode()?;
        tokio::select! {
            outcome = self.shared.run(event, &request, ctx) => outcome,
            () = ctx.shutdown.cancelled() => {
                // Not acked: the run resumes from its recorded steps after restart.
                Err(HandlerError::Interrupted)
            }
        }
    }

    fn failure_event(&self, event: &Envelope, reason: &str) -> Option<NewEvent> {
        let request: pb::FlowRequested = event.decode().ok()?;
        let ids = RunIds::of(event, &request);
        let failed = pb::FlowFailed {
            flow_type: request.flow_type,
            phase: FlowPhase::Unspecified as i32,
            reason: Some(pb::FailureReason {
                code: "flow.gave_up".to_owned(),
                message: clip_chars(&zopu_secrets::redact(reason), 500),
                retryable: true,
            }),
        };
        Some(
            NewEvent::caused_by(&event.context(), &failed, ids.step_key("terminal"))
                .with_flow_run(ids.flow_run_id),
        )
    }
}

impl Shared {
    async fn run(
        &self,
        event: &Envelope,
        request: &pb::FlowRequested,
        ctx: &ReactionContext,
    ) -> Result<(), HandlerError> {
        let ids = RunIds::of(event, request);
        // The run's start is deduplicated by its key: a request keyed with
        // it would take the place of the run's `flow.started`.
        if !invariant::holds(
            FLOW_REQUEST_KEYED_BY_REQUESTER,
            event.idempotency_key != ids.run_key,
            || {
                format!(
                    "the flow request {} is keyed with its run's key {}",
                    event.id, ids.run_key
                )
            },
        ) {
            return Err(HandlerError::Permanent(format!(
                "the flow request is keyed with its run's key ({}); a request is keyed by its requester",
                ids.run_key
            )));
        }
        // The projection must have seen everything up to now (kill switch, context, earlier runs).
        ctx.caught_up_to_end(CATCH_UP_MAX).await?;
        if ctx
            .publisher
            .recorded(&ids.step_key("terminal"))
            .await?
            .is_some()
        {
            tracing::debug!(flow_run = %ids.flow_run_id, "run already finished");
            return Ok(());
        }
        let cause = event.context();
        // Only a registered, enabled specialist runs a flow.
        let definition = match self.registry.specialist(ids.flow_type) {
            Ok(definition) => definition,
            Err(not_runnable) => return self.refuse(&ids, &cause, &not_runnable, ctx).await,
        };
        let provider_label = self.provider_label(ids.flow_type);
        let started_at_elapsed = match self
            .start(&ids, request, &cause, &provider_label, definition, ctx)
            .await?
        {
            Start::New => None,
            Start::Resume { elapsed } => Some(elapsed),
            Start::Duplicate => {
                tracing::info!(flow_run = %ids.flow_run_id, "a run for this source event and version exists; not starting another");
                return Ok(());
            }
        };
        let mut run = Run::new(
            self,
            ctx,
            cause,
            ids.clone(),
            RunAgent {
                id: request.agent_id.clone(),
                definition,
                provider_label,
            },
            started_at_elapsed.unwrap_or_default(),
        );
        if started_at_elapsed.is_some() {
            run.note_resume().await.map_err(runtime)?;
        }
        let began = Instant::now();
        let outcome = run.execute(event, request).await;
        let ending = Ending::of(outcome);
        let metric_outcome = ending.metric_outcome();
        let ended = metric_outcome.is_some();
        run.finish(ending).await?;
        if ended {
            run.record_internal_note().await.map_err(runtime)?;
        }
        if let Some(outcome) = metric_outcome {
            metrics::flow_finished(
                keys::flow_type_name(ids.flow_type),
                outcome,
                started_at_elapsed.unwrap_or_default() + began.elapsed(),
            );
        }
        // The cache only serves resumes of this run.
        run.cache.remove();
        tracing::info!(flow_run = %ids.flow_run_id, replayed = run.replayed, executed = run.executed, guardrails = run.guardrails, "flow run finished");
        Ok(())
    }
}

impl Shared {
    /// A flow no registered specialist may run ends before it starts, as a
    /// visible `flow.failed` the conversation agent reports.
    async fn refuse(
        &self,
        ids: &RunIds,
        cause: &EventContext,
        not_runnable: &NotRunnable,
        ctx: &ReactionContext,
    ) -> Result<(), HandlerError> {
        tracing::warn!(flow_run = %ids.flow_run_id, reason = %not_runnable, "flow refused by the agent registry");
        let failed = pb::FlowFailed {
            flow_type: ids.flow_type as i32,
            phase: FlowPhase::Init as i32,
            reason: Some(pb::FailureReason {
                code: not_runnable.code().to_owned(),
                message: format!("Nothing was run: {not_runnable}."),
                retryable: false,
            }),
        };
        ctx.publisher
            .append(
                NewEvent::caused_by(cause, &failed, ids.step_key("terminal"))
                    .with_flow_run(ids.flow_run_id),
            )
            .await?;
        Ok(())
    }
}

fn runtime(error: FlowError) -> HandlerError {
    match error {
        FlowError::Interrupted => HandlerError::Interrupted,
        other => HandlerError::Transient(other.to_string()),
    }
}

/// One run in progress: the recording [`Port`].
struct Run<'a> {
    shared: &'a Shared,
    ctx: &'a ReactionContext,
    cause: EventContext,
    ids: RunIds,
    agent_id: String,
    /// The registered specialist the run runs under.
    definition: &'a RegisteredAgent,
    provider_label: String,
    sandbox: Option<Arc<Sandbox>>,
    /// The prepared workspace; holds the project's workspace lock shared.
    workspace: Option<Prepared>,
    cache: tools::OutputCache,
    phase: FlowPhase,
    iteration: u32,
    phase_deadline: Instant,
    total_deadline: Instant,
    guardrails: u32,
    replayed: u32,
    executed: u32,
    heartbeats: u32,
    /// The stream sequence of the run's last recorded model usage: the
    /// budget check waits for the store to apply it, so a run under load
    /// never calls past a budget its own calls used up.
    usage_recorded: u64,
    /// The prefix of the step names of a sub-flow or sub-step in progress
    /// (`sub:explore`, `model`), so its keys never collide with the parent's.
    scope: Option<String>,
}

/// The agent a run runs as: its id, its registry definition, the provider
/// label its steps record.
struct RunAgent<'a> {
    id: String,
    definition: &'a RegisteredAgent,
    provider_label: String,
}

impl<'a> Run<'a> {
    /// A run in its init phase; `started_at_elapsed` is the time a resumed
    /// run already spent, taken from its total timeout.
    fn new(
        shared: &'a Shared,
        ctx: &'a ReactionContext,
        cause: EventContext,
        ids: RunIds,
        agent: RunAgent<'a>,
        started_at_elapsed: Duration,
    ) -> Self {
        let RunAgent {
            id: agent_id,
            definition,
            provider_label,
        } = agent;
        let now = Instant::now();
        let total = shared.config.flow.total_timeout;
        Self {
            shared,
            ctx,
            cause,
            agent_id,
            definition,
            provider_label,
            sandbox: None,
            workspace: None,
            cache: tools::OutputCache::new(shared.cache_root.join(ids.flow_run_id.to_string())),
            ids,
            phase: FlowPhase::Init,
            iteration: 1,
            phase_deadline: now + shared.config.flow.init_timeout,
            total_deadline: now + total.saturating_sub(started_at_elapsed),
            guardrails: 0,
            replayed: 0,
            executed: 0,
            heartbeats: 0,
            usage_recorded: 0,
            scope: None,
        }
    }

    /// The model settings of the run's agent definition, for a model input.
    fn agent_model_input(&self) -> crate::model::ModelInput {
        let definition = &self.definition.definition;
        crate::model::ModelInput {
            tools: definition.tools.clone(),
            knowledge: self.definition.package.prompt().to_owned(),
            temperature: definition.model.temperature.unwrap_or(0.0),
            ..crate::model::ModelInput::default()
        }
    }

    /// The most tokens one model answer may have: the definition's, or the provider's setting.
    fn max_output_tokens(&self) -> u32 {
        self.definition
            .definition
            .model
            .max_output_tokens
            .unwrap_or(self.shared.config.provider.max_tokens)
    }

    /// The run's internal note for operators (`agent.note.recorded`): how it
    /// went inside, never shown on the user's timeline.
    async fn record_internal_note(&self) -> Result<(), FlowError> {
        let run_id = self.ids.flow_run_id.to_string();
        let note = pb::AgentNoteRecorded {
            run_id: run_id.clone(),
            agent_key: self.definition.definition.key.clone(),
            text: format!(
                "Run summary: {} step(s) replayed, {} executed, {} guardrail(s), {} heartbeat(s); provider {}; prompt package {}",
                self.replayed,
                self.executed,
                self.guardrails,
                self.heartbeats,
                self.provider_label,
                self.definition.package.version
            ),
        };
        self.ctx
            .publisher
            .append(
                NewEvent::caused_by(&self.cause, &note, keys::agent_note(&run_id, "finished"))
                    .with_flow_run(self.ids.flow_run_id),
            )
            .await?;
        Ok(())
    }

    /// `step` inside the current scope.
    fn scoped(&self, step: &str) -> String {
        match &self.scope {
            Some(scope) => format!("{scope}:{step}"),
            None => step.to_owned(),
        }
    }
}
