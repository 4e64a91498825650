//! The setup state machine, pure: the state of one setup revision folded
//! from its events ([`RevisionState::apply`]), the next step to take
//! ([`decide`]), and the thin status shown to people ([`SetupStatus`],
//! [`status_from_events`]).
//!
//! The same fold feeds the reaction (state rebuilt from the events recorded
//! under the revision's keys), the projection (state stored per revision) and
//! the clients (state from a project's history), so the three never disagree.

use bytes::Bytes;
use prost::Message;
use zopu_schema::{Envelope, Event, pb};

/// Agent type of the project's conversation agent (`agent.registered`).
pub const CONVERSATION_AGENT_TYPE: &str = zopu_schema::AgentId::CONVERSATION;
/// The project's one global timeline (`agent.registered.global_timeline_id`).
pub use zopu_core::commands::GLOBAL_TIMELINE_ID;

/// Step names used in `project.setup.failed.step`.
pub mod step {
    /// Creating or reusing the workspace.
    pub const WORKSPACE: &str = "workspace";
    /// Validating the request and cloning (or reusing) the repository.
    pub const CLONE: &str = "clone";
    /// Checking that the clone is readable.
    pub const VERIFY: &str = "verify";
    /// Registering the conversation agent.
    pub const REGISTER: &str = "register";
}

/// Why a revision stopped, as recorded in `project.setup.failed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `workspace`, `clone`, `verify` or `register`.
    pub step: String,
    /// Stable machine-readable code, e.g. `clone.branch_not_found`.
    pub code: String,
    /// One or two sentences a user can act on; never a secret.
    pub message: String,
    /// Whether a retry (a new setup revision) can help.
    pub retryable: bool,
}

impl Failure {
    pub fn new(step: &str, code: &str, message: impl Into<String>, retryable: bool) -> Self {
        Self {
            step: step.to_owned(),
            code: code.to_owned(),
            message: message.into(),
            retryable,
        }
    }

    /// The `project.setup.failed` payload for `revision`.
    pub fn to_event(&self, revision: u32) -> pb::ProjectSetupFailed {
        pb::ProjectSetupFailed {
            setup_revision: revision,
            step: self.step.clone(),
            reason: Some(pb::FailureReason {
                code: self.code.clone(),
                message: self.message.clone(),
                retryable: self.retryable,
            }),
        }
    }

    fn from_event(failed: &pb::ProjectSetupFailed) -> Self {
        let reason = failed.reason.clone().unwrap_or_default();
        Self {
            step: failed.step.clone(),
            code: reason.code,
            message: reason.message,
            retryable: reason.retryable,
        }
    }
}

/// What was asked (`project.setup.requested`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestRecord {
    pub repository_url: String,
    pub branch: String,
    pub project_name: String,
    pub repository_connection_id: String,
}

/// The workspace (`project.runtime.created`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuntimeRecord {
    pub runtime_id: String,
    pub provider: String,
    pub workspace_path: String,
    pub repository_path: String,
    pub reused: bool,
}

/// The verified clone (`project.repository.cloned`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CloneRecord {
    pub branch: String,
    pub commit: String,
    pub tracked_files: u64,
    pub reused: bool,
}

/// The `.env.example` scan (`project.environment.scanned`): names only.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnvironmentRecord {
    /// `detected`, `none_detected` or `unreadable`.
    pub status: String,
    pub names: Vec<String>,
}

/// The state of one setup revision of one project.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RevisionState {
    pub revision: u32,
    pub request: Option<RequestRecord>,
    pub started: bool,
    pub runtime: Option<RuntimeRecord>,
    pub clone: Option<CloneRecord>,
    pub environment: Option<EnvironmentRecord>,
    /// The project's conversation agent, registered by this or an earlier revision.
    pub agent_id: Option<String>,
    pub ready: bool,
    pub failure: Option<Failure>,
}

/// The next thing setup does for a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Start,
    CreateRuntime,
    CloneRepository,
    ScanEnvironment,
    RegisterAgent,
    MarkReady,
    /// Ready or failed: nothing left to do.
    Finished,
}

/// The thin progression shown while setting up (main spec section 68).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetupPhase {
    CreatingWorkspace,
    Cloning,
    Checking,
    Ready,
    Failed,
}

impl SetupPhase {
    /// Machine name: `creating_workspace`, `cloning`, `checking`, `ready`, `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CreatingWorkspace => "creating_workspace",
            Self::Cloning => "cloning",
            Self::Checking => "checking",
            Self::Ready => "ready",
            Self::Failed => "failed",
        }
    }

    /// Label for people: `Creating workspace`, `Cloning repository`, ...
    pub fn label(self) -> &'static str {
        match self {
            Self::CreatingWorkspace => "Creating workspace",
            Self::Cloning => "Cloning repository",
            Self::Checking => "Checking repository",
            Self::Ready => "Ready",
            Self::Failed => "Setup failed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::CreatingWorkspace,
            Self::Cloning,
            Self::Checking,
            Self::Ready,
            Self::Failed,
        ]
        .into_iter()
        .find(|phase| phase.as_str() == text)
    }

    /// Ready or failed.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Ready | Self::Failed)
    }
}

impl std::fmt::Display for SetupPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a client shows for a project's setup (its latest revision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupStatus {
    pub phase: SetupPhase,
    pub revision: u32,
    /// The name the revision's request carries (chosen at creation: `--name`,
    /// else the repository's name).
    pub project_name: String,
    pub repository_url: String,
    pub branch: String,
    /// Set when `phase` is `Failed`.
    pub reason: Option<Failure>,
    /// Names from the root `.env.example` (optional configuration; never values).
    pub environment_variable_names: Vec<String>,
    pub repository_commit: Option<String>,
    pub runtime_id: Option<String>,
    pub agent_id: Option<String>,
}

fn revision_of(event: &Envelope) -> Option<u32> {
    revision_of_data(&event.event_type, &event.data)
}

fn revision_of_data(event_type: &str, data: &Bytes) -> Option<u32> {
    fn decode<E: Event>(data: &Bytes) -> Option<E> {
        E::decode(data.clone()).ok()
    }
    let revision = match event_type {
        pb::ProjectSetupRequested::TYPE => {
            decode::<pb::ProjectSetupRequested>(data)?.setup_revision
        }
        pb::ProjectSetupStarted::TYPE => decode::<pb::ProjectSetupStarted>(data)?.setup_revision,
        pb::ProjectRuntimeCreated::TYPE => {
            decode::<pb::ProjectRuntimeCreated>(data)?.setup_revision
        }
        pb::ProjectRepositoryCloned::TYPE => {
            decode::<pb::ProjectRepositoryCloned>(data)?.setup_revision
        }
        pb::ProjectEnvironmentScanned::TYPE => {
            decode::<pb::ProjectEnvironmentScanned>(data)?.setup_revision
        }
        pb::AgentRegistered::TYPE => decode::<pb::AgentRegistered>(data)?.setup_revision,
        pb::ProjectReady::TYPE => decode::<pb::ProjectReady>(data)?.setup_revision,
        pb::ProjectSetupFailed::TYPE => decode::<pb::ProjectSetupFailed>(data)?.setup_revision,
        _ => return None,
    };
    Some(revision)
}

/// The setup revision an event belongs to, if it is a setup event.
pub fn setup_revision_of(event: &Envelope) -> Option<u32> {
    revision_of(event)
}

/// True for the event types the setup state is folded from.
pub fn is_setup_event(event_type: &str) -> bool {
    SETUP_EVENT_TYPES.contains(&event_type)
}

/// The event types that make up a project's setup.
pub const SETUP_EVENT_TYPES: [&str; 8] = [
    pb::ProjectSetupRequested::TYPE,
    pb::ProjectSetupStarted::TYPE,
    pb::ProjectRuntimeCreated::TYPE,
    pb::ProjectRepositoryCloned::TYPE,
    pb::ProjectEnvironmentScanned::TYPE,
    pb::AgentRegistered::TYPE,
    pb::ProjectReady::TYPE,
    pb::ProjectSetupFailed::TYPE,
];

fn environment_status(status: i32) -> &'static str {
    use pb::project_environment_scanned::Status;
    match Status::try_from(status) {
        Ok(Status::Detected) => "detected",
        Ok(Status::NoneDetected) => "none_detected",
        Ok(Status::Unreadable) => "unreadable",
        _ => "unspecified",
    }
}

impl RevisionState {
    pub fn new(revision: u32) -> Self {
        Self {
            revision,
            ..Self::default()
        }
    }

    /// Folds one event into the state. Events of other revisions are
    /// ignored, except `agent.registered`: the agent binding belongs to the
    /// project (one per org + project + agent type), so a retry reuses it. The
    /// first event of each kind wins (a repeated request changes nothing).
    /// Returns whether the state changed.
    pub fn apply(&mut self, event: &Envelope) -> bool {
        self.apply_data(&event.event_type, &event.data)
    }

    /// [`RevisionState::apply`] on an event's type and payload alone.
    pub fn apply_data(&mut self, event_type: &str, data: &Bytes) -> bool {
        match event_type {
            pb::AgentRegistered::TYPE => {
                let Ok(registered) = pb::AgentRegistered::decode(data.clone()) else {
                    return false;
                };
                if self.agent_id.is_some() {
                    return false;
                }
                self.agent_id = Some(registered.agent_id);
                true
            }
            _ if revision_of_data(event_type, data) != Some(self.revision) => false,
            pb::ProjectSetupRequested::TYPE => {
                let Ok(requested) = pb::ProjectSetupRequested::decode(data.clone()) else {
                    return false;
                };
                if self.request.is_some() {
                    return false;
                }
                self.request = Some(RequestRecord {
                    repository_url: requested.repository_url,
                    branch: requested.branch,
                    project_name: requested.project_name,
                    repository_connection_id: requested.repository_connection_id,
                });
                true
            }
            pb::ProjectSetupStarted::TYPE => !std::mem::replace(&mut self.started, true),
            pb::ProjectRuntimeCreated::TYPE => {
                let Ok(created) = pb::ProjectRuntimeCreated::decode(data.clone()) else {
                    return false;
                };
                if self.runtime.is_some() {
                    return false;
                }
                self.runtime = Some(RuntimeRecord {
                    runtime_id: created.runtime_id,
                    provider: created.provider,
                    workspace_path: created.workspace_path,
                    repository_path: created.repository_path,
                    reused: created.reused,
                });
                true
            }
            pb::ProjectRepositoryCloned::TYPE => {
                let Ok(cloned) = pb::ProjectRepositoryCloned::decode(data.clone()) else {
                    return false;
                };
                if self.clone.is_some() {
                    return false;
                }
                self.clone = Some(CloneRecord {
                    branch: cloned.branch,
                    commit: cloned.repository_commit,
                    tracked_files: cloned.tracked_files,
                    reused: cloned.reused,
                });
                true
            }
            pb::ProjectEnvironmentScanned::TYPE => {
                let Ok(scanned) = pb::ProjectEnvironmentScanned::decode(data.clone()) else {
                    return false;
                };
                if self.environment.is_some() {
                    return false;
                }
                self.environment = Some(EnvironmentRecord {
                    status: environment_status(scanned.status).to_owned(),
                    names: scanned
                        .variables
                        .into_iter()
                        .map(|variable| variable.name)
                        .collect(),
                });
                true
            }
            pb::ProjectReady::TYPE => {
                if self.ready || self.failure.is_some() {
                    return false;
                }
                self.ready = true;
                true
            }
            pb::ProjectSetupFailed::TYPE => {
                let Ok(failed) = pb::ProjectSetupFailed::decode(data.clone()) else {
                    return false;
                };
                if self.ready || self.failure.is_some() {
                    return false;
                }
                self.failure = Some(Failure::from_event(&failed));
                true
            }
            _ => false,
        }
    }

    /// Where the revision stands.
    pub fn phase(&self) -> SetupPhase {
        if self.failure.is_some() {
            SetupPhase::Failed
        } else if self.ready {
            SetupPhase::Ready
        } else if self.clone.is_some() {
            SetupPhase::Checking
        } else if self.runtime.is_some() {
            SetupPhase::Cloning
        } else {
            SetupPhase::CreatingWorkspace
        }
    }

    /// The client view of this revision.
    pub fn status(&self) -> SetupStatus {
        let request = self.request.clone().unwrap_or_default();
        SetupStatus {
            phase: self.phase(),
            revision: self.revision,
            project_name: request.project_name,
            repository_url: request.repository_url,
            branch: request.branch,
            reason: self.failure.clone(),
            environment_variable_names: self
                .environment
                .as_ref()
                .map(|env| env.names.clone())
                .unwrap_or_default(),
            repository_commit: self.clone.as_ref().map(|clone| clone.commit.clone()),
            runtime_id: self
                .runtime
                .as_ref()
                .map(|runtime| runtime.runtime_id.clone()),
            agent_id: self.agent_id.clone(),
        }
    }

    /// The `project.ready` payload, once every step before it is done.
    /// Carries the request's repository location, which was validated to
    /// hold no credentials before anything ran.
    pub fn ready_event(&self) -> Option<pb::ProjectReady> {
        let request = self.request.as_ref()?;
        let runtime = self.runtime.as_ref()?;
        let clone = self.clone.as_ref()?;
        let environment = self.environment.as_ref()?;
        let agent_id = self.agent_id.clone()?;
        Some(pb::ProjectReady {
            setup_revision: self.revision,
            agent_id,
            runtime_id: runtime.runtime_id.clone(),
            repository_commit: clone.commit.clone(),
            environment_variable_names: environment.names.clone(),
            branch: clone.branch.clone(),
            repository_url: request.repository_url.clone(),
        })
    }
}

/// The next step for a revision. Readiness needs the workspace, a verified
/// clone, the scan (which never fails, whatever the file holds) and the
/// agent; a failure ends the revision.
pub fn decide(state: &RevisionState) -> Next {
    if state.ready || state.failure.is_some() {
        Next::Finished
    } else if !state.started {
        Next::Start
    } else if state.runtime.is_none() {
        Next::CreateRuntime
    } else if state.clone.is_none() {
        Next::CloneRepository
    } else if state.environment.is_none() {
        Next::ScanEnvironment
    } else if state.agent_id.is_none() {
        Next::RegisterAgent
    } else {
        Next::MarkReady
    }
}

/// The status of a project's latest setup revision from its events (in
/// stream order); `None` when setup was never requested.
pub fn status_from_events(events: &[Envelope]) -> Option<SetupStatus> {
    let latest = events
        .iter()
        .filter(|event| event.is::<pb::ProjectSetupRequested>())
        .filter_map(revision_of)
        .max()?;
    let mut state = RevisionState::new(latest);
    for event in events {
        state.apply(event);
    }
    Some(state.status())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use zopu_schema::{EventId, OrgId, ProjectId};

    use super::*;

    pub(crate) fn envelope<E: Event>(payload: &E, version: u64) -> Envelope {
        let org: OrgId = "acme".parse().unwrap();
        let id = EventId::new();
        Envelope {
            id,
            source: "zopu/setup".into(),
            event_type: E::TYPE.into(),
            time: time::OffsetDateTime::UNIX_EPOCH,
            data_schema: E::SCHEMA.into(),
            org_id: org,
            project_id: ProjectId::derived(1, "p"),
            correlation_id: id.into(),
            causation_id: id,
            work_id: None,
            thread_id: None,
            flow_run_id: None,
            dispatch_id: None,
            traceparent: None,
            idempotency_key: format!("k{version}"),
            project_version: version,
            previous_hash: None,
            data: Bytes::from(payload.encode_to_vec()),
        }
    }

    pub(crate) fn chain(revision: u32) -> Vec<Envelope> {
        vec![
            envelope(
                &pb::ProjectSetupRequested {
                    repository_url: "https://example.com/a.git".into(),
                    branch: "main".into(),
                    setup_revision: revision,
                    ..Default::default()
                },
                1,
            ),
            envelope(
                &pb::ProjectSetupStarted {
                    setup_revision: revision,
                },
                2,
            ),
            envelope(
                &pb::ProjectRuntimeCreated {
                    setup_revision: revision,
                    runtime_id: "local:x".into(),
                    ..Default::default()
                },
                3,
            ),
            envelope(
                &pb::ProjectRepositoryCloned {
                    setup_revision: revision,
                    branch: "main".into(),
                    repository_commit: "c0ffee".into(),
                    ..Default::default()
                },
                4,
            ),
            envelope(
                &pb::ProjectEnvironmentScanned {
                    setup_revision: revision,
                    status: pb::project_environment_scanned::Status::Detected as i32,
                    variables: vec![pb::EnvironmentVariable {
                        name: "PORT".into(),
                        ..Default::default()
                    }],
                    dropped_values: 0,
                },
                5,
            ),
            envelope(
                &pb::AgentRegistered {
                    agent_id: "conversation:acme:p".into(),
                    setup_revision: revision,
                    ..Default::default()
                },
                6,
            ),
        ]
    }

    #[test]
    fn decide_walks_the_steps_in_order_and_stops_after_ready() {
        let mut state = RevisionState::new(1);
        let mut steps = vec![decide(&state)];
        for event in chain(1) {
            state.apply(&event);
            steps.push(decide(&state));
        }
        assert_eq!(
            steps,
            [
                Next::Start,
                Next::Start,
                Next::CreateRuntime,
                Next::CloneRepository,
                Next::ScanEnvironment,
                Next::RegisterAgent,
                Next::MarkReady
            ]
        );
        let ready = state.ready_event().unwrap();
        assert_eq!(ready.repository_commit, "c0ffee");
        assert_eq!(ready.environment_variable_names, ["PORT"]);
        assert_eq!(ready.agent_id, "conversation:acme:p");
        assert!(state.apply(&envelope(&ready, 7)));
        assert_eq!(decide(&state), Next::Finished);
        assert_eq!(state.phase(), SetupPhase::Ready);
        // A second ready or a late failure changes nothing.
        assert!(!state.apply(&envelope(&ready, 8)));
        let failure = Failure::new(step::CLONE, "clone.x", "x", true);
        assert!(!state.apply(&envelope(&failure.to_event(1), 9)));
        assert_eq!(state.phase(), SetupPhase::Ready);
    }

    #[test]
    fn repeated_and_foreign_events_do_not_change_the_state() {
        let events = chain(2);
        let mut once = RevisionState::new(2);
        for event in &events {
            once.apply(event);
        }
        let mut twice = RevisionState::new(2);
        for event in events.iter().chain(&events) {
            twice.apply(event);
        }
        assert_eq!(once, twice);
        let mut other = RevisionState::new(3);
        for event in &events {
            other.apply(event);
        }
        // Only the project-level agent binding carries over to a later revision.
        assert_eq!(other.agent_id.as_deref(), Some("conversation:acme:p"));
        assert!(other.runtime.is_none() && other.request.is_none());
        other.started = true;
        assert_eq!(decide(&other), Next::CreateRuntime);
    }

    #[test]
    fn a_failure_ends_the_revision_and_status_reports_it() {
        let mut events = chain(1)[..3].to_vec();
        let failure = Failure::new(
            step::CLONE,
            "clone.branch_not_found",
            "Branch 'x' does not exist.",
            true,
        );
        events.push(envelope(&failure.to_event(1), 4));
        let status = status_from_events(&events).unwrap();
        assert_eq!(status.phase, SetupPhase::Failed);
        assert_eq!(status.reason, Some(failure));
        assert_eq!(status.revision, 1);
        assert_eq!(status.runtime_id.as_deref(), Some("local:x"));
        let mut state = RevisionState::new(1);
        events.iter().for_each(|event| {
            state.apply(event);
        });
        assert_eq!(decide(&state), Next::Finished);
        assert!(state.ready_event().is_none());
    }

    #[test]
    fn status_follows_the_thin_progression_of_the_latest_revision() {
        let events = chain(1);
        let phases: Vec<SetupPhase> = (1..=events.len())
            .map(|n| status_from_events(&events[..n]).unwrap().phase)
            .collect();
        use SetupPhase::*;
        assert_eq!(
            phases,
            [
                CreatingWorkspace,
                CreatingWorkspace,
                Cloning,
                Checking,
                Checking,
                Checking
            ]
        );
        assert!(status_from_events(&[]).is_none());
        // A retry starts a new revision: the status restarts from its beginning.
        let mut all = events.clone();
        let failure = Failure::new(step::VERIFY, "verify.unreadable", "x", true);
        all.push(envelope(&failure.to_event(1), 7));
        all.push(envelope(
            &pb::ProjectSetupRequested {
                setup_revision: 2,
                branch: "dev".into(),
                ..Default::default()
            },
            8,
        ));
        let status = status_from_events(&all).unwrap();
        assert_eq!(
            (status.revision, status.phase, status.branch.as_str()),
            (2, CreatingWorkspace, "dev")
        );
        assert!(status.reason.is_none());
        assert_eq!(SetupPhase::parse("checking"), Some(Checking));
    }
}
