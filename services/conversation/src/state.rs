//! The agent's state, rebuilt from events: one SQLite projection with the
//! project binding and ready info, the summary, the kill switch history, the
//! recent timeline, Work, Threads, flow runs, artifacts and the approvals it
//! requested (`crate::approvals`).
//!
//! Reads take the dispatch's stream sequence (`before`) and look only at what
//! was true before it, so a redelivered dispatch decides exactly as the first
//! delivery did, whatever happened on the stream since.

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use zopu_schema::{Envelope, Event, FlowRunId, OrgId, ProjectId, WorkId, pb};

use zopu_runtime::text::clip_bytes;

use crate::SERVICE;

/// Timeline entries kept per project.
const TIMELINE_KEPT: i64 = 64;
/// Longest text kept per timeline entry / summary.
const ENTRY_MAX_BYTES: usize = 2000;
const SUMMARY_MAX_BYTES: usize = 8000;

/// What kind of timeline entry a row is.
pub mod entry {
    pub const USER: &str = "user";
    pub const ACK: &str = "ack";
    pub const MESSAGE: &str = "message";
    pub const QUESTION: &str = "question";
    pub const FINAL: &str = "final";
    pub const PAUSED: &str = "paused";
    /// Entries written by the agent (compared by the near-duplicate guardrail).
    pub const AGENT_OUTPUTS: &[&str] = &[ACK, MESSAGE, QUESTION, FINAL, PAUSED];
}

/// The conversation projection.
#[derive(Debug, Default)]
pub struct ConversationState;

impl zopu_runtime::Projection for ConversationState {
    fn name(&self) -> &'static str {
        "conversation_state"
    }

    /// 4: approvals; 6: memory; 7: project names; 8: turns.
    fn schema_version(&self) -> u32 {
        8
    }

    fn tables(&self) -> &'static [&'static str] {
        &[
            "cv_projects",
            "cv_project_names",
            "cv_switch",
            "cv_timeline",
            "cv_works",
            "cv_threads",
            "cv_flows",
            "cv_artifacts",
            "cv_outcomes",
            crate::approvals::TABLE,
            crate::turns::TABLE,
            zopu_core::model_usage::TABLE,
            zopu_core::memory::TABLE,
        ]
    }

    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(
            "CREATE TABLE cv_projects (
                org TEXT NOT NULL, project TEXT NOT NULL,
                agent_id TEXT NOT NULL DEFAULT '', timeline_id TEXT NOT NULL DEFAULT '',
                repository_url TEXT NOT NULL DEFAULT '', branch TEXT NOT NULL DEFAULT '',
                repository_commit TEXT NOT NULL DEFAULT '', env_names TEXT NOT NULL DEFAULT '',
                summary TEXT, ready_sequence INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (org, project));
            CREATE TABLE cv_project_names (
                org TEXT NOT NULL, project TEXT NOT NULL, name TEXT NOT NULL,
                PRIMARY KEY (org, project));
            CREATE TABLE cv_switch (
                org TEXT NOT NULL, project TEXT NOT NULL, sequence INTEGER NOT NULL,
                enabled INTEGER NOT NULL, reason TEXT NOT NULL, notice_posted INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (org, project, sequence));
            CREATE TABLE cv_timeline (
                org TEXT NOT NULL, project TEXT NOT NULL, sequence INTEGER NOT NULL,
                kind TEXT NOT NULL, text TEXT NOT NULL, dispatch_id TEXT NOT NULL,
                PRIMARY KEY (org, project, sequence));
            CREATE TABLE cv_works (
                work_id TEXT PRIMARY KEY, org TEXT NOT NULL, project TEXT NOT NULL,
                kind TEXT NOT NULL, title TEXT NOT NULL, status TEXT NOT NULL, sequence INTEGER NOT NULL);
            CREATE TABLE cv_threads (
                thread_id TEXT PRIMARY KEY, work_id TEXT NOT NULL, org TEXT NOT NULL, project TEXT NOT NULL,
                flow_type TEXT NOT NULL, status TEXT NOT NULL);
            CREATE TABLE cv_flows (
                flow_run_id TEXT PRIMARY KEY, org TEXT NOT NULL, project TEXT NOT NULL,
                work_id TEXT NOT NULL, thread_id TEXT NOT NULL, flow_type INTEGER NOT NULL,
                source_event_id TEXT NOT NULL, status TEXT NOT NULL, summary TEXT NOT NULL DEFAULT '',
                artifact_build_id TEXT NOT NULL DEFAULT '', failure_code TEXT NOT NULL DEFAULT '',
                failure_message TEXT NOT NULL DEFAULT '', final_posted INTEGER NOT NULL DEFAULT 0,
                result_json TEXT NOT NULL DEFAULT '');
            CREATE TABLE cv_artifacts (
                artifact_id TEXT NOT NULL, revision INTEGER NOT NULL, org TEXT NOT NULL, project TEXT NOT NULL,
                flow_run_id TEXT NOT NULL, work_id TEXT NOT NULL, title TEXT NOT NULL, status TEXT NOT NULL,
                failure TEXT NOT NULL DEFAULT '', sequence INTEGER NOT NULL,
                PRIMARY KEY (artifact_id, revision));
            CREATE INDEX cv_artifacts_flow ON cv_artifacts (flow_run_id);
            CREATE INDEX cv_artifacts_project ON cv_artifacts (org, project, sequence);
            CREATE INDEX cv_works_project ON cv_works (org, project, sequence);
            CREATE TABLE cv_outcomes (
                org TEXT NOT NULL, project TEXT NOT NULL, sequence INTEGER NOT NULL, outcome TEXT NOT NULL,
                PRIMARY KEY (org, project, sequence));",
        )?;
        tx.execute_batch(crate::approvals::SCHEMA)?;
        tx.execute_batch(crate::turns::SCHEMA)?;
        tx.execute_batch(zopu_core::model_usage::SCHEMA)?;
        tx.execute_batch(zopu_core::memory::SCHEMA)
    }

    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        sequence: u64,
    ) -> rusqlite::Result<()> {
        zopu_core::model_usage::apply(tx, event, sequence)?;
        zopu_core::memory::apply(tx, event, sequence)?;
        crate::approvals::apply(tx, event, sequence as i64)?;
        crate::turns::apply(tx, event, sequence as i64)?;
        apply(tx, event, sequence as i64)
    }
}

fn ids(event: &Envelope) -> (&str, String) {
    (event.org_id.as_str(), event.project_id.to_string())
}

fn ensure_project(tx: &Transaction<'_>, event: &Envelope) -> rusqlite::Result<()> {
    let (org, project) = ids(event);
    tx.prepare_cached("INSERT OR IGNORE INTO cv_projects (org, project) VALUES (?1, ?2)")?
        .execute(params![org, project])
        .map(|_| ())
}

fn timeline(
    tx: &Transaction<'_>,
    event: &Envelope,
    sequence: i64,
    kind: &str,
    text: &str,
) -> rusqlite::Result<()> {
    let (org, project) = ids(event);
    let dispatch = event
        .dispatch_id
        .map(|id| id.to_string())
        .unwrap_or_default();
    tx.prepare_cached("INSERT OR REPLACE INTO cv_timeline (org, project, sequence, kind, text, dispatch_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?.execute(params![org, project, sequence, kind, clip_bytes(text, ENTRY_MAX_BYTES), dispatch],
    )?;
    tx.prepare_cached("DELETE FROM cv_timeline WHERE org = ?1 AND project = ?2 AND sequence <= COALESCE(
            (SELECT sequence FROM cv_timeline WHERE org = ?1 AND project = ?2 ORDER BY sequence DESC LIMIT 1 OFFSET ?3), -1)")?.execute(params![org, project, TIMELINE_KEPT],
    )
    .map(|_| ())
}

fn outcome(
    tx: &Transaction<'_>,
    event: &Envelope,
    sequence: i64,
    outcome: &str,
) -> rusqlite::Result<()> {
    let (org, project) = ids(event);
    tx.prepare_cached("INSERT OR REPLACE INTO cv_outcomes (org, project, sequence, outcome) VALUES (?1, ?2, ?3, ?4)")?.execute(params![org, project, sequence, outcome],
    )?;
    tx.prepare_cached("DELETE FROM cv_outcomes WHERE org = ?1 AND project = ?2 AND sequence <= COALESCE(
            (SELECT sequence FROM cv_outcomes WHERE org = ?1 AND project = ?2 ORDER BY sequence DESC LIMIT 1 OFFSET 32), -1)")?.execute(params![org, project],
    )
    .map(|_| ())
}

fn is_ours(event: &Envelope) -> bool {
    event.source == format!("zopu/{SERVICE}")
}

fn apply(tx: &Transaction<'_>, event: &Envelope, sequence: i64) -> rusqlite::Result<()> {
    let (org, project) = ids(event);
    macro_rules! decode {
        ($ty:ty) => {
            match event.decode::<$ty>() {
                Ok(payload) => payload,
                Err(_) => return Ok(()),
            }
        };
    }
    match event.event_type.as_str() {
        pb::AgentRegistered::TYPE => {
            let registered = decode!(pb::AgentRegistered);
            ensure_project(tx, event)?;
            tx.prepare_cached("UPDATE cv_projects SET agent_id = ?3, timeline_id = ?4 WHERE org = ?1 AND project = ?2")?.execute(params![org, project, registered.agent_id, registered.global_timeline_id],
            )?;
        }
        pb::ProjectSetupRequested::TYPE => {
            // The name chosen at creation; a later request that names the
            // project renames it.
            let requested = decode!(pb::ProjectSetupRequested);
            if !requested.project_name.is_empty() {
                tx.prepare_cached(
                    "INSERT INTO cv_project_names (org, project, name) VALUES (?1, ?2, ?3)
                     ON CONFLICT (org, project) DO UPDATE SET name = ?3",
                )?
                .execute(params![org, project, requested.project_name])?;
            }
        }
        pb::ProjectReady::TYPE => {
            let ready = decode!(pb::ProjectReady);
            ensure_project(tx, event)?;
            tx.prepare_cached("UPDATE cv_projects SET repository_url = ?3, branch = ?4, repository_commit = ?5, env_names = ?6, ready_sequence = ?7
                 WHERE org = ?1 AND project = ?2")?.execute(params![org, project, ready.repository_url, ready.branch, ready.repository_commit, ready.environment_variable_names.join("\n"), sequence],
            )?;
        }
        pb::ContextPublished::TYPE => {
            let context = decode!(pb::ContextPublished);
            if context.kind == "repository_summary" && !context.body.is_empty() {
                ensure_project(tx, event)?;
                tx.prepare_cached(
                    "UPDATE cv_projects SET summary = ?3 WHERE org = ?1 AND project = ?2",
                )?
                .execute(params![
                    org,
                    project,
                    clip_bytes(&context.body, SUMMARY_MAX_BYTES)
                ])?;
            }
        }
        pb::AgentDisabled::TYPE => {
            let disabled = decode!(pb::AgentDisabled);
            tx.prepare_cached("INSERT OR REPLACE INTO cv_switch (org, project, sequence, enabled, reason) VALUES (?1, ?2, ?3, 0, ?4)")?.execute(params![org, project, sequence, clip_bytes(&disabled.reason, 300)],
            )?;
        }
        pb::AgentEnabled::TYPE => {
            tx.prepare_cached("INSERT OR REPLACE INTO cv_switch (org, project, sequence, enabled, reason) VALUES (?1, ?2, ?3, 1, '')")?.execute(params![org, project, sequence],
            )?;
            outcome(tx, event, sequence, "enabled")?;
        }
        pb::TimelineMessageSent::TYPE => {
            let message = decode!(pb::TimelineMessageSent);
            timeline(tx, event, sequence, entry::USER, &message.text)?;
        }
        pb::AgentAcknowledged::TYPE => {
            let ack = decode!(pb::AgentAcknowledged);
            timeline(tx, event, sequence, entry::ACK, &ack.text)?;
        }
        pb::AgentMessage::TYPE => {
            let message = decode!(pb::AgentMessage);
            if message.status == "paused" {
                timeline(tx, event, sequence, entry::PAUSED, &message.text)?;
                tx.prepare_cached("UPDATE cv_switch SET notice_posted = 1 WHERE org = ?1 AND project = ?2 AND sequence =
                        (SELECT MAX(sequence) FROM cv_switch WHERE org = ?1 AND project = ?2)")?.execute(params![org, project],
                )?;
            } else {
                timeline(tx, event, sequence, entry::MESSAGE, &message.text)?;
            }
        }
        pb::AgentBlocked::TYPE => {
            let blocked = decode!(pb::AgentBlocked);
            timeline(tx, event, sequence, entry::QUESTION, &blocked.question)?;
        }
        pb::AgentFinal::TYPE => {
            let last = decode!(pb::AgentFinal);
            timeline(tx, event, sequence, entry::FINAL, &last.text)?;
            if let Some(flow_run) = event.flow_run_id {
                tx.prepare_cached("UPDATE cv_flows SET final_posted = 1 WHERE flow_run_id = ?1")?
                    .execute(params![flow_run.to_string()])?;
            }
        }
        pb::AgentRejected::TYPE => outcome(tx, event, sequence, "rejected")?,
        pb::DispatchCompleted::TYPE if is_ours(event) => outcome(tx, event, sequence, "completed")?,
        pb::WorkCreated::TYPE => {
            let work = decode!(pb::WorkCreated);
            if let Some(work_id) = event.work_id {
                tx.prepare_cached("INSERT OR IGNORE INTO cv_works (work_id, org, project, kind, title, status, sequence) VALUES (?1, ?2, ?3, ?4, ?5, 'open', ?6)")?.execute(params![work_id.to_string(), org, project, work.kind, clip_bytes(&work.title, 300), sequence],
                )?;
            }
        }
        pb::WorkUpdated::TYPE => {
            let work = decode!(pb::WorkUpdated);
            if let Some(work_id) = event.work_id {
                tx.prepare_cached("UPDATE cv_works SET status = ?2 WHERE work_id = ?1")?
                    .execute(params![work_id.to_string(), work.status])?;
            }
        }
        pb::ThreadCreated::TYPE => {
            let thread = decode!(pb::ThreadCreated);
            if let (Some(work_id), Some(thread_id)) = (event.work_id, event.thread_id) {
                tx.prepare_cached("INSERT OR IGNORE INTO cv_threads (thread_id, work_id, org, project, flow_type, status) VALUES (?1, ?2, ?3, ?4, ?5, 'open')")?.execute(params![thread_id.to_string(), work_id.to_string(), org, project, thread.flow_type],
                )?;
            }
        }
        pb::ThreadUpdated::TYPE => {
            let thread = decode!(pb::ThreadUpdated);
            if let Some(thread_id) = event.thread_id {
                tx.prepare_cached("UPDATE cv_threads SET status = ?2 WHERE thread_id = ?1")?
                    .execute(params![thread_id.to_string(), thread.status])?;
            }
        }
        pb::FlowRequested::TYPE => {
            let requested = decode!(pb::FlowRequested);
            // An external agent's flow is its own: this agent neither
            // reports its outcome nor counts it as its work in progress.
            let external = requested
                .agent_id
                .starts_with(zopu_schema::keys::EXTERNAL_AGENT_PREFIX);
            if let Some(flow_run) = event.flow_run_id.filter(|_| !external) {
                tx.prepare_cached("INSERT OR IGNORE INTO cv_flows (flow_run_id, org, project, work_id, thread_id, flow_type, source_event_id, status)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'requested')")?.execute(params![
                        flow_run.to_string(),
                        org,
                        project,
                        event.work_id.map(|id| id.to_string()).unwrap_or_default(),
                        event.thread_id.map(|id| id.to_string()).unwrap_or_default(),
                        requested.flow_type,
                        requested.source_event_id
                    ],
                )?;
            }
        }
        pb::FlowCompleted::TYPE => {
            let completed = decode!(pb::FlowCompleted);
            flow_status(
                tx,
                event,
                "completed",
                &completed.summary,
                &completed.artifact_build_id,
                None,
            )?;
            // An issue's result is what "Publish to tracker" will send.
            if completed.flow_type == pb::FlowType::Issue as i32
                && let Some(flow_run) = event.flow_run_id
            {
                tx.prepare_cached("UPDATE cv_flows SET result_json = ?2 WHERE flow_run_id = ?1")?
                    .execute(params![flow_run.to_string(), completed.result_json])?;
            }
        }
        pb::FlowFailed::TYPE => {
            let failed = decode!(pb::FlowFailed);
            flow_status(tx, event, "failed", "", "", failed.reason.as_ref())?;
        }
        pb::FlowCancelled::TYPE => {
            let cancelled = decode!(pb::FlowCancelled);
            let reason = pb::FailureReason {
                code: "flow.cancelled".into(),
                message: cancelled.reason,
                retryable: true,
            };
            flow_status(tx, event, "cancelled", "", "", Some(&reason))?;
        }
        pb::ArtifactPublished::TYPE => {
            let published = decode!(pb::ArtifactPublished);
            artifact(
                tx,
                event,
                sequence,
                &published.artifact_id,
                published.revision,
                &published.title,
                "published",
                "",
            )?;
        }
        pb::ArtifactFailed::TYPE => {
            let failed = decode!(pb::ArtifactFailed);
            let reason = failed
                .reason
                .map(|reason| reason.message)
                .unwrap_or_default();
            artifact(
                tx,
                event,
                sequence,
                &failed.artifact_id,
                failed.revision,
                "",
                "failed",
                &reason,
            )?;
        }
        _ => {}
    }
    Ok(())
}

fn flow_status(
    tx: &Transaction<'_>,
    event: &Envelope,
    status: &str,
    summary: &str,
    build: &str,
    failure: Option<&pb::FailureReason>,
) -> rusqlite::Result<()> {
    let Some(flow_run) = event.flow_run_id else {
        return Ok(());
    };
    let (code, message) = failure
        .map(|f| (f.code.as_str(), f.message.as_str()))
        .unwrap_or_default();
    tx.prepare_cached("UPDATE cv_flows SET status = ?2, summary = ?3, artifact_build_id = ?4, failure_code = ?5, failure_message = ?6 WHERE flow_run_id = ?1")?.execute(params![flow_run.to_string(), status, clip_bytes(summary, ENTRY_MAX_BYTES), build, code, clip_bytes(message, 500)],
    )
    .map(|_| ())
}

#[allow(clippy::too_many_arguments)]
fn artifact(
    tx: &Transaction<'_>,
    event: &Envelope,
    sequence: i64,
    artifact_id: &str,
    revision: u32,
    title: &str,
    status: &str,
    failure: &str,
) -> rusqlite::Result<()> {
    let (org, project) = ids(event);
    tx.prepare_cached("INSERT OR REPLACE INTO cv_artifacts (artifact_id, revision, org, project, flow_run_id, work_id, title, status, failure, sequence)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)")?.execute(params![
            artifact_id,
            revision,
            org,
            project,
            event.flow_run_id.map(|id| id.to_string()).unwrap_or_default(),
            event.work_id.map(|id| id.to_string()).unwrap_or_default(),
            clip_bytes(title, 300),
            status,
            clip_bytes(failure, 500),
            sequence
        ],
    )
    .map(|_| ())
}

/// One entry of the recent timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineEntry {
    pub sequence: u64,
    pub kind: String,
    pub text: String,
    pub dispatch_id: String,
}

/// A Work the agent owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkSummary {
    pub work_id: String,
    pub kind: String,
    pub title: String,
    pub status: String,
}

/// Everything a turn needs about its project, as of one stream sequence.
#[derive(Debug, Clone, Default)]
pub struct ProjectView {
    pub agent_id: String,
    pub timeline_id: String,
    pub repository_url: String,
    /// The name chosen at creation (`--name`, else the repository's name);
    /// empty for a project whose setup request named none.
    pub name: String,
    pub branch: String,
    pub repository_commit: String,
    pub env_names: Vec<String>,
    pub summary: Option<String>,
    pub ready: bool,
    /// The kill switch as of the dispatch.
    pub enabled: bool,
    pub disabled_reason: String,
    /// The "agent is paused" notice was already posted since the last disable.
    pub paused_notice_posted: bool,
    /// Newest last.
    pub recent: Vec<TimelineEntry>,
    pub active_works: Vec<WorkSummary>,
    /// `(artifact id, title)`, newest first.
    pub recent_artifacts: Vec<(String, String)>,
    /// `agent.rejected` since the last completed dispatch or re-enable.
    pub rejection_streak: u32,
    /// The agent's long-term memory in the project (the preferences the
    /// user stated), unexpired at the load's time, by key.
    pub preferences: Vec<zopu_core::memory::Entry>,
}

impl ProjectView {
    /// The project's state before stream sequence `before`, its memory as
    /// unexpired at `at_ms` (Unix ms); `None` when no event of the project
    /// bound an agent or made it ready.
    pub fn load(
        conn: &Connection,
        org: &OrgId,
        project: &ProjectId,
        before: u64,
        at_ms: i64,
    ) -> rusqlite::Result<Option<Self>> {
        let org_id = org;
        let project_id = project;
        let (org, project) = (org.as_str(), project.to_string());
        let before = i64::try_from(before).unwrap_or(i64::MAX);
        let row = conn
            .prepare_cached("SELECT agent_id, timeline_id, repository_url, branch, repository_commit, env_names, summary, ready_sequence
                 FROM cv_projects WHERE org = ?1 AND project = ?2")?.query_row(params![org, project],
                |row| {
                    Ok(ProjectView {
                        agent_id: row.get(0)?,
                        timeline_id: row.get(1)?,
                        repository_url: row.get(2)?,
                        branch: row.get(3)?,
                        repository_commit: row.get(4)?,
                        env_names: row
                            .get::<_, String>(5)?
                            .split('\n')
                            .filter(|name| !name.is_empty())
                            .map(str::to_owned)
                            .collect(),
                        summary: row.get(6)?,
                        ready: row.get::<_, i64>(7)? > 0,
                        enabled: true,
                        ..Default::default()
                    })
                },
            )
            .optional()?;
        let Some(mut view) = row else { return Ok(None) };
        view.name = conn
            .prepare_cached("SELECT name FROM cv_project_names WHERE org = ?1 AND project = ?2")?
            .query_row(params![org, project], |row| row.get(0))
            .optional()?
            .unwrap_or_default();
        if let Some((enabled, reason, notice)) = conn
            .prepare_cached("SELECT enabled, reason, notice_posted FROM cv_switch WHERE org = ?1 AND project = ?2 AND sequence < ?3
                 ORDER BY sequence DESC LIMIT 1")?.query_row(params![org, project, before],
                |row| Ok((row.get::<_, i64>(0)? != 0, row.get::<_, String>(1)?, row.get::<_, i64>(2)? != 0)),
            )
            .optional()?
        {
            view.enabled = enabled;
            view.disabled_reason = reason;
            view.paused_notice_posted = notice;
        }
        let mut statement = conn.prepare_cached(
            "SELECT sequence, kind, text, dispatch_id FROM cv_timeline WHERE org = ?1 AND project = ?2 AND sequence < ?3
             ORDER BY sequence DESC LIMIT 20",
        )?;
        view.recent = statement
            .query_map(params![org, project, before], |row| {
                Ok(TimelineEntry {
                    sequence: row.get::<_, i64>(0)? as u64,
                    kind: row.get(1)?,
                    text: row.get(2)?,
                    dispatch_id: row.get(3)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        view.recent.reverse();
        let mut statement = conn.prepare_cached(
            "SELECT work_id, kind, title, status FROM cv_works WHERE org = ?1 AND project = ?2 AND sequence < ?3
             AND status NOT IN ('done', 'cancelled') ORDER BY sequence DESC LIMIT 10",
        )?;
        view.active_works = statement
            .query_map(params![org, project, before], |row| {
                Ok(WorkSummary {
                    work_id: row.get(0)?,
                    kind: row.get(1)?,
                    title: row.get(2)?,
                    status: row.get(3)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut statement = conn.prepare_cached(
            "SELECT artifact_id, title FROM cv_artifacts WHERE org = ?1 AND project = ?2 AND sequence < ?3 AND status = 'published'
             ORDER BY sequence DESC LIMIT 10",
        )?;
        view.recent_artifacts = statement
            .query_map(params![org, project, before], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut statement = conn.prepare_cached(
            "SELECT outcome FROM cv_outcomes WHERE org = ?1 AND project = ?2 AND sequence < ?3 ORDER BY sequence DESC LIMIT 32",
        )?;
        let outcomes = statement
            .query_map(params![org, project, before], |row| row.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        view.rejection_streak = outcomes
            .iter()
            .take_while(|outcome| outcome.as_str() == "rejected")
            .count() as u32;
        view.preferences =
            zopu_core::memory::entries(conn, org_id, project_id, Some(&view.agent_id), at_ms)?
                .into_iter()
                .filter(|entry| {
                    entry.tier == zopu_core::memory::Tier::LongTerm
                        && (entry.sequence as i64) < before
                })
                .collect();
        Ok(Some(view))
    }

    /// The agent's outputs of other dispatches, newest last (for guardrails).
    pub fn recent_outputs(&self, limit: usize, exclude_dispatch: &str) -> Vec<String> {
        let outputs: Vec<String> = self
            .recent
            .iter()
            .filter(|entry| {
                entry::AGENT_OUTPUTS.contains(&entry.kind.as_str())
                    && entry.dispatch_id != exclude_dispatch
            })
            .map(|entry| entry.text.clone())
            .collect();
        outputs[outputs.len().saturating_sub(limit)..].to_vec()
    }

    /// True when the agent's last output (of another dispatch) was a clarifying question.
    pub fn just_asked(&self, exclude_dispatch: &str) -> bool {
        self.recent
            .iter()
            .rev()
            .find(|entry| entry.kind != entry::USER && entry.dispatch_id != exclude_dispatch)
            .is_some_and(|entry| entry.kind == entry::QUESTION)
    }

    /// The project's one name: the one chosen at creation, else (a setup
    /// request that named none) the repository's last path segment.
    pub fn project_name(&self) -> String {
        if self.name.is_empty() {
            crate::decide::project_name(&self.repository_url)
        } else {
            self.name.clone()
        }
    }

    /// Whether `work` is a Work of this project the agent created.
    pub fn owns_work(
        conn: &Connection,
        org: &OrgId,
        project: &ProjectId,
        work: &WorkId,
    ) -> rusqlite::Result<bool> {
        conn.prepare_cached(
            "SELECT COUNT(*) FROM cv_works WHERE work_id = ?1 AND org = ?2 AND project = ?3",
        )?
        .query_row(
            params![work.to_string(), org.as_str(), project.to_string()],
            |row| row.get::<_, i64>(0),
        )
        .map(|count| count > 0)
    }
}

/// A flow run the agent requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowView {
    pub flow_run_id: FlowRunId,
    pub work_id: Option<WorkId>,
    pub thread_id: Option<zopu_schema::ThreadId>,
    pub flow_type: pb::FlowType,
    pub source_event_id: String,
    pub status: String,
    pub summary: String,
    pub artifact_build_id: String,
    pub failure_code: String,
    pub failure_message: String,
    pub final_posted: bool,
    /// Published artifact ids of the run (latest revision first).
    pub artifacts: Vec<String>,
    /// Failed artifact builds of the run: `(artifact id, reason)`.
    pub failed_artifacts: Vec<(String, String)>,
}

impl FlowView {
    pub fn load(
        conn: &Connection,
        org: &OrgId,
        project: &ProjectId,
        flow_run: &FlowRunId,
    ) -> rusqlite::Result<Option<Self>> {
        let row = conn
            .prepare_cached("SELECT work_id, thread_id, flow_type, source_event_id, status, summary, artifact_build_id, failure_code,
                        failure_message, final_posted
                 FROM cv_flows WHERE flow_run_id = ?1 AND org = ?2 AND project = ?3")?.query_row(params![flow_run.to_string(), org.as_str(), project.to_string()],
                |row| {
                    Ok(FlowView {
                        flow_run_id: *flow_run,
                        work_id: row.get::<_, String>(0)?.parse().ok(),
                        thread_id: row.get::<_, String>(1)?.parse().ok(),
                        flow_type: pb::FlowType::try_from(row.get::<_, i32>(2)?).unwrap_or(pb::FlowType::Unspecified),
                        source_event_id: row.get(3)?,
                        status: row.get(4)?,
                        summary: row.get(5)?,
                        artifact_build_id: row.get(6)?,
                        failure_code: row.get(7)?,
                        failure_message: row.get(8)?,
                        final_posted: row.get::<_, i64>(9)? != 0,
                        artifacts: Vec::new(),
                        failed_artifacts: Vec::new(),
                    })
                },
            )
            .optional()?;
        let Some(mut flow) = row else { return Ok(None) };
        let mut statement = conn.prepare_cached(
            "SELECT artifact_id, status, failure FROM cv_artifacts WHERE flow_run_id = ?1 ORDER BY sequence DESC",
        )?;
        let rows = statement
            .query_map(params![flow_run.to_string()], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        for (artifact, status, failure) in rows {
            if status == "published" {
                if !flow.artifacts.contains(&artifact) {
                    flow.artifacts.push(artifact);
                }
            } else {
                flow.failed_artifacts.push((artifact, failure));
            }
        }
        Ok(Some(flow))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use zopu_runtime::{Projection as _, Store};
    use zopu_schema::{OrgId, ProjectId};

    use super::*;

    /// An event of `project` (org `acme`) as stored, for tests of what reads events.
    pub(crate) fn envelope<E: Event>(payload: &E, project: ProjectId) -> Envelope {
        zopu_schema::test_support::envelope(payload, &"acme".parse::<OrgId>().unwrap(), project)
    }

    /// The agent calls the project by the name chosen at creation (the web
    /// shows the same), not by its repository's directory.
    #[test]
    fn the_agent_names_the_project_as_it_was_named_at_creation() {
        let temp = tempfile::tempdir().unwrap();
        let store = Store::open(&temp.path().join("c.sqlite")).unwrap();
        let (org, project) = ("acme".parse::<OrgId>().unwrap(), ProjectId::new());
        let repository_url = "/home/ada/checkouts/wt48".to_owned();
        let events = [
            envelope(
                &pb::ProjectSetupRequested {
                    repository_url: repository_url.clone(),
                    setup_revision: 1,
                    project_name: "Shop front".into(),
                    ..Default::default()
                },
                project,
            ),
            envelope(
                &pb::AgentRegistered {
                    agent_id: "agent-1".into(),
                    setup_revision: 1,
                    ..Default::default()
                },
                project,
            ),
            envelope(
                &pb::ProjectReady {
                    setup_revision: 1,
                    repository_url,
                    repository_commit: "0123abc".into(),
                    ..Default::default()
                },
                project,
            ),
        ];
        store
            .write(|tx| {
                let mut state = ConversationState;
                state.migrate(tx)?;
                for (sequence, event) in events.iter().enumerate() {
                    state.apply(tx, event, sequence as u64 + 1)?;
                }
                Ok(())
            })
            .unwrap();
        let view = store
            .read(|conn| ProjectView::load(conn, &org, &project, u64::MAX, 0))
            .unwrap()
            .unwrap();
        assert_eq!(view.project_name(), "Shop front");
        let onboarding = crate::decide::onboarding_turn(&view);
        assert_eq!(
            onboarding.acknowledgement.as_deref().unwrap_or_default(),
            "Shop front is connected. I'm exploring the repository now and will post a short project overview when it's ready."
        );
        // A project whose request named none: its repository's name.
        let unnamed = ProjectView {
            repository_url: "https://example.com/acme/shop.git".into(),
            ..Default::default()
        };
        assert_eq!(unnamed.project_name(), "shop");
    }
}
