//! The one builder of every user command: create a project (and retry its
//! setup), send a message, send a card action, flip the kill switch, decide
//! an approval (keyed by the approval, not the request: one decision), cancel
//! a flow (keyed by the flow: one request). The
//! gateway and the CLI both call these functions and append what they return,
//! so a command has one validation, one trimming, one idempotency key and one
//! timeline id whichever client sent it.
//!
//! The scheme:
//! - every command carries the caller's request id (the gateway's
//!   `X-Request-Id`, a new UUIDv7 for a CLI invocation); it becomes the
//!   command's correlation id, which every event the command causes carries;
//! - a setup request is keyed by its project and revision
//!   ([`keys::setup_request`]), so two concurrent retries of one failure store
//!   one request, and a new project's id is derived from (organization,
//!   request id) ([`ProjectId::for_request`]);
//! - every other command is keyed by its project, request id and kind
//!   ([`keys::user_request`]), so repeating a request (an HTTP retry with the
//!   same `X-Request-Id`, a CLI retry inside the publisher) stores it once, and
//!   one organization's request ids never collide with another's;
//! - messages and actions address the project's global timeline
//!   ([`GLOBAL_TIMELINE_ID`], the id setup registers);
//! - free text is trimmed, then checked: not empty where required, at most
//!   its limit of characters, no control characters but newline, tab and
//!   carriage return.
//!
//! Building appends nothing and reads nothing: what the command refers to
//! (the project exists, the artifact has the action) is checked by the caller
//! against its own view before it appends.

use zopu_schema::repository::{BranchName, BranchProblem, LocationProblem, RepositoryLocation};
use zopu_schema::{
    AgentId, ArtifactId, CorrelationId, EventId, FlowRunId, OrgId, ProjectId, keys, pb,
};

use zopu_runtime::NewEvent;

/// The id of a project's one global timeline (`agent.registered.global_timeline_id`).
pub const GLOBAL_TIMELINE_ID: &str = "global";
/// The branch set up when the user names none.
pub const DEFAULT_BRANCH: &str = "main";
/// Longest message text, in characters.
pub const MESSAGE_MAX_CHARS: usize = 8000;
/// Longest kill-switch reason, in characters.
pub const REASON_MAX_CHARS: usize = 500;
/// Longest project name, in characters.
pub const PROJECT_NAME_MAX_CHARS: usize = 100;
/// Longest card action id, in characters.
pub const ACTION_ID_MAX_CHARS: usize = 100;
/// Longest approval id.
pub const APPROVAL_ID_MAX_CHARS: usize = 200;
/// Longest repository connection id, in bytes of printable ASCII.
pub const CONNECTION_ID_MAX_LEN: usize = 128;
/// The name of a project whose repository gives none.
const FALLBACK_PROJECT_NAME: &str = "project";
/// Longest user id (a token's user, the CLI's `--as`).
pub const USER_ID_MAX_LEN: usize = 64;

/// Whether `user` is a user id: 1 to [`USER_ID_MAX_LEN`] letters, digits,
/// `.`, `_`, `@` or `-`. Every recorded author (a token's user, the CLI's
/// operator) is one.
pub fn is_valid_user_id(user: &str) -> bool {
    !user.is_empty()
        && user.len() <= USER_ID_MAX_LEN
        && user
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._@-".contains(c))
}

/// Why a command was not built. Never echoes the rejected input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("{field} must not be empty")]
    Empty { field: &'static str },
    #[error("{field} must be at most {max_chars} characters")]
    TooLong {
        field: &'static str,
        max_chars: usize,
    },
    #[error("{field} contains control characters")]
    ControlCharacters { field: &'static str },
    #[error("{0}")]
    Repository(LocationProblem),
    #[error("{0}")]
    Branch(BranchProblem),
    #[error("setup revision must be 1 or more")]
    Revision,
    #[error(
        "repository connection id must be at most {CONNECTION_ID_MAX_LEN} printable ASCII characters without spaces"
    )]
    ConnectionId,
    #[error("reply_to_event_id is not an event id")]
    ReplyTo,
    #[error("artifact_id is not an artifact id")]
    ArtifactId,
    #[error("agents cannot send user commands")]
    AgentAuthor,
    #[error("name is not an environment variable name (a letter or _, then letters, digits or _)")]
    EnvironmentName,
}

impl Invalid {
    /// The request field the problem is in.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Empty { field }
            | Self::TooLong { field, .. }
            | Self::ControlCharacters { field } => field,
            Self::Repository(_) => "repository",
            Self::Branch(_) => "branch",
            Self::Revision => "setup_revision",
            Self::ConnectionId => "repository_connection_id",
            Self::ReplyTo => "reply_to_event_id",
            Self::ArtifactId => "artifact_id",
            Self::AgentAuthor => "author",
            Self::EnvironmentName => "name",
        }
    }
}

/// Who sends a command, under which request id.
#[derive(Debug, Clone)]
pub struct Requester {
    pub org: OrgId,
    /// The caller's request id: the correlation id of everything the command causes.
    pub request_id: CorrelationId,
    pub author: pb::Actor,
}

impl Requester {
    pub fn new(org: OrgId, request_id: CorrelationId, author: pb::Actor) -> Self {
        Self {
            org,
            request_id,
            author,
        }
    }

    /// A user (`kind: user`) named `user`.
    pub fn user(org: OrgId, request_id: CorrelationId, user: &str) -> Self {
        let author = pb::Actor {
            kind: pb::actor::Kind::User as i32,
            id: user.to_owned(),
        };
        Self::new(org, request_id, author)
    }

    fn root<E: zopu_schema::Event>(
        &self,
        project: ProjectId,
        payload: &E,
        key: String,
    ) -> Result<NewEvent, Invalid> {
        if self.author.kind() == pb::actor::Kind::Agent {
            return Err(Invalid::AgentAuthor);
        }
        Ok(NewEvent::root(
            self.org.clone(),
            project,
            payload,
            key,
            Some(self.request_id.clone()),
        ))
    }

    /// The key of a command that is not a setup request.
    fn key(&self, project: &ProjectId, what: &str) -> String {
        keys::user_request(project, &self.request_id, what)
    }
}

/// What a project is set up from, as the user gave it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProjectSetup {
    /// An `https://` URL without credentials, or (when allowed) an absolute local path.
    pub repository: String,
    /// Default: [`DEFAULT_BRANCH`].
    pub branch: Option<String>,
    /// Default: the repository's last path segment.
    pub name: Option<String>,
    /// Opaque id of a credential in the setup service's credential store; empty: none.
    pub repository_connection_id: String,
}

impl ProjectSetup {
    pub fn new(repository: &str) -> Self {
        Self {
            repository: repository.to_owned(),
            ..Self::default()
        }
    }

    pub fn branch(mut self, branch: &str) -> Self {
        self.branch = Some(branch.to_owned());
        self
    }

    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }
}

/// `project.setup.requested`, revision 1, for a new project whose id is
/// derived from (organization, request id): repeating the request names the
/// same project.
pub fn create_project(
    requester: &Requester,
    setup: &ProjectSetup,
    allow_local_repositories: bool,
) -> Result<NewEvent, Invalid> {
    let project = ProjectId::for_request(&requester.org, &requester.request_id);
    request_setup(requester, project, setup, 1, allow_local_repositories)
}

/// `project.setup.requested` for `revision` of `project` (1: its first
/// setup; a retry: the latest revision + 1), keyed by project and revision.
/// The repository is stored as the setup service will read it (the URL
/// normalized, a local path canonical).
pub fn request_setup(
    requester: &Requester,
    project: ProjectId,
    setup: &ProjectSetup,
    revision: u32,
    allow_local_repositories: bool,
) -> Result<NewEvent, Invalid> {
    let repository = repository(&setup.repository, allow_local_repositories)?;
    let branch = branch(setup.branch.as_deref().unwrap_or(DEFAULT_BRANCH))?;
    let name = match &setup.name {
        Some(name) => text("name", name, PROJECT_NAME_MAX_CHARS, true)?,
        None => default_project_name(&repository),
    };
    if revision == 0 {
        return Err(Invalid::Revision);
    }
    let connection = &setup.repository_connection_id;
    let connection_ok = connection.len() <= CONNECTION_ID_MAX_LEN
        && connection.bytes().all(|b| b.is_ascii_graphic());
    if !connection_ok {
        return Err(Invalid::ConnectionId);
    }
    let payload = pb::ProjectSetupRequested {
        repository_url: repository,
        branch,
        setup_revision: revision,
        project_name: name,
        requested_by: Some(requester.author.clone()),
        repository_connection_id: connection.clone(),
    };
    requester.root(project, &payload, keys::setup_request(&project, revision))
}

/// `timeline.message.sent` on the project's global timeline.
pub fn send_message(
    requester: &Requester,
    project: ProjectId,
    message: &str,
    reply_to_event_id: Option<&str>,
) -> Result<NewEvent, Invalid> {
    let message = text("text", message, MESSAGE_MAX_CHARS, true)?;
    let reply_to_event_id = match reply_to_event_id {
        Some(id) => id
            .parse::<EventId>()
            .map_err(|_| Invalid::ReplyTo)?
            .to_string(),
        None => String::new(),
    };
    let payload = pb::TimelineMessageSent {
        timeline_id: GLOBAL_TIMELINE_ID.to_owned(),
        text: message,
        author: Some(requester.author.clone()),
        reply_to_event_id,
    };
    requester.root(project, &payload, requester.key(&project, "message"))
}

/// `timeline.action.sent`: a click on the action `action_id` of the card of
/// `artifact_id` (the caller checks the card has it).
pub fn send_action(
    requester: &Requester,
    project: ProjectId,
    artifact_id: &str,
    action_id: &str,
) -> Result<NewEvent, Invalid> {
    let artifact_id = artifact_id
        .parse::<ArtifactId>()
        .map_err(|_| Invalid::ArtifactId)?;
    let action_id = text("action_id", action_id, ACTION_ID_MAX_CHARS, true)?;
    let payload = pb::TimelineActionSent {
        timeline_id: GLOBAL_TIMELINE_ID.to_owned(),
        action_id,
        artifact_id: artifact_id.to_string(),
        author: Some(requester.author.clone()),
    };
    requester.root(project, &payload, requester.key(&project, "action"))
}

/// The kill switch: `agent.disabled` for the project's conversation agent,
/// which takes no new dispatch until [`enable_agent`]; running specialist
/// flows halt at their next step.
pub fn disable_agent(
    requester: &Requester,
    project: ProjectId,
    reason: &str,
) -> Result<NewEvent, Invalid> {
    let reason = text("reason", reason, REASON_MAX_CHARS, false)?;
    let payload = pb::AgentDisabled {
        agent_id: AgentId::conversation(&requester.org, &project).to_string(),
        reason,
        by: Some(requester.author.clone()),
    };
    let key = requester.key(&project, <pb::AgentDisabled as zopu_schema::Event>::TYPE);
    requester.root(project, &payload, key)
}

/// How a reviewer decides an approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Reject { reason: String },
}

/// A reviewer's decision on an approval the project's agent requested:
/// `approval.granted` or `approval.denied`, by the requester's author, under
/// the approval's one decision key ([`keys::approval_decision`]), so only
/// the first decision is ever stored.
pub fn decide_approval(
    requester: &Requester,
    project: ProjectId,
    approval_id: &str,
    decision: &Decision,
) -> Result<NewEvent, Invalid> {
    let approval_id = text("approval_id", approval_id, APPROVAL_ID_MAX_CHARS, true)?;
    let key = keys::approval_decision(&project, &approval_id);
    let by = Some(requester.author.clone());
    match decision {
        Decision::Approve => requester.root(project, &pb::ApprovalGranted { approval_id, by }, key),
        Decision::Reject { reason } => {
            let reason = text("reason", reason, REASON_MAX_CHARS, false)?;
            let denied = pb::ApprovalDenied {
                approval_id,
                by,
                reason,
            };
            requester.root(project, &denied, key)
        }
    }
}

/// A user's request that a running flow stop: `flow.cancel.requested`,
/// under the flow's one cancel key ([`keys::flow_cancel`]), so a retried,
/// repeated or concurrent cancel stores one request. The flow run id is also
/// the event's `flowrunid`.
pub fn cancel_flow(
    requester: &Requester,
    project: ProjectId,
    flow_run: FlowRunId,
    reason: &str,
) -> Result<NewEvent, Invalid> {
    let reason = text("reason", reason, REASON_MAX_CHARS, false)?;
    let payload = pb::FlowCancelRequested {
        flow_run_id: flow_run.to_string(),
        reason,
        by: Some(requester.author.clone()),
    };
    Ok(requester
        .root(project, &payload, keys::flow_cancel(&flow_run))?
        .with_flow_run(flow_run))
}

/// The record of a value the caller stored in the secret store for one of
/// the project's environment names: `project.environment.value.set` with the
/// name, the store's version and the keyed fingerprint — never the value.
/// Keyed by the write ([`keys::environment_value`]).
pub fn record_environment_value(
    requester: &Requester,
    project: ProjectId,
    name: &str,
    stored: &crate::secret_store::Stored,
) -> Result<NewEvent, Invalid> {
    crate::secret_store::check_name(name).map_err(|_| Invalid::EnvironmentName)?;
    let payload = pb::ProjectEnvironmentValueSet {
        name: name.to_owned(),
        version: stored.version,
        fingerprint: stored.fingerprint.clone(),
        by: Some(requester.author.clone()),
    };
    let key = keys::environment_value(&project, name, stored.version);
    requester.root(project, &payload, key)
}

/// The record of an environment value the caller removed:
/// `project.environment.value.deleted`, keyed by the request.
pub fn record_environment_deletion(
    requester: &Requester,
    project: ProjectId,
    name: &str,
) -> Result<NewEvent, Invalid> {
    crate::secret_store::check_name(name).map_err(|_| Invalid::EnvironmentName)?;
    let payload = pb::ProjectEnvironmentValueDeleted {
        name: name.to_owned(),
        by: Some(requester.author.clone()),
    };
    let key = requester.key(&project, &format!("environment.delete:{name}"));
    requester.root(project, &payload, key)
}

/// Turns the kill switch off again: `agent.enabled`.
pub fn enable_agent(requester: &Requester, project: ProjectId) -> Result<NewEvent, Invalid> {
    let payload = pb::AgentEnabled {
        agent_id: AgentId::conversation(&requester.org, &project).to_string(),
        by: Some(requester.author.clone()),
    };
    let key = requester.key(&project, <pb::AgentEnabled as zopu_schema::Event>::TYPE);
    requester.root(project, &payload, key)
}

/// The repository as stored: the parsed location's URL, or a local repository's canonical path.
fn repository(input: &str, allow_local_repositories: bool) -> Result<String, Invalid> {
    match RepositoryLocation::parse(input, allow_local_repositories).map_err(Invalid::Repository)? {
        RepositoryLocation::Https { url, .. } => Ok(url),
        RepositoryLocation::Local { path, .. } => Ok(path.display().to_string()),
    }
}

fn branch(input: &str) -> Result<String, Invalid> {
    Ok(BranchName::parse(input)
        .map_err(Invalid::Branch)?
        .as_str()
        .to_owned())
}

/// A project's name when the user gives none: the repository's last path
/// segment without `.git`, at most [`PROJECT_NAME_MAX_CHARS`] characters.
pub fn default_project_name(repository: &str) -> String {
    let last = repository
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .map(|last| last.trim_end_matches(".git"))
        .unwrap_or_default();
    let name: String = last.chars().take(PROJECT_NAME_MAX_CHARS).collect();
    if name.is_empty() {
        FALLBACK_PROJECT_NAME.to_owned()
    } else {
        name
    }
}

/// Free text as stored: trimmed, then checked against its limit.
fn text(
    field: &'static str,
    value: &str,
    max_chars: usize,
    required: bool,
) -> Result<String, Invalid> {
    let trimmed = value.trim();
    if required && trimmed.is_empty() {
        return Err(Invalid::Empty { field });
    }
    if trimmed.chars().count() > max_chars {
        return Err(Invalid::TooLong { field, max_chars });
    }
    if trimmed
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r'))
    {
        return Err(Invalid::ControlCharacters { field });
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use zopu_schema::Event;

    fn requester(request: &str) -> Requester {
        Requester::user("acme".parse().unwrap(), request.parse().unwrap(), "ada")
    }

    fn decode<E: Event + Default>(event: &NewEvent) -> E {
        E::decode(event.data.clone()).unwrap()
    }

    #[test]
    fn every_cancel_of_a_flow_shares_its_one_key_and_names_the_flow() {
        let project = ProjectId::new();
        let flow = FlowRunId::new();
        let first = cancel_flow(&requester("r1"), project, flow, " Too slow. ").unwrap();
        let again = cancel_flow(&requester("r2"), project, flow, "").unwrap();
        assert_eq!(first.idempotency_key, again.idempotency_key);
        assert_eq!(first.idempotency_key, format!("flow:{flow}:cancel"));
        assert_eq!(first.context.flow_run_id, Some(flow));
        let request: pb::FlowCancelRequested = decode(&first);
        assert_eq!(request.flow_run_id, flow.to_string());
        assert_eq!(request.reason, "Too slow.");
        assert_eq!(request.by.unwrap().id, "ada");
        assert!(matches!(
            cancel_flow(&requester("r3"), project, flow, &"x".repeat(501)),
            Err(Invalid::TooLong {
                field: "reason",
                ..
            })
        ));
    }

    #[test]
    fn both_decisions_on_an_approval_share_one_key_whoever_sends_them() {
        let project = ProjectId::new();
        let approve = decide_approval(
            &requester("r1"),
            project,
            " approval:f:issue.publish ",
            &Decision::Approve,
        )
        .unwrap();
        let reject = Decision::Reject {
            reason: "Not now.".into(),
        };
        let denied = decide_approval(
            &requester("r2"),
            project,
            "approval:f:issue.publish",
            &reject,
        )
        .unwrap();
        assert_eq!(approve.idempotency_key, denied.idempotency_key);
        assert_eq!(
            approve.idempotency_key,
            format!("project:{project}:approval:approval:f:issue.publish:decision")
        );
        let granted: pb::ApprovalGranted = decode(&approve);
        assert_eq!(
            (
                granted.approval_id.as_str(),
                granted.by.unwrap().id.as_str()
            ),
            ("approval:f:issue.publish", "ada")
        );
        assert_eq!(decode::<pb::ApprovalDenied>(&denied).reason, "Not now.");
        assert!(matches!(
            decide_approval(&requester("r3"), project, "  ", &Decision::Approve),
            Err(Invalid::Empty {
                field: "approval_id"
            })
        ));
        let long = Decision::Reject {
            reason: "x".repeat(REASON_MAX_CHARS + 1),
        };
        assert!(matches!(
            decide_approval(&requester("r4"), project, "a", &long),
            Err(Invalid::TooLong {
                field: "reason",
                ..
            })
        ));
    }

    #[test]
    fn a_message_is_trimmed_keyed_by_project_and_request_and_on_the_global_timeline() {
        let project = ProjectId::new();
        let event =
            send_message(&requester("req-1"), project, "  How does it work?\n", None).unwrap();
        let message: pb::TimelineMessageSent = decode(&event);
        assert_eq!(message.text, "How does it work?");
        assert_eq!(message.timeline_id, GLOBAL_TIMELINE_ID);
        assert_eq!(message.author.unwrap().id, "ada");
        assert_eq!(
            event.idempotency_key,
            format!("project:{project}:request:req-1:message")
        );
        assert_eq!(event.context.correlation_id.as_str(), "req-1");
        assert_eq!(event.context.project_id, project);
        // The same request builds the same key (a retry stores once); another request another.
        let again = send_message(&requester("req-1"), project, "How does it work?", None).unwrap();
        assert_eq!(again.idempotency_key, event.idempotency_key);
        let other = send_message(&requester("req-2"), project, "How does it work?", None).unwrap();
        assert_ne!(other.idempotency_key, event.idempotency_key);
    }

    #[test]
    fn message_text_is_checked_after_trimming() {
        let project = ProjectId::new();
        let send = |text: &str| send_message(&requester("r"), project, text, None);
        assert_eq!(
            send(" \n\t ").unwrap_err(),
            Invalid::Empty { field: "text" }
        );
        let longest = "x".repeat(MESSAGE_MAX_CHARS);
        assert!(send(&format!("  {longest}  ")).is_ok());
        assert_eq!(
            send(&format!("{longest}x")).unwrap_err(),
            Invalid::TooLong {
                field: "text",
                max_chars: MESSAGE_MAX_CHARS
            }
        );
        assert_eq!(
            send("a\u{7}b").unwrap_err(),
            Invalid::ControlCharacters { field: "text" }
        );
        assert!(send("line one\nline two\ttab\r\n").is_ok());
        let error = send_message(&requester("r"), project, "hi", Some("not-an-id")).unwrap_err();
        assert_eq!(
            (error.field(), error),
            ("reply_to_event_id", Invalid::ReplyTo)
        );
        let reply_to = EventId::new().to_string();
        let event = send_message(&requester("r"), project, "hi", Some(&reply_to)).unwrap();
        assert_eq!(
            decode::<pb::TimelineMessageSent>(&event).reply_to_event_id,
            reply_to
        );
    }

    #[test]
    fn agents_cannot_send_user_commands() {
        let mut agent = requester("r");
        agent.author.kind = pb::actor::Kind::Agent as i32;
        let project = ProjectId::new();
        assert_eq!(
            send_message(&agent, project, "hi", None).unwrap_err(),
            Invalid::AgentAuthor
        );
        assert_eq!(
            disable_agent(&agent, project, "").unwrap_err(),
            Invalid::AgentAuthor
        );
    }

    #[test]
    fn a_new_project_is_named_by_its_request_and_keyed_by_its_revision() {
        let requester = requester("req-create-1");
        let setup = ProjectSetup::new("https://Example.com/acme/shop.git");
        let event = create_project(&requester, &setup, false).unwrap();
        let project = ProjectId::for_request(&requester.org, &requester.request_id);
        assert_eq!(event.context.project_id, project);
        assert_eq!(event.idempotency_key, keys::setup_request(&project, 1));
        assert_eq!(event.context.correlation_id.as_str(), "req-create-1");
        let request: pb::ProjectSetupRequested = decode(&event);
        assert_eq!(request.repository_url, "https://example.com/acme/shop.git");
        assert_eq!(
            (
                request.branch.as_str(),
                request.project_name.as_str(),
                request.setup_revision
            ),
            (DEFAULT_BRANCH, "shop", 1)
        );
        // A retry of the same request names the same project and key.
        let again = create_project(&requester, &setup, false).unwrap();
        assert_eq!(
            (again.context.project_id, again.idempotency_key),
            (project, event.idempotency_key)
        );
    }

    #[test]
    fn setup_errors_name_their_field() {
        let requester = requester("r");
        let project = ProjectId::new();
        let build = |setup: ProjectSetup, revision| {
            request_setup(&requester, project, &setup, revision, false)
        };
        let error = build(ProjectSetup::new("ext::sh -c x"), 1).unwrap_err();
        assert_eq!(error.field(), "repository");
        let error = build(ProjectSetup::new("/srv/repo"), 1).unwrap_err();
        assert_eq!(error, Invalid::Repository(LocationProblem::LocalNotAllowed));
        let error = build(
            ProjectSetup::new("https://example.com/a/b.git").branch("-x"),
            1,
        )
        .unwrap_err();
        assert_eq!(error.field(), "branch");
        let error = build(
            ProjectSetup::new("https://example.com/a/b.git").name("  "),
            1,
        )
        .unwrap_err();
        assert_eq!(error, Invalid::Empty { field: "name" });
        let error = build(ProjectSetup::new("https://example.com/a/b.git"), 0).unwrap_err();
        assert_eq!(error, Invalid::Revision);
        let mut with_connection = ProjectSetup::new("https://example.com/a/b.git");
        with_connection.repository_connection_id = "has space".into();
        assert_eq!(
            build(with_connection, 1).unwrap_err(),
            Invalid::ConnectionId
        );
        let named = build(
            ProjectSetup::new("https://example.com/a/b.git").name(" Shop "),
            2,
        )
        .unwrap();
        let request: pb::ProjectSetupRequested = decode(&named);
        assert_eq!(
            (request.project_name.as_str(), request.setup_revision),
            ("Shop", 2)
        );
        assert_eq!(named.idempotency_key, keys::setup_request(&project, 2));
    }

    #[test]
    fn default_names_come_from_the_last_path_segment() {
        assert_eq!(
            default_project_name("https://example.com/a/shop.git"),
            "shop"
        );
        assert_eq!(default_project_name("/srv/repos/shop/"), "shop");
        assert_eq!(default_project_name("https://example.com/"), "example.com");
        assert_eq!(default_project_name("/"), FALLBACK_PROJECT_NAME);
        let long = format!("/srv/{}", "n".repeat(300));
        assert_eq!(
            default_project_name(&long).chars().count(),
            PROJECT_NAME_MAX_CHARS
        );
    }

    #[test]
    fn kill_switch_and_actions_are_keyed_by_request_and_kind() {
        let requester = requester("req-9");
        let project = ProjectId::new();
        let disabled = disable_agent(&requester, project, "  maintenance ").unwrap();
        let payload: pb::AgentDisabled = decode(&disabled);
        assert_eq!(payload.reason, "maintenance");
        assert_eq!(
            payload.agent_id,
            AgentId::conversation(&requester.org, &project).to_string()
        );
        assert_eq!(
            disabled.idempotency_key,
            format!("project:{project}:request:req-9:agent.disabled")
        );
        let enabled = enable_agent(&requester, project).unwrap();
        assert_eq!(
            enabled.idempotency_key,
            format!("project:{project}:request:req-9:agent.enabled")
        );
        let error =
            disable_agent(&requester, project, &"r".repeat(REASON_MAX_CHARS + 1)).unwrap_err();
        assert_eq!(error.field(), "reason");
        let artifact = zopu_schema::ArtifactId::new().to_string();
        let action = send_action(&requester, project, &artifact, " approve ").unwrap();
        let payload: pb::TimelineActionSent = decode(&action);
        assert_eq!(
            (payload.action_id.as_str(), payload.timeline_id.as_str()),
            ("approve", GLOBAL_TIMELINE_ID)
        );
        assert_eq!(
            action.idempotency_key,
            format!("project:{project}:request:req-9:action")
        );
        assert_eq!(
            send_action(&requester, project, "nope", "approve").unwrap_err(),
            Invalid::ArtifactId
        );
    }
}
