//! Projects: a project's repository, setup status, agent and kill switch,
//! whether a specialist flow runs, and its current summary document.
//!
//! Invariants: a setup event moves only the project's current setup
//! revision, and never out of that revision's terminal state (ready or
//! failed); a new revision (a retry) clears the previous failure. A flow in
//! a terminal state is never reopened by a late or redelivered start.

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use zopu_schema::envelope::format_time;
use zopu_schema::{Envelope, Event, OrgId, ProjectId, pb};

use super::{FailureRow, read_list, replace_list};

/// The thin setup state progression shown to users (spec section 68).
pub mod setup_state {
    pub const CREATING_WORKSPACE: &str = "creating_workspace";
    pub const CLONING: &str = "cloning";
    pub const CHECKING: &str = "checking";
    pub const READY: &str = "ready";
    pub const FAILED: &str = "failed";
}

pub(super) const TABLES: &[&str] = &[
    "gw_projects",
    "gw_project_environment_names",
    "gw_environment_values",
    "gw_flows",
    "gw_summaries",
];

pub(super) const SCHEMA: &str = "
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
    agent_id TEXT,
    agent_enabled INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL,
    correlation_id TEXT NOT NULL,
    updated_sequence INTEGER NOT NULL
);
CREATE INDEX gw_projects_org ON gw_projects (org, created_at);
CREATE INDEX gw_projects_request ON gw_projects (org, correlation_id);
-- The names in the repository's .env.example, in order.
CREATE TABLE gw_project_environment_names (
    project_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    name TEXT NOT NULL,
    PRIMARY KEY (project_id, position)
);
-- The environment names a user stored a value for (the value is only in the secret store).
CREATE TABLE gw_environment_values (
    project_id TEXT NOT NULL,
    org TEXT NOT NULL,
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    updated_by TEXT NOT NULL,
    PRIMARY KEY (project_id, name)
);
CREATE TABLE gw_flows (
    flow_run_id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    state TEXT NOT NULL
);
CREATE INDEX gw_flows_project ON gw_flows (project_id, state);
CREATE TABLE gw_summaries (
    project_id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    document_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    title TEXT NOT NULL,
    content_type TEXT NOT NULL,
    body TEXT NOT NULL,
    -- Where the body lives when it is not inline (all NULL when it is).
    blob_bucket TEXT,
    blob_name TEXT,
    blob_sha256 TEXT,
    blob_size_bytes INTEGER,
    blob_content_type TEXT,
    repository_commit TEXT NOT NULL,
    sequence INTEGER NOT NULL
);
";

/// A project as stored, with whether a flow of it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectRow {
    pub project_id: String,
    pub name: String,
    pub repository_url: String,
    pub branch: String,
    pub created_at: String,
    pub setup: SetupRow,
    pub agent_id: Option<String>,
    pub agent_enabled: bool,
    /// True while a specialist flow is requested or running.
    pub running: bool,
}

/// A project's setup status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupRow {
    /// One of [`setup_state`].
    pub state: String,
    pub revision: u32,
    pub failed_step: Option<String>,
    pub failure: Option<FailureRow>,
    pub environment_names: Vec<String>,
    /// The names a value is stored for, by name.
    pub environment_values: Vec<EnvironmentValueRow>,
    pub repository_commit: Option<String>,
}

/// A stored environment value, as its events tell it (never the value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentValueRow {
    pub name: String,
    pub version: u64,
    pub fingerprint: String,
    pub updated_at: String,
    pub updated_by: String,
}

/// The current repository summary document; its body is inline or in a blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryRow {
    pub document_id: String,
    pub revision: u32,
    pub title: String,
    pub content_type: String,
    pub body: String,
    pub repository_commit: String,
    pub blob: Option<pb::BlobRef>,
}

/// Applies what `event` changes of a project.
pub(super) fn apply(tx: &Transaction<'_>, event: &Envelope, sequence: u64) -> rusqlite::Result<()> {
    let at = Place {
        project: event.project_id.to_string(),
        org: event.org_id.as_str(),
        sequence: sequence as i64,
    };
    match event.event_type.as_str() {
        t if t == pb::ProjectSetupRequested::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectSetupRequested>() {
                setup_requested(tx, &at, event, &m)?;
            }
        }
        t if t == pb::ProjectSetupStarted::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectSetupStarted>() {
                move_setup(tx, &at, m.setup_revision, setup_state::CREATING_WORKSPACE)?;
            }
        }
        t if t == pb::ProjectRuntimeCreated::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectRuntimeCreated>() {
                move_setup(tx, &at, m.setup_revision, setup_state::CLONING)?;
            }
        }
        t if t == pb::ProjectRepositoryCloned::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectRepositoryCloned>() {
                move_setup(tx, &at, m.setup_revision, setup_state::CHECKING)?;
                tx.prepare_cached("UPDATE gw_projects SET repository_commit = ?1 WHERE project_id = ?2 AND org = ?3 AND setup_revision = ?4")?
                    .execute(params![m.repository_commit, at.project, at.org, m.setup_revision])?;
            }
        }
        t if t == pb::ProjectEnvironmentScanned::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectEnvironmentScanned>() {
                let names: Vec<&str> = m.variables.iter().map(|v| v.name.as_str()).collect();
                set_environment_names(tx, &at, m.setup_revision, &names)?;
            }
        }
        t if t == pb::ProjectEnvironmentValueSet::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectEnvironmentValueSet>() {
                // A value's events may arrive out of their writes' order only
                // across requests; the higher version is the current value.
                tx.prepare_cached(
                    "INSERT INTO gw_environment_values (project_id, org, name, version, fingerprint, updated_at, updated_by)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT (project_id, name) DO UPDATE SET version = ?4, fingerprint = ?5, updated_at = ?6, updated_by = ?7
                     WHERE ?4 > gw_environment_values.version",
                )?
                .execute(params![
                    at.project,
                    at.org,
                    m.name,
                    i64::try_from(m.version).unwrap_or(i64::MAX),
                    m.fingerprint,
                    zopu_schema::envelope::format_time(event.time),
                    m.by.map(|by| by.id).unwrap_or_default()
                ])?;
            }
        }
        t if t == pb::ProjectEnvironmentValueDeleted::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectEnvironmentValueDeleted>() {
                tx.prepare_cached(
                    "DELETE FROM gw_environment_values WHERE project_id = ?1 AND org = ?2 AND name = ?3",
                )?
                .execute(params![at.project, at.org, m.name])?;
            }
        }
        t if t == pb::AgentRegistered::TYPE => {
            if let Ok(m) = event.decode::<pb::AgentRegistered>() {
                tx.prepare_cached(
                    "UPDATE gw_projects SET agent_id = ?1 WHERE project_id = ?2 AND org = ?3",
                )?
                .execute(params![m.agent_id, at.project, at.org])?;
            }
        }
        t if t == pb::ProjectReady::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectReady>() {
                ready(tx, &at, &m)?;
            }
        }
        t if t == pb::ProjectSetupFailed::TYPE => {
            if let Ok(m) = event.decode::<pb::ProjectSetupFailed>() {
                setup_failed(tx, &at, &m)?;
            }
        }
        t if t == pb::AgentDisabled::TYPE || t == pb::AgentEnabled::TYPE => {
            let enabled = t == pb::AgentEnabled::TYPE;
            tx.prepare_cached(
                "UPDATE gw_projects SET agent_enabled = ?1 WHERE project_id = ?2 AND org = ?3",
            )?
            .execute(params![enabled, at.project, at.org])?;
        }
        t => {
            if let Some(state) = flow_state(t) {
                flow_moved(tx, &at, event, state)?;
            } else if t == pb::ContextPublished::TYPE
                && let Ok(m) = event.decode::<pb::ContextPublished>()
                && m.kind == "repository_summary"
            {
                summary_published(tx, &at, &m)?;
            }
        }
    }
    Ok(())
}

/// The project, organization and stream sequence an event applies at.
struct Place<'a> {
    project: String,
    org: &'a str,
    sequence: i64,
}

fn setup_requested(
    tx: &Transaction<'_>,
    at: &Place<'_>,
    event: &Envelope,
    m: &pb::ProjectSetupRequested,
) -> rusqlite::Result<()> {
    tx.prepare_cached("INSERT INTO gw_projects (project_id, org, name, repository_url, branch, setup_revision, state, created_at, updated_sequence, correlation_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT(project_id) DO UPDATE SET
            repository_url = excluded.repository_url, branch = excluded.branch,
            name = CASE WHEN excluded.name = '' THEN gw_projects.name ELSE excluded.name END,
            setup_revision = excluded.setup_revision, state = excluded.state,
            failed_step = NULL, failure_code = NULL, failure_message = NULL, failure_retryable = NULL,
            updated_sequence = excluded.updated_sequence
         WHERE excluded.setup_revision > gw_projects.setup_revision AND gw_projects.org = excluded.org")?
        .execute(params![
            at.project,
            at.org,
            m.project_name,
            m.repository_url,
            m.branch,
            m.setup_revision,
            setup_state::CREATING_WORKSPACE,
            format_time(event.time),
            at.sequence,
            event.correlation_id.as_str()
        ])?;
    Ok(())
}

/// Moves the setup of `revision` to `state`: only the current revision moves,
/// and never out of a terminal state of that revision (but `ready` is final).
fn move_setup(
    tx: &Transaction<'_>,
    at: &Place<'_>,
    revision: u32,
    state: &str,
) -> rusqlite::Result<()> {
    tx.prepare_cached("UPDATE gw_projects SET state = ?1, updated_sequence = ?2
         WHERE project_id = ?3 AND org = ?4 AND setup_revision = ?5 AND state NOT IN ('ready', 'failed')")?
        .execute(params![state, at.sequence, at.project, at.org, revision])?;
    if state == setup_state::READY {
        tx.prepare_cached("UPDATE gw_projects SET state = 'ready', updated_sequence = ?1 WHERE project_id = ?2 AND org = ?3 AND setup_revision = ?4")?
            .execute(params![at.sequence, at.project, at.org, revision])?;
    }
    Ok(())
}

fn set_environment_names(
    tx: &Transaction<'_>,
    at: &Place<'_>,
    revision: u32,
    names: &[impl AsRef<str>],
) -> rusqlite::Result<()> {
    let current: bool = tx
        .prepare_cached(
            "SELECT 1 FROM gw_projects WHERE project_id = ?1 AND org = ?2 AND setup_revision = ?3",
        )?
        .exists(params![at.project, at.org, revision])?;
    if current {
        replace_list(
            tx,
            "gw_project_environment_names",
            "project_id",
            "name",
            &at.project,
            names,
        )?;
    }
    Ok(())
}

fn ready(tx: &Transaction<'_>, at: &Place<'_>, m: &pb::ProjectReady) -> rusqlite::Result<()> {
    move_setup(tx, at, m.setup_revision, setup_state::READY)?;
    tx.prepare_cached(
        "UPDATE gw_projects SET repository_commit = ?1, agent_id = COALESCE(NULLIF(?2, ''), agent_id)
         WHERE project_id = ?3 AND org = ?4 AND setup_revision = ?5",
    )?
    .execute(params![
        m.repository_commit,
        m.agent_id,
        at.project,
        at.org,
        m.setup_revision
    ])?;
    set_environment_names(tx, at, m.setup_revision, &m.environment_variable_names)
}

fn setup_failed(
    tx: &Transaction<'_>,
    at: &Place<'_>,
    m: &pb::ProjectSetupFailed,
) -> rusqlite::Result<()> {
    let reason = m.reason.clone().unwrap_or_default();
    tx.prepare_cached("UPDATE gw_projects SET state = ?1, failed_step = ?2, failure_code = ?3, failure_message = ?4,
            failure_retryable = ?5, updated_sequence = ?6
         WHERE project_id = ?7 AND org = ?8 AND setup_revision = ?9")?
        .execute(params![
            setup_state::FAILED,
            m.step,
            reason.code,
            reason.message,
            reason.retryable,
            at.sequence,
            at.project,
            at.org,
            m.setup_revision
        ])?;
    Ok(())
}

/// The state a flow event moves its run to (the names the API shows).
pub(super) fn flow_state(event_type: &str) -> Option<&'static str> {
    match event_type {
        t if t == pb::FlowRequested::TYPE => Some("requested"),
        t if t == pb::FlowStarted::TYPE => Some("running"),
        t if t == pb::FlowCompleted::TYPE => Some("completed"),
        t if t == pb::FlowFailed::TYPE => Some("failed"),
        t if t == pb::FlowCancelled::TYPE => Some("cancelled"),
        _ => None,
    }
}

fn flow_moved(
    tx: &Transaction<'_>,
    at: &Place<'_>,
    event: &Envelope,
    state: &str,
) -> rusqlite::Result<()> {
    let Some(flow) = event.flow_run_id else {
        return Ok(());
    };
    tx.prepare_cached(
        "INSERT INTO gw_flows (flow_run_id, org, project_id, state) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(flow_run_id) DO UPDATE SET state = excluded.state
         WHERE gw_flows.state IN ('requested', 'running')",
    )?
    .execute(params![flow.to_string(), at.org, at.project, state])?;
    Ok(())
}

fn summary_published(
    tx: &Transaction<'_>,
    at: &Place<'_>,
    m: &pb::ContextPublished,
) -> rusqlite::Result<()> {
    let blob = m.blob.as_ref();
    tx.prepare_cached("INSERT INTO gw_summaries (project_id, org, document_id, revision, title, content_type, body,
            blob_bucket, blob_name, blob_sha256, blob_size_bytes, blob_content_type, repository_commit, sequence)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
         ON CONFLICT(project_id) DO UPDATE SET document_id = excluded.document_id, revision = excluded.revision,
            title = excluded.title, content_type = excluded.content_type, body = excluded.body,
            blob_bucket = excluded.blob_bucket, blob_name = excluded.blob_name, blob_sha256 = excluded.blob_sha256,
            blob_size_bytes = excluded.blob_size_bytes, blob_content_type = excluded.blob_content_type,
            repository_commit = excluded.repository_commit, sequence = excluded.sequence
         WHERE gw_summaries.org = excluded.org")?
        .execute(params![
            at.project,
            at.org,
            m.document_id,
            m.revision,
            m.title,
            m.content_type,
            m.body,
            blob.map(|b| &b.bucket),
            blob.map(|b| &b.name),
            blob.map(|b| &b.sha256),
            blob.map(|b| i64::try_from(b.size_bytes).unwrap_or(i64::MAX)),
            blob.map(|b| &b.content_type),
            m.repository_commit,
            at.sequence
        ])?;
    Ok(())
}

const PROJECT_COLUMNS: &str = "project_id, name, repository_url, branch, created_at, setup_revision, state, failed_step,
    failure_code, failure_message, failure_retryable, repository_commit, agent_id, agent_enabled,
    EXISTS (SELECT 1 FROM gw_flows f WHERE f.project_id = p.project_id AND f.state IN ('requested', 'running'))";

fn project_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ProjectRow> {
    Ok(ProjectRow {
        project_id: row.get(0)?,
        name: row.get(1)?,
        repository_url: row.get(2)?,
        branch: row.get(3)?,
        created_at: row.get(4)?,
        setup: SetupRow {
            revision: row.get(5)?,
            state: row.get(6)?,
            failed_step: row.get(7)?,
            failure: FailureRow::from_columns(row, 8)?,
            environment_names: Vec::new(),
            environment_values: Vec::new(),
            repository_commit: row.get::<_, Option<String>>(11)?.filter(|c| !c.is_empty()),
        },
        agent_id: row.get(12)?,
        agent_enabled: row.get(13)?,
        running: row.get(14)?,
    })
}

fn with_environment_names(
    conn: &Connection,
    mut project: ProjectRow,
) -> rusqlite::Result<ProjectRow> {
    project.setup.environment_names = read_list(
        conn,
        "gw_project_environment_names",
        "project_id",
        "name",
        &project.project_id,
    )?;
    project.setup.environment_values = conn
        .prepare_cached(
            "SELECT name, version, fingerprint, updated_at, updated_by FROM gw_environment_values
             WHERE project_id = ?1 ORDER BY name",
        )?
        .query_map([&project.project_id], |row| {
            Ok(EnvironmentValueRow {
                name: row.get(0)?,
                version: u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
                fingerprint: row.get(2)?,
                updated_at: row.get(3)?,
                updated_by: row.get(4)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(project)
}

/// The organization's projects, newest first.
pub fn list(conn: &Connection, org: &OrgId, limit: usize) -> rusqlite::Result<Vec<ProjectRow>> {
    let rows: Vec<ProjectRow> = conn
        .prepare_cached(&format!(
            "SELECT {PROJECT_COLUMNS} FROM gw_projects p WHERE org = ?1 ORDER BY created_at DESC, project_id LIMIT ?2"
        ))?
        .query_map(params![org.as_str(), limit as i64], project_row)?
        .collect::<rusqlite::Result<_>>()?;
    rows.into_iter()
        .map(|project| with_environment_names(conn, project))
        .collect()
}

/// One project of the organization.
pub fn find(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
) -> rusqlite::Result<Option<ProjectRow>> {
    conn.prepare_cached(&format!(
        "SELECT {PROJECT_COLUMNS} FROM gw_projects p WHERE project_id = ?1 AND org = ?2"
    ))?
    .query_row(params![project.to_string(), org.as_str()], project_row)
    .optional()?
    .map(|project| with_environment_names(conn, project))
    .transpose()
}

/// The project's current summary document.
pub fn summary(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
) -> rusqlite::Result<Option<SummaryRow>> {
    conn.prepare_cached(
        "SELECT document_id, revision, title, content_type, body, repository_commit,
            blob_bucket, blob_name, blob_sha256, blob_size_bytes, blob_content_type
         FROM gw_summaries WHERE project_id = ?1 AND org = ?2",
    )?
    .query_row(params![project.to_string(), org.as_str()], |row| {
        let blob = match row.get::<_, Option<String>>(6)? {
            Some(bucket) => Some(pb::BlobRef {
                bucket,
                name: row.get(7)?,
                sha256: row.get(8)?,
                size_bytes: row.get::<_, i64>(9)?.max(0) as u64,
                content_type: row.get(10)?,
            }),
            None => None,
        };
        Ok(SummaryRow {
            document_id: row.get(0)?,
            revision: row.get(1)?,
            title: row.get(2)?,
            content_type: row.get(3)?,
            body: row.get(4)?,
            repository_commit: row.get(5)?,
            blob,
        })
    })
    .optional()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::read_model::tests::{TestStore, envelope};
    use zopu_schema::FlowRunId;

    fn requested(revision: u32) -> pb::ProjectSetupRequested {
        pb::ProjectSetupRequested {
            repository_url: "https://example.com/r.git".into(),
            branch: "main".into(),
            setup_revision: revision,
            project_name: "demo".into(),
            ..Default::default()
        }
    }

    #[test]
    fn setup_progresses_and_a_retry_clears_the_failure() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap();
        store.apply(&[
            envelope("acme", project, &requested(1), 1),
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
        ]);
        let row = find(&store.connection, &org, &project).unwrap().unwrap();
        assert_eq!(row.setup.state, setup_state::FAILED);
        assert_eq!(row.setup.failed_step.as_deref(), Some("clone"));
        assert_eq!(
            row.setup.failure,
            Some(FailureRow {
                code: "clone.branch_not_found".into(),
                message: "no branch".into(),
                retryable: false,
            })
        );
        assert!(
            find(&store.connection, &"other".parse().unwrap(), &project)
                .unwrap()
                .is_none(),
            "another organization reads the project"
        );

        store.apply(&[
            envelope("acme", project, &requested(2), 4),
            // A late event of the old revision moves nothing.
            envelope(
                "acme",
                project,
                &pb::ProjectRuntimeCreated {
                    setup_revision: 1,
                    ..Default::default()
                },
                5,
            ),
        ]);
        let row = find(&store.connection, &org, &project).unwrap().unwrap();
        assert_eq!(
            (row.setup.state.as_str(), row.setup.revision),
            (setup_state::CREATING_WORKSPACE, 2)
        );
        assert!(row.setup.failure.is_none());
        assert!(row.setup.failed_step.is_none());
    }

    #[test]
    fn ready_records_commit_names_and_agent_and_stays_ready() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap();
        store.apply(&[
            envelope("acme", project, &requested(1), 1),
            envelope(
                "acme",
                project,
                &pb::ProjectEnvironmentScanned {
                    setup_revision: 1,
                    variables: vec![pb::EnvironmentVariable {
                        name: "SCANNED".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                2,
            ),
            envelope(
                "acme",
                project,
                &pb::ProjectReady {
                    setup_revision: 1,
                    repository_commit: "abc123".into(),
                    environment_variable_names: vec!["DATABASE_URL".into(), "API_HOST".into()],
                    agent_id: "agent-1".into(),
                    ..Default::default()
                },
                3,
            ),
            envelope(
                "acme",
                project,
                &pb::ProjectRepositoryCloned {
                    setup_revision: 1,
                    ..Default::default()
                },
                4,
            ),
            envelope("acme", project, &pb::AgentDisabled::default(), 5),
        ]);
        let row = find(&store.connection, &org, &project).unwrap().unwrap();
        assert_eq!(row.setup.state, setup_state::READY);
        assert_eq!(
            row.setup.environment_names,
            vec!["DATABASE_URL".to_owned(), "API_HOST".to_owned()]
        );
        assert_eq!(row.agent_id.as_deref(), Some("agent-1"));
        assert!(!row.agent_enabled);
        assert_eq!(
            row.setup.repository_commit, None,
            "a late clone event's empty commit reads as none"
        );
        assert_eq!(list(&store.connection, &org, 10).unwrap(), vec![row]);
        assert!(
            list(&store.connection, &"other".parse().unwrap(), 10)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_project_runs_while_a_flow_is_open_and_a_terminal_flow_stays_closed() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap();
        let flow = FlowRunId::new();
        let with_flow = |mut event: Envelope| {
            event.flow_run_id = Some(flow);
            event
        };
        store.apply(&[
            envelope("acme", project, &requested(1), 1),
            with_flow(envelope("acme", project, &pb::FlowRequested::default(), 2)),
        ]);
        assert!(
            find(&store.connection, &org, &project)
                .unwrap()
                .unwrap()
                .running
        );
        store.apply(&[
            with_flow(envelope("acme", project, &pb::FlowCompleted::default(), 3)),
            with_flow(envelope("acme", project, &pb::FlowStarted::default(), 4)),
        ]);
        assert!(
            !find(&store.connection, &org, &project)
                .unwrap()
                .unwrap()
                .running
        );
    }

    #[test]
    fn the_summary_keeps_its_blob_reference_in_columns() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap();
        let blob = pb::BlobRef {
            bucket: "zopu-artifacts".into(),
            name: "summary/1.md".into(),
            sha256: "ab".repeat(32),
            size_bytes: 4096,
            content_type: "text/markdown".into(),
        };
        let published = |revision, blob: Option<pb::BlobRef>| pb::ContextPublished {
            kind: "repository_summary".into(),
            document_id: "doc-1".into(),
            revision,
            title: "summary.md".into(),
            content_type: "text/markdown".into(),
            repository_commit: "abc".into(),
            blob,
            ..Default::default()
        };
        store.apply(&[
            envelope("acme", project, &published(1, Some(blob.clone())), 1),
            envelope(
                "acme",
                project,
                &pb::ContextPublished {
                    kind: "other".into(),
                    ..published(9, None)
                },
                2,
            ),
        ]);
        let row = summary(&store.connection, &org, &project).unwrap().unwrap();
        assert_eq!((row.revision, row.blob), (1, Some(blob)));
        store.apply(&[envelope("acme", project, &published(2, None), 3)]);
        let row = summary(&store.connection, &org, &project).unwrap().unwrap();
        assert_eq!((row.revision, row.blob), (2, None));
        assert!(
            summary(&store.connection, &"other".parse().unwrap(), &project)
                .unwrap()
                .is_none()
        );
    }
}
