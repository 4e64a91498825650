//! The timeline: one item per event a user sees — messages and card actions,
//! the agent's posts and state, Work cards, flow state, artifact cards,
//! setup progress, approvals the agent requested and their decisions.
//!
//! Invariants: an item's id is the stream sequence of the event it shows.
//! Which event becomes which item is decided by [`item_of`] (pure) or, for a
//! setup event, from the project's setup status after it; the item keeps
//! what it showed then (a later event never rewrites an earlier item). An
//! artifact item's card is the artifacts aggregate's card of the same
//! sequence.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ValueRef};
use rusqlite::{Connection, OptionalExtension, Transaction, params};
use serde::Serialize;
use utoipa::ToSchema;
use zopu_schema::envelope::format_time;
use zopu_schema::{Envelope, Event, OrgId, ProjectId, pb};

use super::artifacts::{self, CardRow};
use super::projects::SetupRow;
use super::works::{self};
use super::{FailureRow, read_lists, replace_list};

mod items;

pub use items::item_of;
use items::{SETUP_TYPES, lists_artifacts, setup_item};

pub(super) const TABLES: &[&str] = &[
    "gw_timeline",
    "gw_timeline_artifact_ids",
    "gw_timeline_environment_names",
];

pub(super) const SCHEMA: &str = "
CREATE TABLE gw_timeline (
    sequence INTEGER PRIMARY KEY,
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    time TEXT NOT NULL,
    correlation_id TEXT NOT NULL,
    work_id TEXT,
    thread_id TEXT,
    text TEXT,
    author TEXT,
    reply_to_event_id TEXT,
    status TEXT,
    provider TEXT,
    -- A failed turn's or flow's reason; a setup item's setup failure.
    failure_code TEXT,
    failure_message TEXT,
    failure_retryable INTEGER,
    -- The Work card (its id is work_id); all NULL when the item shows none.
    work_title TEXT,
    work_kind TEXT,
    work_status TEXT,
    work_summary TEXT,
    -- The flow; flow_state NULL when the item shows none.
    flow_run_id TEXT,
    flow_type TEXT,
    flow_state TEXT,
    flow_note TEXT,
    -- The card action a user sent; action_id NULL when none.
    action_id TEXT,
    action_artifact_id TEXT,
    -- The approval an approval item or its decision is about; NULL when none.
    approval_id TEXT,
    approval_action TEXT,
    approval_expires_at TEXT,
    -- The setup status after the event (its failure: failure_*); setup_state NULL when none.
    setup_state TEXT,
    setup_revision INTEGER,
    setup_failed_step TEXT,
    setup_repository_commit TEXT
);
CREATE INDEX gw_timeline_project ON gw_timeline (project_id, sequence);
CREATE INDEX gw_timeline_work ON gw_timeline (work_id, sequence) WHERE work_id IS NOT NULL;
-- The artifacts an agent's final answer names, in order.
CREATE TABLE gw_timeline_artifact_ids (
    sequence INTEGER NOT NULL,
    position INTEGER NOT NULL,
    artifact_id TEXT NOT NULL,
    PRIMARY KEY (sequence, position)
);
-- A setup item's environment variable names, in order.
CREATE TABLE gw_timeline_environment_names (
    sequence INTEGER NOT NULL,
    position INTEGER NOT NULL,
    name TEXT NOT NULL,
    PRIMARY KEY (sequence, position)
);
";

// Its name (snake case) is both the stored value and the API's.
/// What a timeline item shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
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
    /// What the agent asks to do outside the runtime (`approval.requested`).
    Approval,
    /// The one decision on it: `approval.granted`, `.denied` or `.expired`.
    ApprovalDecision,
    /// How a granted approval was carried out: `execution.dry_run`,
    /// `execution.failed` or `tracker.issue.created` (status `dry_run`,
    /// `failed`, `created`; text the request, the reason or the issue URL).
    Execution,
}

impl ItemKind {
    pub const ALL: [Self; 15] = [
        Self::UserMessage,
        Self::UserAction,
        Self::Acknowledgement,
        Self::AgentMessage,
        Self::AgentBlocked,
        Self::AgentFinal,
        Self::AgentState,
        Self::Work,
        Self::WorkUpdated,
        Self::Flow,
        Self::Artifact,
        Self::Setup,
        Self::Approval,
        Self::ApprovalDecision,
        Self::Execution,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::UserMessage => "user_message",
            Self::UserAction => "user_action",
            Self::Acknowledgement => "acknowledgement",
            Self::AgentMessage => "agent_message",
            Self::AgentBlocked => "agent_blocked",
            Self::AgentFinal => "agent_final",
            Self::AgentState => "agent_state",
            Self::Work => "work",
            Self::WorkUpdated => "work_updated",
            Self::Flow => "flow",
            Self::Artifact => "artifact",
            Self::Setup => "setup",
            Self::Approval => "approval",
            Self::ApprovalDecision => "approval_decision",
            Self::Execution => "execution",
        }
    }
}

impl FromSql for ItemKind {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let name = value.as_str()?;
        Self::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| {
                FromSqlError::Other(format!("unknown timeline item kind {name:?}").into())
            })
    }
}

/// One timeline item as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemRow {
    pub sequence: u64,
    pub kind: ItemKind,
    pub event_id: String,
    pub event_type: String,
    pub time: String,
    pub project_id: String,
    pub correlation_id: String,
    pub work_id: Option<String>,
    pub thread_id: Option<String>,
    pub text: Option<String>,
    pub author: Option<String>,
    pub reply_to_event_id: Option<String>,
    pub status: Option<String>,
    pub provider: Option<String>,
    pub artifact_ids: Vec<String>,
    pub work: Option<WorkCardRow>,
    pub flow: Option<FlowRow>,
    /// Filled by [`items`] from the artifacts aggregate; [`item_of`] leaves it empty.
    pub artifact: Option<CardRow>,
    pub action: Option<ActionRow>,
    pub approval: Option<ApprovalRefRow>,
    pub setup: Option<SetupRow>,
    pub failure: Option<FailureRow>,
}

/// The approval an item is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRefRow {
    pub approval_id: String,
    /// What would be done (`issue.publish`); empty on a decision item.
    pub action: String,
    /// On a request item: past it, it can no longer be decided.
    pub expires_at: Option<String>,
}

/// A Work as a card on the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkCardRow {
    pub work_id: String,
    pub title: String,
    pub kind: String,
    pub status: String,
    pub summary: String,
}

/// A specialist flow's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRow {
    pub flow_run_id: String,
    pub flow_type: String,
    pub state: String,
    pub note: Option<String>,
}

/// A card action a user sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionRow {
    pub action_id: String,
    pub artifact_id: String,
}

impl ItemRow {
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
            approval: None,
            setup: None,
            failure: None,
        }
    }
}

/// Adds the item `event` shows, if any. Runs after the other aggregates
/// applied the event.
pub(super) fn apply(tx: &Transaction<'_>, event: &Envelope, sequence: u64) -> rusqlite::Result<()> {
    let t = event.event_type.as_str();
    let item = if SETUP_TYPES.contains(&t) {
        setup_item(tx, event, sequence)?
    } else {
        let work = match event.work_id {
            Some(work) if t == pb::WorkUpdated::TYPE => {
                works::find(tx, &event.org_id, &event.project_id, &work.to_string())?
            }
            _ => None,
        };
        item_of(event, sequence, work.as_ref())
    };
    match item {
        Some(item) => insert(tx, event.org_id.as_str(), &item),
        None => Ok(()),
    }
}

fn insert(tx: &Transaction<'_>, org: &str, item: &ItemRow) -> rusqlite::Result<()> {
    let sequence = item.sequence as i64;
    let failure = item.failure.as_ref();
    let work = item.work.as_ref();
    let flow = item.flow.as_ref();
    let action = item.action.as_ref();
    let approval = item.approval.as_ref();
    let setup = item.setup.as_ref();
    let inserted = tx
        .prepare_cached(&format!(
            "INSERT OR IGNORE INTO gw_timeline ({ITEM_COLUMNS}, org)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20,
                     ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33, ?34, ?35)"
        ))?
        .execute(params![
            sequence,
            item.kind.name(),
            item.event_id,
            item.event_type,
            item.time,
            item.project_id,
            item.correlation_id,
            item.work_id,
            item.thread_id,
            item.text,
            item.author,
            item.reply_to_event_id,
            item.status,
            item.provider,
            failure.map(|f| &f.code),
            failure.map(|f| &f.message),
            failure.map(|f| f.retryable),
            work.map(|w| &w.title),
            work.map(|w| &w.kind),
            work.map(|w| &w.status),
            work.map(|w| &w.summary),
            flow.map(|f| &f.flow_run_id),
            flow.map(|f| &f.flow_type),
            flow.map(|f| &f.state),
            flow.and_then(|f| f.note.as_ref()),
            action.map(|a| &a.action_id),
            action.map(|a| &a.artifact_id),
            setup.map(|s| &s.state),
            setup.map(|s| s.revision),
            setup.and_then(|s| s.failed_step.as_ref()),
            setup.and_then(|s| s.repository_commit.as_ref()),
            approval.map(|a| &a.approval_id),
            approval.map(|a| &a.action),
            approval.and_then(|a| a.expires_at.as_ref()),
            org,
        ])?;
    if inserted == 0 {
        return Ok(());
    }
    if !item.artifact_ids.is_empty() {
        replace_list(
            tx,
            "gw_timeline_artifact_ids",
            "sequence",
            "artifact_id",
            &sequence,
            &item.artifact_ids,
        )?;
    }
    if let Some(setup) = setup {
        replace_list(
            tx,
            "gw_timeline_environment_names",
            "sequence",
            "name",
            &sequence,
            &setup.environment_names,
        )?;
    }
    Ok(())
}

const ITEM_COLUMNS: &str = "sequence, kind, event_id, event_type, time, project_id, correlation_id, work_id, thread_id,
    text, author, reply_to_event_id, status, provider, failure_code, failure_message, failure_retryable,
    work_title, work_kind, work_status, work_summary, flow_run_id, flow_type, flow_state, flow_note,
    action_id, action_artifact_id, setup_state, setup_revision, setup_failed_step, setup_repository_commit,
    approval_id, approval_action, approval_expires_at";

fn item_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ItemRow> {
    let work_id: Option<String> = row.get(7)?;
    let failure = FailureRow::from_columns(row, 14)?;
    let work = match row.get::<_, Option<String>>(17)? {
        Some(title) => Some(WorkCardRow {
            work_id: work_id.clone().unwrap_or_default(),
            title,
            kind: row.get(18)?,
            status: row.get(19)?,
            summary: row.get(20)?,
        }),
        None => None,
    };
    let flow = match row.get::<_, Option<String>>(23)? {
        Some(state) => Some(FlowRow {
            flow_run_id: row.get(21)?,
            flow_type: row.get(22)?,
            state,
            note: row.get(24)?,
        }),
        None => None,
    };
    let action = match row.get::<_, Option<String>>(25)? {
        Some(action_id) => Some(ActionRow {
            action_id,
            artifact_id: row.get(26)?,
        }),
        None => None,
    };
    let setup = match row.get::<_, Option<String>>(27)? {
        Some(state) => Some(SetupRow {
            state,
            revision: row.get(28)?,
            failed_step: row.get(29)?,
            failure: failure.clone(),
            environment_names: Vec::new(),
            environment_values: Vec::new(),
            repository_commit: row.get(30)?,
        }),
        None => None,
    };
    let approval = match row.get::<_, Option<String>>(31)? {
        Some(approval_id) => Some(ApprovalRefRow {
            approval_id,
            action: row.get::<_, Option<String>>(32)?.unwrap_or_default(),
            expires_at: row.get(33)?,
        }),
        None => None,
    };
    Ok(ItemRow {
        sequence: row.get::<_, i64>(0)?.max(0) as u64,
        kind: row.get(1)?,
        event_id: row.get(2)?,
        event_type: row.get(3)?,
        time: row.get(4)?,
        project_id: row.get(5)?,
        correlation_id: row.get(6)?,
        work_id,
        thread_id: row.get(8)?,
        text: row.get(9)?,
        author: row.get(10)?,
        reply_to_event_id: row.get(11)?,
        status: row.get(12)?,
        provider: row.get(13)?,
        artifact_ids: Vec::new(),
        work,
        flow,
        artifact: None,
        action,
        approval,
        setup,
        failure,
    })
}

/// Fills what the page's items keep outside their rows: the artifact ids of
/// a final answer, a setup's environment names, an artifact's card. One query
/// per child table for the whole page, never one per item.
fn with_children(
    conn: &Connection,
    org: &OrgId,
    mut page: Vec<ItemRow>,
) -> rusqlite::Result<Vec<ItemRow>> {
    let sequences_where = |shows: fn(&ItemRow) -> bool| -> Vec<u64> {
        page.iter()
            .filter(|item| shows(item))
            .map(|item| item.sequence)
            .collect()
    };
    let finals = sequences_where(|item| lists_artifacts(item.kind));
    let setups = sequences_where(|item| item.setup.is_some());
    let artifact_items = sequences_where(|item| item.kind == ItemKind::Artifact);
    let mut artifact_ids = read_lists(conn, "gw_timeline_artifact_ids", "artifact_id", &finals)?;
    let mut environment_names = read_lists(conn, "gw_timeline_environment_names", "name", &setups)?;
    let mut cards = artifacts::cards(conn, org, &artifact_items)?;
    for item in &mut page {
        if lists_artifacts(item.kind) {
            item.artifact_ids = artifact_ids.remove(&item.sequence).unwrap_or_default();
        }
        if let Some(setup) = item.setup.as_mut() {
            setup.environment_names = environment_names.remove(&item.sequence).unwrap_or_default();
        }
        if item.kind == ItemKind::Artifact {
            item.artifact = cards.remove(&item.sequence);
        }
    }
    Ok(page)
}

/// The project's items after `after`, oldest first; `work` narrows to one Work.
pub fn items(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
    work: Option<&str>,
    after: u64,
    limit: usize,
) -> rusqlite::Result<Vec<ItemRow>> {
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    let project = project.to_string();
    let rows: Vec<ItemRow> = match work {
        None => conn
            .prepare_cached(&format!(
                "SELECT {ITEM_COLUMNS} FROM gw_timeline
                 WHERE project_id = ?1 AND sequence > ?2 AND org = ?3 ORDER BY sequence LIMIT ?4"
            ))?
            .query_map(params![project, after, org.as_str(), limit as i64], item_row)?
            .collect::<rusqlite::Result<_>>()?,
        Some(work) => conn
            .prepare_cached(&format!(
                "SELECT {ITEM_COLUMNS} FROM gw_timeline
                 WHERE work_id = ?1 AND sequence > ?2 AND org = ?3 AND project_id = ?4 ORDER BY sequence LIMIT ?5"
            ))?
            .query_map(
                params![work, after, org.as_str(), project, limit as i64],
                item_row,
            )?
            .collect::<rusqlite::Result<_>>()?,
    };
    with_children(conn, org, rows)
}

/// The flow states that end a flow.
const FLOW_ENDINGS: [&str; 3] = ["completed", "failed", "cancelled"];

/// What awaits `replier` (an external agent's id) in `projects` after
/// stream sequence `after`, oldest first: the users' messages it has not
/// answered, and the endings of the flows it requested that it has not
/// answered either (its candidates).
pub fn awaiting(
    conn: &Connection,
    org: &OrgId,
    projects: &[ProjectId],
    replier: &str,
    after: u64,
    limit: usize,
) -> rusqlite::Result<Vec<ItemRow>> {
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    let projects: Vec<String> = projects.iter().map(ToString::to_string).collect();
    let projects = serde_json::to_string(&projects).unwrap_or_else(|_| "[]".to_owned());
    conn.prepare_cached(&format!(
        "SELECT {ITEM_COLUMNS} FROM gw_timeline AS item
         WHERE org = ?1 AND sequence > ?3
         AND project_id IN (SELECT value FROM json_each(?4))
         AND (kind = ?2 OR (kind = ?7 AND flow_state IN (?8, ?9, ?10) AND EXISTS (
             SELECT 1 FROM gw_timeline AS request WHERE request.org = ?1
             AND request.project_id = item.project_id AND request.kind = ?7
             AND request.flow_run_id = item.flow_run_id AND request.flow_state = 'requested'
             AND request.author = ?6)))
         AND NOT EXISTS (SELECT 1 FROM gw_timeline AS reply WHERE reply.org = ?1
             AND reply.project_id = item.project_id AND reply.reply_to_event_id = item.event_id
             AND reply.author = ?6)
         ORDER BY sequence LIMIT ?5"
    ))?
    .query_map(
        params![
            org.as_str(),
            ItemKind::UserMessage.name(),
            after,
            projects,
            limit as i64,
            replier,
            ItemKind::Flow.name(),
            FLOW_ENDINGS[0],
            FLOW_ENDINGS[1],
            FLOW_ENDINGS[2],
        ],
        item_row,
    )?
    .collect()
}

/// Whether `item` is something `agent` may act on: a user's message, or
/// the ending of a flow `agent` requested.
pub fn awaits(
    conn: &Connection,
    org: &OrgId,
    item: &ItemRow,
    agent: &str,
) -> rusqlite::Result<bool> {
    match item.kind {
        ItemKind::UserMessage => Ok(true),
        ItemKind::Flow => {
            let Some(flow) = item
                .flow
                .as_ref()
                .filter(|flow| FLOW_ENDINGS.contains(&flow.state.as_str()))
            else {
                return Ok(false);
            };
            conn.prepare_cached(
                "SELECT 1 FROM gw_timeline WHERE org = ?1 AND project_id = ?2 AND kind = ?3
                 AND flow_run_id = ?4 AND flow_state = 'requested' AND author = ?5",
            )?
            .query_row(
                params![
                    org.as_str(),
                    item.project_id,
                    ItemKind::Flow.name(),
                    flow.flow_run_id,
                    agent
                ],
                |_| Ok(()),
            )
            .optional()
            .map(|found| found.is_some())
        }
        _ => Ok(false),
    }
}

/// The item of event `event_id` in `project`, if the timeline shows it.
pub fn item_of_event(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
    event_id: &str,
) -> rusqlite::Result<Option<ItemRow>> {
    conn.prepare_cached(&format!(
        "SELECT {ITEM_COLUMNS} FROM gw_timeline WHERE org = ?1 AND project_id = ?2 AND event_id = ?3"
    ))?
    .query_row(params![org.as_str(), project.to_string(), event_id], item_row)
    .optional()
}

/// The newest `limit` texts `author` posted as agent messages in `project`,
/// newest first (the near-duplicate guard's memory).
pub fn recent_texts_of(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
    author: &str,
    limit: usize,
) -> rusqlite::Result<Vec<String>> {
    conn.prepare_cached(
        "SELECT text FROM gw_timeline WHERE org = ?1 AND project_id = ?2 AND kind = ?3 AND author = ?4
         AND text IS NOT NULL ORDER BY sequence DESC LIMIT ?5",
    )?
    .query_map(
        params![
            org.as_str(),
            project.to_string(),
            ItemKind::AgentMessage.name(),
            author,
            limit as i64
        ],
        |row| row.get(0),
    )?
    .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::read_model::tests::{TestStore, envelope};
    use crate::read_model::works::WorkRow;
    use zopu_schema::{FlowRunId, WorkId};

    #[test]
    fn every_kind_is_stored_under_its_api_name() {
        for kind in ItemKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.name());
        }
    }

    #[test]
    fn agent_posts_and_work_cards_become_items_and_quiet_progress_does_not() {
        let project = ProjectId::new();
        let work = WorkId::new();
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
        created.work_id = Some(work);
        let item = item_of(&created, 7, None).unwrap();
        assert_eq!((item.kind, item.sequence), (ItemKind::Work, 7));
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
            item_of(&ack, 8, None).unwrap().text.as_deref(),
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
        assert!(item_of(&quiet, 9, None).is_none());
        let unrelated = envelope("acme", project, &pb::ThreadCreated::default(), 4);
        assert!(item_of(&unrelated, 10, None).is_none());
    }

    #[test]
    fn a_work_update_shows_the_stored_work_with_the_new_status() {
        let project = ProjectId::new();
        let work = WorkId::new();
        let mut updated = envelope(
            "acme",
            project,
            &pb::WorkUpdated {
                status: "done".into(),
                ..Default::default()
            },
            1,
        );
        updated.work_id = Some(work);
        let stored = WorkRow {
            work_id: work.to_string(),
            project_id: project.to_string(),
            title: "Explore auth".into(),
            summary: "kept".into(),
            kind: "explore".into(),
            status: "done".into(),
            created_at: String::new(),
            updated_at: String::new(),
        };
        let item = item_of(&updated, 5, Some(&stored)).unwrap();
        assert_eq!(item.status.as_deref(), Some("done"));
        assert_eq!(
            item.work,
            Some(WorkCardRow {
                work_id: work.to_string(),
                title: "Explore auth".into(),
                kind: "explore".into(),
                status: "done".into(),
                summary: "kept".into(),
            })
        );
    }

    /// Every part an item can show, stored and read back as it was built.
    #[test]
    fn items_read_back_exactly_as_built() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap();
        let work = WorkId::new();
        let flow = FlowRunId::new();
        let in_work = |mut event: Envelope| {
            event.work_id = Some(work);
            event
        };
        let in_flow = |mut event: Envelope| {
            event.work_id = Some(work);
            event.flow_run_id = Some(flow);
            event
        };
        let events = vec![
            envelope(
                "acme",
                project,
                &pb::TimelineMessageSent {
                    text: "explore the login".into(),
                    author: Some(pb::Actor {
                        id: "ana".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                1,
            ),
            envelope(
                "acme",
                project,
                &pb::TimelineActionSent {
                    action_id: "create_issue".into(),
                    artifact_id: "art-1".into(),
                    ..Default::default()
                },
                2,
            ),
            in_work(envelope(
                "acme",
                project,
                &pb::WorkCreated {
                    title: "Explore login".into(),
                    kind: "explore".into(),
                    summary: "s".into(),
                    ..Default::default()
                },
                3,
            )),
            in_work(envelope(
                "acme",
                project,
                &pb::WorkUpdated {
                    status: "working".into(),
                    ..Default::default()
                },
                4,
            )),
            in_flow(envelope(
                "acme",
                project,
                &pb::FlowFailed {
                    flow_type: pb::FlowType::Explore as i32,
                    reason: Some(pb::FailureReason {
                        code: "flow.timeout".into(),
                        message: "act phase".into(),
                        retryable: true,
                    }),
                    ..Default::default()
                },
                5,
            )),
            in_flow(envelope(
                "acme",
                project,
                &pb::FlowCompleted {
                    flow_type: pb::FlowType::Issue as i32,
                    summary: "drafted".into(),
                    ..Default::default()
                },
                6,
            )),
            envelope(
                "acme",
                project,
                &pb::AgentFinal {
                    text: "done".into(),
                    agent_id: "agent-1".into(),
                    artifact_ids: vec!["art-1".into(), "art-2".into()],
                    ..Default::default()
                },
                7,
            ),
            envelope(
                "acme",
                project,
                &pb::AgentDisabled {
                    reason: "paused".into(),
                    ..Default::default()
                },
                8,
            ),
        ];
        let built: Vec<ItemRow> = events
            .iter()
            .enumerate()
            .map(|(index, event)| {
                let stored_work = (event.event_type == pb::WorkUpdated::TYPE).then(|| WorkRow {
                    work_id: work.to_string(),
                    project_id: project.to_string(),
                    title: "Explore login".into(),
                    summary: "s".into(),
                    kind: "explore".into(),
                    status: "working".into(),
                    created_at: String::new(),
                    updated_at: String::new(),
                });
                item_of(event, index as u64 + 1, stored_work.as_ref()).unwrap()
            })
            .collect();
        store.apply(&events);

        let read = items(&store.connection, &org, &project, None, 0, 100).unwrap();
        assert_eq!(read, built);
        let of_work = items(
            &store.connection,
            &org,
            &project,
            Some(&work.to_string()),
            0,
            100,
        )
        .unwrap();
        assert_eq!(of_work, built[2..6].to_vec());
        let page = items(&store.connection, &org, &project, None, 2, 3).unwrap();
        assert_eq!(page, built[2..5].to_vec());
        assert!(
            items(
                &store.connection,
                &"other".parse().unwrap(),
                &project,
                None,
                0,
                100
            )
            .unwrap()
            .is_empty()
        );
    }

    fn published_with_card(
        artifact_id: &str,
        facts: &[&str],
        actions: &[&str],
    ) -> pb::ArtifactPublished {
        pb::ArtifactPublished {
            artifact_id: artifact_id.into(),
            revision: 1,
            kind: pb::ArtifactKind::Issue as i32,
            title: format!("{artifact_id} title"),
            summary: format!("{artifact_id} summary"),
            card: Some(pb::ArtifactCard {
                label: format!("{artifact_id} label"),
                facts: facts
                    .iter()
                    .map(|fact| pb::CardFact {
                        label: format!("{fact} label"),
                        value: format!("{fact} value"),
                    })
                    .collect(),
                actions: actions
                    .iter()
                    .map(|action| pb::CardAction {
                        id: (*action).into(),
                        label: format!("{action} label"),
                        style: "secondary".into(),
                        ..Default::default()
                    })
                    .collect(),
            }),
            provider: "offline".into(),
            ..Default::default()
        }
    }

    /// A page mixing every kind of item, with several items of each kind
    /// that keeps child rows (cards, artifact ids, environment names) and
    /// another project's items in between, reads back exactly as each item
    /// was built when its event was applied, whole and in pages.
    #[test]
    fn a_page_of_every_kind_reads_back_exactly_as_built_item_by_item() {
        let mut store = TestStore::new();
        let org: OrgId = "acme".parse().unwrap();
        let project = ProjectId::new();
        let elsewhere = ProjectId::new();
        let work = WorkId::new();
        let flow = FlowRunId::new();
        let in_flow = |mut event: Envelope| {
            event.work_id = Some(work);
            event.flow_run_id = Some(flow);
            event
        };
        let final_answer = |text: &str, artifact_ids: &[&str]| pb::AgentFinal {
            text: text.into(),
            agent_id: "agent-1".into(),
            artifact_ids: artifact_ids.iter().map(|id| (*id).into()).collect(),
            ..Default::default()
        };
        let ours: Vec<Envelope> = vec![
            envelope(
                "acme",
                project,
                &pb::ProjectSetupRequested {
                    repository_url: "https://example.com/r.git".into(),
                    branch: "main".into(),
                    setup_revision: 1,
                    ..Default::default()
                },
                1,
            ),
            envelope(
                "acme",
                project,
                &pb::ProjectReady {
                    setup_revision: 1,
                    repository_commit: "abc".into(),
                    environment_variable_names: vec!["API_URL".into(), "TOKEN_NAME".into()],
                    ..Default::default()
                },
                2,
            ),
            envelope(
                "acme",
                project,
                &pb::TimelineMessageSent {
                    text: "explore the login".into(),
                    ..Default::default()
                },
                3,
            ),
            envelope(
                "acme",
                project,
                &pb::AgentAcknowledged {
                    text: "On it".into(),
                    agent_id: "agent-1".into(),
                    provider: "offline".into(),
                    ..Default::default()
                },
                4,
            ),
            envelope(
                "acme",
                project,
                &pb::AgentMessage {
                    text: "Looking".into(),
                    agent_id: "agent-1".into(),
                    status: "working".into(),
                    ..Default::default()
                },
                5,
            ),
            envelope(
                "acme",
                project,
                &pb::AgentBlocked {
                    question: "Which login?".into(),
                    agent_id: "agent-1".into(),
                    ..Default::default()
                },
                6,
            ),
            in_flow(envelope(
                "acme",
                project,
                &pb::WorkCreated {
                    title: "Explore login".into(),
                    kind: "explore".into(),
                    summary: "s".into(),
                    ..Default::default()
                },
                7,
            )),
            in_flow(envelope(
                "acme",
                project,
                &pb::FlowRequested {
                    flow_type: pb::FlowType::Explore as i32,
                    ..Default::default()
                },
                8,
            )),
            in_flow(envelope(
                "acme",
                project,
                &pb::FlowProgress {
                    visible: true,
                    note: "reading auth.rs".into(),
                    ..Default::default()
                },
                9,
            )),
            in_flow(envelope(
                "acme",
                project,
                &published_with_card("art-1", &["files", "risk"], &["create_issue"]),
                10,
            )),
            envelope("acme", project, &final_answer("found it", &["art-1"]), 11),
            envelope(
                "acme",
                project,
                &pb::TimelineActionSent {
                    action_id: "create_issue".into(),
                    artifact_id: "art-1".into(),
                    ..Default::default()
                },
                12,
            ),
            in_flow(envelope(
                "acme",
                project,
                &published_with_card("art-2", &["steps"], &["open", "dismiss"]),
                13,
            )),
            in_flow(envelope(
                "acme",
                project,
                &pb::WorkUpdated {
                    status: "done".into(),
                    ..Default::default()
                },
                14,
            )),
            envelope(
                "acme",
                project,
                &pb::AgentFinal {
                    failure: Some(pb::FailureReason {
                        code: "model.unavailable".into(),
                        message: "try later".into(),
                        retryable: true,
                    }),
                    ..final_answer("drafted", &["art-2", "art-1"])
                },
                15,
            ),
            envelope(
                "acme",
                project,
                &pb::AgentDisabled {
                    reason: "paused".into(),
                    ..Default::default()
                },
                16,
            ),
            envelope("acme", project, &pb::AgentEnabled::default(), 17),
            envelope(
                "acme",
                project,
                &pb::ApprovalRequested {
                    approval_id: "approval:art-1:issue.publish".into(),
                    action: "issue.publish".into(),
                    detail: "Publish the issue.".into(),
                    expires_at: "2999-01-01T00:00:00.000000000Z".into(),
                    ..Default::default()
                },
                17,
            ),
            envelope(
                "acme",
                project,
                &pb::ApprovalDenied {
                    approval_id: "approval:art-1:issue.publish".into(),
                    by: Some(pb::Actor {
                        kind: pb::actor::Kind::User as i32,
                        id: "lead".into(),
                    }),
                    reason: "Not yet.".into(),
                },
                17,
            ),
            envelope(
                "acme",
                project,
                &pb::TrackerIssueCreated {
                    approval_id: "approval:art-1:issue.publish".into(),
                    artifact_id: "art-1".into(),
                    url: "https://tracker.example/acme/r/issues/3".into(),
                    number: 3,
                    ..Default::default()
                },
                17,
            ),
            envelope(
                "acme",
                project,
                &pb::ProjectSetupRequested {
                    repository_url: "https://example.com/r.git".into(),
                    branch: "main".into(),
                    setup_revision: 2,
                    ..Default::default()
                },
                18,
            ),
            envelope(
                "acme",
                project,
                &pb::ProjectReady {
                    setup_revision: 2,
                    repository_commit: "def".into(),
                    environment_variable_names: vec!["DATABASE_URL".into()],
                    ..Default::default()
                },
                19,
            ),
        ];
        let mut built = Vec::new();
        for (index, event) in ours.iter().enumerate() {
            // Another project's items with child rows sit between ours.
            let theirs = if index % 2 == 0 {
                envelope(
                    "acme",
                    elsewhere,
                    &published_with_card("theirs", &["x"], &["y"]),
                    index as u64 + 1,
                )
            } else {
                envelope(
                    "acme",
                    elsewhere,
                    &final_answer("theirs", &["theirs"]),
                    index as u64 + 1,
                )
            };
            store.apply(&[theirs]);
            let sequence = store.apply(std::slice::from_ref(event));
            let conn = &store.connection;
            let item = if SETUP_TYPES.contains(&event.event_type.as_str()) {
                setup_item(conn, event, sequence).unwrap()
            } else {
                let stored_work = match event.work_id {
                    Some(work) if event.event_type == pb::WorkUpdated::TYPE => {
                        works::find(conn, &org, &project, &work.to_string()).unwrap()
                    }
                    _ => None,
                };
                item_of(event, sequence, stored_work.as_ref()).map(|mut item| {
                    if item.kind == ItemKind::Artifact {
                        item.artifact = artifacts::card(conn, &org, sequence).unwrap();
                    }
                    item
                })
            };
            built.push(item.unwrap());
        }
        let mut kinds: Vec<&str> = built.iter().map(|item| item.kind.name()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        let mut every_kind: Vec<&str> = ItemKind::ALL.iter().map(|kind| kind.name()).collect();
        every_kind.sort_unstable();
        assert_eq!(kinds, every_kind, "the page mixes every kind of item");
        assert!(built.iter().all(|item| {
            match item.kind {
                ItemKind::Artifact => item
                    .artifact
                    .as_ref()
                    .is_some_and(|card| !card.facts.is_empty()),
                ItemKind::AgentFinal => !item.artifact_ids.is_empty(),
                _ => true,
            }
        }));
        assert_eq!(
            built
                .last()
                .unwrap()
                .setup
                .as_ref()
                .unwrap()
                .environment_names,
            vec!["DATABASE_URL".to_owned()]
        );

        // A card reads as it is now: the issue published later on the page
        // says so on its earlier card.
        for item in built
            .iter_mut()
            .filter(|item| item.kind == ItemKind::Artifact)
        {
            item.artifact = artifacts::card(&store.connection, &org, item.sequence).unwrap();
        }
        assert!(
            built
                .iter()
                .filter_map(|item| item.artifact.as_ref())
                .any(|card| card.published_url.is_some())
        );
        let whole = items(&store.connection, &org, &project, None, 0, 200).unwrap();
        assert_eq!(whole, built);
        let mut paged = Vec::new();
        let mut after = 0;
        loop {
            let page = items(&store.connection, &org, &project, None, after, 4).unwrap();
            let Some(last) = page.last() else { break };
            after = last.sequence;
            paged.extend(page);
        }
        assert_eq!(paged, built);
        let of_work: Vec<ItemRow> = built
            .iter()
            .filter(|item| item.work_id == Some(work.to_string()))
            .cloned()
            .collect();
        assert_eq!(
            items(
                &store.connection,
                &org,
                &project,
                Some(&work.to_string()),
                0,
                200
            )
            .unwrap(),
            of_work
        );
    }

    #[test]
    fn setup_items_keep_the_status_they_showed() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap();
        store.apply(&[
            envelope(
                "acme",
                project,
                &pb::ProjectSetupRequested {
                    repository_url: "https://example.com/r.git".into(),
                    branch: "main".into(),
                    setup_revision: 1,
                    ..Default::default()
                },
                1,
            ),
            envelope(
                "acme",
                project,
                &pb::ProjectReady {
                    setup_revision: 1,
                    repository_commit: "abc".into(),
                    environment_variable_names: vec!["TOKEN_NAME".into()],
                    ..Default::default()
                },
                2,
            ),
        ]);
        let read = items(&store.connection, &org, &project, None, 0, 100).unwrap();
        let states: Vec<(ItemKind, Option<&str>)> = read
            .iter()
            .map(|item| (item.kind, item.status.as_deref()))
            .collect();
        assert_eq!(
            states,
            vec![
                (ItemKind::Setup, Some("creating_workspace")),
                (ItemKind::Setup, Some("ready"))
            ]
        );
        let ready = read[1].setup.clone().unwrap();
        assert_eq!(ready.environment_names, vec!["TOKEN_NAME".to_owned()]);
        assert_eq!(ready.repository_commit.as_deref(), Some("abc"));
        assert!(read[0].setup.as_ref().unwrap().environment_names.is_empty());
    }

    #[test]
    fn an_artifact_item_shows_the_card_published_at_its_sequence() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap();
        let sequence = store.apply(&[envelope(
            "acme",
            project,
            &pb::ArtifactPublished {
                artifact_id: "art-9".into(),
                revision: 3,
                title: "Issue".into(),
                ..Default::default()
            },
            1,
        )]);
        let read = items(&store.connection, &org, &project, None, 0, 100).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].kind, ItemKind::Artifact);
        assert_eq!(
            read[0].artifact,
            artifacts::card(&store.connection, &org, sequence).unwrap()
        );
        assert_eq!(read[0].artifact.as_ref().unwrap().revision, 3);
    }
}
