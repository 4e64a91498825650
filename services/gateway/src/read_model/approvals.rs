//! Approvals: what a project's agent asked to do outside the runtime, and
//! the one decision a reviewer took on it.
//!
//! Invariants: an approval is recorded once, pending (a redelivered request
//! changes nothing); the first `approval.granted` or `approval.denied` of a
//! pending approval decides it and nothing changes it afterwards (a later
//! decision, which the one decision key makes a duplicate anyway, is
//! ignored); `approval.expired` closes a pending one the same way. The
//! reviewer and the decision's time are the event's.

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use zopu_schema::envelope::format_time;
use zopu_schema::{Envelope, Event, OrgId, ProjectId, approval, pb};

pub(super) const TABLES: &[&str] = &["gw_approvals"];

pub(super) const SCHEMA: &str = "
CREATE TABLE gw_approvals (
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    approval_id TEXT NOT NULL,
    action TEXT NOT NULL,
    detail TEXT NOT NULL,
    dry_run INTEGER NOT NULL,
    requested_sequence INTEGER NOT NULL,
    requested_at TEXT NOT NULL,
    expires_at TEXT,
    status TEXT NOT NULL,
    decided_by TEXT,
    decided_at TEXT,
    reason TEXT,
    execution TEXT,
    execution_detail TEXT,
    executed_at TEXT,
    PRIMARY KEY (org, project_id, approval_id)
);
CREATE INDEX gw_approvals_project ON gw_approvals (project_id, requested_sequence);
";

/// The stored status of an approval nobody decided yet.
const PENDING: &str = approval::Status::Pending.as_str();

/// An approval as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRow {
    pub approval_id: String,
    pub action: String,
    pub detail: String,
    pub dry_run: bool,
    pub requested_sequence: u64,
    pub requested_at: String,
    /// RFC 3339; `None` for approvals recorded before expiry existed.
    pub expires_at: Option<String>,
    /// An [`approval::Status`]'s name.
    pub status: String,
    /// The reviewer's actor id.
    pub decided_by: Option<String>,
    pub decided_at: Option<String>,
    /// A rejection's reason.
    pub reason: Option<String>,
    /// How a granted approval was carried out: `dry_run`, `created` or
    /// `failed` (`None` until the executor recorded it).
    pub execution: Option<String>,
    /// The request a dry run recorded, the issue URL, or the failure.
    pub execution_detail: Option<String>,
    pub executed_at: Option<String>,
}

/// Applies what `event` changes of an approval.
pub(super) fn apply(tx: &Transaction<'_>, event: &Envelope, sequence: u64) -> rusqlite::Result<()> {
    let org = event.org_id.as_str();
    let project = event.project_id.to_string();
    let time = format_time(event.time);
    match event.event_type.as_str() {
        t if t == pb::ApprovalRequested::TYPE => {
            if let Ok(m) = event.decode::<pb::ApprovalRequested>() {
                tx.prepare_cached(
                    "INSERT OR IGNORE INTO gw_approvals (org, project_id, approval_id, action, detail, dry_run, requested_sequence, requested_at, expires_at, status)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULLIF(?9, ''), ?10)",
                )?
                .execute(params![
                    org,
                    project,
                    m.approval_id,
                    m.action,
                    m.detail,
                    m.dry_run,
                    sequence as i64,
                    time,
                    m.expires_at,
                    PENDING
                ])?;
            }
        }
        _ => {
            if let Some(decided) = approval::decision_of(event) {
                decide(tx, (org, &project), &decided, &time)?;
            } else if let Some((approval_id, execution)) = approval::execution_of(event) {
                let (status, detail) = execution.summary();
                tx.prepare_cached(
                    "UPDATE gw_approvals SET execution = ?1, execution_detail = ?2, executed_at = ?3
                     WHERE org = ?4 AND project_id = ?5 AND approval_id = ?6 AND execution IS NULL",
                )?
                .execute(params![status, detail, time, org, project, approval_id])?;
            }
        }
    }
    Ok(())
}

/// Records `decided` on a pending approval of `(org, project)`.
fn decide(
    tx: &Transaction<'_>,
    (org, project): (&str, &str),
    decided: &approval::Decision,
    time: &str,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE gw_approvals SET status = ?1, decided_by = ?2, decided_at = ?3, reason = NULLIF(?4, '')
         WHERE org = ?5 AND project_id = ?6 AND approval_id = ?7 AND status = ?8",
    )?
    .execute(params![
        decided.status.as_str(),
        decided.by,
        time,
        decided.reason,
        org,
        project,
        decided.approval_id,
        PENDING
    ])?;
    Ok(())
}

const COLUMNS: &str = "approval_id, action, detail, dry_run, requested_sequence, requested_at, expires_at, status, decided_by, decided_at, reason, execution, execution_detail, executed_at";

fn row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ApprovalRow> {
    Ok(ApprovalRow {
        approval_id: row.get(0)?,
        action: row.get(1)?,
        detail: row.get(2)?,
        dry_run: row.get(3)?,
        requested_sequence: row.get::<_, i64>(4)?.max(0) as u64,
        requested_at: row.get(5)?,
        expires_at: row.get(6)?,
        status: row.get(7)?,
        decided_by: row.get(8)?,
        decided_at: row.get(9)?,
        reason: row.get(10)?,
        execution: row.get(11)?,
        execution_detail: row.get(12)?,
        executed_at: row.get(13)?,
    })
}

/// One approval of the organization's project.
pub fn find(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
    approval: &str,
) -> rusqlite::Result<Option<ApprovalRow>> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM gw_approvals WHERE org = ?1 AND project_id = ?2 AND approval_id = ?3"
    ))?
    .query_row(params![org.as_str(), project.to_string(), approval], row)
    .optional()
}

/// The project's approvals in the order they were requested, only those
/// with `status` when given.
pub fn list(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
    status: Option<&str>,
) -> rusqlite::Result<Vec<ApprovalRow>> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM gw_approvals WHERE org = ?1 AND project_id = ?2 AND (?3 IS NULL OR status = ?3)
         ORDER BY requested_sequence"
    ))?
    .query_map(params![org.as_str(), project.to_string(), status], row)?
    .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::tests::{TestStore, envelope};
    use super::*;

    fn user(id: &str) -> Option<pb::Actor> {
        Some(pb::Actor {
            kind: pb::actor::Kind::User as i32,
            id: id.into(),
        })
    }

    #[test]
    fn the_first_decision_of_a_pending_approval_stands() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let requested = pb::ApprovalRequested {
            approval_id: "approval:f:issue.publish".into(),
            action: "issue.publish".into(),
            detail: "Publish the issue.".into(),
            dry_run: true,
            ..Default::default()
        };
        let granted = pb::ApprovalGranted {
            approval_id: requested.approval_id.clone(),
            by: user("lead"),
        };
        let denied = pb::ApprovalDenied {
            approval_id: requested.approval_id.clone(),
            by: user("other"),
            reason: "too late".into(),
        };
        let sequence = store.apply(&[
            envelope("acme", project, &requested, 1),
            envelope("acme", project, &requested, 2),
        ]);
        let org: OrgId = "acme".parse().unwrap();
        let pending = list(&store.connection, &org, &project, Some(PENDING)).unwrap();
        assert_eq!(pending.len(), 1, "a redelivered request is one approval");
        assert_eq!(pending[0].requested_sequence, sequence - 1);
        store.apply(&[
            envelope("acme", project, &granted, 3),
            envelope("acme", project, &denied, 4),
        ]);
        let decided = find(&store.connection, &org, &project, &requested.approval_id)
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                decided.status.as_str(),
                decided.decided_by.as_deref(),
                decided.reason
            ),
            ("approved", Some("lead"), None)
        );
        assert!(decided.decided_at.is_some());
        let other: OrgId = "other".parse().unwrap();
        assert!(
            find(&store.connection, &other, &project, &requested.approval_id)
                .unwrap()
                .is_none()
        );
        assert!(
            list(&store.connection, &org, &project, Some(PENDING))
                .unwrap()
                .is_empty()
        );
        // The executor's one outcome is shown on it; a second is ignored.
        let created = pb::TrackerIssueCreated {
            approval_id: requested.approval_id.clone(),
            url: "http://127.0.0.1:9/acme/widgets/issues/7".into(),
            number: 7,
            ..Default::default()
        };
        let failed = pb::ExecutionFailed {
            approval_id: requested.approval_id.clone(),
            ..Default::default()
        };
        store.apply(&[
            envelope("acme", project, &created, 5),
            envelope("acme", project, &failed, 6),
        ]);
        let executed = find(&store.connection, &org, &project, &requested.approval_id)
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                executed.execution.as_deref(),
                executed.execution_detail.as_deref()
            ),
            (
                Some("created"),
                Some("http://127.0.0.1:9/acme/widgets/issues/7")
            )
        );
    }
}
