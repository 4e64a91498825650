//! What the API answers with: the JSON views of the read model's rows,
//! built here at the HTTP edge, and the queries the handlers run, which read
//! rows (`read_model`) and turn them into views.
//!
//! Invariants: a view is built only from rows, never stored; renaming a
//! field here changes the API (and its `/openapi.json`), never what the
//! projection stores.

use serde::Serialize;
use utoipa::ToSchema;

use crate::read_model::FailureRow;
use crate::read_model::artifacts::{CardActionRow, CardFactRow, CardRow};
use crate::read_model::projects::{ProjectRow, SetupRow, SummaryRow};
use crate::read_model::timeline::{ActionRow, ApprovalRefRow, FlowRow, ItemRow, WorkCardRow};
use crate::read_model::works::{ThreadRow, WorkRow};

pub use crate::read_model::artifacts::ArtifactRecord;
pub use crate::read_model::projects::setup_state;
pub use crate::read_model::timeline::ItemKind;

/// A failure as users see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Failure {
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

impl From<FailureRow> for Failure {
    fn from(row: FailureRow) -> Self {
        Self {
            code: row.code,
            message: row.message,
            retryable: row.retryable,
        }
    }
}

/// Setup status of a project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
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
    /// The names a value is stored for (`PUT …/environment/{name}`), with
    /// its version and keyed fingerprint; never a value.
    pub environment_values: Vec<EnvironmentValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repository_commit: Option<String>,
}

/// An environment name with a stored value (the value stays in the secret store).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct EnvironmentValue {
    pub name: String,
    /// The value's version in the secret store (1 for the first, one more for each rotation).
    pub version: u64,
    /// HMAC-SHA256 of the value under the deployment's key (32 hex digits).
    pub fingerprint: String,
    pub updated_at: String,
    /// The user who stored it.
    pub updated_by: String,
}

impl From<crate::read_model::projects::EnvironmentValueRow> for EnvironmentValue {
    fn from(row: crate::read_model::projects::EnvironmentValueRow) -> Self {
        Self {
            name: row.name,
            version: row.version,
            fingerprint: row.fingerprint,
            updated_at: row.updated_at,
            updated_by: row.updated_by,
        }
    }
}

impl From<SetupRow> for SetupStatus {
    fn from(row: SetupRow) -> Self {
        Self {
            state: row.state,
            revision: row.revision,
            failed_step: row.failed_step,
            failure: row.failure.map(Failure::from),
            environment_names: row.environment_names,
            environment_values: row
                .environment_values
                .into_iter()
                .map(EnvironmentValue::from)
                .collect(),
            repository_commit: row.repository_commit,
        }
    }
}

/// A project as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
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
    /// Events stored on the project's subjects that do not extend its
    /// chain (a forgery stored without the expected sequence): shown to
    /// operators, applied nowhere. Newest first; only on a single project.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused_events: Vec<RefusedEventView>,
}

/// An event of the project that no read model applied and no agent acted
/// on, because it does not extend the project's version/hash chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct RefusedEventView {
    pub sequence: u64,
    pub event_type: String,
    pub reason: String,
}

impl From<zopu_runtime::ledger::Refusal> for RefusedEventView {
    fn from(refusal: zopu_runtime::ledger::Refusal) -> Self {
        Self {
            sequence: refusal.sequence,
            event_type: refusal.event_type,
            reason: refusal.reason,
        }
    }
}

/// At most this many refused events are shown with a project.
pub const REFUSED_EVENTS_SHOWN: u32 = 20;

impl From<ProjectRow> for ProjectView {
    fn from(row: ProjectRow) -> Self {
        Self {
            project_id: row.project_id,
            name: row.name,
            repository: row.repository_url,
            branch: row.branch,
            created_at: row.created_at,
            setup: row.setup.into(),
            agent_id: row.agent_id,
            agent_enabled: row.agent_enabled,
            running: row.running,
            refused_events: Vec::new(),
        }
    }
}

/// A Work: a durable responsibility on the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
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

impl From<WorkRow> for WorkView {
    fn from(row: WorkRow) -> Self {
        Self {
            work_id: row.work_id,
            project_id: row.project_id,
            title: row.title,
            summary: row.summary,
            kind: row.kind,
            status: row.status,
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

/// A Thread beneath a Work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ThreadView {
    pub thread_id: String,
    pub work_id: Option<String>,
    pub title: String,
    pub flow_type: String,
    pub status: String,
    pub summary: String,
    pub created_at: String,
}

impl From<ThreadRow> for ThreadView {
    fn from(row: ThreadRow) -> Self {
        Self {
            thread_id: row.thread_id,
            work_id: row.work_id,
            title: row.title,
            flow_type: row.flow_type,
            status: row.status,
            summary: row.summary,
            created_at: row.created_at,
        }
    }
}

/// One fact on an artifact card.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct CardFactView {
    pub label: String,
    pub value: String,
}

/// One action on an artifact card.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct CardActionView {
    pub id: String,
    pub label: String,
    pub style: String,
}

/// An artifact card on the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ArtifactView {
    pub artifact_id: String,
    pub revision: u32,
    /// `project_setup`, `exploration`, `issue`, `check_report`.
    pub kind: String,
    pub title: String,
    pub summary: String,
    pub label: String,
    pub facts: Vec<CardFactView>,
    pub actions: Vec<CardActionView>,
    pub provider: String,
    /// Where the HTML is served (needs the bearer token or a signed link).
    pub href: String,
    /// The tracker's address of the issue this draft was published as
    /// (its `Status` fact then reads `published`); absent before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published_url: Option<String>,
}

/// The API path of an artifact revision.
pub fn artifact_href(artifact_id: &str, revision: u32) -> String {
    format!("/v1/artifacts/{artifact_id}?revision={revision}")
}

impl From<CardRow> for ArtifactView {
    /// A card without a label of its own is labelled with the title.
    fn from(row: CardRow) -> Self {
        Self {
            href: artifact_href(&row.artifact_id, row.revision),
            artifact_id: row.artifact_id,
            revision: row.revision,
            kind: row.kind,
            label: if row.label.is_empty() {
                row.title.clone()
            } else {
                row.label
            },
            title: row.title,
            summary: row.summary,
            facts: row
                .facts
                .into_iter()
                .map(|CardFactRow { label, value }| CardFactView { label, value })
                .collect(),
            actions: row
                .actions
                .into_iter()
                .map(
                    |CardActionRow {
                         action_id,
                         label,
                         style,
                     }| CardActionView {
                        id: action_id,
                        label,
                        style,
                    },
                )
                .collect(),
            provider: row.provider,
            published_url: row.published_url,
        }
    }
}

/// A Work as a card on the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct WorkRef {
    pub work_id: String,
    pub title: String,
    pub kind: String,
    pub status: String,
    /// The status as a person reads it (`waiting for you: …`), as the web
    /// and `zopu timeline` show it.
    pub status_text: String,
    pub summary: String,
}

impl From<WorkCardRow> for WorkRef {
    fn from(row: WorkCardRow) -> Self {
        Self {
            work_id: row.work_id,
            title: row.title,
            kind: row.kind,
            status_text: zopu_schema::work_status_text(&row.status).to_owned(),
            status: row.status,
            summary: row.summary,
        }
    }
}

/// A specialist flow's state (the running indicator).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FlowRef {
    pub flow_run_id: String,
    /// `onboarding_explore`, `explore`, `issue`, `check`.
    pub flow_type: String,
    /// `requested`, `running`, `progress`, `completed`, `failed`, `cancelled`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl From<FlowRow> for FlowRef {
    fn from(row: FlowRow) -> Self {
        Self {
            flow_run_id: row.flow_run_id,
            flow_type: row.flow_type,
            state: row.state,
            note: row.note,
        }
    }
}

/// A card action a user sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ActionRef {
    pub action_id: String,
    pub artifact_id: String,
}

impl From<ActionRow> for ActionRef {
    fn from(row: ActionRow) -> Self {
        Self {
            action_id: row.action_id,
            artifact_id: row.artifact_id,
        }
    }
}

/// The approval an item is about (answer it with
/// `POST /v1/projects/{id}/approvals/{approval_id}/approve` or `/reject`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ApprovalRef {
    pub approval_id: String,
    /// What would be done (`issue.publish`); absent on a decision.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

impl From<ApprovalRefRow> for ApprovalRef {
    fn from(row: ApprovalRefRow) -> Self {
        Self {
            approval_id: row.approval_id,
            action: row.action,
            expires_at: row.expires_at,
        }
    }
}

/// One item of a timeline. `sequence` is the stream sequence of the event
/// it shows: the SSE `id:` and the `after` cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
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
    pub approval: Option<ApprovalRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<SetupStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}

impl From<ItemRow> for TimelineItem {
    fn from(row: ItemRow) -> Self {
        Self {
            sequence: row.sequence,
            kind: row.kind,
            event_id: row.event_id,
            event_type: row.event_type,
            time: row.time,
            project_id: row.project_id,
            correlation_id: row.correlation_id,
            work_id: row.work_id,
            thread_id: row.thread_id,
            text: row.text,
            author: row.author,
            reply_to_event_id: row.reply_to_event_id,
            status: row.status,
            provider: row.provider,
            artifact_ids: row.artifact_ids,
            work: row.work.map(WorkRef::from),
            flow: row.flow.map(FlowRef::from),
            artifact: row.artifact.map(ArtifactView::from),
            action: row.action.map(ActionRef::from),
            approval: row.approval.map(ApprovalRef::from),
            setup: row.setup.map(SetupStatus::from),
            failure: row.failure.map(Failure::from),
        }
    }
}

/// The current project summary document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SummaryView {
    pub document_id: String,
    pub revision: u32,
    pub title: String,
    pub content_type: String,
    pub body: String,
    pub repository_commit: String,
}

/// The summary's view and, when its body is not inline, where it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryRecord {
    pub view: SummaryView,
    pub blob: Option<zopu_schema::pb::BlobRef>,
}

impl From<SummaryRow> for SummaryRecord {
    fn from(row: SummaryRow) -> Self {
        Self {
            view: SummaryView {
                document_id: row.document_id,
                revision: row.revision,
                title: row.title,
                content_type: row.content_type,
                body: row.body,
                repository_commit: row.repository_commit,
            },
            blob: row.blob,
        }
    }
}

/// The handlers' read-only queries: rows from the read model, as views.
/// Every one is scoped to an organization.
pub mod queries {
    use rusqlite::Connection;
    use zopu_schema::{OrgId, ProjectId};

    use super::{
        ArtifactRecord, ArtifactView, ProjectView, SummaryRecord, ThreadView, TimelineItem,
        WorkView,
    };
    use crate::read_model::{artifacts, projects, timeline, works};

    pub fn projects(
        conn: &Connection,
        org: &OrgId,
        limit: usize,
    ) -> rusqlite::Result<Vec<ProjectView>> {
        Ok(projects::list(conn, org, limit)?
            .into_iter()
            .map(ProjectView::from)
            .collect())
    }

    /// A project with the events refused for breaking its chain.
    pub fn project(
        conn: &Connection,
        org: &OrgId,
        project: &ProjectId,
    ) -> rusqlite::Result<Option<ProjectView>> {
        let Some(row) = projects::find(conn, org, project)? else {
            return Ok(None);
        };
        let mut view = ProjectView::from(row);
        view.refused_events =
            zopu_runtime::ledger::refusals_of(conn, org, project, super::REFUSED_EVENTS_SHOWN)?
                .into_iter()
                .map(super::RefusedEventView::from)
                .collect();
        Ok(Some(view))
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
        Ok(timeline::items(conn, org, project, work, after, limit)?
            .into_iter()
            .map(TimelineItem::from)
            .collect())
    }

    pub fn work(
        conn: &Connection,
        org: &OrgId,
        project: &ProjectId,
        work: &str,
    ) -> rusqlite::Result<Option<WorkView>> {
        Ok(works::find(conn, org, project, work)?.map(WorkView::from))
    }

    pub fn threads(
        conn: &Connection,
        org: &OrgId,
        project: &ProjectId,
        work: &str,
    ) -> rusqlite::Result<Vec<ThreadView>> {
        Ok(works::threads(conn, org, project, work)?
            .into_iter()
            .map(ThreadView::from)
            .collect())
    }

    /// An artifact revision (the newest when `revision` is `None`) and its card.
    pub fn artifact(
        conn: &Connection,
        org: &OrgId,
        artifact: &str,
        revision: Option<u32>,
    ) -> rusqlite::Result<Option<(ArtifactRecord, ArtifactView)>> {
        Ok(artifacts::find(conn, org, artifact, revision)?
            .map(|(record, card)| (record, ArtifactView::from(card))))
    }

    pub fn summary(
        conn: &Connection,
        org: &OrgId,
        project: &ProjectId,
    ) -> rusqlite::Result<Option<SummaryRecord>> {
        Ok(projects::summary(conn, org, project)?.map(SummaryRecord::from))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_card_without_a_label_is_labelled_with_its_title_and_links_its_revision() {
        let card = CardRow {
            artifact_id: "art-1".into(),
            revision: 2,
            kind: "issue".into(),
            title: "Add SSO".into(),
            summary: String::new(),
            label: String::new(),
            facts: vec![CardFactRow {
                label: "Scope".into(),
                value: "auth".into(),
            }],
            actions: vec![CardActionRow {
                action_id: "approve".into(),
                label: "Approve".into(),
                style: "primary".into(),
            }],
            provider: "offline".into(),
            published_url: None,
        };
        let view = ArtifactView::from(card.clone());
        assert_eq!(view.label, "Add SSO");
        assert_eq!(view.href, "/v1/artifacts/art-1?revision=2");
        assert_eq!(view.actions[0].id, "approve");
        let labelled = ArtifactView::from(CardRow {
            label: "Issue".into(),
            ..card
        });
        assert_eq!(labelled.label, "Issue");
    }

    #[test]
    fn a_timeline_item_serializes_only_the_parts_it_shows() {
        let item = TimelineItem::from(ItemRow {
            sequence: 4,
            kind: ItemKind::AgentBlocked,
            event_id: "e".into(),
            event_type: "agent.blocked".into(),
            time: "t".into(),
            project_id: "p".into(),
            correlation_id: "c".into(),
            work_id: None,
            thread_id: None,
            text: Some("Which branch?".into()),
            author: Some("agent-1".into()),
            reply_to_event_id: None,
            status: Some("blocked".into()),
            provider: None,
            artifact_ids: Vec::new(),
            work: None,
            flow: None,
            artifact: None,
            action: None,
            approval: None,
            setup: None,
            failure: None,
        });
        assert_eq!(
            serde_json::to_value(item).unwrap(),
            serde_json::json!({
                "sequence": 4, "kind": "agent_blocked", "event_id": "e", "event_type": "agent.blocked",
                "time": "t", "project_id": "p", "correlation_id": "c", "text": "Which branch?",
                "author": "agent-1", "status": "blocked"
            })
        );
    }
}
