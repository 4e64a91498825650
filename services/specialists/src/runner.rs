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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use zopu_core::text::clip_chars;

use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tracing::Instrument as _;
use zopu_core::{HandlerError, NewEvent, Reaction, ReactionContext};
use zopu_llm::{ChatReply, ChatRequest, Provider};
use zopu_sandbox::git::CredentialStore;
use zopu_sandbox::policy::WorkspaceRoot;
use zopu_sandbox::tools::{Sandbox, ToolOutcome, WriteGeneratedFileInput};
use zopu_schema::envelope::EventContext;
use zopu_schema::pb::{self, FlowPhase, FlowType, flow_progress::Signal};
use zopu_schema::{ArtifactId, BuildId, Envelope, Event, EventId, FlowRunId, keys};

use crate::config::{Config, ProviderKind};
use crate::manifest::{self, ManifestIds};
use crate::port::{self, FlowError, Port, ToolFailure, ToolRequest, ToolResult};
use crate::results::{self, ExplorationResult};
use crate::workspace::{Prepared, Workspaces};
use crate::{explore, issue, model, onboarding, state};

/// The handler version of the flows (part of the run key).
pub const HANDLER_VERSION: u32 = 1;
/// The context document kind onboarding publishes.
pub const SUMMARY_KIND: &str = "repository_summary";

/// The name of a flow type as used in keys and results.
pub fn flow_type_name(flow_type: FlowType) -> &'static str {
    match flow_type {
        FlowType::OnboardingExplore => "onboarding_explore",
        FlowType::Explore => "explore",
        FlowType::Issue => "issue",
        FlowType::Unspecified => "unspecified",
    }
}

fn phase_name(phase: FlowPhase) -> &'static str {
    match phase {
        FlowPhase::Init => "init",
        FlowPhase::Plan => "plan",
        FlowPhase::Act => "act",
        FlowPhase::Reflect => "reflect",
        FlowPhase::Terminate => "terminate",
        FlowPhase::Unspecified => "unspecified",
    }
}

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
        let run_key = keys::flow_run(&source_event, flow_type_name(flow_type), version);
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

/// What every run shares.
#[derive(Debug)]
struct Shared {
    config: Config,
    workspaces: Arc<Workspaces>,
    cache_root: PathBuf,
    provider: Option<Arc<dyn Provider>>,
}

/// The `flow.requested` reaction.
#[derive(Debug, Clone)]
pub struct FlowRunner {
    shared: Arc<Shared>,
}

impl FlowRunner {
    /// `data_dir` holds the tool-output cache and, unless configured
    /// elsewhere, this instance's `specialists/workspaces/<project>`;
    /// `credentials` resolves the connection ids setup recorded.
    pub fn new(
        config: Config,
        data_dir: PathBuf,
        provider: Option<Arc<dyn Provider>>,
        credentials: Arc<dyn CredentialStore>,
    ) -> Self {
        // No local repository is read from this instance's own directories
        // (other projects' workspaces, the data directory).
        let mut options = config.git_options();
        options.local_repository_excluded =
            vec![config.workspaces_root(&data_dir), data_dir.clone()];
        let workspaces = Workspaces::new(config.workspaces_root(&data_dir), options, credentials);
        let cache_root = data_dir.join("specialists-cache");
        Self {
            shared: Arc::new(Shared {
                config,
                workspaces: Arc::new(workspaces),
                cache_root,
                provider,
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
        // The projection must have seen everything up to now (kill switch, context, earlier runs).
        let last = zopu_core::publish::last_sequence(ctx.publisher.bus()).await?;
        if tokio::time::timeout(Duration::from_secs(30), ctx.store.wait_for(last))
            .await
            .is_err()
        {
            return Err(HandlerError::Transient(
                "the projection is behind the stream".to_owned(),
            ));
        }
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
        let provider_label =
            if ids.flow_type == FlowType::OnboardingExplore && self.provider.is_none() {
                "offline".to_owned()
            } else {
                self.config.provider_label()
            };
        let total = self.config.flow.total_timeout;
        let (started_at_elapsed, first_start) = match ctx.publisher.recorded(&ids.run_key).await? {
            Some(started) => {
                if started.flow_run_id != Some(ids.flow_run_id) {
                    // Another request for the same source event already started a run.
                    tracing::info!(flow_run = %ids.flow_run_id, "a run for this source event and version exists; not starting another");
                    return Ok(());
                }
                let elapsed = time::OffsetDateTime::now_utc() - started.time;
                (Duration::try_from(elapsed).unwrap_or_default(), false)
            }
            None => {
                let started = pb::FlowStarted {
                    flow_type: request.flow_type,
                    flow_version: ids.version,
                    attempt: u32::try_from(ctx.delivered).unwrap_or(1),
                    provider: provider_label.clone(),
                };
                ctx.publisher
                    .append(
                        NewEvent::caused_by(&cause, &started, ids.run_key.clone())
                            .with_flow_run(ids.flow_run_id),
                    )
                    .await?;
                (Duration::ZERO, true)
            }
        };
        let now = Instant::now();
        let mut run = Run {
            shared: self,
            ctx,
            cause,
            ids: ids.clone(),
            agent_id: request.agent_id.clone(),
            provider_label,
            sandbox: None,
            workspace: None,
            cache: self.cache_root.join(ids.flow_run_id.to_string()),
            phase: FlowPhase::Init,
            iteration: 1,
            phase_deadline: now + self.config.flow.init_timeout,
            total_deadline: now + total.saturating_sub(started_at_elapsed),
            guardrails: 0,
            replayed: 0,
            executed: 0,
            heartbeats: 0,
            scope: None,
        };
        if !first_start {
            let note = format!("Resumed after an interruption (delivery {})", ctx.delivered);
            run.progress(
                Signal::Ready,
                &format!("resume:{}", ctx.delivered),
                &note,
                false,
                None,
            )
            .await
            .map_err(runtime)?;
        }
        let outcome = run.execute(event, request).await;
        let finished = match outcome {
            Ok(()) => Ok(()),
            Err(FlowError::Interrupted) => {
                return Err(HandlerError::Interrupted);
            }
            Err(FlowError::Runtime(reason)) => return Err(HandlerError::Transient(reason)),
            Err(FlowError::Halted(reason)) => run.cancel(&reason).await,
            Err(error) => run.fail(&error).await,
        };
        finished.map_err(runtime)?;
        // The cache only serves resumes of this run.
        let _ = std::fs::remove_dir_all(&run.cache);
        tracing::info!(flow_run = %ids.flow_run_id, replayed = run.replayed, executed = run.executed, guardrails = run.guardrails, "flow run finished");
        Ok(())
    }
}

fn runtime(error: FlowError) -> HandlerError {
    match error {
        FlowError::Interrupted => HandlerError::Fatal("interrupted by shutdown".to_owned()),
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
    provider_label: String,
    sandbox: Option<Arc<Sandbox>>,
    /// The prepared workspace; holds the project's workspace lock shared.
    workspace: Option<Prepared>,
    cache: PathBuf,
    phase: FlowPhase,
    iteration: u32,
    phase_deadline: Instant,
    total_deadline: Instant,
    guardrails: u32,
    replayed: u32,
    executed: u32,
    heartbeats: u32,
    /// The prefix of the step names of a sub-flow or sub-step in progress
    /// (`sub:explore`, `model`), so its keys never collide with the parent's.
    scope: Option<String>,
}

impl Run<'_> {
    /// `step` inside the current scope.
    fn scoped(&self, step: &str) -> String {
        match &self.scope {
            Some(scope) => format!("{scope}:{step}"),
            None => step.to_owned(),
        }
    }

    fn uses_model(&self) -> bool {
        self.shared.config.provider.kind == ProviderKind::Openai && self.shared.provider.is_some()
    }

    /// Delegation to an exploration sub-flow (for an issue with no earlier
    /// exploration to reuse): the sub-flow's steps are keyed under
    /// `sub:explore:` so they resume like the parent's. Returns the result as
    /// (flow run id, JSON), like a stored exploration.
    async fn delegate_exploration(
        &mut self,
        request: &pb::FlowRequested,
        project: &str,
    ) -> Result<(String, String), FlowError> {
        self.progress(
            Signal::Delegation,
            "delegate:explore",
            "No earlier exploration to reuse: delegating to exploration",
            true,
            None,
        )
        .await?;
        self.scope = Some("sub:explore".to_owned());
        let outcome = self.run_exploration(request, project).await;
        self.scope = None;
        let result = outcome?;
        let note = format!(
            "Exploration sub-flow returned {} finding(s); defining the issue",
            result.findings.len()
        );
        self.progress(
            Signal::Phase,
            "delegate:explore:returned",
            &note,
            true,
            None,
        )
        .await?;
        Ok((
            self.ids.flow_run_id.to_string(),
            results::to_redacted_json(&result),
        ))
    }

    /// Exploration with the configured provider.
    async fn run_exploration(
        &mut self,
        request: &pb::FlowRequested,
        project: &str,
    ) -> Result<ExplorationResult, FlowError> {
        if self.uses_model() {
            let input = self.model_input(request, project, None)?;
            match model::run(self, model::Goal::Explore, &input).await? {
                model::ModelResult::Explore(result) => Ok(result),
                _ => Err(FlowError::InvalidOutput(
                    "expected an exploration".to_owned(),
                )),
            }
        } else {
            let input = explore::ExploreInput {
                question: request.request_text.clone(),
                provider: self.provider_label.clone(),
                repository_commit: request.repository_commit.clone(),
            };
            explore::explore(self, &input).await
        }
    }

    /// Onboarding driven by the model, seeded with the offline findings. A
    /// model that misbehaves (invalid output after the repair, a failed call,
    /// the iteration bound) does not fail onboarding: the offline summary is
    /// kept and the fallback is recorded.
    async fn onboard_with_model(
        &mut self,
        request: &pb::FlowRequested,
        offline: results::OnboardingResult,
    ) -> Result<results::OnboardingResult, FlowError> {
        let input = model::ModelInput {
            request: onboarding::MODEL_TASK.to_owned(),
            provider: self.provider_label.clone(),
            repository_commit: request.repository_commit.clone(),
            context: Some(onboarding::seed(&offline)),
            exploration: None,
            max_tokens: self.shared.config.provider.max_tokens,
        };
        self.scope = Some("model".to_owned());
        let outcome = model::run(self, model::Goal::Onboarding, &input).await;
        self.scope = None;
        let reason = match outcome {
            Ok(model::ModelResult::Onboarding(answer)) => {
                return Ok(onboarding::merge_model(&offline, answer, &input.provider));
            }
            Ok(_) => "the model returned the wrong kind of result".to_owned(),
            Err(
                error @ (FlowError::InvalidOutput(_)
                | FlowError::Llm { .. }
                | FlowError::BudgetExceeded(_)
                | FlowError::IterationLimit { .. }
                | FlowError::PhaseTimeout { .. }
                | FlowError::ToolNotAllowed(_)),
            ) => error.to_string(),
            Err(other) => return Err(other),
        };
        let note = format!("Fell back to the offline summary: {reason}");
        tracing::warn!(flow_run = %self.ids.flow_run_id, %note, "model onboarding fell back");
        self.progress(Signal::Phase, "model:fallback", &note, true, None)
            .await?;
        Ok(offline)
    }

    fn new_event<E: Event>(&self, payload: &E, step: &str) -> NewEvent {
        NewEvent::caused_by(&self.cause, payload, self.ids.step_key(step))
            .with_flow_run(self.ids.flow_run_id)
    }

    async fn append<E: Event>(
        &self,
        payload: &E,
        step: &str,
    ) -> Result<zopu_core::Appended, FlowError> {
        Ok(self
            .ctx
            .publisher
            .append(self.new_event(payload, step))
            .await?)
    }

    async fn progress(
        &self,
        signal: Signal,
        step: &str,
        note: &str,
        visible: bool,
        tool_call: Option<pb::ToolCall>,
    ) -> Result<(), FlowError> {
        let progress = pb::FlowProgress {
            signal: signal as i32,
            phase: self.phase as i32,
            iteration: self.iteration,
            note: clip_chars(&zopu_secrets::redact(note), 500),
            visible,
            tool_call,
            step: step.to_owned(),
        };
        self.append(&progress, step).await.map(|_| ())
    }

    /// Refuses a new model call once the organization's model tokens of the
    /// current UTC day (every call stored so far) reached the budget.
    async fn check_budget(&self) -> Result<(), FlowError> {
        use zopu_core::model_usage;
        let budget = self.shared.config.daily_model_tokens_per_org;
        if budget == 0 {
            return Ok(());
        }
        let day = model_usage::utc_day(time::OffsetDateTime::now_utc());
        let (org, query_day) = (self.cause.org_id.clone(), day.clone());
        let used = self
            .ctx
            .store
            .query(move |conn| model_usage::tokens_used(conn, &org, &query_day, u64::MAX))
            .await?;
        if used < budget {
            return Ok(());
        }
        tracing::warn!(flow_run = %self.ids.flow_run_id, org = %self.cause.org_id, used, budget, "daily model budget used up; not calling the model");
        Err(FlowError::BudgetExceeded(model_usage::exceeded_message(
            used,
            budget,
            &day,
            "specialists.daily_model_tokens_per_org",
        )))
    }

    fn check_halt(&self) -> Result<(), FlowError> {
        if self.ctx.shutdown.is_cancelled() {
            return Err(FlowError::Interrupted);
        }
        if self.agent_id.is_empty() {
            return Ok(());
        }
        match state::disabled(&self.ctx.store, &self.agent_id)? {
            Some(reason) => Err(FlowError::Halted(if reason.is_empty() {
                "the agent was disabled".to_owned()
            } else {
                format!("the agent was disabled: {reason}")
            })),
            None => Ok(()),
        }
    }

    fn deadline(&self) -> Instant {
        self.phase_deadline.min(self.total_deadline)
    }

    fn timeout_error(&self) -> FlowError {
        if Instant::now() >= self.total_deadline {
            FlowError::TotalTimeout {
                seconds: self.shared.config.flow.total_timeout.as_secs(),
            }
        } else {
            FlowError::PhaseTimeout {
                phase: phase_name(self.phase),
                seconds: self.phase_timeout(self.phase).as_secs(),
            }
        }
    }

    fn phase_timeout(&self, phase: FlowPhase) -> Duration {
        let flow = &self.shared.config.flow;
        match phase {
            FlowPhase::Init | FlowPhase::Unspecified => flow.init_timeout,
            FlowPhase::Plan => flow.plan_timeout,
            FlowPhase::Act => flow.act_timeout,
            FlowPhase::Reflect => flow.reflect_timeout,
            FlowPhase::Terminate => flow.terminate_timeout,
        }
    }

    /// Awaits `work` within the phase and total deadlines (and `limit`),
    /// sending heartbeats while it waits.
    async fn bounded<T>(
        &mut self,
        limit: Duration,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, FlowError> {
        let deadline = self.deadline().min(Instant::now() + limit);
        let work = tokio::time::timeout_at(deadline, work);
        tokio::pin!(work);
        let interval = self.shared.config.flow.heartbeat_interval;
        let mut heartbeat = tokio::time::interval_at(Instant::now() + interval, interval);
        loop {
            tokio::select! {
                outcome = &mut work => {
                    return outcome.map_err(|_| if Instant::now() >= self.deadline() { self.timeout_error() } else {
                        FlowError::PhaseTimeout { phase: phase_name(self.phase), seconds: limit.as_secs() }
                    });
                }
                _ = heartbeat.tick() => {
                    self.heartbeats += 1;
                    let step = self.scoped(&format!("heartbeat:{}:{}:{}", phase_name(self.phase), self.iteration, self.heartbeats));
                    self.progress(Signal::Heartbeat, &step, "still working", false, None).await?;
                }
            }
        }
    }

    async fn execute(
        &mut self,
        event: &Envelope,
        request: &pb::FlowRequested,
    ) -> Result<(), FlowError> {
        self.phase(FlowPhase::Init, 1, "Preparing the workspace")
            .await?;
        let prepared = self.prepare_workspace(event, request).await?;
        if let Some(note) = &prepared.note {
            self.progress(Signal::Ready, "workspace", note, false, None)
                .await?;
        }
        let workspace = prepared.path.clone();
        self.workspace = Some(prepared);
        let limits = self.shared.config.sandbox.clone();
        let opened = self
            .bounded(self.shared.config.flow.tool_timeout, async move {
                tokio::task::spawn_blocking(move || {
                    let root = WorkspaceRoot::open(&workspace).map_err(|e| e.to_string())?;
                    Sandbox::new(root, limits).map_err(|e| e.to_string())
                })
                .await
            })
            .await?;
        let sandbox = opened
            .map_err(|e| FlowError::Workspace(e.to_string()))?
            .map_err(FlowError::Workspace)?;
        self.sandbox = Some(Arc::new(sandbox));
        self.progress(Signal::Ready, "ready", "Workspace ready", false, None)
            .await?;
        let project = event.project_id.to_string();
        let commit = request.repository_commit.clone();
        let store = &self.ctx.store;
        match self.ids.flow_type {
            FlowType::OnboardingExplore => {
                let input = onboarding::OnboardingInput {
                    repository_commit: commit,
                    environment_variables: state::environment_names(store, &project)?,
                    provider: "offline".to_owned(),
                };
                let mut result = onboarding::onboard(self, &input).await?;
                if self.uses_model() {
                    result = self.onboard_with_model(request, result).await?;
                }
                // flow.completed names the provider that produced the summary.
                self.provider_label = result.provenance.provider.clone();
                self.terminate_onboarding(event, &mut result).await
            }
            FlowType::Explore => {
                let result = self.run_exploration(request, &project).await?;
                self.terminate_result(event, Outcome::Explore(result)).await
            }
            FlowType::Issue => {
                let mut previous = state::latest_result(store, &project, FlowType::Explore)?;
                // A resumed run that already delegated delegates again (its steps replay).
                let delegated = self
                    .ctx
                    .publisher
                    .recorded(&self.ids.step_key("delegate:explore"))
                    .await?
                    .is_some();
                if previous.is_none() || delegated {
                    previous = Some(self.delegate_exploration(request, &project).await?);
                }
                let store = &self.ctx.store;
                let result = match (
                    self.shared.config.provider.kind,
                    self.shared.provider.is_some(),
                ) {
                    (ProviderKind::Openai, true) => {
                        let input = self.model_input(request, &project, previous)?;
                        match model::run(self, model::Goal::Issue, &input).await? {
                            model::ModelResult::Issue(result) => result,
                            _ => {
                                return Err(FlowError::InvalidOutput(
                                    "expected an issue".to_owned(),
                                ));
                            }
                        }
                    }
                    _ => {
                        let exploration = previous.and_then(|(run, json)| {
                            serde_json::from_str::<ExplorationResult>(&json)
                                .ok()
                                .map(|r| (run, r))
                        });
                        let summary = state::current_document(store, &project, SUMMARY_KIND)?;
                        let input = issue::IssueInput {
                            request: request.request_text.clone(),
                            provider: self.provider_label.clone(),
                            repository_commit: commit,
                            exploration,
                            test_command: summary.and_then(|doc| test_command(&doc.body)),
                        };
                        issue::define(self, &input).await?
                    }
                };
                self.terminate_result(event, Outcome::Issue(result)).await
            }
            FlowType::Unspecified => Err(FlowError::InvalidOutput(
                "flow.requested names no flow type".to_owned(),
            )),
        }
    }

    /// This instance's workspace of the project at the flow's commit,
    /// materialized from the stream's record when missing or stale. A clone
    /// may take longer than the init phase allows, so the phase gets the
    /// materialization's own limit.
    async fn prepare_workspace(
        &mut self,
        event: &Envelope,
        request: &pb::FlowRequested,
    ) -> Result<Prepared, FlowError> {
        let project = event.project_id.to_string();
        let recorded =
            state::recorded_repository(&self.ctx.store, &project, &request.repository_commit)?;
        let limit = self.shared.config.materialize_timeout();
        self.phase_deadline = self.phase_deadline.max(Instant::now() + limit);
        let workspaces = Arc::clone(&self.shared.workspaces);
        let requested = request.repository_commit.clone();
        // Boxed: the checkout's future is large and the run's is already.
        let prepared = self
            .bounded(limit, async move {
                Box::pin(workspaces.prepare(&project, &requested, recorded)).await
            })
            .await?;
        prepared.map_err(|error| {
            let message = zopu_secrets::redact(&error.to_string());
            if error.is_retryable() {
                FlowError::Runtime(format!("the workspace could not be prepared: {message}"))
            } else {
                FlowError::Workspace(message)
            }
        })
    }

    fn model_input(
        &self,
        request: &pb::FlowRequested,
        project: &str,
        exploration: Option<(String, String)>,
    ) -> Result<model::ModelInput, FlowError> {
        let context =
            state::current_document(&self.ctx.store, project, SUMMARY_KIND)?.map(|doc| doc.body);
        Ok(model::ModelInput {
            request: request.request_text.clone(),
            provider: self.provider_label.clone(),
            repository_commit: request.repository_commit.clone(),
            context,
            exploration,
            max_tokens: self.shared.config.provider.max_tokens,
        })
    }

    fn manifest_ids(&self, event: &Envelope) -> ManifestIds {
        let mut sources = vec![self.ids.source_event.to_string()];
        if event.id != self.ids.source_event {
            sources.push(event.id.to_string());
        }
        let commit = event
            .decode::<pb::FlowRequested>()
            .map(|r| r.repository_commit)
            .unwrap_or_default();
        let commit_ok = (7..=64).contains(&commit.len())
            && commit
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let work = event.work_id.map(|w| w.to_string()).unwrap_or_default();
        ManifestIds {
            project_id: event.project_id.to_string(),
            thread_id: if work.is_empty() {
                String::new()
            } else {
                event.thread_id.map(|t| t.to_string()).unwrap_or_default()
            },
            work_id: work,
            flow_run_id: self.ids.flow_run_id.to_string(),
            source_event_ids: sources,
            repository_commit: if commit_ok { commit } else { String::new() },
        }
    }

    async fn terminate_onboarding(
        &mut self,
        event: &Envelope,
        result: &mut results::OnboardingResult,
    ) -> Result<(), FlowError> {
        self.phase(
            FlowPhase::Terminate,
            self.iteration,
            "Writing summary.md and the project setup artifact",
        )
        .await?;
        // summary.md in .zopu/ (never overwritten: a later run writes beside it).
        let mut written = None;
        for (index, path) in [
            "summary.md".to_owned(),
            format!("runs/{}/summary.md", self.ids.flow_run_id),
        ]
        .into_iter()
        .enumerate()
        {
            let input = WriteGeneratedFileInput {
                path,
                content: result.summary_markdown.clone(),
            };
            match port::write_generated(self, &format!("write:summary:{index}"), input).await? {
                Ok(output) => {
                    written = Some(output.path);
                    break;
                }
                Err(failure) if failure.code == "already_exists" => continue,
                Err(failure) => {
                    tracing::warn!(code = %failure.code, "summary.md not written to the workspace");
                    break;
                }
            }
        }
        result.provenance.generated_files = written.into_iter().collect();
        result.provenance.guardrails_triggered = self.guardrails;
        // The context document: one current per project and kind.
        let project = event.project_id.to_string();
        let context_key = self.ids.step_key("context");
        if self.ctx.publisher.recorded(&context_key).await?.is_none() {
            let current = state::current_document(&self.ctx.store, &project, SUMMARY_KIND)?;
            let document_id = EventId::derived(
                self.cause.cause_unix_ms,
                &format!("flow:{}:context:{SUMMARY_KIND}", self.ids.flow_run_id),
            )
            .to_string();
            let published = pb::ContextPublished {
                document_id: document_id.clone(),
                kind: SUMMARY_KIND.to_owned(),
                title: "summary.md".to_owned(),
                content_type: "text/markdown".to_owned(),
                body: result.summary_markdown.clone(),
                blob: None,
                revision: current.as_ref().map_or(1, |doc| doc.revision + 1),
                repository_commit: result.provenance.repository_commit.clone(),
                supersedes_document_id: current.map(|doc| doc.document_id).unwrap_or_default(),
            };
            self.append(&published, "context").await?;
        }
        let ids = self.manifest_ids(event);
        let manifest = manifest::project_setup(result, &ids);
        let project_ms =
            unix_ms_of(&EventId::from_str_lossy(&project)).unwrap_or(self.cause.cause_unix_ms);
        let artifact_id = ArtifactId::derived(
            project_ms,
            &format!("project:{project}:artifact:project_setup"),
        );
        let build_id = self
            .request_build(artifact_id, "project_setup", manifest)
            .await?;
        let summary = format!(
            "Onboarded {}: summary.md stored as the current project context.",
            result.name
        );
        self.complete(
            FlowType::OnboardingExplore,
            &summary,
            &results::to_redacted_json(result),
            &build_id,
        )
        .await
    }

    async fn terminate_result(
        &mut self,
        event: &Envelope,
        outcome: Outcome,
    ) -> Result<(), FlowError> {
        self.phase(
            FlowPhase::Terminate,
            self.iteration,
            "Preparing the artifact",
        )
        .await?;
        let ids = self.manifest_ids(event);
        let (flow_type, kind, summary, json, manifest) = match outcome {
            Outcome::Explore(mut result) => {
                result.provenance.guardrails_triggered = self.guardrails;
                let manifest = manifest::exploration(&result, &ids);
                (
                    FlowType::Explore,
                    "exploration",
                    clip_chars(&result.summary, 600),
                    results::to_redacted_json(&result),
                    manifest,
                )
            }
            Outcome::Issue(mut result) => {
                result.provenance.guardrails_triggered = self.guardrails;
                let manifest = manifest::issue(&result, &ids);
                (
                    FlowType::Issue,
                    "issue",
                    clip_chars(&result.title, 600),
                    results::to_redacted_json(&result),
                    manifest,
                )
            }
        };
        let artifact_id = ArtifactId::derived(
            self.cause.cause_unix_ms,
            &format!("flow:{}:artifact:{kind}", self.ids.flow_run_id),
        );
        let build_id = self.request_build(artifact_id, kind, manifest).await?;
        self.complete(flow_type, &zopu_secrets::redact(&summary), &json, &build_id)
            .await
    }

    async fn request_build(
        &mut self,
        artifact_id: ArtifactId,
        kind: &str,
        mut manifest: pb::ArtifactManifest,
    ) -> Result<String, FlowError> {
        manifest::redact(&mut manifest);
        manifest::check(&manifest).map_err(FlowError::InvalidManifest)?;
        let revision = match state::artifact_revision(&self.ctx.store, &artifact_id.to_string())? {
            // This run already asked (a resume): same revision, so the append is a duplicate.
            Some((revision, run)) if run == self.ids.flow_run_id.to_string() => revision,
            Some((revision, _)) => revision + 1,
            None => 1,
        };
        let key = keys::artifact_build(&self.ids.flow_run_id, kind, revision);
        let build_id = BuildId::derived(self.cause.cause_unix_ms, &key);
        let requested = pb::ArtifactBuildRequested {
            build_id: build_id.to_string(),
            artifact_id: artifact_id.to_string(),
            revision,
            manifest: Some(manifest),
        };
        let event =
            NewEvent::caused_by(&self.cause, &requested, key).with_flow_run(self.ids.flow_run_id);
        self.ctx.publisher.append(event).await?;
        Ok(build_id.to_string())
    }

    async fn complete(
        &mut self,
        flow_type: FlowType,
        summary: &str,
        result_json: &str,
        build_id: &str,
    ) -> Result<(), FlowError> {
        let note = format!(
            "Finished: {} step(s) replayed from the record, {} executed, {} guardrail(s)",
            self.replayed, self.executed, self.guardrails
        );
        self.progress(Signal::Phase, "finished", &note, false, None)
            .await?;
        let completed = pb::FlowCompleted {
            flow_type: flow_type as i32,
            summary: clip_chars(summary, 600),
            result_json: result_json.to_owned(),
            result_blob: None,
            artifact_build_id: build_id.to_owned(),
            provider: self.provider_label.clone(),
        };
        self.append(&completed, "terminal").await.map(|_| ())
    }

    async fn cancel(&mut self, reason: &str) -> Result<(), FlowError> {
        self.progress(Signal::Halt, "halt", reason, true, None)
            .await?;
        let cancelled = pb::FlowCancelled {
            flow_type: self.ids.flow_type as i32,
            phase: self.phase as i32,
            reason: clip_chars(reason, 500),
        };
        self.append(&cancelled, "terminal").await.map(|_| ())
    }

    async fn fail(&mut self, error: &FlowError) -> Result<(), FlowError> {
        let message = clip_chars(&zopu_secrets::redact(&error.to_string()), 500);
        tracing::warn!(flow_run = %self.ids.flow_run_id, code = error.code(), %message, "flow run failed");
        self.progress(Signal::Error, "error", &message, true, None)
            .await?;
        let failed = pb::FlowFailed {
            flow_type: self.ids.flow_type as i32,
            phase: self.phase as i32,
            reason: Some(pb::FailureReason {
                code: error.code().to_owned(),
                message,
                retryable: error.retryable(),
            }),
        };
        self.append(&failed, "terminal").await.map(|_| ())
    }

    fn cache_file(&self, sha: &str) -> PathBuf {
        self.cache.join(format!("{sha}.json"))
    }

    fn sandbox(&self) -> Result<Arc<Sandbox>, FlowError> {
        self.sandbox
            .clone()
            .ok_or_else(|| FlowError::Workspace("the workspace is not open".to_owned()))
    }

    async fn replay_tool(
        &mut self,
        request: &ToolRequest,
        recorded: &Envelope,
    ) -> Result<ToolResult, FlowError> {
        let progress: pb::FlowProgress = recorded
            .decode()
            .map_err(|e| FlowError::Runtime(e.to_string()))?;
        let call = progress.tool_call.unwrap_or_default();
        self.replayed += 1;
        if call.outcome == "denied" || call.outcome == "failed" {
            let code = call
                .detail
                .split(':')
                .next()
                .unwrap_or("")
                .trim()
                .to_owned();
            return Ok(Err(ToolFailure {
                denied: call.outcome == "denied",
                code,
                message: call.detail,
            }));
        }
        let path = self.cache_file(&call.output_sha256);
        if let Ok(bytes) = std::fs::read(&path)
            && hex::encode(Sha256::digest(&bytes)) == call.output_sha256
            && let Ok(value) = serde_json::from_slice(&bytes)
        {
            return Ok(Ok(value));
        }
        // The cache is gone (another machine, a cleaned disk): the tools are
        // read-only over the same checkout, so running it again is safe.
        tracing::warn!(
            tool = request.name(),
            "recorded tool output not in the cache; running the tool again"
        );
        self.replayed -= 1;
        let (result, _) = self.run_tool(request.clone()).await?;
        Ok(result)
    }

    /// Runs one tool in its span: the tool's name and outcome, never its
    /// arguments or output (they may hold file contents).
    async fn run_tool(
        &mut self,
        request: ToolRequest,
    ) -> Result<(ToolResult, pb::ToolCall), FlowError> {
        let span = tracing::info_span!(
            target: zopu_core::telemetry::TRACE_TARGET,
            "tool",
            otel.name = format!("execute_tool {}", request.name()),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = request.name(),
            outcome = tracing::field::Empty,
            output_bytes = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let outcome = self
            .run_tool_untraced(request)
            .instrument(span.clone())
            .await;
        match &outcome {
            Ok((result, call)) => {
                span.record("outcome", call.outcome.as_str());
                span.record("output_bytes", call.output_bytes);
                if let Err(failure) = result {
                    span.record("error.type", zopu_secrets::redact_label(&failure.code));
                }
            }
            Err(error) => {
                span.record("outcome", "error");
                span.record("error.type", error.code());
            }
        }
        outcome
    }

    async fn run_tool_untraced(
        &mut self,
        request: ToolRequest,
    ) -> Result<(ToolResult, pb::ToolCall), FlowError> {
        let sandbox = self.sandbox()?;
        let cache = self.cache.clone();
        let limit = self.shared.config.flow.tool_timeout;
        let joined = self
            .bounded(limit, async move {
                tokio::task::spawn_blocking(move || {
                    let output = port::execute(&sandbox, &request);
                    let record = sandbox.recorder().drain().pop();
                    if let Ok(bytes) = &output {
                        let sha = hex::encode(Sha256::digest(bytes));
                        if std::fs::create_dir_all(&cache).is_ok() {
                            let _ = std::fs::write(cache.join(format!("{sha}.json")), bytes);
                        }
                    }
                    (output, record)
                })
                .await
            })
            .await?;
        let (output, record) =
            joined.map_err(|e| FlowError::Runtime(format!("tool task failed: {e}")))?;
        self.executed += 1;
        let call = match record {
            Some(record) => pb::ToolCall {
                tool: record.tool,
                arguments_json: clip_chars(&zopu_secrets::redact(&record.arguments_json), 2_000),
                outcome: match record.outcome {
                    ToolOutcome::Allowed => "allowed",
                    ToolOutcome::Denied => "denied",
                    ToolOutcome::Truncated => "truncated",
                    ToolOutcome::Failed => "failed",
                }
                .to_owned(),
                detail: clip_chars(
                    &zopu_secrets::redact(record.detail.as_deref().unwrap_or("")),
                    500,
                ),
                duration_ms: record.duration_ms,
                output_sha256: output
                    .as_ref()
                    .map(|bytes| hex::encode(Sha256::digest(bytes)))
                    .unwrap_or_default(),
                output_bytes: output.as_ref().map_or(0, |bytes| bytes.len() as u64),
            },
            None => pb::ToolCall::default(),
        };
        let result = match output {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| ToolFailure {
                denied: false,
                code: "output".into(),
                message: e.to_string(),
            }),
            Err(failure) => Err(failure),
        };
        Ok((result, call))
    }
}

/// The test command named in a summary.md (`- `cmd` — test — ...`).
pub fn test_command(summary: &str) -> Option<String> {
    summary.lines().find_map(|line| {
        let rest = line.strip_prefix("- `")?;
        let (command, tail) = rest.split_once('`')?;
        tail.trim_start()
            .starts_with("— test —")
            .then(|| command.to_owned())
    })
}

enum Outcome {
    Explore(ExplorationResult),
    Issue(results::IssueResult),
}

trait LossyEventId {
    fn from_str_lossy(text: &str) -> EventId;
}

impl LossyEventId for EventId {
    /// Any v7 UUID string as an event id (used to read a project id's timestamp).
    fn from_str_lossy(text: &str) -> EventId {
        text.parse().unwrap_or_else(|_| EventId::derived(0, text))
    }
}

impl Port for Run<'_> {
    async fn phase(
        &mut self,
        phase: FlowPhase,
        iteration: u32,
        note: &str,
    ) -> Result<(), FlowError> {
        self.check_halt()?;
        let max = self.shared.config.flow.max_iterations;
        if iteration > max {
            return Err(FlowError::IterationLimit { max });
        }
        if Instant::now() >= self.total_deadline {
            return Err(FlowError::TotalTimeout {
                seconds: self.shared.config.flow.total_timeout.as_secs(),
            });
        }
        self.phase = phase;
        self.iteration = iteration;
        self.phase_deadline = Instant::now() + self.phase_timeout(phase);
        let step = self.scoped(&format!("phase:{}:{iteration}", phase_name(phase)));
        self.progress(Signal::Phase, &step, note, true, None).await
    }

    async fn tool(&mut self, step: &str, request: ToolRequest) -> Result<ToolResult, FlowError> {
        let step = self.scoped(&format!("tool:{step}"));
        if let Some(recorded) = self
            .ctx
            .publisher
            .recorded(&self.ids.step_key(&step))
            .await?
        {
            return self.replay_tool(&request, &recorded).await;
        }
        self.check_halt()?;
        if Instant::now() >= self.deadline() {
            return Err(self.timeout_error());
        }
        let (result, call) = self.run_tool(request).await?;
        let note = format!("{} {}", call.tool, call.outcome);
        self.progress(Signal::ToolCall, &step, &note, false, Some(call))
            .await?;
        Ok(result)
    }

    async fn llm(&mut self, step: &str, request: ChatRequest) -> Result<ChatReply, FlowError> {
        let step = &self.scoped(step);
        let key = self.ids.step_key(step);
        if let Some(recorded) = self.ctx.publisher.recorded(&key).await? {
            self.replayed += 1;
            if recorded.is::<pb::AgentLlmFailed>() {
                let failed: pb::AgentLlmFailed = recorded
                    .decode()
                    .map_err(|e| FlowError::Runtime(e.to_string()))?;
                let message = failed.reason.map(|r| r.message).unwrap_or_default();
                return Err(FlowError::ToolNotAllowed(message));
            }
            let completed: pb::AgentLlmCompleted = recorded
                .decode()
                .map_err(|e| FlowError::Runtime(e.to_string()))?;
            return serde_json::from_str(&completed.reply_json)
                .map_err(|e| FlowError::Runtime(format!("recorded reply does not decode: {e}")));
        }
        self.check_halt()?;
        self.check_budget().await?;
        let provider = self.shared.provider.clone().ok_or_else(|| FlowError::Llm {
            message: "no model is configured".to_owned(),
            retryable: false,
        })?;
        let started = std::time::Instant::now();
        let limit = self.shared.config.flow.llm_timeout;
        let reply = self
            .bounded(limit, zopu_llm::complete_traced(provider.as_ref(), request))
            .await?;
        self.executed += 1;
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match reply {
            Ok(mut reply) => {
                reply.redact_secrets();
                let value =
                    serde_json::to_value(&reply).map_err(|e| FlowError::Runtime(e.to_string()))?;
                let completed = pb::AgentLlmCompleted {
                    agent_id: self.agent_id.clone(),
                    provider: self.provider_label.clone(),
                    model: reply.model.clone(),
                    step: step.to_owned(),
                    reply_json: value.to_string(),
                    reply_blob: None,
                    prompt_tokens: reply.usage.prompt_tokens,
                    completion_tokens: reply.usage.completion_tokens,
                    attempts: reply.attempts,
                    duration_ms,
                };
                self.ctx
                    .publisher
                    .append(
                        NewEvent::caused_by(&self.cause, &completed, key)
                            .with_flow_run(self.ids.flow_run_id),
                    )
                    .await?;
                Ok(reply)
            }
            Err(error) => {
                if let zopu_llm::Error::UnknownTool { name } = error.root() {
                    let failed = pb::AgentLlmFailed {
                        agent_id: self.agent_id.clone(),
                        provider: self.provider_label.clone(),
                        step: step.to_owned(),
                        reason: Some(pb::FailureReason {
                            code: "llm.unknown_tool".to_owned(),
                            message: clip_chars(name, 64),
                            retryable: false,
                        }),
                        attempts: 1,
                    };
                    self.ctx
                        .publisher
                        .append(
                            NewEvent::caused_by(&self.cause, &failed, key)
                                .with_flow_run(self.ids.flow_run_id),
                        )
                        .await?;
                    return Err(FlowError::ToolNotAllowed(clip_chars(name, 64)));
                }
                Err(FlowError::Llm {
                    message: clip_chars(&zopu_secrets::redact(&error.to_string()), 400),
                    retryable: error.is_retryable(),
                })
            }
        }
    }

    async fn guardrail(
        &mut self,
        step: &str,
        rule: &str,
        detail: &str,
        action: &str,
    ) -> Result<(), FlowError> {
        self.guardrails += 1;
        let triggered = pb::AgentGuardrailTriggered {
            agent_id: self.agent_id.clone(),
            rule: rule.to_owned(),
            detail: clip_chars(&zopu_secrets::redact(detail), 500),
            action: action.to_owned(),
        };
        tracing::info!(flow_run = %self.ids.flow_run_id, rule, action, "guardrail triggered");
        self.append(&triggered, &self.scoped(&format!("guardrail:{step}")))
            .await
            .map(|_| ())
    }

    fn guardrails(&self) -> u32 {
        self.guardrails
    }
}
