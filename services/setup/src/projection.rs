//! The setup projection: per project and revision the folded
//! [`RevisionState`], the project's runtime (workspace binding) and its
//! conversation agent binding. Rebuilt from the stream like every other;
//! rows are a function of the events alone (no clock, no I/O).

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use zopu_runtime::Projection;
use zopu_schema::{Envelope, OrgId, ProjectId, pb};

use crate::state::{
    CloneRecord, EnvironmentRecord, Failure, RequestRecord, RevisionState, RuntimeRecord,
    SetupStatus, is_setup_event, setup_revision_of,
};

/// Checkpoint name inside the setup service's store.
pub const NAME: &str = "setup";
const TABLES: &[&str] = &[
    "setup_revisions",
    "setup_project_runtimes",
    "setup_agent_bindings",
];

const SCHEMA: &str = "
CREATE TABLE setup_revisions (
    org TEXT NOT NULL,
    project TEXT NOT NULL,
    revision INTEGER NOT NULL,
    phase TEXT NOT NULL,
    repository_url TEXT,
    branch TEXT,
    project_name TEXT,
    connection_id TEXT,
    started INTEGER NOT NULL,
    runtime_id TEXT,
    provider TEXT,
    workspace_path TEXT,
    repository_path TEXT,
    runtime_reused INTEGER,
    clone_branch TEXT,
    repository_commit TEXT,
    tracked_files INTEGER,
    clone_reused INTEGER,
    environment_status TEXT,
    environment_names TEXT,
    agent_id TEXT,
    ready INTEGER NOT NULL,
    failure_step TEXT,
    failure_code TEXT,
    failure_message TEXT,
    failure_retryable INTEGER,
    last_sequence INTEGER NOT NULL,
    PRIMARY KEY (org, project, revision)
);
CREATE TABLE setup_project_runtimes (
    org TEXT NOT NULL,
    project TEXT NOT NULL,
    runtime_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    workspace_path TEXT NOT NULL,
    repository_path TEXT NOT NULL,
    status TEXT NOT NULL,
    repository_commit TEXT,
    setup_revision INTEGER NOT NULL,
    last_error_code TEXT,
    PRIMARY KEY (org, project)
);
CREATE TABLE setup_agent_bindings (
    agent_id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    project TEXT NOT NULL,
    agent_type TEXT NOT NULL,
    runtime_id TEXT NOT NULL,
    global_timeline_id TEXT NOT NULL,
    setup_revision INTEGER NOT NULL,
    UNIQUE (org, project, agent_type)
);
";

/// The projection (stateless; everything lives in the tables).
#[derive(Debug, Default, Clone, Copy)]
pub struct SetupProjection;

impl Projection for SetupProjection {
    fn name(&self) -> &'static str {
        NAME
    }

    fn schema_version(&self) -> u32 {
        1
    }

    fn tables(&self) -> &'static [&'static str] {
        TABLES
    }

    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(SCHEMA)
    }

    // Every event is read (an unfiltered projection keeps the store's
    // checkpoint at the stream's end); only setup events change rows.
    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        sequence: u64,
    ) -> rusqlite::Result<()> {
        if !is_setup_event(&event.event_type) {
            return Ok(());
        }
        let Some(revision) = setup_revision_of(event) else {
            return Ok(());
        };
        let (org, project) = (event.org_id.as_str(), event.project_id.to_string());
        if let Ok(registered) = event.decode::<pb::AgentRegistered>() {
            tx.prepare_cached("INSERT OR IGNORE INTO setup_agent_bindings
                 (agent_id, org, project, agent_type, runtime_id, global_timeline_id, setup_revision)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")?.execute(params![
                    registered.agent_id,
                    org,
                    project,
                    registered.agent_type,
                    registered.runtime_id,
                    registered.global_timeline_id,
                    registered.setup_revision
                ],
            )?;
        }
        let existing = load(tx, org, &project, revision)?;
        let mut state = match existing.clone() {
            Some(state) => state,
            None if event.is::<pb::ProjectSetupRequested>() => {
                let mut state = RevisionState::new(revision);
                state.agent_id = binding_of(tx, org, &project)?.map(|binding| binding.agent_id);
                state
            }
            // Only a request opens a revision.
            None => return Ok(()),
        };
        if !state.apply(event) && existing.is_some() {
            return Ok(());
        }
        save(tx, org, &project, &state, sequence)?;
        if let Some(runtime) = &state.runtime {
            tx.prepare_cached("INSERT INTO setup_project_runtimes
                 (org, project, runtime_id, provider, workspace_path, repository_path, status, repository_commit, setup_revision, last_error_code)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                 ON CONFLICT (org, project) DO UPDATE SET
                    runtime_id = excluded.runtime_id, provider = excluded.provider,
                    workspace_path = excluded.workspace_path, repository_path = excluded.repository_path,
                    status = excluded.status, repository_commit = excluded.repository_commit,
                    setup_revision = excluded.setup_revision, last_error_code = excluded.last_error_code
                 WHERE excluded.setup_revision >= setup_project_runtimes.setup_revision")?.execute(params![
                    org,
                    project,
                    runtime.runtime_id,
                    runtime.provider,
                    runtime.workspace_path,
                    runtime.repository_path,
                    state.phase().as_str(),
                    state.clone.as_ref().map(|clone| clone.commit.clone()),
                    state.revision,
                    state.failure.as_ref().map(|failure| failure.code.clone()),
                ],
            )?;
        }
        Ok(())
    }
}

/// The projects of `org` whose setup started, other than `project`, and
/// whether `project`'s own setup started (in any revision).
pub fn started_projects(
    store: &zopu_runtime::Store,
    org: &OrgId,
    project: &ProjectId,
) -> Result<(u64, bool), zopu_runtime::Error> {
    let project = project.to_string();
    store.read(|conn| {
        let others: i64 = conn
            .prepare_cached(
                "SELECT COUNT(DISTINCT project) FROM setup_revisions
                 WHERE org = ?1 AND started = 1 AND project <> ?2",
            )?
            .query_row(params![org.as_str(), project], |row| row.get(0))?;
        let this: bool = conn
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM setup_revisions
                 WHERE org = ?1 AND project = ?2 AND started = 1)",
            )?
            .query_row(params![org.as_str(), project], |row| row.get(0))?;
        Ok((u64::try_from(others).unwrap_or(0), this))
    })
}

/// A project's conversation agent binding (main spec section 8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentBinding {
    pub agent_id: String,
    pub agent_type: String,
    pub runtime_id: String,
    pub global_timeline_id: String,
    pub setup_revision: u32,
}

fn binding_of(
    conn: &Connection,
    org: &str,
    project: &str,
) -> rusqlite::Result<Option<AgentBinding>> {
    conn.prepare_cached(
        "SELECT agent_id, agent_type, runtime_id, global_timeline_id, setup_revision
         FROM setup_agent_bindings WHERE org = ?1 AND project = ?2 ORDER BY setup_revision LIMIT 1",
    )?
    .query_row(params![org, project], |row| {
        Ok(AgentBinding {
            agent_id: row.get(0)?,
            agent_type: row.get(1)?,
            runtime_id: row.get(2)?,
            global_timeline_id: row.get(3)?,
            setup_revision: row.get(4)?,
        })
    })
    .optional()
}

fn load(
    conn: &Connection,
    org: &str,
    project: &str,
    revision: u32,
) -> rusqlite::Result<Option<RevisionState>> {
    conn.prepare_cached(
        "SELECT revision, repository_url, branch, project_name, connection_id, started,
                runtime_id, provider, workspace_path, repository_path, runtime_reused,
                clone_branch, repository_commit, tracked_files, clone_reused,
                environment_status, environment_names, agent_id, ready,
                failure_step, failure_code, failure_message, failure_retryable
         FROM setup_revisions WHERE org = ?1 AND project = ?2 AND revision = ?3",
    )?
    .query_row(params![org, project, revision], row_to_state)
    .optional()
}

fn row_to_state(row: &rusqlite::Row<'_>) -> rusqlite::Result<RevisionState> {
    let text = |index: usize| row.get::<_, Option<String>>(index);
    let flag = |index: usize| {
        row.get::<_, Option<bool>>(index)
            .map(Option::unwrap_or_default)
    };
    let request = match text(1)? {
        Some(repository_url) => Some(RequestRecord {
            repository_url,
            branch: text(2)?.unwrap_or_default(),
            project_name: text(3)?.unwrap_or_default(),
            repository_connection_id: text(4)?.unwrap_or_default(),
        }),
        None => None,
    };
    let runtime = match text(6)? {
        Some(runtime_id) => Some(RuntimeRecord {
            runtime_id,
            provider: text(7)?.unwrap_or_default(),
            workspace_path: text(8)?.unwrap_or_default(),
            repository_path: text(9)?.unwrap_or_default(),
            reused: flag(10)?,
        }),
        None => None,
    };
    let clone = match text(12)? {
        Some(commit) => Some(CloneRecord {
            branch: text(11)?.unwrap_or_default(),
            commit,
            tracked_files: row
                .get::<_, Option<i64>>(13)?
                .and_then(|n| u64::try_from(n).ok())
                .unwrap_or_default(),
            reused: flag(14)?,
        }),
        None => None,
    };
    let environment = match text(15)? {
        Some(status) => Some(EnvironmentRecord {
            status,
            names: split_names(&text(16)?.unwrap_or_default()),
        }),
        None => None,
    };
    let failure = match text(20)? {
        Some(code) => Some(Failure {
            step: text(19)?.unwrap_or_default(),
            code,
            message: text(21)?.unwrap_or_default(),
            retryable: flag(22)?,
        }),
        None => None,
    };
    Ok(RevisionState {
        revision: row.get(0)?,
        request,
        started: flag(5)?,
        runtime,
        clone,
        environment,
        agent_id: text(17)?,
        ready: flag(18)?,
        failure,
    })
}

/// Variable names match `[A-Za-z_][A-Za-z0-9_]*`, so a newline separates them.
fn split_names(joined: &str) -> Vec<String> {
    joined
        .split('\n')
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

fn save(
    tx: &Transaction<'_>,
    org: &str,
    project: &str,
    state: &RevisionState,
    sequence: u64,
) -> rusqlite::Result<()> {
    let request = state.request.as_ref();
    let runtime = state.runtime.as_ref();
    let clone = state.clone.as_ref();
    let environment = state.environment.as_ref();
    let failure = state.failure.as_ref();
    tx.prepare_cached("INSERT OR REPLACE INTO setup_revisions
         (org, project, revision, phase, repository_url, branch, project_name, connection_id, started,
          runtime_id, provider, workspace_path, repository_path, runtime_reused,
          clone_branch, repository_commit, tracked_files, clone_reused,
          environment_status, environment_names, agent_id, ready,
          failure_step, failure_code, failure_message, failure_retryable, last_sequence)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27)")?.execute(params![
            org,
            project,
            state.revision,
            state.phase().as_str(),
            request.map(|r| r.repository_url.clone()),
            request.map(|r| r.branch.clone()),
            request.map(|r| r.project_name.clone()),
            request.map(|r| r.repository_connection_id.clone()),
            state.started,
            runtime.map(|r| r.runtime_id.clone()),
            runtime.map(|r| r.provider.clone()),
            runtime.map(|r| r.workspace_path.clone()),
            runtime.map(|r| r.repository_path.clone()),
            runtime.map(|r| r.reused),
            clone.map(|c| c.branch.clone()),
            clone.map(|c| c.commit.clone()),
            clone.map(|c| i64::try_from(c.tracked_files).unwrap_or(i64::MAX)),
            clone.map(|c| c.reused),
            environment.map(|e| e.status.clone()),
            environment.map(|e| e.names.join("\n")),
            state.agent_id.clone(),
            state.ready,
            failure.map(|f| f.step.clone()),
            failure.map(|f| f.code.clone()),
            failure.map(|f| f.message.clone()),
            failure.map(|f| f.retryable),
            i64::try_from(sequence).unwrap_or(i64::MAX),
        ],
    )
    .map(|_| ())
}

/// The status of a project's latest setup revision, from the projection.
pub fn read_status(
    store: &zopu_runtime::Store,
    org: &OrgId,
    project: &ProjectId,
) -> Result<Option<SetupStatus>, zopu_runtime::Error> {
    read_state(store, org, project).map(|state| state.map(|state| state.status()))
}

/// The folded state of a project's latest setup revision.
pub fn read_state(
    store: &zopu_runtime::Store,
    org: &OrgId,
    project: &ProjectId,
) -> Result<Option<RevisionState>, zopu_runtime::Error> {
    let project = project.to_string();
    store.read(|conn| {
        let latest: Option<u32> = conn
            .prepare_cached(
                "SELECT MAX(revision) FROM setup_revisions WHERE org = ?1 AND project = ?2",
            )?
            .query_row(params![org.as_str(), project], |row| row.get(0))
            .optional()?
            .flatten();
        match latest {
            Some(revision) => load(conn, org.as_str(), &project, revision),
            None => Ok(None),
        }
    })
}

/// The project's conversation agent binding, once registered.
pub fn agent_binding(
    store: &zopu_runtime::Store,
    org: &OrgId,
    project: &ProjectId,
) -> Result<Option<AgentBinding>, zopu_runtime::Error> {
    store.read(|conn| binding_of(conn, org.as_str(), &project.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::state::tests::{chain, envelope};
    use crate::state::{Failure, SetupPhase, status_from_events, step};

    fn project(events: &[Envelope], path: &std::path::Path) -> zopu_runtime::Store {
        let store = zopu_runtime::Store::open(path).unwrap();
        store
            .write(|tx| {
                let mut projection = SetupProjection;
                projection.migrate(tx)?;
                for (index, event) in events.iter().enumerate() {
                    projection.apply(tx, event, index as u64 + 1)?;
                }
                Ok(())
            })
            .unwrap();
        store
    }

    #[test]
    fn the_projection_agrees_with_the_fold_and_rebuilds_identically() {
        let mut events = chain(1);
        let ready = {
            let mut state = RevisionState::new(1);
            events.iter().for_each(|event| {
                state.apply(event);
            });
            state.ready_event().unwrap()
        };
        events.push(envelope(&ready, 7));
        let org: OrgId = "acme".parse().unwrap();
        let project_id = events[0].project_id;
        let dir = tempfile::tempdir().unwrap();
        let first = project(&events, &dir.path().join("a.sqlite"));
        let status = read_status(&first, &org, &project_id).unwrap().unwrap();
        assert_eq!(Some(status.clone()), status_from_events(&events));
        assert_eq!(status.phase, SetupPhase::Ready);
        assert_eq!(status.environment_variable_names, ["PORT"]);

        // A retry that fails: the latest revision is reported, the agent binding stays.
        events.push(envelope(
            &pb::ProjectSetupRequested {
                setup_revision: 2,
                branch: "dev".into(),
                ..Default::default()
            },
            8,
        ));
        events.push(envelope(
            &Failure::new(step::CLONE, "clone.branch_not_found", "x", true).to_event(2),
            9,
        ));
        let second = project(&events, &dir.path().join("b.sqlite"));
        let status = read_status(&second, &org, &project_id).unwrap().unwrap();
        assert_eq!(Some(status.clone()), status_from_events(&events));
        assert_eq!((status.revision, status.phase), (2, SetupPhase::Failed));
        assert_eq!(status.agent_id.as_deref(), Some("conversation:acme:p"));
        let binding = agent_binding(&second, &org, &project_id).unwrap().unwrap();
        assert_eq!(binding.setup_revision, 1);

        // Replaying the same events (twice over) gives the same rows.
        let doubled: Vec<Envelope> = events.iter().chain(&events).cloned().collect();
        let third = project(&doubled, &dir.path().join("c.sqlite"));
        let digest = |store: &zopu_runtime::Store| {
            let conn_tables = [
                "setup_revisions",
                "setup_project_runtimes",
                "setup_agent_bindings",
            ];
            store
                .read(|conn| {
                    let mut rows = Vec::new();
                    for table in conn_tables {
                        let mut statement =
                            conn.prepare(&format!("SELECT * FROM {table} ORDER BY 1, 2, 3"))?;
                        let names: Vec<String> = statement
                            .column_names()
                            .into_iter()
                            .map(str::to_owned)
                            .collect();
                        let mut query = statement.query([])?;
                        while let Some(row) = query.next()? {
                            // last_sequence differs between the two replays by design.
                            let values: Vec<String> = (0..names.len())
                                .filter(|&column| names[column] != "last_sequence")
                                .map(|column| {
                                    format!(
                                        "{:?}",
                                        row.get::<_, rusqlite::types::Value>(column).unwrap()
                                    )
                                })
                                .collect();
                            rows.push(values.join("|"));
                        }
                    }
                    Ok(rows)
                })
                .unwrap()
        };
        assert_eq!(digest(&second), digest(&third));
    }
}
