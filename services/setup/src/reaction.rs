//! The setup reaction: one handler per `project.setup.requested` that walks
//! the revision's steps, appending each step's event under its
//! deterministic key before taking the next.
//!
//! On every delivery it first rebuilds the revision's state from the events
//! already recorded under those keys, so a redelivery (after a crash, a
//! restart or a duplicate request) skips what is done and continues where
//! the last attempt stopped. `project.ready` is appended only at the
//! project version the handler last read (`append_at`), under the
//! revision's ready key, so two setup instances cannot both emit it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use zopu_core::secret_store::SecretStore;
use zopu_runtime::publish::AppendAtError;
use zopu_runtime::{HandlerError, NewEvent, Reaction, ReactionContext};
use zopu_sandbox::env_scan::{self, EnvManifest, EnvStatus};
use zopu_sandbox::git::{CloneSource, Git};
use zopu_sandbox::workspace::WorkspaceProvider;
use zopu_schema::envelope::EventContext;
use zopu_schema::{AgentId, Envelope, EventId, OrgId, ProjectId, pb};

use crate::failure::{self, Access, Outcome};
use crate::keys;
use crate::state::{self, Failure, Next, RevisionState, decide};

/// Attempts to append `project.ready` while other events keep moving the project's head.
const READY_ATTEMPTS_MAX: u32 = 20;
/// Longest wait for this service's store to index the stream's end after
/// `project.ready` lost the optimistic-concurrency race.
const CATCH_UP_AFTER_CONFLICT_MAX: Duration = Duration::from_secs(30);
/// Failures remembered between a transient error and the runner giving up.
const PENDING_FAILURES_MAX: usize = 10_000;
/// Budget for the `.env.example` part of an event (events stay far below 1 MB).
const ENVIRONMENT_EVENT_BYTES_MAX: usize = 128 * 1024;

/// Handles `project.setup.requested`.
pub struct SetupReaction<W> {
    workspaces: W,
    provider: &'static str,
    git: Git,
    /// The organizations' repository credentials (`None`: this instance has
    /// no secrets key, so every https clone is anonymous).
    credentials: Option<SecretStore>,
    /// Per request event: the failure to record if the runner gives up.
    pending: Mutex<HashMap<EventId, Failure>>,
    /// Most projects per organization.
    org_projects_max: u32,
    /// Held from counting an organization's projects to appending a new
    /// project's `project.setup.started`, so two new projects handled at
    /// once by this instance cannot both take the last place.
    starts: tokio::sync::Mutex<()>,
}

impl<W> std::fmt::Debug for SetupReaction<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetupReaction")
            .field("provider", &self.provider)
            .field("git", &self.git)
            .finish_non_exhaustive()
    }
}

impl<W: WorkspaceProvider + 'static> SetupReaction<W> {
    /// `provider` names the workspace provider in `project.runtime.created`
    /// (e.g. `local`); `credentials` holds the organizations' repository
    /// tokens.
    pub fn new(
        workspaces: W,
        provider: &'static str,
        git: Git,
        credentials: Option<SecretStore>,
    ) -> Self {
        Self {
            workspaces,
            provider,
            git,
            credentials,
            pending: Mutex::new(HashMap::new()),
            org_projects_max: crate::ORG_PROJECTS_MAX_DEFAULT,
            starts: tokio::sync::Mutex::new(()),
        }
    }

    /// Limits each organization to `max` projects (`setup.org_projects_max`).
    pub fn with_org_projects_max(mut self, max: u32) -> Self {
        self.org_projects_max = max;
        self
    }

    /// `Some(failure)` when `project` would be a new project beyond its
    /// organization's limit. Reads the store once it holds every event
    /// appended so far (the other projects' `project.setup.started`).
    async fn over_project_limit(
        &self,
        ctx: &ReactionContext,
        org: &OrgId,
        project: &ProjectId,
    ) -> Result<Option<Failure>, HandlerError> {
        ctx.caught_up_to_end(zopu_runtime::reaction::CATCH_UP_MAX)
            .await?;
        let (others, started) = crate::projection::started_projects(&ctx.store, org, project)?;
        if started || others < u64::from(self.org_projects_max) {
            return Ok(None);
        }
        tracing::warn!(%org, %project, others, max = self.org_projects_max, "organization project limit reached");
        Ok(Some(failure::project_limit(self.org_projects_max)))
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<EventId, Failure>> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What to record if the step now starting never succeeds.
    fn expect_failure(&self, request: EventId, failure: Failure) {
        let mut pending = self.pending();
        if pending.len() >= PENDING_FAILURES_MAX && !pending.contains_key(&request) {
            pending.clear();
        }
        pending.insert(request, failure);
    }

    async fn run(&self, event: &Envelope, ctx: &ReactionContext) -> Result<(), HandlerError> {
        let request = event.decode::<pb::ProjectSetupRequested>()?;
        let (org, project, revision) = (
            event.org_id.clone(),
            event.project_id,
            request.setup_revision,
        );
        let mut steps = Steps::new(event, revision);
        if revision == 0 {
            return steps.record_failure(ctx, failure::invalid_revision()).await;
        }
        let mut state = RevisionState::new(revision);
        state.apply(event);
        steps.load(ctx, &mut state).await?;
        if decide(&state) == Next::Finished {
            tracing::debug!(%project, revision, "setup revision already finished");
            return Ok(());
        }
        // Validated again here: the request may not come from `request_setup`.
        let source = match CloneSource::parse(
            &request.repository_url,
            &request.branch,
            None,
            self.git.options(),
        ) {
            Ok(source) => source,
            Err(error) => {
                return steps
                    .record_failure(ctx, failure::invalid_request(&error))
                    .await;
            }
        };
        let mut start_guard = None;
        loop {
            let next = decide(&state);
            let generic = |step: &str| {
                Failure::new(
                    step,
                    "setup.gave_up",
                    "Setup stopped after repeated errors. Retry; if it keeps failing, ask the operator to check the setup service.",
                    true,
                )
            };
            let new_event = match next {
                Next::Finished => return Ok(()),
                Next::Start => {
                    start_guard = Some(self.starts.lock().await);
                    if let Some(failure) = self.over_project_limit(ctx, &org, &project).await? {
                        return steps.record_failure(ctx, failure).await;
                    }
                    steps.event(
                        &pb::ProjectSetupStarted {
                            setup_revision: revision,
                        },
                        keys::started(&project, revision),
                    )
                }
                Next::CreateRuntime => {
                    self.expect_failure(event.id, generic(state::step::WORKSPACE));
                    match self.workspaces.ensure(&project.to_string()).await {
                        Ok(handle) => steps.event(
                            &pb::ProjectRuntimeCreated {
                                setup_revision: revision,
                                runtime_id: handle.runtime_id,
                                provider: self.provider.to_owned(),
                                workspace_path: handle.workspace_path.display().to_string(),
                                repository_path: handle.repository_path.display().to_string(),
                                reused: handle.reused,
                            },
                            keys::runtime_created(&project, revision),
                        ),
                        Err(error) => {
                            tracing::warn!(%project, revision, %error, "workspace step failed");
                            return self
                                .step_failed(&steps, ctx, event.id, failure::workspace(&error))
                                .await;
                        }
                    }
                }
                Next::CloneRepository => {
                    self.expect_failure(event.id, generic(state::step::CLONE));
                    let path = PathBuf::from(
                        state
                            .runtime
                            .as_ref()
                            .map(|runtime| runtime.repository_path.as_str())
                            .unwrap_or_default(),
                    );
                    let (source, access) = match self.authenticated(&org, &source).await {
                        Ok(authenticated) => authenticated,
                        Err(outcome) => {
                            return self.step_failed(&steps, ctx, event.id, outcome).await;
                        }
                    };
                    let mut outcome = self.git.ensure_clone(&source, &path).await;
                    if revision > 1
                        && matches!(&outcome, Err(error) if failure::needs_repair(error))
                    {
                        tracing::info!(%project, revision, "explicit retry: replacing the workspace's clone");
                        outcome = self.git.repair(&source, &path).await;
                    }
                    match outcome {
                        Ok(clone) => steps.event(
                            &pb::ProjectRepositoryCloned {
                                setup_revision: revision,
                                runtime_id: state
                                    .runtime
                                    .as_ref()
                                    .map(|runtime| runtime.runtime_id.clone())
                                    .unwrap_or_default(),
                                branch: source.branch.as_str().to_owned(),
                                repository_commit: clone.repository.commit,
                                tracked_files: clone.repository.tracked_files as u64,
                                reused: clone.reused,
                                credential_host: match &access {
                                    Access::Stored { host, .. } => host.clone(),
                                    _ => String::new(),
                                },
                                credential_version: match &access {
                                    Access::Stored { version, .. } => *version,
                                    _ => 0,
                                },
                            },
                            keys::cloned(&project, revision),
                        ),
                        Err(error) => {
                            tracing::warn!(%project, revision, %error, "clone step failed");
                            return self
                                .step_failed(
                                    &steps,
                                    ctx,
                                    event.id,
                                    failure::clone(&error, source.branch.as_str(), &access),
                                )
                                .await;
                        }
                    }
                }
                Next::ScanEnvironment => {
                    self.expect_failure(event.id, generic(state::step::VERIFY));
                    let path = PathBuf::from(
                        state
                            .runtime
                            .as_ref()
                            .map(|runtime| runtime.repository_path.as_str())
                            .unwrap_or_default(),
                    );
                    let manifest =
                        tokio::task::spawn_blocking(move || env_scan::scan_env_example(&path))
                            .await
                            .map_err(|error| {
                                HandlerError::Transient(format!(
                                    "environment scan did not complete: {error}"
                                ))
                            })?;
                    steps.event(
                        &environment_event(revision, &manifest),
                        keys::environment_scanned(&project, revision),
                    )
                }
                Next::RegisterAgent => {
                    self.expect_failure(event.id, generic(state::step::REGISTER));
                    let agent = AgentId::conversation(&org, &project);
                    steps.event(
                        &pb::AgentRegistered {
                            agent_id: agent.to_string(),
                            agent_type: state::CONVERSATION_AGENT_TYPE.to_owned(),
                            runtime_id: state
                                .runtime
                                .as_ref()
                                .map(|runtime| runtime.runtime_id.clone())
                                .unwrap_or_default(),
                            global_timeline_id: state::GLOBAL_TIMELINE_ID.to_owned(),
                            setup_revision: revision,
                        },
                        keys::agent_registered(&agent),
                    )
                }
                Next::MarkReady => {
                    self.expect_failure(event.id, generic(state::step::REGISTER));
                    return steps.mark_ready(ctx, &state).await;
                }
            };
            steps.append(ctx, &mut state, new_event).await?;
            // The started event is in the stream: the next count sees it.
            drop(start_guard.take());
        }
    }

    /// `source` with `org`'s stored credential for its host, if there is
    /// one, and how the clone authenticates. The credential stays in memory
    /// (a [`zopu_secrets::Secret`]); only its host and version are recorded.
    async fn authenticated(
        &self,
        org: &OrgId,
        source: &CloneSource,
    ) -> Result<(CloneSource, Access), Outcome> {
        let Some(host) = source.location.credential_host() else {
            return Ok((source.clone(), Access::Anonymous { host: None }));
        };
        let Some(store) = &self.credentials else {
            return Ok((source.clone(), Access::NoStore { host }));
        };
        match store.repository_credential(org, &host).await {
            Ok(Some((credential, stored))) => {
                let mut source = source.clone();
                source.credential = Some(credential);
                tracing::debug!(%org, %host, version = stored.version, "cloning with the stored repository credential");
                Ok((
                    source,
                    Access::Stored {
                        host,
                        version: stored.version,
                    },
                ))
            }
            Ok(None) => Ok((source.clone(), Access::Anonymous { host: Some(host) })),
            Err(error) => {
                tracing::warn!(%org, %host, %error, "repository credentials unavailable");
                Err(failure::credentials_unavailable())
            }
        }
    }

    async fn step_failed(
        &self,
        steps: &Steps,
        ctx: &ReactionContext,
        request: EventId,
        outcome: Outcome,
    ) -> Result<(), HandlerError> {
        match outcome {
            Outcome::Transient(failure) => {
                let reason = format!("{}: {}", failure.code, failure.message);
                self.expect_failure(request, failure);
                Err(HandlerError::Transient(reason))
            }
            Outcome::Terminal(failure) => steps.record_failure(ctx, failure).await,
        }
    }
}

impl<W: WorkspaceProvider + 'static> Reaction for SetupReaction<W> {
    async fn handle(&self, event: &Envelope, ctx: &ReactionContext) -> Result<(), HandlerError> {
        let outcome = self.run(event, ctx).await;
        if !matches!(outcome, Err(HandlerError::Transient(_))) {
            self.pending().remove(&event.id);
        }
        outcome
    }

    /// The runner gave up (retries exhausted, or the request kept crashing
    /// the service): the revision ends with the last known failure.
    fn failure_event(&self, event: &Envelope, reason: &str) -> Option<NewEvent> {
        let revision = event
            .decode::<pb::ProjectSetupRequested>()
            .map(|request| request.setup_revision)
            .unwrap_or(0);
        let failure = self.pending().remove(&event.id).unwrap_or_else(|| {
            tracing::warn!(%reason, "setup gave up without a classified failure");
            Failure::new(
                state::step::WORKSPACE,
                "setup.gave_up",
                "Setup stopped after repeated errors. Retry; if it keeps failing, ask the operator to check the setup service.",
                true,
            )
        });
        Some(NewEvent::caused_by(
            &event.context(),
            &failure.to_event(revision),
            keys::failed(&event.project_id, revision),
        ))
    }
}

/// The `.env.example` scan as an event: names always; example values and
/// descriptions only while the event stays small.
fn environment_event(revision: u32, manifest: &EnvManifest) -> pb::ProjectEnvironmentScanned {
    use pb::project_environment_scanned::Status;
    use prost::Message;
    let status = match manifest.status {
        EnvStatus::Detected => Status::Detected,
        EnvStatus::NoneDetected => Status::NoneDetected,
        EnvStatus::Unreadable => Status::Unreadable,
    };
    let mut event = pb::ProjectEnvironmentScanned {
        setup_revision: revision,
        status: status as i32,
        variables: manifest
            .variables
            .iter()
            .map(|variable| pb::EnvironmentVariable {
                name: variable.name.clone(),
                example_value: variable.example_value.clone().unwrap_or_default(),
                description: variable.description.clone().unwrap_or_default(),
            })
            .collect(),
        dropped_values: u32::try_from(manifest.dropped_values).unwrap_or(u32::MAX),
    };
    if event.encoded_len() > ENVIRONMENT_EVENT_BYTES_MAX {
        for variable in &mut event.variables {
            variable.example_value.clear();
            variable.description.clear();
        }
    }
    while event.encoded_len() > ENVIRONMENT_EVENT_BYTES_MAX && event.variables.pop().is_some() {}
    event
}

/// The chain of one revision: its context, keys and causation.
struct Steps {
    org: OrgId,
    project: ProjectId,
    revision: u32,
    /// The request's context; every step keeps its time, so event ids are
    /// the same however often the chain is resumed.
    context: EventContext,
    /// The event the next step is caused by (the previous step, or the request).
    cause: EventId,
}

impl Steps {
    fn new(request: &Envelope, revision: u32) -> Self {
        Self {
            org: request.org_id.clone(),
            project: request.project_id,
            revision,
            context: request.context(),
            cause: request.id,
        }
    }

    fn event<E: zopu_schema::Event>(&self, payload: &E, key: String) -> NewEvent {
        let context = EventContext {
            causation_id: self.cause,
            ..self.context.clone()
        };
        NewEvent::caused_by(&context, payload, key)
    }

    fn keys(&self) -> Vec<String> {
        let (project, revision) = (&self.project, self.revision);
        vec![
            keys::started(project, revision),
            keys::runtime_created(project, revision),
            keys::cloned(project, revision),
            keys::environment_scanned(project, revision),
            keys::agent_registered(&AgentId::conversation(&self.org, project)),
            keys::ready(project, revision),
            keys::failed(project, revision),
        ]
    }

    /// Folds in every step already recorded for this revision (and the
    /// project's agent binding), and continues the causation chain after
    /// the last of them.
    async fn load(
        &mut self,
        ctx: &ReactionContext,
        state: &mut RevisionState,
    ) -> Result<(), HandlerError> {
        let mut last: Option<(u64, EventId)> = None;
        for key in self.keys() {
            if let Some(recorded) = ctx.publisher.recorded(&key).await? {
                let ours = state::setup_revision_of(&recorded) == Some(self.revision);
                if state.apply(&recorded)
                    && ours
                    && last.is_none_or(|(version, _)| recorded.project_version > version)
                {
                    last = Some((recorded.project_version, recorded.id));
                }
            }
        }
        if let Some((_, id)) = last {
            self.cause = id;
        }
        Ok(())
    }

    /// Appends one step's event and folds it into the state.
    async fn append(
        &mut self,
        ctx: &ReactionContext,
        state: &mut RevisionState,
        event: NewEvent,
    ) -> Result<(), HandlerError> {
        let appended = ctx.publisher.append(event.clone()).await?;
        // A duplicate was stored before (maybe by another instance): fold what is stored.
        let stored = match appended.duplicate {
            true => ctx.publisher.recorded(&event.idempotency_key).await?,
            false => None,
        };
        let advanced = match &stored {
            Some(stored) => {
                self.cause = stored.id;
                state.apply(stored)
            }
            None => {
                self.cause = appended.event_id;
                state.apply_data(event.event_type, &event.data)
            }
        };
        if !advanced {
            return Err(HandlerError::Permanent(format!(
                "appended {} did not advance setup revision {}",
                event.event_type, self.revision
            )));
        }
        tracing::debug!(project = %self.project, revision = self.revision, event_type = event.event_type, duplicate = appended.duplicate, "setup step recorded");
        Ok(())
    }

    async fn record_failure(
        &self,
        ctx: &ReactionContext,
        failure: Failure,
    ) -> Result<(), HandlerError> {
        tracing::warn!(project = %self.project, revision = self.revision, step = %failure.step, code = %failure.code, "setup failed");
        let event = self.event(
            &failure.to_event(self.revision),
            keys::failed(&self.project, self.revision),
        );
        ctx.publisher.append(event).await?;
        Ok(())
    }

    /// Appends `project.ready` at the project's current version; when the
    /// project moved on, catches up and decides again.
    async fn mark_ready(
        &self,
        ctx: &ReactionContext,
        state: &RevisionState,
    ) -> Result<(), HandlerError> {
        let ready = state.ready_event().ok_or_else(|| {
            HandlerError::Permanent("ready decided before every step was recorded".to_owned())
        })?;
        let (ready_key, failed_key) = (
            keys::ready(&self.project, self.revision),
            keys::failed(&self.project, self.revision),
        );
        for attempt in 1..=READY_ATTEMPTS_MAX {
            let expected = ctx
                .publisher
                .fetch_head(&self.org, &self.project)
                .await?
                .map_or(0, |head| head.version);
            match ctx
                .publisher
                .append_at(self.event(&ready, ready_key.clone()), expected)
                .await
            {
                Ok(appended) => {
                    tracing::info!(project = %self.project, revision = self.revision, duplicate = appended.duplicate, "project ready");
                    return Ok(());
                }
                Err(AppendAtError::Conflict { current_version }) => {
                    tracing::debug!(project = %self.project, attempt, current_version, "project moved on; re-reading before deciding again");
                    ctx.caught_up_to_end(CATCH_UP_AFTER_CONFLICT_MAX).await?;
                    for key in [&ready_key, &failed_key] {
                        if ctx.publisher.recorded(key).await?.is_some() {
                            tracing::info!(project = %self.project, revision = self.revision, "setup revision was finished elsewhere");
                            return Ok(());
                        }
                    }
                }
                Err(AppendAtError::Failed(error)) => return Err(error.into()),
            }
        }
        Err(HandlerError::Transient(format!(
            "the project kept moving; project.ready not appended after {READY_ATTEMPTS_MAX} attempts"
        )))
    }
}
