//! The client side of setup, for the CLI (no printing): [`request_setup`]
//! builds a request with `zopu_core::commands` (as the gateway does) and
//! appends `project.setup.requested`; [`project_setup_events`] and [`StatusWatch`]
//! read a project's setup events so a client can show the thin progression
//! of [`SetupStatus`].

use std::time::Duration;

use zopu_core::commands::{self, Invalid, ProjectSetup, Requester};
use zopu_runtime::log::{Reader, Start};
use zopu_runtime::nats::Bus;
use zopu_runtime::{NewEvent, Publisher};
use zopu_schema::repository::{BranchProblem, LocationProblem};
use zopu_schema::{CorrelationId, Envelope, EventId, OrgId, ProjectId, pb, subjects};

use crate::state::{SETUP_EVENT_TYPES, SetupStatus, is_setup_event, status_from_events};

/// The branch a client asks for when the user names none.
pub use zopu_core::commands::DEFAULT_BRANCH;

/// A request to set a project up (first setup: revision 1; a retry: the
/// latest revision + 1).
#[derive(Debug, Clone)]
pub struct SetupRequest {
    pub org: OrgId,
    pub project: ProjectId,
    /// `https://` URL without credentials, or (when allowed) an absolute local path.
    pub repository: String,
    pub branch: String,
    pub revision: u32,
    /// The caller's request id: the correlation id of the whole setup.
    pub request_id: String,
    /// Accept local repository paths (`sandbox.allow_local_repositories`).
    pub allow_local_repositories: bool,
    /// Empty: the repository's last path segment.
    pub project_name: String,
    pub requested_by: Option<pb::Actor>,
    /// Opaque id of a credential in the setup service's credential store.
    pub repository_connection_id: String,
}

impl SetupRequest {
    pub fn new(
        org: OrgId,
        project: ProjectId,
        repository: &str,
        branch: &str,
        revision: u32,
        request_id: &str,
    ) -> Self {
        Self {
            org,
            project,
            repository: repository.to_owned(),
            branch: branch.to_owned(),
            revision,
            request_id: request_id.to_owned(),
            allow_local_repositories: false,
            project_name: String::new(),
            requested_by: None,
            repository_connection_id: String::new(),
        }
    }

    pub fn allow_local_repositories(mut self, allow: bool) -> Self {
        self.allow_local_repositories = allow;
        self
    }
}

/// Why a setup request was not appended. Never echoes the rejected input.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("repository: {0}")]
    InvalidRepository(LocationProblem),
    #[error("branch: {0}")]
    InvalidBranch(BranchProblem),
    #[error("setup revision must be 1 or more")]
    InvalidRevision,
    #[error("request id must be 1-128 printable ASCII characters without spaces")]
    InvalidRequestId,
    #[error(
        "repository connection id must be at most 128 printable ASCII characters without spaces"
    )]
    InvalidConnectionId,
    /// Any other field (the project name).
    #[error("{field}: {0}", field = .0.field())]
    Invalid(Invalid),
    #[error(
        "setup revision {revision} of this project was already requested (event {event_id}); retry with the next revision"
    )]
    RevisionTaken { revision: u32, event_id: EventId },
    #[error(transparent)]
    Append(#[from] zopu_runtime::Error),
}

/// The command this request is: `project.setup.requested`, built by
/// [`commands::request_setup`] like the gateway's.
pub fn build(request: &SetupRequest) -> Result<NewEvent, RequestError> {
    let request_id: CorrelationId = request
        .request_id
        .parse()
        .map_err(|_| RequestError::InvalidRequestId)?;
    let author = request.requested_by.clone().unwrap_or_default();
    let requester = Requester::new(request.org.clone(), request_id, author);
    let mut setup = ProjectSetup::new(&request.repository).branch(&request.branch);
    if !request.project_name.is_empty() {
        setup = setup.name(&request.project_name);
    }
    setup.repository_connection_id = request.repository_connection_id.clone();
    commands::request_setup(
        &requester,
        request.project,
        &setup,
        request.revision,
        request.allow_local_repositories,
    )
    .map_err(|problem| match problem {
        Invalid::Repository(problem) => RequestError::InvalidRepository(problem),
        Invalid::Branch(problem) => RequestError::InvalidBranch(problem),
        Invalid::Revision => RequestError::InvalidRevision,
        Invalid::ConnectionId => RequestError::InvalidConnectionId,
        other => RequestError::Invalid(other),
    })
}

/// Checks a request without appending anything.
pub fn validate(request: &SetupRequest) -> Result<(), RequestError> {
    build(request).map(|_| ())
}

/// Validates and builds the request ([`build`]) and only then appends
/// `project.setup.requested` under the key of the project's revision.
/// Repeating the same request returns the stored event's id; a different
/// request for a revision already taken is [`RequestError::RevisionTaken`].
pub async fn request_setup(
    publisher: &Publisher,
    request: &SetupRequest,
) -> Result<EventId, RequestError> {
    let event = build(request)?;
    let correlation = event.context.correlation_id.clone();
    let appended = publisher.append(event).await?;
    if !appended.duplicate {
        return Ok(appended.event_id);
    }
    let stored = zopu_runtime::publish::get_event(publisher.bus(), appended.sequence).await?;
    if stored.correlation_id == correlation {
        Ok(stored.id)
    } else {
        Err(RequestError::RevisionTaken {
            revision: request.revision,
            event_id: stored.id,
        })
    }
}

/// Most setup events kept while reading or watching one project.
const SETUP_EVENTS_MAX: usize = 10_000;

/// The setup events of one project currently in the stream, in order.
pub async fn project_setup_events(
    bus: &Bus,
    org: &OrgId,
    project: &ProjectId,
) -> Result<Vec<Envelope>, zopu_runtime::Error> {
    let events = zopu_runtime::log::events(bus, subjects::project_events(org, project)).await?;
    Ok(events
        .into_iter()
        .map(|(_, envelope)| envelope)
        .filter(|envelope| is_setup_event(&envelope.event_type))
        .take(SETUP_EVENTS_MAX)
        .collect())
}

/// The status of a project's latest setup revision, read from the stream.
pub async fn read_setup_status(
    bus: &Bus,
    org: &OrgId,
    project: &ProjectId,
) -> Result<Option<SetupStatus>, zopu_runtime::Error> {
    Ok(status_from_events(
        &project_setup_events(bus, org, project).await?,
    ))
}

/// Every project of `org` that asked for a setup, in the order they were
/// created, with the status of its latest setup revision (which carries the
/// name chosen at creation), read from the stream in one pass over the
/// setup events.
pub async fn org_projects(
    bus: &Bus,
    org: &OrgId,
) -> Result<Vec<(ProjectId, SetupStatus)>, zopu_runtime::Error> {
    let filters = SETUP_EVENT_TYPES
        .iter()
        .map(|event_type| subjects::org_events_of_type(org, event_type))
        .collect();
    let mut projects: Vec<(ProjectId, Vec<Envelope>)> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for logged in zopu_runtime::log::history_of(bus, filters).await? {
        let Ok(envelope) = logged.event else {
            continue;
        };
        let at = *index.entry(envelope.project_id).or_insert_with(|| {
            projects.push((envelope.project_id, Vec::new()));
            projects.len() - 1
        });
        let events = &mut projects[at].1;
        if events.len() < SETUP_EVENTS_MAX {
            events.push(envelope);
        }
    }
    Ok(projects
        .into_iter()
        .filter_map(|(project, events)| Some((project, status_from_events(&events)?)))
        .collect())
}

/// Follows one project's events and reports each change of its setup status.
pub struct StatusWatch {
    reader: Reader,
    events: Vec<Envelope>,
    last: Option<SetupStatus>,
}

impl std::fmt::Debug for StatusWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWatch")
            .field("events", &self.events.len())
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl StatusWatch {
    /// Starts at the project's first event.
    pub async fn start(
        bus: &Bus,
        org: &OrgId,
        project: &ProjectId,
    ) -> Result<Self, zopu_runtime::Error> {
        Ok(Self {
            reader: Reader::open(
                bus,
                subjects::project_events(org, project),
                Start::Beginning,
            )
            .await?,
            events: Vec::new(),
            last: None,
        })
    }

    /// The next status that differs from the last one reported; `None` when
    /// `timeout` passes without a change.
    pub async fn next(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<SetupStatus>, zopu_runtime::Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let next = tokio::time::timeout_at(deadline, self.reader.next()).await;
            let logged = match next {
                Err(_) => return Ok(None),
                Ok(None) => {
                    return Err(zopu_runtime::Error::jetstream(
                        "ordered consumer",
                        "message stream ended",
                    ));
                }
                Ok(Some(logged)) => logged?,
            };
            let Ok(envelope) = logged.event else {
                continue;
            };
            if !is_setup_event(&envelope.event_type) || self.events.len() >= SETUP_EVENTS_MAX {
                continue;
            }
            self.events.push(envelope);
            let status = status_from_events(&self.events);
            if status.is_some() && status != self.last {
                self.last = status.clone();
                return Ok(status);
            }
        }
    }
}
