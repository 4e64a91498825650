//! The gateway's read side: one projection (projects, setup status, timeline
//! items, works, threads, flows, artifacts, summaries, agent state) rebuilt
//! from the stream, and the queries the API serves from it.
//!
//! Invariants: every row carries the organization it belongs to and every
//! query filters on it, so a caller scoped to one organization never reads
//! another's rows. A timeline item's id is the stream sequence of the event
//! it shows, so "items after N" is gapless and duplicate-free.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction, params};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use zopu_schema::envelope::format_time;
use zopu_schema::{Envelope, Event, OrgId, ProjectId, pb};

/// Bump to rebuild the projection (tables are dropped and the stream replayed).
const SCHEMA_VERSION: u32 = 1;

const TABLES: &[&str] = &[
    "gw_projects",
    "gw_timeline",
    "gw_works",
    "gw_threads",
    "gw_flows",
    "gw_artifacts",
    "gw_summaries",
];

const SCHEMA: &str = "
CREATE TABLE gw_projects (
    project_id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    name TEXT NOT NULL,
    repository_url TEXT NOT NULL,
    branch TEXT NOT NULL,
    setup_revision INTEGER NOT NULL,
    state TEXT NOT NULL,
    failed_step TEXT,
    failure_code TEXT,
    failure_message TEXT,
    failure_retryable INTEGER,
    repository_commit TEXT,
    environment_names TEXT NOT NULL DEFAULT '[]',
    agent_id TEXT,
    agent_enabled INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL,
    correlation_id TEXT NOT NULL,
    updated_sequence INTEGER NOT NULL
);
CREATE INDEX gw_projects_org ON gw_projects (org, created_at);
CREATE INDEX gw_projects_request ON gw_projects (org, correlation_id);
CREATE TABLE gw_timeline (
    sequence INTEGER PRIMARY KEY,
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    work_id TEXT,
    item TEXT NOT NULL
);
CREATE INDEX gw_timeline_project ON gw_timeline (project_id, sequence);
CREATE INDEX gw_timeline_work ON gw_timeline (work_id, sequence) WHERE work_id IS NOT NULL;
CREATE TABLE gw_works (
    work_id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    title TEXT NOT NULL,
    summary TEXT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE gw_threads (
    thread_id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    work_id TEXT,
    title TEXT NOT NULL,
    flow_type TEXT NOT NULL,
    status TEXT NOT NULL,
    summary TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX gw_threads_work ON gw_threads (work_id);
CREATE TABLE gw_flows (
    flow_run_id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    state TEXT NOT NULL
);
CREATE INDEX gw_flows_project ON gw_flows (project_id, state);
CREATE TABLE gw_artifacts (
    artifact_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    work_id TEXT,
    view TEXT NOT NULL,
    bucket TEXT NOT NULL,
    object_name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    content_type TEXT NOT NULL,
    superseded_by INTEGER,
    PRIMARY KEY (artifact_id, revision)
);
CREATE TABLE gw_summaries (
    project_id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    document_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    title TEXT NOT NULL,
    content_type TEXT NOT NULL,
    body TEXT NOT NULL,
    blob TEXT,
    repository_commit TEXT NOT NULL,
    sequence INTEGER NOT NULL
);
";

/// The thin setup state progression shown to users (spec section 68).
pub mod setup_state {
    pub const CREATING_WORKSPACE: &str = "creating_workspace";
    pub const CLONING: &str = "cloning";
    pub const CHECKING: &str = "checking";
    pub const READY: &str = "ready";
    pub const FAILED: &str = "failed";
}

/// A failure as users see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Failure {
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

impl From<&pb::FailureReason> for Failure {
    fn from(reason: &pb::FailureReason) -> Self {
        Self {
            code: reason.code.clone(),
            message: reason.message.clone(),
            retryable: reason.retryable,
        }
    }
}

/// Setup status of a project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SetupStatus {
    /// `creating_workspace`, `cloning`, `checking`, `ready` or `failed`.
    pub state: String,
    pub revision: u32,
    /// The step that failed, when `state` is `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// Names from the repository's `.env.example` (optional configuration).
    pub environment_names: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repository_commit: Option<String>,
}

/// A project as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProjectView {
    pub project_id: String,
    pub name: String,
    pub repository: String,
    pub branch: String,
    pub created_at: String,
    pub setup: SetupStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    pub agent_enabled: bool,
    /// True while a specialist flow runs (the subtle running indicator).
    pub running: bool,
}

/// A Work: a durable responsibility on the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkView {
    pub work_id: String,
    pub project_id: String,
    pub title: String,
    pub summary: String,
    /// `explore`, `issue`, `onboarding`.
    pub kind: String,
    /// `open`, `working`, `blocked`, `waiting`, `done`, `failed`, `cancelled`.
    pub status: String,
    pub created_at: String,
    pub updated_at: String,
}

/// A Thread beneath a Work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ThreadView {
    pub thread_id: String,
    pub work_id: Option<String>,
    pub title: String,
    pub flow_type: String,
    pub status: String,
    pub summary: String,
    pub created_at: String,
}

/// One fact on an artifact card.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CardFactView {
    pub label: String,
    pub value: String,
}

/// One action on an artifact card.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CardActionView {
    pub id: String,
    pub label: String,
    pub style: String,
}

/// An artifact card on the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactView {
    pub artifact_id: String,
    pub revision: u32,
    /// `project_setup`, `exploration`, `issue`.
    pub kind: String,
    pub title: String,
    pub summary: String,
    pub label: String,
    pub facts: Vec<CardFactView>,
    pub actions: Vec<CardActionView>,
    pub provider: String,
    /// Where the HTML is served (needs the bearer token or a signed link).
    pub href: String,
}

/// A Work as a card on the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkRef {
    pub work_id: String,
    pub title: String,
    pub kind: String,
    pub status: String,
    pub summary: String,
}

/// A specialist flow's state (the running indicator).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FlowRef {
    pub flow_run_id: String,
    /// `onboarding_explore`, `explore`, `issue`.
    pub flow_type: String,
    /// `requested`, `running`, `progress`, `completed`, `failed`, `cancelled`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A card action a user sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ActionRef {
    pub action_id: String,
    pub artifact_id: String,
}

/// What a timeline item shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    UserMessage,
    UserAction,
    Acknowledgement,
    AgentMessage,
    AgentBlocked,
    AgentFinal,
    AgentState,
    Work,
    WorkUpdated,
    Flow,
    Artifact,
    Setup,
}

/// One item of a timeline. `sequence` is the stream sequence of the event
/// it shows: the SSE `id:` and the `after` cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TimelineItem {
    pub sequence: u64,
    pub kind: ItemKind,
    pub event_id: String,
    pub event_type: String,
    pub time: String,
    pub project_id: String,
    pub correlation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_event_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifact_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<WorkRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<ArtifactView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<ActionRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<SetupStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}

impl TimelineItem {
    fn new(kind: ItemKind, event: &Envelope, sequence: u64) -> Self {
        Self {
            sequence,
            kind,
            event_id: event.id.to_string(),
            event_type: event.event_type.clone(),
            time: format_time(event.time),
            project_id: event.project_id.to_string(),
            correlation_id: event.correlation_id.to_string(),
            work_id: event.work_id.map(|id| id.to_string()),
            thread_id: event.thread_id.map(|id| id.to_string()),
            text: None,
            author: None,
            reply_to_event_id: None,
            status: None,
            provider: None,
            artifact_ids: Vec::new(),
            work: None,
            flow: None,
            artifact: None,
            action: None,
            setup: None,
            failure: None,
        }
    }
}

/// Where a stored artifact revision lives, for serving it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactRecord {
    pub artifact_id: String,
    pub revision: u32,
    pub project_id: String,
    pub bucket: String,
    pub object_name: String,
    pub sha256: String,
    pub size_bytes: u64,
    pub content_type: String,
}

/// The current project summary document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SummaryView {
    pub document_id: String,
    pub revision: u32,
    pub title: String,
    pub content_type: String,
    pub body: String,
    pub repository_commit: String,
}

/// The stored summary row; the body may live in a blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryRecord {
    pub view: SummaryView,
    pub blob: Option<pb::BlobRef>,
}

fn empty_to_none(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

fn flow_type_name(value: i32) -> String {
    match pb::FlowType::try_from(value) {
        Ok(pb::FlowType::OnboardingExplore) => "onboarding_explore",
        Ok(pb::FlowType::Explore) => "explore",
        Ok(pb::FlowType::Issue) => "issue",
        _ => "unspecified",
    }
    .to_owned()
}

fn artifact_kind_name(value: i32) -> String {
    match pb::ArtifactKind::try_from(value) {
        Ok(pb::ArtifactKind::ProjectSetup) => "project_setup",
        Ok(pb::ArtifactKind::Exploration) => "exploration",
        Ok(pb::ArtifactKind::Issue) => "issue",
        _ => "unspecified",
    }
    .to_owned()
}

/// The API path of an artifact revision.
pub fn artifact_href(artifact_id: &str, revision: u32) -> String {
    format!("/v1/artifacts/{artifact_id}?revision={revision}")
}

/// The card view of a published artifact (pure).
pub fn artifact_view(published: &pb::ArtifactPublished) -> ArtifactView {
    let card = published.card.clone().unwrap_or_default();
    ArtifactView {
        artifact_id: published.artifact_id.clone(),
        revision: published.revision,
        kind: artifact_kind_name(published.kind),
        title: published.title.clone(),
        summary: published.summary.clone(),
        label: if card.label.is_empty() {
            published.title.clone()
        } else {
            card.label
        },
        facts: card
            .facts
            .into_iter()
            .map(|fact| CardFactView {
                label: fact.label,
                value: fact.value,
            })
            .collect(),
        actions: card
            .actions
            .into_iter()
            .map(|action| CardActionView {
                id: action.id,
                label: action.label,
                style: action.style,
            })
            .collect(),
        provider: published.provider.clone(),
        href: artifact_href(&published.artifact_id, published.revision),
    }
}

/// The timeline item an event shows, if any (pure; state lookups such as a
/// Work's title are passed in by the caller).
pub fn timeline_item(
    event: &Envelope,
    sequence: u64,
    work_title: Option<&WorkRef>,
) -> Option<TimelineItem> {
    use ItemKind as K;
    let item = |kind| TimelineItem::new(kind, event, sequence);
    match event.event_type.as_str() {
        t if t == pb::TimelineMessageSent::TYPE => event
            .decode::<pb::TimelineMessageSent>()
            .ok()
            .map(|m| TimelineItem {
                text: Some(m.text),
                author: m.author.map(|a| a.id),
                reply_to_event_id: empty_to_none(&m.reply_to_event_id),
                ..item(K::UserMessage)
            }),
        t if t == pb::TimelineActionSent::TYPE => event
            .decode::<pb::TimelineActionSent>()
            .ok()
            .map(|m| TimelineItem {
                author: m.author.map(|a| a.id),
                action: Some(ActionRef {
                    action_id: m.action_id,
                    artifact_id: m.artifact_id,
                }),
                ..item(K::UserAction)
            }),
        t if t == pb::AgentAcknowledged::TYPE => {
            event
                .decode::<pb::AgentAcknowledged>()
                .ok()
                .map(|m| TimelineItem {
                    text: Some(m.text),
                    author: Some(m.agent_id),
                    reply_to_event_id: empty_to_none(&m.reply_to_event_id),
                    provider: empty_to_none(&m.provider),
                    ..item(K::Acknowledgement)
                })
        }
        t if t == pb::AgentMessage::TYPE => {
            event
                .decode::<pb::AgentMessage>()
                .ok()
                .map(|m| TimelineItem {
                    text: Some(m.text),
                    author: Some(m.agent_id),
                    reply_to_event_id: empty_to_none(&m.reply_to_event_id),
                    status: empty_to_none(&m.status),
                    provider: empty_to_none(&m.provider),
                    ..item(K::AgentMessage)
                })
        }
        t if t == pb::AgentBlocked::TYPE => {
            event
                .decode::<pb::AgentBlocked>()
                .ok()
                .map(|m| TimelineItem {
                    text: Some(m.question),
                    author: Some(m.agent_id),
                    reply_to_event_id: empty_to_none(&m.reply_to_event_id),
                    status: Some("blocked".into()),
                    ..item(K::AgentBlocked)
                })
        }
        t if t == pb::AgentFinal::TYPE => {
            event.decode::<pb::AgentFinal>().ok().map(|m| TimelineItem {
                text: Some(m.text),
                author: Some(m.agent_id),
                reply_to_event_id: empty_to_none(&m.reply_to_event_id),
                artifact_ids: m.artifact_ids,
                failure: m.failure.as_ref().map(Failure::from),
                ..item(K::AgentFinal)
            })
        }
        t if t == pb::AgentDisabled::TYPE => {
            event
                .decode::<pb::AgentDisabled>()
                .ok()
                .map(|m| TimelineItem {
                    text: empty_to_none(&m.reason),
                    author: m.by.map(|a| a.id),
                    status: Some("disabled".into()),
                    ..item(K::AgentState)
                })
        }
        t if t == pb::AgentEnabled::TYPE => {
            event
                .decode::<pb::AgentEnabled>()
                .ok()
                .map(|m| TimelineItem {
                    author: m.by.map(|a| a.id),
                    status: Some("enabled".into()),
                    ..item(K::AgentState)
                })
        }
        t if t == pb::WorkCreated::TYPE => {
            let work_id = event.work_id?;
            event
                .decode::<pb::WorkCreated>()
                .ok()
                .map(|m| TimelineItem {
                    work: Some(WorkRef {
                        work_id: work_id.to_string(),
                        title: m.title,
                        kind: m.kind,
                        status: "open".into(),
                        summary: m.summary,
                    }),
                    ..item(K::Work)
                })
        }
        t if t == pb::WorkUpdated::TYPE => {
            let work_id = event.work_id?;
            event.decode::<pb::WorkUpdated>().ok().map(|m| {
                let base = work_title.cloned().unwrap_or(WorkRef {
                    work_id: work_id.to_string(),
                    title: String::new(),
                    kind: String::new(),
                    status: String::new(),
                    summary: String::new(),
                });
                TimelineItem {
                    status: Some(m.status.clone()),
                    work: Some(WorkRef {
                        status: m.status,
                        summary: if m.summary.is_empty() {
                            base.summary.clone()
                        } else {
                            m.summary
                        },
                        ..base
                    }),
                    ..item(K::WorkUpdated)
                }
            })
        }
        t if t == pb::FlowRequested::TYPE => event.decode::<pb::FlowRequested>().ok().map(|m| {
            flow_item(
                item(K::Flow),
                event,
                flow_type_name(m.flow_type),
                "requested",
                None,
            )
        }),
        t if t == pb::FlowStarted::TYPE => event.decode::<pb::FlowStarted>().ok().map(|m| {
            flow_item(
                item(K::Flow),
                event,
                flow_type_name(m.flow_type),
                "running",
                None,
            )
        }),
        t if t == pb::FlowProgress::TYPE => {
            let m = event.decode::<pb::FlowProgress>().ok()?;
            (m.visible && !m.note.is_empty()).then(|| {
                flow_item(
                    item(K::Flow),
                    event,
                    String::new(),
                    "progress",
                    Some(m.note),
                )
            })
        }
        t if t == pb::FlowCompleted::TYPE => event.decode::<pb::FlowCompleted>().ok().map(|m| {
            flow_item(
                item(K::Flow),
                event,
                flow_type_name(m.flow_type),
                "completed",
                empty_to_none(&m.summary),
            )
        }),
        t if t == pb::FlowFailed::TYPE => {
            event.decode::<pb::FlowFailed>().ok().map(|m| TimelineItem {
                failure: m.reason.as_ref().map(Failure::from),
                ..flow_item(
                    item(K::Flow),
                    event,
                    flow_type_name(m.flow_type),
                    "failed",
                    None,
                )
            })
        }
        t if t == pb::FlowCancelled::TYPE => event.decode::<pb::FlowCancelled>().ok().map(|m| {
            flow_item(
                item(K::Flow),
                event,
                flow_type_name(m.flow_type),
                "cancelled",
                empty_to_none(&m.reason),
            )
        }),
        t if t == pb::ArtifactPublished::TYPE => {
            event
                .decode::<pb::ArtifactPublished>()
                .ok()
                .map(|m| TimelineItem {
                    artifact: Some(artifact_view(&m)),
                    ..item(K::Artifact)
                })
        }
        _ => None,
    }
}

fn flow_item(
    base: TimelineItem,
    event: &Envelope,
    flow_type: String,
    state: &str,
    note: Option<String>,
) -> TimelineItem {
    TimelineItem {
        status: Some(state.to_owned()),
        flow: Some(FlowRef {
            flow_run_id: event
                .flow_run_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            flow_type,
            state: state.to_owned(),
            note,
        }),
        ..base
    }
}

/// The gateway projection.
#[derive(Debug, Default)]
pub struct GatewayProjection;

impl zopu_core::Projection for GatewayProjection {
    fn name(&self) -> &'static str {
        "gateway"
    }

    fn schema_version(&self) -> u32 {
        SCHEMA_VERSION
    }

    fn tables(&self) -> &'static [&'static str] {
        TABLES
    }

    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(SCHEMA)
    }

    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        sequence: u64,
    ) -> rusqlite::Result<()> {
        apply(tx, event, sequence)
    }
}

fn apply(tx: &Transaction<'_>, event: &Envelope, sequence: u64) -> rusqlite::Result<()> {
    let org = event.org_id.as_str();
    let project = event.project_id.to_string();
    let time = format_time(event.time);
    let seq = sequence as i64;
    // Rows first, then the item (a WorkUpdated item shows the Work's title).
    match event.event_type.as_str() {
        t if t == pb::ProjectSetupRequested::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectSetupRequested>() {
                tx.prepare_cached("INSERT INTO gw_projects (project_id, org, name, repository_url, branch, setup_revision, state, created_at, updated_sequence, correlation_id)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                     ON CONFLICT(project_id) DO UPDATE SET
                        repository_url = excluded.repository_url, branch = excluded.branch,
                        name = CASE WHEN excluded.name = '' THEN gw_projects.name ELSE excluded.name END,
                        setup_revision = excluded.setup_revision, state = excluded.state,
                        failed_step = NULL, failure_code = NULL, failure_message = NULL, failure_retryable = NULL,
                        updated_sequence = excluded.updated_sequence
                     WHERE excluded.setup_revision > gw_projects.setup_revision AND gw_projects.org = excluded.org")?.execute(params![
                        project,
                        org,
                        m.project_name,
                        m.repository_url,
                        m.branch,
                        m.setup_revision,
                        setup_state::CREATING_WORKSPACE,
                        time,
                        seq,
                        event.correlation_id.as_str()
                    ],
                )?;
            }
        }
        t if t == pb::ProjectSetupStarted::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectSetupStarted>() {
                set_state(
                    tx,
                    &project,
                    org,
                    m.setup_revision,
                    setup_state::CREATING_WORKSPACE,
                    seq,
                )?;
            }
        }
        t if t == pb::ProjectRuntimeCreated::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectRuntimeCreated>() {
                set_state(
                    tx,
                    &project,
                    org,
                    m.setup_revision,
                    setup_state::CLONING,
                    seq,
                )?;
            }
        }
        t if t == pb::ProjectRepositoryCloned::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectRepositoryCloned>() {
                set_state(
                    tx,
                    &project,
                    org,
                    m.setup_revision,
                    setup_state::CHECKING,
                    seq,
                )?;
                tx.prepare_cached("UPDATE gw_projects SET repository_commit = ?1 WHERE project_id = ?2 AND org = ?3 AND setup_revision = ?4")?.execute(params![m.repository_commit, project, org, m.setup_revision],
                )?;
            }
        }
        t if t == pb::ProjectEnvironmentScanned::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectEnvironmentScanned>() {
                let names: Vec<&str> = m.variables.iter().map(|v| v.name.as_str()).collect();
                tx.prepare_cached("UPDATE gw_projects SET environment_names = ?1 WHERE project_id = ?2 AND org = ?3 AND setup_revision = ?4")?.execute(params![json(&names), project, org, m.setup_revision],
                )?;
            }
        }
        t if t == pb::AgentRegistered::TYPE => {
            if let Ok(m) = event.decode::<pb::AgentRegistered>() {
                tx.prepare_cached(
                    "UPDATE gw_projects SET agent_id = ?1 WHERE project_id = ?2 AND org = ?3",
                )?
                .execute(params![m.agent_id, project, org])?;
            }
        }
        t if t == pb::ProjectReady::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectReady>() {
                set_state(tx, &project, org, m.setup_revision, setup_state::READY, seq)?;
                tx.prepare_cached(
                    "UPDATE gw_projects SET repository_commit = ?1, environment_names = ?2,
                        agent_id = COALESCE(NULLIF(?3, ''), agent_id)
                     WHERE project_id = ?4 AND org = ?5 AND setup_revision = ?6",
                )?
                .execute(params![
                    m.repository_commit,
                    json(&m.environment_variable_names),
                    m.agent_id,
                    project,
                    org,
                    m.setup_revision
                ])?;
            }
        }
        t if t == pb::ProjectSetupFailed::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectSetupFailed>() {
                let reason = m.reason.unwrap_or_default();
                tx.prepare_cached("UPDATE gw_projects SET state = ?1, failed_step = ?2, failure_code = ?3, failure_message = ?4,
                        failure_retryable = ?5, updated_sequence = ?6
                     WHERE project_id = ?7 AND org = ?8 AND setup_revision = ?9")?.execute(params![
                        setup_state::FAILED,
                        m.step,
                        reason.code,
                        reason.message,
                        reason.retryable,
                        seq,
                        project,
                        org,
                        m.setup_revision
                    ],
                )?;
            }
        }
        t if t == pb::AgentDisabled::TYPE || t == pb::AgentEnabled::TYPE => {
            let enabled = t == pb::AgentEnabled::TYPE;
            tx.prepare_cached(
                "UPDATE gw_projects SET agent_enabled = ?1 WHERE project_id = ?2 AND org = ?3",
            )?
            .execute(params![enabled, project, org])?;
        }
        t if t == pb::WorkCreated::TYPE => {
            if let (Some(work), Ok(m)) = (event.work_id, event.decode::<pb::WorkCreated>()) {
                tx.prepare_cached("INSERT OR IGNORE INTO gw_works (work_id, org, project_id, title, summary, kind, status, created_at, updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'open', ?7, ?7)")?.execute(params![work.to_string(), org, project, m.title, m.summary, m.kind, time],
                )?;
            }
        }
        t if t == pb::WorkUpdated::TYPE => {
            if let (Some(work), Ok(m)) = (event.work_id, event.decode::<pb::WorkUpdated>()) {
                tx.prepare_cached(
                    "UPDATE gw_works SET status = CASE WHEN ?1 = '' THEN status ELSE ?1 END,
                        summary = CASE WHEN ?2 = '' THEN summary ELSE ?2 END, updated_at = ?3
                     WHERE work_id = ?4 AND org = ?5 AND project_id = ?6",
                )?
                .execute(params![
                    m.status,
                    m.summary,
                    time,
                    work.to_string(),
                    org,
                    project
                ])?;
            }
        }
        t if t == pb::ThreadCreated::TYPE => {
            if let (Some(thread), Ok(m)) = (event.thread_id, event.decode::<pb::ThreadCreated>()) {
                tx.prepare_cached("INSERT OR IGNORE INTO gw_threads (thread_id, org, project_id, work_id, title, flow_type, status, summary, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'open', '', ?7)")?.execute(params![thread.to_string(), org, project, event.work_id.map(|w| w.to_string()), m.title, m.flow_type, time],
                )?;
            }
        }
        t if t == pb::ThreadUpdated::TYPE => {
            if let (Some(thread), Ok(m)) = (event.thread_id, event.decode::<pb::ThreadUpdated>()) {
                tx.prepare_cached(
                    "UPDATE gw_threads SET status = CASE WHEN ?1 = '' THEN status ELSE ?1 END,
                        summary = CASE WHEN ?2 = '' THEN summary ELSE ?2 END
                     WHERE thread_id = ?3 AND org = ?4 AND project_id = ?5",
                )?
                .execute(params![
                    m.status,
                    m.summary,
                    thread.to_string(),
                    org,
                    project
                ])?;
            }
        }
        t if [
            pb::FlowRequested::TYPE,
            pb::FlowStarted::TYPE,
            pb::FlowCompleted::TYPE,
            pb::FlowFailed::TYPE,
            pb::FlowCancelled::TYPE,
        ]
        .contains(&t) =>
        {
            if let Some(flow) = event.flow_run_id {
                let state = match t {
                    x if x == pb::FlowRequested::TYPE => "requested",
                    x if x == pb::FlowStarted::TYPE => "running",
                    x if x == pb::FlowCompleted::TYPE => "completed",
                    x if x == pb::FlowFailed::TYPE => "failed",
                    _ => "cancelled",
                };
                // A terminal state is never reopened by a late or redelivered start.
                tx.prepare_cached("INSERT INTO gw_flows (flow_run_id, org, project_id, state) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT(flow_run_id) DO UPDATE SET state = excluded.state
                     WHERE gw_flows.state IN ('requested', 'running')")?.execute(params![flow.to_string(), org, project, state],
                )?;
            }
        }
        t if t == pb::ArtifactPublished::TYPE => {
            if let Ok(m) = event.decode::<pb::ArtifactPublished>() {
                let html = m.html.clone().unwrap_or_default();
                tx.prepare_cached("INSERT OR IGNORE INTO gw_artifacts (artifact_id, revision, org, project_id, work_id, view, bucket, object_name, sha256, size_bytes, content_type)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)")?.execute(params![
                        m.artifact_id,
                        m.revision,
                        org,
                        project,
                        event.work_id.map(|w| w.to_string()),
                        json(&artifact_view(&m)),
                        html.bucket,
                        html.name,
                        html.sha256,
                        html.size_bytes as i64,
                        html.content_type
                    ],
                )?;
            }
        }
        t if t == pb::ArtifactSuperseded::TYPE => {
            if let Ok(m) = event.decode::<pb::ArtifactSuperseded>() {
                tx.prepare_cached("UPDATE gw_artifacts SET superseded_by = ?1 WHERE artifact_id = ?2 AND revision = ?3 AND org = ?4 AND project_id = ?5")?.execute(params![m.superseded_by_revision, m.artifact_id, m.revision, org, project],
                )?;
            }
        }
        t if t == pb::ContextPublished::TYPE => {
            if let Ok(m) = event.decode::<pb::ContextPublished>()
                && m.kind == "repository_summary"
            {
                tx.prepare_cached("INSERT INTO gw_summaries (project_id, org, document_id, revision, title, content_type, body, blob, repository_commit, sequence)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                     ON CONFLICT(project_id) DO UPDATE SET document_id = excluded.document_id, revision = excluded.revision,
                        title = excluded.title, content_type = excluded.content_type, body = excluded.body, blob = excluded.blob,
                        repository_commit = excluded.repository_commit, sequence = excluded.sequence
                     WHERE gw_summaries.org = excluded.org")?.execute(params![
                        project,
                        org,
                        m.document_id,
                        m.revision,
                        m.title,
                        m.content_type,
                        m.body,
                        m.blob.as_ref().map(|blob| hex::encode(prost::Message::encode_to_vec(blob))),
                        m.repository_commit,
                        seq
                    ],
                )?;
            }
        }
        _ => {}
    }

    let setup_item = setup_item(tx, event, sequence)?;
    let work = match (event.event_type.as_str(), event.work_id) {
        (t, Some(work)) if t == pb::WorkUpdated::TYPE => work_ref(tx, org, &work.to_string())?,
        _ => None,
    };
    let item = setup_item.or_else(|| timeline_item(event, sequence, work.as_ref()));
    if let Some(item) = item {
        tx.prepare_cached("INSERT OR IGNORE INTO gw_timeline (sequence, org, project_id, work_id, item) VALUES (?1, ?2, ?3, ?4, ?5)")?.execute(params![seq, org, project, item.work_id, json(&item)],
        )?;
    }
    Ok(())
}

fn json<T: Serialize>(value: &T) -> String {
    // Plain data structs with string keys always serialize.
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

fn set_state(
    tx: &Transaction<'_>,
    project: &str,
    org: &str,
    revision: u32,
    state: &str,
    seq: i64,
) -> rusqlite::Result<()> {
    // Only the current revision moves, and never out of a terminal state of that revision.
    tx.prepare_cached("UPDATE gw_projects SET state = ?1, updated_sequence = ?2
         WHERE project_id = ?3 AND org = ?4 AND setup_revision = ?5 AND state NOT IN ('ready', 'failed')")?.execute(params![state, seq, project, org, revision],
    )?;
    if state == setup_state::READY {
        tx.prepare_cached("UPDATE gw_projects SET state = 'ready', updated_sequence = ?1 WHERE project_id = ?2 AND org = ?3 AND setup_revision = ?4")?.execute(params![seq, project, org, revision],
        )?;
    }
    Ok(())
}

/// Setup events become items carrying the project's setup status after the event.
fn setup_item(
    tx: &Transaction<'_>,
    event: &Envelope,
    sequence: u64,
) -> rusqlite::Result<Option<TimelineItem>> {
    const SETUP_TYPES: &[&str] = &[
        pb::ProjectSetupRequested::TYPE,
        pb::ProjectSetupStarted::TYPE,
        pb::ProjectRuntimeCreated::TYPE,
        pb::ProjectRepositoryCloned::TYPE,
        pb::ProjectEnvironmentScanned::TYPE,
        pb::ProjectReady::TYPE,
        pb::ProjectSetupFailed::TYPE,
    ];
    if !SETUP_TYPES.contains(&event.event_type.as_str()) {
        return Ok(None);
    }
    let Some(project) = load_project(tx, event.org_id.as_str(), &event.project_id.to_string())?
    else {
        return Ok(None);
    };
    let failure = project.setup.failure.clone();
    Ok(Some(TimelineItem {
        status: Some(project.setup.state.clone()),
        setup: Some(project.setup),
        failure,
        ..TimelineItem::new(ItemKind::Setup, event, sequence)
    }))
}

fn work_ref(conn: &Connection, org: &str, work: &str) -> rusqlite::Result<Option<WorkRef>> {
    conn.prepare_cached("SELECT work_id, title, kind, status, summary FROM gw_works WHERE work_id = ?1 AND org = ?2")?.query_row(params![work, org],
        |row| {
            Ok(WorkRef { work_id: row.get(0)?, title: row.get(1)?, kind: row.get(2)?, status: row.get(3)?, summary: row.get(4)? })
        },
    )
    .optional()
}

const PROJECT_COLUMNS: &str = "project_id, name, repository_url, branch, created_at, setup_revision, state, failed_step,
    failure_code, failure_message, failure_retryable, repository_commit, environment_names, agent_id, agent_enabled,
    EXISTS (SELECT 1 FROM gw_flows f WHERE f.project_id = p.project_id AND f.state IN ('requested', 'running'))";

fn project_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ProjectView> {
    let failure_code: Option<String> = row.get(8)?;
    let failure = match failure_code {
        Some(code) => Some(Failure {
            code,
            message: row.get::<_, Option<String>>(9)?.unwrap_or_default(),
            retryable: row.get::<_, Option<bool>>(10)?.unwrap_or(false),
        }),
        None => None,
    };
    let names: String = row.get(12)?;
    Ok(ProjectView {
        project_id: row.get(0)?,
        name: row.get(1)?,
        repository: row.get(2)?,
        branch: row.get(3)?,
        created_at: row.get(4)?,
        setup: SetupStatus {
            revision: row.get(5)?,
            state: row.get(6)?,
            failed_step: row.get(7)?,
            failure,
            environment_names: serde_json::from_str(&names).unwrap_or_default(),
            repository_commit: row.get::<_, Option<String>>(11)?.filter(|c| !c.is_empty()),
        },
        agent_id: row.get(13)?,
        agent_enabled: row.get(14)?,
        running: row.get(15)?,
    })
}

fn load_project(
    conn: &Connection,
    org: &str,
    project: &str,
) -> rusqlite::Result<Option<ProjectView>> {
    conn.query_row(
        &format!("SELECT {PROJECT_COLUMNS} FROM gw_projects p WHERE project_id = ?1 AND org = ?2"),
        params![project, org],
        project_row,
    )
    .optional()
}

/// Read-only queries over the projection. Every one is scoped to an organization.
pub mod queries {
    use super::*;

    pub fn projects(
        conn: &Connection,
        org: &OrgId,
        limit: usize,
    ) -> rusqlite::Result<Vec<ProjectView>> {
        let mut statement = conn.prepare_cached(&format!(
            "SELECT {PROJECT_COLUMNS} FROM gw_projects p WHERE org = ?1 ORDER BY created_at DESC, project_id LIMIT ?2"
        ))?;
        statement
            .query_map(params![org.as_str(), limit as i64], project_row)?
            .collect()
    }

    pub fn project(
        conn: &Connection,
        org: &OrgId,
        project: &ProjectId,
    ) -> rusqlite::Result<Option<ProjectView>> {
        load_project(conn, org.as_str(), &project.to_string())
    }

    /// Items after `after`, oldest first; `work` narrows to one Work.
    pub fn timeline(
        conn: &Connection,
        org: &OrgId,
        project: &ProjectId,
        work: Option<&str>,
        after: u64,
        limit: usize,
    ) -> rusqlite::Result<Vec<TimelineItem>> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let rows: Vec<String> = match work {
            None => {
                let mut statement = conn.prepare_cached(
                    "SELECT item FROM gw_timeline WHERE project_id = ?1 AND sequence > ?2 AND org = ?3 ORDER BY sequence LIMIT ?4",
                )?;
                statement
                    .query_map(
                        params![project.to_string(), after, org.as_str(), limit as i64],
                        |row| row.get(0),
                    )?
                    .collect::<rusqlite::Result<_>>()?
            }
            Some(work) => {
                let mut statement = conn.prepare_cached(
                    "SELECT item FROM gw_timeline WHERE work_id = ?1 AND sequence > ?2 AND org = ?3 AND project_id = ?4 ORDER BY sequence LIMIT ?5",
                )?;
                statement
                    .query_map(
                        params![work, after, org.as_str(), project.to_string(), limit as i64],
                        |row| row.get(0),
                    )?
                    .collect::<rusqlite::Result<_>>()?
            }
        };
        Ok(rows
            .iter()
            .filter_map(|row| serde_json::from_str(row).ok())
            .collect())
    }

    pub fn work(
        conn: &Connection,
        org: &OrgId,
        project: &ProjectId,
        work: &str,
    ) -> rusqlite::Result<Option<WorkView>> {
        conn.prepare_cached("SELECT work_id, project_id, title, summary, kind, status, created_at, updated_at FROM gw_works
             WHERE work_id = ?1 AND org = ?2 AND project_id = ?3")?.query_row(params![work, org.as_str(), project.to_string()],
            |row| {
                Ok(WorkView {
                    work_id: row.get(0)?,
                    project_id: row.get(1)?,
                    title: row.get(2)?,
                    summary: row.get(3)?,
                    kind: row.get(4)?,
                    status: row.get(5)?,
                    created_at: row.get(6)?,
                    updated_at: row.get(7)?,
                })
            },
        )
        .optional()
    }

    pub fn threads(
        conn: &Connection,
        org: &OrgId,
        project: &ProjectId,
        work: &str,
    ) -> rusqlite::Result<Vec<ThreadView>> {
        let mut statement = conn.prepare_cached(
            "SELECT thread_id, work_id, title, flow_type, status, summary, created_at FROM gw_threads
             WHERE work_id = ?1 AND org = ?2 AND project_id = ?3 ORDER BY created_at, thread_id LIMIT 1000",
        )?;
        statement
            .query_map(params![work, org.as_str(), project.to_string()], |row| {
                Ok(ThreadView {
                    thread_id: row.get(0)?,
                    work_id: row.get(1)?,
                    title: row.get(2)?,
                    flow_type: row.get(3)?,
                    status: row.get(4)?,
                    summary: row.get(5)?,
                    created_at: row.get(6)?,
                })
            })?
            .collect()
    }

    /// An artifact revision (the newest when `revision` is `None`) and its card.
    pub fn artifact(
        conn: &Connection,
        org: &OrgId,
        artifact: &str,
        revision: Option<u32>,
    ) -> rusqlite::Result<Option<(ArtifactRecord, ArtifactView)>> {
        let sql = "SELECT artifact_id, revision, project_id, bucket, object_name, sha256, size_bytes, content_type, view
                   FROM gw_artifacts WHERE artifact_id = ?1 AND org = ?2 AND (?3 IS NULL OR revision = ?3)
                   ORDER BY revision DESC LIMIT 1";
        conn.query_row(sql, params![artifact, org.as_str(), revision], |row| {
            let view: String = row.get(8)?;
            let record = ArtifactRecord {
                artifact_id: row.get(0)?,
                revision: row.get(1)?,
                project_id: row.get(2)?,
                bucket: row.get(3)?,
                object_name: row.get(4)?,
                sha256: row.get(5)?,
                size_bytes: row.get::<_, i64>(6)?.max(0) as u64,
                content_type: row.get(7)?,
            };
            Ok((record, view))
        })
        .optional()
        .map(|found| {
            found.and_then(|(record, view)| {
                serde_json::from_str(&view).ok().map(|view| (record, view))
            })
        })
    }

    pub fn summary(
        conn: &Connection,
        org: &OrgId,
        project: &ProjectId,
    ) -> rusqlite::Result<Option<SummaryRecord>> {
        conn.prepare_cached("SELECT document_id, revision, title, content_type, body, blob, repository_commit FROM gw_summaries
             WHERE project_id = ?1 AND org = ?2")?.query_row(params![project.to_string(), org.as_str()],
            |row| {
                let blob: Option<String> = row.get(5)?;
                Ok(SummaryRecord {
                    view: SummaryView {
                        document_id: row.get(0)?,
                        revision: row.get(1)?,
                        title: row.get(2)?,
                        content_type: row.get(3)?,
                        body: row.get(4)?,
                        repository_commit: row.get(6)?,
                    },
                    blob: blob
                        .and_then(|hex_bytes| hex::decode(hex_bytes).ok())
                        .and_then(|bytes| <pb::BlobRef as prost::Message>::decode(bytes.as_slice()).ok()),
                })
            },
        )
        .optional()
    }
}

/// A few read-only connections to the projection file, so queries never wait
/// for the projection writer (SQLite WAL: readers see the last commit).
#[derive(Debug, Clone)]
pub struct ReadPool {
    path: PathBuf,
    idle: Arc<Mutex<Vec<Connection>>>,
    idle_max: usize,
}

impl ReadPool {
    pub fn new(path: &Path, idle_max: usize) -> Self {
        Self {
            path: path.to_owned(),
            idle: Arc::new(Mutex::new(Vec::new())),
            idle_max,
        }
    }

    fn open(&self) -> rusqlite::Result<Connection> {
        let connection = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )?;
        connection.busy_timeout(std::time::Duration::from_secs(2))?;
        Ok(connection)
    }

    /// Runs a query on a pooled connection (blocking: call from `spawn_blocking`).
    pub fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let connection = match pooled {
            Some(connection) => connection,
            None => self.open()?,
        };
        let result = f(&connection);
        // A connection that saw a schema change (rebuild) is dropped rather than reused.
        if result.is_ok() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < self.idle_max {
                idle.push(connection);
            }
        }
        result
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use zopu_core::Projection;
    use zopu_schema::{CorrelationId, EventId, WorkId};

    fn envelope<E: Event>(org: &str, project: ProjectId, payload: &E, version: u64) -> Envelope {
        let id = EventId::new();
        Envelope {
            id,
            source: "zopu/test".into(),
            event_type: E::TYPE.into(),
            time: time::OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(version as i64),
            data_schema: E::SCHEMA.into(),
            org_id: org.parse().unwrap(),
            project_id: project,
            correlation_id: CorrelationId::from(id),
            causation_id: id,
            work_id: None,
            thread_id: None,
            flow_run_id: None,
            dispatch_id: None,
            traceparent: None,
            idempotency_key: format!("k:{id}"),
            project_version: version,
            previous_hash: None,
            data: Bytes::from(prost::Message::encode_to_vec(payload)),
        }
    }

    fn store() -> (Connection, GatewayProjection) {
        let connection = Connection::open_in_memory().unwrap();
        (connection, GatewayProjection)
    }

    fn apply_all(
        connection: &mut Connection,
        projection: &mut GatewayProjection,
        events: &[Envelope],
    ) {
        let tx = connection.transaction().unwrap();
        for (index, event) in events.iter().enumerate() {
            projection.apply(&tx, event, index as u64 + 1).unwrap();
        }
        tx.commit().unwrap();
    }

    #[test]
    fn setup_progresses_and_a_retry_clears_the_failure() {
        let (mut connection, mut projection) = store();
        {
            let tx = connection.transaction().unwrap();
            projection.migrate(&tx).unwrap();
            tx.commit().unwrap();
        }
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap();
        let request = |revision| pb::ProjectSetupRequested {
            repository_url: "https://example.com/r.git".into(),
            branch: "main".into(),
            setup_revision: revision,
            project_name: "demo".into(),
            ..Default::default()
        };
        apply_all(
            &mut connection,
            &mut projection,
            &[
                envelope("acme", project, &request(1), 1),
                envelope(
                    "acme",
                    project,
                    &pb::ProjectRuntimeCreated {
                        setup_revision: 1,
                        ..Default::default()
                    },
                    2,
                ),
                envelope(
                    "acme",
                    project,
                    &pb::ProjectSetupFailed {
                        setup_revision: 1,
                        step: "clone".into(),
                        reason: Some(pb::FailureReason {
                            code: "clone.branch_not_found".into(),
                            message: "no branch".into(),
                            retryable: false,
                        }),
                    },
                    3,
                ),
            ],
        );
        let view = queries::project(&connection, &org, &project)
            .unwrap()
            .unwrap();
        assert_eq!(view.setup.state, setup_state::FAILED);
        assert_eq!(
            view.setup.failure.as_ref().unwrap().code,
            "clone.branch_not_found"
        );
        assert!(
            queries::project(&connection, &"other".parse().unwrap(), &project)
                .unwrap()
                .is_none()
        );

        apply_all(
            &mut connection,
            &mut projection,
            &[
                envelope("acme", project, &request(2), 4),
                envelope(
                    "acme",
                    project,
                    &pb::ProjectRuntimeCreated {
                        setup_revision: 1,
                        ..Default::default()
                    },
                    5,
                ),
            ],
        );
        let view = queries::project(&connection, &org, &project)
            .unwrap()
            .unwrap();
        assert_eq!(
            (view.setup.state.as_str(), view.setup.revision),
            (setup_state::CREATING_WORKSPACE, 2)
        );
        assert!(view.setup.failure.is_none());
    }

    #[test]
    fn agent_posts_and_work_cards_become_items() {
        let project = ProjectId::new();
        let mut created = envelope(
            "acme",
            project,
            &pb::WorkCreated {
                title: "Explore".into(),
                kind: "explore".into(),
                ..Default::default()
            },
            1,
        );
        let work = WorkId::new();
        created.work_id = Some(work);
        let item = timeline_item(&created, 7, None).unwrap();
        assert_eq!(item.kind, ItemKind::Work);
        assert_eq!(item.sequence, 7);
        assert_eq!(item.work.unwrap().work_id, work.to_string());
        let ack = envelope(
            "acme",
            project,
            &pb::AgentAcknowledged {
                text: "On it".into(),
                ..Default::default()
            },
            2,
        );
        assert_eq!(
            timeline_item(&ack, 8, None).unwrap().text.as_deref(),
            Some("On it")
        );
        let quiet = envelope(
            "acme",
            project,
            &pb::FlowProgress {
                visible: false,
                note: "x".into(),
                ..Default::default()
            },
            3,
        );
        assert!(timeline_item(&quiet, 9, None).is_none());
    }
}
