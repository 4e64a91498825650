//! The service's projection: what flows need to know about the rest of the
//! project. Agents' kill-switch state, the environment names from setup, the
//! repository each setup revision cloned (location, branch, connection id and
//! commit, so any instance can materialize the workspace), the current
//! context document per project and kind, the latest exploration result per
//! project, artifact revisions and the flows a user asked to cancel. Deterministic; deleting the file rebuilds
//! it from the stream.

use rusqlite::{OptionalExtension, Transaction, params};
use zopu_runtime::{Projection, Store};
use zopu_schema::{Envelope, Event, pb};

/// The projection.
#[derive(Debug, Default, Clone, Copy)]
pub struct State;

const TABLES: &[&str] = &[
    "specialist_agents",
    "specialist_env",
    "specialist_context",
    "specialist_results",
    "specialist_artifacts",
    "specialist_repositories",
    "specialist_cancels",
    zopu_core::model_usage::TABLE,
];

impl Projection for State {
    fn name(&self) -> &'static str {
        "specialists"
    }

    fn schema_version(&self) -> u32 {
        5
    }

    fn tables(&self) -> &'static [&'static str] {
        TABLES
    }

    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(
            "CREATE TABLE specialist_agents (agent_id TEXT PRIMARY KEY, disabled INTEGER NOT NULL, reason TEXT NOT NULL, sequence INTEGER NOT NULL);
             CREATE TABLE specialist_env (project_id TEXT PRIMARY KEY, names_json TEXT NOT NULL, sequence INTEGER NOT NULL);
             CREATE TABLE specialist_context (project_id TEXT NOT NULL, kind TEXT NOT NULL, document_id TEXT NOT NULL, revision INTEGER NOT NULL,
                 body TEXT NOT NULL, sequence INTEGER NOT NULL, PRIMARY KEY (project_id, kind));
             CREATE TABLE specialist_results (flow_run_id TEXT PRIMARY KEY, project_id TEXT NOT NULL, flow_type INTEGER NOT NULL,
                 result_json TEXT NOT NULL, sequence INTEGER NOT NULL);
             CREATE INDEX specialist_results_project ON specialist_results (project_id, flow_type, sequence);
             CREATE TABLE specialist_artifacts (artifact_id TEXT PRIMARY KEY, revision INTEGER NOT NULL, flow_run_id TEXT NOT NULL, sequence INTEGER NOT NULL);
             CREATE TABLE specialist_repositories (project_id TEXT NOT NULL, setup_revision INTEGER NOT NULL,
                 repository_url TEXT NOT NULL, branch TEXT NOT NULL, connection_id TEXT NOT NULL,
                 repository_commit TEXT NOT NULL, sequence INTEGER NOT NULL, project_name TEXT NOT NULL DEFAULT '',
                 PRIMARY KEY (project_id, setup_revision));
             CREATE TABLE specialist_cancels (flow_run_id TEXT PRIMARY KEY, reason TEXT NOT NULL, requested_by TEXT NOT NULL, sequence INTEGER NOT NULL);",
        )?;
        tx.execute_batch(zopu_core::model_usage::SCHEMA)
    }

    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        sequence: u64,
    ) -> rusqlite::Result<()> {
        zopu_core::model_usage::apply(tx, event, sequence)?;
        let sequence = sequence as i64;
        let project = event.project_id.to_string();
        let decode_error = |e: zopu_schema::envelope::PayloadError| {
            rusqlite::Error::ToSqlConversionFailure(Box::new(e))
        };
        match event.event_type.as_str() {
            t if t == pb::AgentDisabled::TYPE => {
                let payload: pb::AgentDisabled = event.decode().map_err(decode_error)?;
                tx.prepare_cached("INSERT INTO specialist_agents (agent_id, disabled, reason, sequence) VALUES (?1, 1, ?2, ?3)
                     ON CONFLICT (agent_id) DO UPDATE SET disabled = 1, reason = ?2, sequence = ?3")?.execute(params![payload.agent_id, payload.reason, sequence],
                )?;
            }
            t if t == pb::AgentEnabled::TYPE => {
                let payload: pb::AgentEnabled = event.decode().map_err(decode_error)?;
                tx.prepare_cached("INSERT INTO specialist_agents (agent_id, disabled, reason, sequence) VALUES (?1, 0, '', ?2)
                     ON CONFLICT (agent_id) DO UPDATE SET disabled = 0, reason = '', sequence = ?2")?.execute(params![payload.agent_id, sequence],
                )?;
            }
            t if t == pb::FlowCancelRequested::TYPE => {
                let payload: pb::FlowCancelRequested = event.decode().map_err(decode_error)?;
                let by = payload.by.map(|actor| actor.id).unwrap_or_default();
                // The first request stands (one key per flow; a later copy changes nothing).
                tx.prepare_cached("INSERT INTO specialist_cancels (flow_run_id, reason, requested_by, sequence) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (flow_run_id) DO NOTHING")?.execute(params![payload.flow_run_id, payload.reason, by, sequence])?;
            }
            t if t == pb::ProjectSetupRequested::TYPE => {
                let payload: pb::ProjectSetupRequested = event.decode().map_err(decode_error)?;
                tx.prepare_cached("INSERT INTO specialist_repositories (project_id, setup_revision, repository_url, branch, connection_id, repository_commit, sequence, project_name)
                     VALUES (?1, ?2, ?3, ?4, ?5, '', ?6, ?7)
                     ON CONFLICT (project_id, setup_revision) DO UPDATE SET repository_url = ?3, branch = ?4, connection_id = ?5, sequence = ?6, project_name = ?7")?
                    .execute(params![project, payload.setup_revision, payload.repository_url, payload.branch, payload.repository_connection_id, sequence, payload.project_name])?;
            }
            t if t == pb::ProjectRepositoryCloned::TYPE => {
                let payload: pb::ProjectRepositoryCloned = event.decode().map_err(decode_error)?;
                record_commit(
                    tx,
                    &project,
                    payload.setup_revision,
                    "",
                    &payload.branch,
                    &payload.repository_commit,
                    sequence,
                )?;
            }
            t if t == pb::ProjectReady::TYPE => {
                let payload: pb::ProjectReady = event.decode().map_err(decode_error)?;
                record_commit(
                    tx,
                    &project,
                    payload.setup_revision,
                    &payload.repository_url,
                    &payload.branch,
                    &payload.repository_commit,
                    sequence,
                )?;
                let names = serde_json::to_string(&payload.environment_variable_names)
                    .unwrap_or_else(|_| "[]".into());
                tx.prepare_cached("INSERT INTO specialist_env (project_id, names_json, sequence) VALUES (?1, ?2, ?3)
                     ON CONFLICT (project_id) DO UPDATE SET names_json = ?2, sequence = ?3")?.execute(params![project, names, sequence],
                )?;
            }
            t if t == pb::ContextPublished::TYPE => {
                let payload: pb::ContextPublished = event.decode().map_err(decode_error)?;
                tx.prepare_cached("INSERT INTO specialist_context (project_id, kind, document_id, revision, body, sequence) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (project_id, kind) DO UPDATE SET document_id = ?3, revision = ?4, body = ?5, sequence = ?6
                     WHERE excluded.revision >= specialist_context.revision")?.execute(params![project, payload.kind, payload.document_id, payload.revision, payload.body, sequence],
                )?;
            }
            t if t == pb::FlowCompleted::TYPE => {
                let payload: pb::FlowCompleted = event.decode().map_err(decode_error)?;
                if let Some(run) = event.flow_run_id {
                    tx.prepare_cached("INSERT OR IGNORE INTO specialist_results (flow_run_id, project_id, flow_type, result_json, sequence) VALUES (?1, ?2, ?3, ?4, ?5)")?.execute(params![run.to_string(), project, payload.flow_type, payload.result_json, sequence],
                    )?;
                }
            }
            t if t == pb::ArtifactBuildRequested::TYPE => {
                let payload: pb::ArtifactBuildRequested = event.decode().map_err(decode_error)?;
                let run = event
                    .flow_run_id
                    .map(|id| id.to_string())
                    .unwrap_or_default();
                tx.prepare_cached("INSERT INTO specialist_artifacts (artifact_id, revision, flow_run_id, sequence) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (artifact_id) DO UPDATE SET revision = ?2, flow_run_id = ?3, sequence = ?4
                     WHERE excluded.revision > specialist_artifacts.revision")?.execute(params![payload.artifact_id, payload.revision, run, sequence],
                )?;
            }
            _ => {}
        }
        Ok(())
    }
    // Follows every event (the default filter): a filtered projection's
    // checkpoint would not reach the stream's end, and `Store::wait_for`,
    // which the reaction runner relies on, waits for the lowest checkpoint.
}

/// Records the commit a setup revision cloned; fills location and branch
/// only where the request did not (a request always comes first on the
/// stream, `project.ready` repeats what it said).
fn record_commit(
    tx: &Transaction<'_>,
    project: &str,
    revision: u32,
    repository_url: &str,
    branch: &str,
    commit: &str,
    sequence: i64,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO specialist_repositories (project_id, setup_revision, repository_url, branch, connection_id, repository_commit, sequence)
         VALUES (?1, ?2, ?3, ?4, '', ?5, ?6)
         ON CONFLICT (project_id, setup_revision) DO UPDATE SET
             repository_url = CASE WHEN repository_url = '' THEN excluded.repository_url ELSE repository_url END,
             branch = CASE WHEN branch = '' THEN excluded.branch ELSE branch END,
             repository_commit = CASE WHEN excluded.repository_commit = '' THEN repository_commit ELSE excluded.repository_commit END,
             sequence = ?6",
    )?
    .execute(params![project, revision, repository_url, branch, commit, sequence])?;
    Ok(())
}

/// Where a project's repository comes from, as the stream recorded it.
/// `connection_id` names a credential in the credential store; it is not a
/// secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRepository {
    pub setup_revision: u32,
    pub repository_url: String,
    pub branch: String,
    pub connection_id: String,
    /// Empty until the revision's clone is recorded.
    pub commit: String,
}

/// The recorded repository to materialize `commit` from: the latest setup
/// revision that cloned that commit, else the latest revision with a
/// location (an empty `commit` asks for the latest).
pub fn recorded_repository(
    store: &Store,
    project_id: &str,
    commit: &str,
) -> Result<Option<RecordedRepository>, zopu_runtime::Error> {
    store.read(|conn| {
        conn.prepare_cached(
            "SELECT setup_revision, repository_url, branch, connection_id, repository_commit FROM specialist_repositories
             WHERE project_id = ?1 AND repository_url <> ''
             ORDER BY (?2 <> '' AND repository_commit = ?2) DESC, setup_revision DESC LIMIT 1",
        )?
        .query_row(params![project_id, commit], |row| {
            Ok(RecordedRepository {
                setup_revision: row.get(0)?,
                repository_url: row.get(1)?,
                branch: row.get(2)?,
                connection_id: row.get(3)?,
                commit: row.get(4)?,
            })
        })
        .optional()
    })
}

/// The project's name as its latest setup request that named it chose
/// (`--name`, else the repository's name); `None` before any did.
pub fn project_name(
    store: &Store,
    project_id: &str,
) -> Result<Option<String>, zopu_runtime::Error> {
    store.read(|conn| {
        conn.prepare_cached(
            "SELECT project_name FROM specialist_repositories
             WHERE project_id = ?1 AND project_name <> ''
             ORDER BY setup_revision DESC LIMIT 1",
        )?
        .query_row([project_id], |row| row.get(0))
        .optional()
    })
}

/// The current context document of a project and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentDocument {
    pub document_id: String,
    pub revision: u32,
    pub body: String,
}

/// Why the agent is disabled, when it is.
pub fn disabled(store: &Store, agent_id: &str) -> Result<Option<String>, zopu_runtime::Error> {
    store.read(|conn| {
        conn.prepare_cached(
            "SELECT reason FROM specialist_agents WHERE agent_id = ?1 AND disabled = 1",
        )?
        .query_row([agent_id], |row| row.get::<_, String>(0))
        .optional()
    })
}

/// A user's request to cancel a flow run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelRequest {
    pub reason: String,
    pub requested_by: String,
}

/// The cancel request of `flow_run_id`, when a user asked for one.
pub fn cancel_requested(
    store: &Store,
    flow_run_id: &str,
) -> Result<Option<CancelRequest>, zopu_runtime::Error> {
    store.read(|conn| {
        conn.prepare_cached(
            "SELECT reason, requested_by FROM specialist_cancels WHERE flow_run_id = ?1",
        )?
        .query_row([flow_run_id], |row| {
            Ok(CancelRequest {
                reason: row.get(0)?,
                requested_by: row.get(1)?,
            })
        })
        .optional()
    })
}

pub fn environment_names(
    store: &Store,
    project_id: &str,
) -> Result<Vec<String>, zopu_runtime::Error> {
    let json = store.read(|conn| {
        conn.prepare_cached("SELECT names_json FROM specialist_env WHERE project_id = ?1")?
            .query_row([project_id], |row| row.get::<_, String>(0))
            .optional()
    })?;
    Ok(json
        .and_then(|json| serde_json::from_str(&json).ok())
        .unwrap_or_default())
}

pub fn current_document(
    store: &Store,
    project_id: &str,
    kind: &str,
) -> Result<Option<CurrentDocument>, zopu_runtime::Error> {
    store.read(|conn| {
        conn.prepare_cached("SELECT document_id, revision, body FROM specialist_context WHERE project_id = ?1 AND kind = ?2")?.query_row(params![project_id, kind],
            |row| Ok(CurrentDocument { document_id: row.get(0)?, revision: row.get(1)?, body: row.get(2)? }),
        )
        .optional()
    })
}

/// The latest completed result of a flow type in a project: (flow run id, JSON).
pub fn latest_result(
    store: &Store,
    project_id: &str,
    flow_type: pb::FlowType,
) -> Result<Option<(String, String)>, zopu_runtime::Error> {
    store.read(|conn| {
        conn.prepare_cached("SELECT flow_run_id, result_json FROM specialist_results WHERE project_id = ?1 AND flow_type = ?2 ORDER BY sequence DESC LIMIT 1")?.query_row(params![project_id, flow_type as i32],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
    })
}

/// The last requested revision of an artifact and the flow run that requested it.
pub fn artifact_revision(
    store: &Store,
    artifact_id: &str,
) -> Result<Option<(u32, String)>, zopu_runtime::Error> {
    store.read(|conn| {
        conn.prepare_cached(
            "SELECT revision, flow_run_id FROM specialist_artifacts WHERE artifact_id = ?1",
        )?
        .query_row([artifact_id], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()
    })
}

#[cfg(test)]
mod tests {
    use zopu_schema::{OrgId, ProjectId};

    use super::*;

    fn envelope<E: Event>(payload: &E, project: ProjectId) -> Envelope {
        zopu_schema::test_support::envelope(payload, &"acme".parse::<OrgId>().unwrap(), project)
    }

    #[test]
    fn the_repository_of_each_setup_revision_is_recorded() {
        let temp = tempfile::tempdir().unwrap();
        let store = Store::open(&temp.path().join("s.sqlite")).unwrap();
        let project = ProjectId::derived(1, "p");
        let (first, second) = ("a".repeat(40), "b".repeat(40));
        let events = [
            envelope(
                &pb::ProjectSetupRequested {
                    repository_url: "https://example.com/o/r.git".into(),
                    branch: "main".into(),
                    setup_revision: 1,
                    repository_connection_id: "conn-1".into(),
                    project_name: "Shop front".into(),
                    ..Default::default()
                },
                project,
            ),
            envelope(
                &pb::ProjectRepositoryCloned {
                    setup_revision: 1,
                    branch: "main".into(),
                    repository_commit: first.clone(),
                    ..Default::default()
                },
                project,
            ),
            envelope(
                &pb::ProjectSetupRequested {
                    repository_url: "https://example.com/o/r.git".into(),
                    branch: "dev".into(),
                    setup_revision: 2,
                    ..Default::default()
                },
                project,
            ),
            // project.ready repeats the request; the clone's commit comes with it.
            envelope(
                &pb::ProjectReady {
                    setup_revision: 2,
                    repository_commit: second.clone(),
                    branch: "other".into(),
                    repository_url: "https://example.com/x.git".into(),
                    ..Default::default()
                },
                project,
            ),
        ];
        store
            .write(|tx| {
                State.migrate(tx)?;
                for (sequence, event) in events.iter().enumerate() {
                    State.apply(tx, event, sequence as u64 + 1)?;
                }
                Ok(())
            })
            .unwrap();
        let project = project.to_string();
        let by_commit = recorded_repository(&store, &project, &first)
            .unwrap()
            .unwrap();
        assert_eq!(
            by_commit,
            RecordedRepository {
                setup_revision: 1,
                repository_url: "https://example.com/o/r.git".into(),
                branch: "main".into(),
                connection_id: "conn-1".into(),
                commit: first,
            }
        );
        let latest = recorded_repository(&store, &project, "").unwrap().unwrap();
        assert_eq!(
            (latest.setup_revision, latest.branch.as_str(), latest.commit),
            (2, "dev", second)
        );
        assert_eq!(
            project_name(&store, &project).unwrap().as_deref(),
            Some("Shop front"),
            "the name the first request chose (the retry named none)"
        );
        let unknown = recorded_repository(&store, &project, &"c".repeat(40))
            .unwrap()
            .unwrap();
        assert_eq!(unknown.setup_revision, 2, "the latest location");
        assert!(
            recorded_repository(&store, &ProjectId::new().to_string(), "")
                .unwrap()
                .is_none()
        );
    }
}
