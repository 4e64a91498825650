//! The agent's turns as the log records them: one row per dispatch to a
//! project's conversation agent (`dispatch.created`), ended by its
//! `dispatch.completed` or `dispatch.failed`.
//!
//! Invariant (one turn per project at a time, decided by the log): a turn
//! starts only when every turn created before it in the stream has ended.
//! The runner's per-project lanes already run a project's dispatches one by
//! one in stream order; this table is what makes the promise hold when a
//! partition changes hands mid-turn and an earlier turn is still running on
//! the instance that lost it.

use rusqlite::{OptionalExtension, Transaction};
use zopu_schema::{AgentId, Envelope, Event, pb};

pub(crate) const TABLE: &str = "cv_turns";

pub(crate) const SCHEMA: &str = "CREATE TABLE cv_turns (
    dispatch_id TEXT PRIMARY KEY, org TEXT NOT NULL, project TEXT NOT NULL,
    created_sequence INTEGER NOT NULL, ended_sequence INTEGER);
CREATE INDEX cv_turns_open ON cv_turns (org, project, created_sequence) WHERE ended_sequence IS NULL;";

/// Records a turn's creation (dispatches to the project's conversation
/// agent only) and its end.
pub(crate) fn apply(tx: &Transaction<'_>, event: &Envelope, sequence: i64) -> rusqlite::Result<()> {
    let Some(dispatch) = event.dispatch_id.map(|id| id.to_string()) else {
        return Ok(());
    };
    match event.event_type.as_str() {
        pb::DispatchCreated::TYPE => {
            let Ok(created) = event.decode::<pb::DispatchCreated>() else {
                return Ok(());
            };
            if created.agent_id
                != AgentId::conversation(&event.org_id, &event.project_id).to_string()
            {
                return Ok(());
            }
            tx.execute(
                "INSERT OR IGNORE INTO cv_turns (dispatch_id, org, project, created_sequence) VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![dispatch, event.org_id.as_str(), event.project_id.to_string(), sequence],
            )?;
        }
        pb::DispatchCompleted::TYPE | pb::DispatchFailed::TYPE => {
            tx.execute(
                "UPDATE cv_turns SET ended_sequence = ?2 WHERE dispatch_id = ?1 AND ended_sequence IS NULL",
                rusqlite::params![dispatch, sequence],
            )?;
        }
        _ => {}
    }
    Ok(())
}

/// The earliest turn of the project created before `created_sequence` that
/// has not ended: its dispatch id and the sequence of its `dispatch.created`.
pub(crate) fn earliest_open_before(
    conn: &rusqlite::Connection,
    org: &str,
    project: &str,
    created_sequence: u64,
) -> rusqlite::Result<Option<(String, u64)>> {
    conn.query_row(
        "SELECT dispatch_id, created_sequence FROM cv_turns
         WHERE org = ?1 AND project = ?2 AND created_sequence < ?3 AND ended_sequence IS NULL
         ORDER BY created_sequence LIMIT 1",
        rusqlite::params![org, project, created_sequence as i64],
        |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)? as u64)),
    )
    .optional()
}
