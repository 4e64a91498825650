//! The executor's projection: the approvals requested (their action and
//! parameters, fixed at request time, and expiry), the first decision on
//! each (folded by `zopu_schema::approval`, as every reader does), and each
//! project's kill switch.

use rusqlite::{OptionalExtension, Transaction, params};
use zopu_runtime::Projection;
use zopu_schema::approval::{self, Status};
use zopu_schema::{Envelope, pb};

/// An approval as requested: what a grant of it executes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    pub action: String,
    pub parameters_json: String,
    /// The request itself was made in dry-run (`conversation.dry_run`).
    pub dry_run: bool,
    /// RFC 3339; empty: it never expires.
    pub expires_at: String,
    /// The first decision on it (only [`Status::Approved`] executes).
    pub status: Status,
}

/// Approvals and kill switches, folded from the stream.
#[derive(Debug, Default)]
pub struct ExecutorState;

impl Projection for ExecutorState {
    fn name(&self) -> &'static str {
        "executor"
    }
    fn schema_version(&self) -> u32 {
        1
    }
    fn tables(&self) -> &'static [&'static str] {
        &["ex_approvals", "ex_switch"]
    }
    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(
            "CREATE TABLE ex_approvals (
                org TEXT NOT NULL, project TEXT NOT NULL, approval_id TEXT NOT NULL,
                action TEXT NOT NULL, parameters_json TEXT NOT NULL, dry_run INTEGER NOT NULL,
                expires_at TEXT NOT NULL, status TEXT NOT NULL,
                PRIMARY KEY (org, project, approval_id));
            CREATE TABLE ex_switch (
                org TEXT NOT NULL, project TEXT NOT NULL, enabled INTEGER NOT NULL,
                PRIMARY KEY (org, project));",
        )
    }
    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        _sequence: u64,
    ) -> rusqlite::Result<()> {
        let (org, project) = (event.org_id.as_str(), event.project_id.to_string());
        let switch = |enabled: bool| {
            tx.prepare_cached(
                "INSERT INTO ex_switch (org, project, enabled) VALUES (?1, ?2, ?3)
                 ON CONFLICT(org, project) DO UPDATE SET enabled = excluded.enabled",
            )?
            .execute(params![org, project, enabled])
            .map(|_| ())
        };
        if event.is::<pb::ApprovalRequested>() {
            let Ok(requested) = event.decode::<pb::ApprovalRequested>() else {
                return Ok(());
            };
            // The first request of an id is the one reviewed.
            tx.prepare_cached(
                "INSERT OR IGNORE INTO ex_approvals (org, project, approval_id, action, parameters_json, dry_run, expires_at, status)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                org,
                project,
                requested.approval_id,
                requested.action,
                requested.parameters_json,
                requested.dry_run,
                requested.expires_at,
                Status::Pending.as_str()
            ])?;
        } else if let Some(decided) = approval::decision_of(event) {
            // The first decision stands; a later one (a duplicate) changes nothing.
            tx.prepare_cached(
                "UPDATE ex_approvals SET status = ?4 WHERE org = ?1 AND project = ?2 AND approval_id = ?3 AND status = ?5",
            )?
            .execute(params![
                org,
                project,
                decided.approval_id,
                decided.status.as_str(),
                Status::Pending.as_str()
            ])?;
        } else if event.is::<pb::AgentDisabled>() {
            switch(false)?;
        } else if event.is::<pb::AgentEnabled>() {
            switch(true)?;
        }
        Ok(())
    }
}

/// The approval `approval_id` of the project, as requested.
pub fn requested(
    conn: &rusqlite::Connection,
    org: &str,
    project: &str,
    approval_id: &str,
) -> rusqlite::Result<Option<Requested>> {
    conn.prepare_cached(
        "SELECT action, parameters_json, dry_run, expires_at, status FROM ex_approvals WHERE org = ?1 AND project = ?2 AND approval_id = ?3",
    )?
    .query_row(params![org, project, approval_id], |row| {
        let status: String = row.get(4)?;
        Ok(Requested {
            action: row.get(0)?,
            parameters_json: row.get(1)?,
            dry_run: row.get(2)?,
            expires_at: row.get(3)?,
            status: Status::parse(&status).unwrap_or(Status::Pending),
        })
    })
    .optional()
}

/// Whether the project's agent is disabled (the kill switch is on).
pub fn is_disabled(
    conn: &rusqlite::Connection,
    org: &str,
    project: &str,
) -> rusqlite::Result<bool> {
    let enabled: Option<bool> = conn
        .prepare_cached("SELECT enabled FROM ex_switch WHERE org = ?1 AND project = ?2")?
        .query_row(params![org, project], |row| row.get(0))
        .optional()?;
    Ok(enabled == Some(false))
}
