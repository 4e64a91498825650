//! The AgentRun log (Numu plan): one row per run of any agent — a
//! conversation turn (`dispatch.accepted` … `dispatch.completed` /
//! `dispatch.failed`) or a specialist flow (`flow.started` … `flow.completed`
//! / `flow.failed` / `flow.cancelled`) — with the definition it ran under,
//! its output, what it recommended and how that approval went; plus the
//! runs' internal notes and the handoffs between agents.
//!
//! Invariants: a run is recorded once, by the event that starts it; only a
//! running run is ended, and only once (a redelivered or late end changes
//! nothing). Notes are kept here and never reach the timeline. A handoff
//! that supersedes another marks the earlier one `superseded_by`; a chain
//! shows its latest link as current.

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use zopu_schema::envelope::format_time;
use zopu_schema::{Envelope, Event, OrgId, approval, pb};

pub const TABLES: &[&str] = &["gw_runs", "gw_run_notes", "gw_handoffs"];

pub const SCHEMA: &str = "
CREATE TABLE gw_runs (
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    agent_key TEXT NOT NULL,
    agent_version TEXT NOT NULL,
    definition_hash TEXT NOT NULL,
    prompt_package_version TEXT NOT NULL,
    knowledge_hash TEXT NOT NULL,
    model TEXT NOT NULL,
    input_event_id TEXT NOT NULL,
    created_by TEXT NOT NULL,
    status TEXT NOT NULL,
    output TEXT,
    recommendation TEXT,
    approval_id TEXT,
    approval_status TEXT,
    error_code TEXT,
    error_message TEXT,
    started_sequence INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    completed_at TEXT,
    PRIMARY KEY (org, project_id, run_id)
);
CREATE INDEX gw_runs_org ON gw_runs (org, started_sequence);
CREATE TABLE gw_run_notes (
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    agent_key TEXT NOT NULL,
    text TEXT NOT NULL,
    recorded_at TEXT NOT NULL,
    PRIMARY KEY (org, sequence)
);
CREATE INDEX gw_run_notes_run ON gw_run_notes (org, project_id, run_id);
CREATE TABLE gw_handoffs (
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    handoff_id TEXT NOT NULL,
    source_run_id TEXT NOT NULL,
    source_agent_key TEXT NOT NULL,
    target_agent_key TEXT NOT NULL,
    flow TEXT NOT NULL,
    brief TEXT NOT NULL,
    target_run_id TEXT,
    supersedes_handoff_id TEXT,
    correction TEXT,
    superseded_by TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (org, project_id, handoff_id)
);
CREATE INDEX gw_handoffs_source ON gw_handoffs (org, project_id, source_run_id);
";

/// The event types that change the run log (a reader of the log may read
/// only these).
pub const EVENT_TYPES: &[&str] = &[
    pb::DispatchAccepted::TYPE,
    pb::AgentDecided::TYPE,
    pb::DispatchCompleted::TYPE,
    pb::DispatchFailed::TYPE,
    pb::FlowStarted::TYPE,
    pb::FlowCompleted::TYPE,
    pb::FlowFailed::TYPE,
    pb::FlowCancelled::TYPE,
    pb::ApprovalRequested::TYPE,
    pb::ApprovalGranted::TYPE,
    pb::ApprovalDenied::TYPE,
    pb::ApprovalExpired::TYPE,
    pb::AgentNoteRecorded::TYPE,
    pb::AgentHandoffCreated::TYPE,
];

/// A run's status as stored.
pub const RUNNING: &str = "running";
pub const CANCELLED: &str = "cancelled";
pub const STATUSES: [&str; 4] = [RUNNING, "completed", "failed", CANCELLED];
/// The kind of a specialist flow's run (a conversation turn's is `conversation_turn`).
pub const FLOW: &str = "flow";

/// Characters of a run's output kept in the log (a flow's result beyond
/// this stays in its `flow.completed`).
const OUTPUT_CHARS_MAX: usize = 20_000;

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRow {
    pub project_id: String,
    pub run_id: String,
    /// `conversation_turn` or `flow`.
    pub kind: String,
    pub agent_key: String,
    pub agent_version: String,
    pub definition_hash: String,
    pub prompt_package_version: String,
    pub knowledge_hash: String,
    pub model: String,
    pub input_event_id: String,
    pub created_by: String,
    pub status: String,
    /// The validated structured output, as JSON.
    pub output: Option<String>,
    pub recommendation: Option<String>,
    pub approval_id: Option<String>,
    pub approval_status: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    pub started_sequence: u64,
    pub created_at: String,
    pub completed_at: Option<String>,
}

/// An internal note of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoteRow {
    pub run_id: String,
    pub agent_key: String,
    pub text: String,
    pub recorded_at: String,
}

/// A handoff from a run to another agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffRow {
    pub handoff_id: String,
    pub source_run_id: String,
    pub source_agent_key: String,
    pub target_agent_key: String,
    pub flow: String,
    pub brief: String,
    /// The flow run the handoff started, when it names one.
    pub target_run_id: Option<String>,
    pub supersedes_handoff_id: Option<String>,
    pub correction: Option<String>,
    pub superseded_by: Option<String>,
    pub created_at: String,
}

/// Which runs a query wants.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub project_id: Option<String>,
    pub agent_key: Option<String>,
    pub status: Option<String>,
    /// Runs started after this stream sequence.
    pub after: u64,
    pub limit: u32,
}

fn start(
    tx: &Transaction<'_>,
    event: &Envelope,
    sequence: u64,
    (run_id, kind, fallback_agent): (&str, &str, &str),
    definition: Option<&pb::AgentRunDefinition>,
) -> rusqlite::Result<()> {
    let empty = pb::AgentRunDefinition::default();
    let d = definition.unwrap_or(&empty);
    let agent_key = if d.agent_key.is_empty() {
        fallback_agent
    } else {
        d.agent_key.as_str()
    };
    tx.prepare_cached(
        "INSERT OR IGNORE INTO gw_runs (org, project_id, run_id, kind, agent_key, agent_version, definition_hash,
             prompt_package_version, knowledge_hash, model, input_event_id, created_by, status, started_sequence, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
    )?
    .execute(params![
        event.org_id.as_str(),
        event.project_id.to_string(),
        run_id,
        kind,
        agent_key,
        d.agent_version,
        d.definition_hash,
        d.prompt_package_version,
        d.knowledge_hash,
        d.model,
        d.input_event_id,
        zopu_schema::actor_label(d.created_by.as_ref()),
        RUNNING,
        sequence as i64,
        format_time(event.time),
    ])?;
    Ok(())
}

fn end(
    tx: &Transaction<'_>,
    event: &Envelope,
    run_id: &str,
    status: &str,
    output: Option<&str>,
    error: Option<&pb::FailureReason>,
) -> rusqlite::Result<()> {
    let output = output.map(|text| zopu_runtime::text::clip_chars(text, OUTPUT_CHARS_MAX));
    tx.prepare_cached(
        "UPDATE gw_runs SET status = ?1, output = COALESCE(?2, output), error_code = ?3, error_message = ?4, completed_at = ?5
         WHERE org = ?6 AND project_id = ?7 AND run_id = ?8 AND status = ?9",
    )?
    .execute(params![
        status,
        output,
        error.map(|reason| reason.code.as_str()),
        error.map(|reason| reason.message.as_str()),
        format_time(event.time),
        event.org_id.as_str(),
        event.project_id.to_string(),
        run_id,
        RUNNING,
    ])?;
    Ok(())
}

/// Applies what `event` changes of the run log. An event that does not
/// decode changes nothing here (the runtime dead-letters it).
pub fn apply(tx: &Transaction<'_>, event: &Envelope, sequence: u64) -> rusqlite::Result<()> {
    let dispatch = event.dispatch_id.map(|id| id.to_string());
    let flow_run = event.flow_run_id.map(|id| id.to_string());
    match event.event_type.as_str() {
        t if t == pb::DispatchAccepted::TYPE => {
            if let (Some(run), Ok(m)) = (&dispatch, event.decode::<pb::DispatchAccepted>()) {
                let kind = ("conversation_turn", "conversation");
                start(
                    tx,
                    event,
                    sequence,
                    (run, kind.0, kind.1),
                    m.definition.as_ref(),
                )?;
            }
        }
        t if t == pb::AgentDecided::TYPE => {
            if let (Some(run), Ok(m)) = (&dispatch, event.decode::<pb::AgentDecided>()) {
                let decision = pb::agent_decided::Decision::try_from(m.decision)
                    .map_or("unspecified", |d| d.as_str_name());
                let output = serde_json::json!({
                    "decision": decision.trim_start_matches("DECISION_").to_ascii_lowercase(),
                    "rationale": m.rationale,
                    "provider": m.provider,
                });
                tx.prepare_cached(
                    "UPDATE gw_runs SET output = ?1 WHERE org = ?2 AND project_id = ?3 AND run_id = ?4",
                )?
                .execute(params![
                    output.to_string(),
                    event.org_id.as_str(),
                    event.project_id.to_string(),
                    run
                ])?;
            }
        }
        t if t == pb::DispatchCompleted::TYPE => {
            if let Some(run) = &dispatch {
                end(tx, event, run, "completed", None, None)?;
            }
        }
        t if t == pb::DispatchFailed::TYPE => {
            if let (Some(run), Ok(m)) = (&dispatch, event.decode::<pb::DispatchFailed>()) {
                end(tx, event, run, "failed", None, m.reason.as_ref())?;
            }
        }
        t if t == pb::FlowStarted::TYPE => {
            if let (Some(run), Ok(m)) = (&flow_run, event.decode::<pb::FlowStarted>()) {
                start(tx, event, sequence, (run, FLOW, ""), m.definition.as_ref())?;
            }
        }
        t if t == pb::FlowCompleted::TYPE => {
            if let (Some(run), Ok(m)) = (&flow_run, event.decode::<pb::FlowCompleted>()) {
                let output = (!m.result_json.is_empty()).then_some(m.result_json.as_str());
                end(tx, event, run, "completed", output, None)?;
            }
        }
        t if t == pb::FlowFailed::TYPE => {
            if let (Some(run), Ok(m)) = (&flow_run, event.decode::<pb::FlowFailed>()) {
                end(tx, event, run, "failed", None, m.reason.as_ref())?;
            }
        }
        t if t == pb::FlowCancelled::TYPE => {
            if let (Some(run), Ok(m)) = (&flow_run, event.decode::<pb::FlowCancelled>()) {
                let reason = pb::FailureReason {
                    code: "flow.cancelled".to_owned(),
                    message: m.reason,
                    retryable: false,
                };
                end(tx, event, run, CANCELLED, None, Some(&reason))?;
            }
        }
        t if t == pb::ApprovalRequested::TYPE => {
            if let (Some(run), Ok(m)) = (&dispatch, event.decode::<pb::ApprovalRequested>()) {
                tx.prepare_cached(
                    "UPDATE gw_runs SET recommendation = ?1, approval_id = ?2, approval_status = ?3
                     WHERE org = ?4 AND project_id = ?5 AND run_id = ?6",
                )?
                .execute(params![
                    m.action,
                    m.approval_id,
                    approval::Status::Pending.as_str(),
                    event.org_id.as_str(),
                    event.project_id.to_string(),
                    run
                ])?;
            }
        }
        t if t == pb::AgentNoteRecorded::TYPE => {
            if let Ok(m) = event.decode::<pb::AgentNoteRecorded>() {
                tx.prepare_cached(
                    "INSERT OR IGNORE INTO gw_run_notes (org, project_id, run_id, sequence, agent_key, text, recorded_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?
                .execute(params![
                    event.org_id.as_str(),
                    event.project_id.to_string(),
                    m.run_id,
                    sequence as i64,
                    m.agent_key,
                    m.text,
                    format_time(event.time),
                ])?;
            }
        }
        t if t == pb::AgentHandoffCreated::TYPE => {
            if let Ok(m) = event.decode::<pb::AgentHandoffCreated>() {
                record_handoff(tx, event, &m, flow_run.as_deref())?;
            }
        }
        _ => {
            if let Some(decided) = approval::decision_of(event) {
                tx.prepare_cached(
                    "UPDATE gw_runs SET approval_status = ?1
                     WHERE org = ?2 AND project_id = ?3 AND approval_id = ?4 AND approval_status = ?5",
                )?
                .execute(params![
                    decided.status.as_str(),
                    event.org_id.as_str(),
                    event.project_id.to_string(),
                    decided.approval_id,
                    approval::Status::Pending.as_str(),
                ])?;
            }
        }
    }
    Ok(())
}

fn record_handoff(
    tx: &Transaction<'_>,
    event: &Envelope,
    handoff: &pb::AgentHandoffCreated,
    target_run: Option<&str>,
) -> rusqlite::Result<()> {
    let (org, project) = (event.org_id.as_str(), event.project_id.to_string());
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO gw_handoffs (org, project_id, handoff_id, source_run_id, source_agent_key, target_agent_key,
                 flow, brief, target_run_id, supersedes_handoff_id, correction, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, NULLIF(?10, ''), NULLIF(?11, ''), ?12)",
        )?
        .execute(params![
            org,
            project,
            handoff.handoff_id,
            handoff.source_run_id,
            handoff.source_agent_key,
            handoff.target_agent_key,
            handoff.flow,
            handoff.brief,
            target_run,
            handoff.supersedes_handoff_id,
            handoff.correction,
            format_time(event.time),
        ])?;
    if inserted > 0 && !handoff.supersedes_handoff_id.is_empty() {
        tx.prepare_cached(
            "UPDATE gw_handoffs SET superseded_by = ?1
             WHERE org = ?2 AND project_id = ?3 AND handoff_id = ?4 AND superseded_by IS NULL",
        )?
        .execute(params![
            handoff.handoff_id,
            org,
            project,
            handoff.supersedes_handoff_id
        ])?;
    }
    Ok(())
}

fn run_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
    Ok(RunRow {
        project_id: row.get(0)?,
        run_id: row.get(1)?,
        kind: row.get(2)?,
        agent_key: row.get(3)?,
        agent_version: row.get(4)?,
        definition_hash: row.get(5)?,
        prompt_package_version: row.get(6)?,
        knowledge_hash: row.get(7)?,
        model: row.get(8)?,
        input_event_id: row.get(9)?,
        created_by: row.get(10)?,
        status: row.get(11)?,
        output: row.get(12)?,
        recommendation: row.get(13)?,
        approval_id: row.get(14)?,
        approval_status: row.get(15)?,
        error_code: row.get(16)?,
        error_message: row.get(17)?,
        started_sequence: row.get::<_, i64>(18)?.max(0) as u64,
        created_at: row.get(19)?,
        completed_at: row.get(20)?,
    })
}

const RUN_COLUMNS: &str = "project_id, run_id, kind, agent_key, agent_version, definition_hash, prompt_package_version,
    knowledge_hash, model, input_event_id, created_by, status, output, recommendation, approval_id, approval_status,
    error_code, error_message, started_sequence, created_at, completed_at";

/// The organization's runs matching `filter`, oldest first.
pub fn list(conn: &Connection, org: &OrgId, filter: &RunFilter) -> rusqlite::Result<Vec<RunRow>> {
    conn.prepare_cached(&format!(
        "SELECT {RUN_COLUMNS} FROM gw_runs
         WHERE org = ?1 AND started_sequence > ?2
           AND (?3 IS NULL OR project_id = ?3) AND (?4 IS NULL OR agent_key = ?4) AND (?5 IS NULL OR status = ?5)
         ORDER BY started_sequence LIMIT ?6"
    ))?
    .query_map(
        params![
            org.as_str(),
            filter.after as i64,
            filter.project_id,
            filter.agent_key,
            filter.status,
            i64::from(filter.limit)
        ],
        run_row,
    )?
    .collect()
}

/// One run of the organization.
pub fn get(conn: &Connection, org: &OrgId, run_id: &str) -> rusqlite::Result<Option<RunRow>> {
    conn.prepare_cached(&format!(
        "SELECT {RUN_COLUMNS} FROM gw_runs WHERE org = ?1 AND run_id = ?2"
    ))?
    .query_row(params![org.as_str(), run_id], run_row)
    .optional()
}

/// The internal notes of one run, in stream order.
pub fn notes(
    conn: &Connection,
    org: &OrgId,
    project_id: &str,
    run_id: &str,
) -> rusqlite::Result<Vec<NoteRow>> {
    conn.prepare_cached(
        "SELECT run_id, agent_key, text, recorded_at FROM gw_run_notes
         WHERE org = ?1 AND project_id = ?2 AND run_id = ?3 ORDER BY sequence",
    )?
    .query_map(params![org.as_str(), project_id, run_id], |row| {
        Ok(NoteRow {
            run_id: row.get(0)?,
            agent_key: row.get(1)?,
            text: row.get(2)?,
            recorded_at: row.get(3)?,
        })
    })?
    .collect()
}

/// The handoffs made by one run, and the one that started it (as its
/// target), oldest first.
pub fn handoffs(
    conn: &Connection,
    org: &OrgId,
    project_id: &str,
    run_id: &str,
) -> rusqlite::Result<Vec<HandoffRow>> {
    conn.prepare_cached(
        "SELECT handoff_id, source_run_id, source_agent_key, target_agent_key, flow, brief, target_run_id,
                supersedes_handoff_id, correction, superseded_by, created_at
         FROM gw_handoffs WHERE org = ?1 AND project_id = ?2 AND (source_run_id = ?3 OR target_run_id = ?3)
         ORDER BY rowid",
    )?
    .query_map(params![org.as_str(), project_id, run_id], |row| {
        Ok(HandoffRow {
            handoff_id: row.get(0)?,
            source_run_id: row.get(1)?,
            source_agent_key: row.get(2)?,
            target_agent_key: row.get(3)?,
            flow: row.get(4)?,
            brief: row.get(5)?,
            target_run_id: row.get(6)?,
            supersedes_handoff_id: row.get(7)?,
            correction: row.get(8)?,
            superseded_by: row.get(9)?,
            created_at: row.get(10)?,
        })
    })?
    .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::tests::{TestStore, envelope};
    use super::*;
    use zopu_schema::{DispatchId, FlowRunId, ProjectId};

    fn definition(key: &str) -> pb::AgentRunDefinition {
        pb::AgentRunDefinition {
            agent_key: key.to_owned(),
            agent_version: "1.0.0".to_owned(),
            definition_hash: "d".repeat(64),
            prompt_package_version: "1.0.0+abcdefabcdef".to_owned(),
            knowledge_hash: "abcdef".repeat(10),
            model: "offline".to_owned(),
            input_event_id: "input".to_owned(),
            created_by: Some(pb::Actor {
                kind: pb::actor::Kind::User as i32,
                id: "ana".to_owned(),
            }),
        }
    }

    #[test]
    fn a_turn_and_the_flow_it_hands_off_are_two_runs_with_their_fields() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let dispatch = DispatchId::new();
        let flow = FlowRunId::new();
        let with_dispatch = |mut event: Envelope| {
            event.dispatch_id = Some(dispatch);
            event
        };
        let with_flow = |mut event: Envelope| {
            event.flow_run_id = Some(flow);
            event
        };
        store.apply(&[
            with_dispatch(envelope(
                "acme",
                project,
                &pb::DispatchAccepted {
                    agent_id: "a".into(),
                    attempt: 1,
                    definition: Some(definition("conversation")),
                },
                1,
            )),
            with_dispatch(envelope(
                "acme",
                project,
                &pb::AgentDecided {
                    decision: pb::agent_decided::Decision::Explore as i32,
                    rationale: "a code question".into(),
                    ..Default::default()
                },
                2,
            )),
            with_flow(envelope(
                "acme",
                project,
                &pb::AgentHandoffCreated {
                    handoff_id: "h0".into(),
                    source_run_id: dispatch.to_string(),
                    source_agent_key: "conversation".into(),
                    target_agent_key: "explorer".into(),
                    flow: "explore".into(),
                    brief: "Where are cards charged?".into(),
                    ..Default::default()
                },
                3,
            )),
            with_dispatch(envelope(
                "acme",
                project,
                &pb::DispatchCompleted::default(),
                4,
            )),
            with_flow(envelope(
                "acme",
                project,
                &pb::FlowStarted {
                    definition: Some(definition("explorer")),
                    ..Default::default()
                },
                5,
            )),
            envelope(
                "acme",
                project,
                &pb::AgentNoteRecorded {
                    run_id: flow.to_string(),
                    agent_key: "explorer".into(),
                    text: "Finished: 0 replayed".into(),
                },
                6,
            ),
            with_flow(envelope(
                "acme",
                project,
                &pb::FlowFailed {
                    reason: Some(pb::FailureReason {
                        code: "flow.timeout".into(),
                        message: "too slow".into(),
                        retryable: true,
                    }),
                    ..Default::default()
                },
                7,
            )),
            // A late completion of an ended run changes nothing.
            with_flow(envelope("acme", project, &pb::FlowCompleted::default(), 8)),
        ]);
        let org: OrgId = "acme".parse().unwrap();
        let runs = list(
            &store.connection,
            &org,
            &RunFilter {
                limit: 10,
                ..RunFilter::default()
            },
        )
        .unwrap();
        assert_eq!(runs.len(), 2);
        let (turn, explore) = (&runs[0], &runs[1]);
        assert_eq!(
            (
                turn.kind.as_str(),
                turn.agent_key.as_str(),
                turn.status.as_str()
            ),
            ("conversation_turn", "conversation", "completed")
        );
        assert_eq!(turn.created_by, "user:ana");
        assert!(turn.output.as_deref().unwrap().contains("\"explore\""));
        assert_eq!(
            (explore.agent_key.as_str(), explore.status.as_str()),
            ("explorer", "failed")
        );
        assert_eq!(explore.error_code.as_deref(), Some("flow.timeout"));
        assert_eq!(explore.prompt_package_version, "1.0.0+abcdefabcdef");
        let project = project.to_string();
        let notes = notes(&store.connection, &org, &project, &explore.run_id).unwrap();
        assert_eq!(notes.len(), 1);
        let handoffs = handoffs(&store.connection, &org, &project, &explore.run_id).unwrap();
        assert_eq!(handoffs[0].source_run_id, turn.run_id);
        let other: OrgId = "other".parse().unwrap();
        assert!(
            get(&store.connection, &other, &turn.run_id)
                .unwrap()
                .is_none()
        );
        let filtered = list(
            &store.connection,
            &org,
            &RunFilter {
                agent_key: Some("explorer".into()),
                status: Some("failed".into()),
                limit: 10,
                ..RunFilter::default()
            },
        )
        .unwrap();
        assert_eq!(filtered.len(), 1);
    }

    #[test]
    fn a_correction_supersedes_the_handoff_it_names() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let handoff = |id: &str, supersedes: &str| {
            envelope(
                "acme",
                project,
                &pb::AgentHandoffCreated {
                    handoff_id: id.into(),
                    source_run_id: "run".into(),
                    source_agent_key: "conversation".into(),
                    target_agent_key: "explorer".into(),
                    flow: "explore".into(),
                    brief: "b".into(),
                    supersedes_handoff_id: supersedes.into(),
                    correction: if supersedes.is_empty() {
                        String::new()
                    } else {
                        "the gateway, not the CLI".into()
                    },
                },
                1,
            )
        };
        store.apply(&[handoff("h0", ""), handoff("h1", "h0"), handoff("h1", "h0")]);
        let org: OrgId = "acme".parse().unwrap();
        let rows = handoffs(&store.connection, &org, &project.to_string(), "run").unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].superseded_by.as_deref(), Some("h1"));
        assert_eq!(
            rows[1].correction.as_deref(),
            Some("the gateway, not the CLI")
        );
        assert!(rows[1].superseded_by.is_none());
    }
}
