//! Works (durable responsibilities on the timeline) and the Threads beneath
//! them.
//!
//! Invariants: a Work or Thread is created once (a redelivered creation
//! changes nothing); an update with an empty status or summary keeps the
//! current one.

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use zopu_schema::envelope::format_time;
use zopu_schema::{Envelope, Event, OrgId, ProjectId, pb};

pub(super) const TABLES: &[&str] = &["gw_works", "gw_threads"];

pub(super) const SCHEMA: &str = "
CREATE TABLE gw_works (
    work_id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    title TEXT NOT NULL,
    summary TEXT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE gw_threads (
    thread_id TEXT PRIMARY KEY,
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    work_id TEXT,
    title TEXT NOT NULL,
    flow_type TEXT NOT NULL,
    status TEXT NOT NULL,
    summary TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX gw_threads_work ON gw_threads (work_id);
";

/// The status of a Work or Thread when it is created.
pub const OPEN: &str = "open";

/// A Work as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRow {
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

/// A Thread as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadRow {
    pub thread_id: String,
    pub work_id: Option<String>,
    pub title: String,
    pub flow_type: String,
    pub status: String,
    pub summary: String,
    pub created_at: String,
}

/// Applies what `event` changes of a Work or Thread.
pub(super) fn apply(tx: &Transaction<'_>, event: &Envelope) -> rusqlite::Result<()> {
    let org = event.org_id.as_str();
    let project = event.project_id.to_string();
    let time = format_time(event.time);
    let work = event.work_id.map(|id| id.to_string());
    match event.event_type.as_str() {
        t if t == pb::WorkCreated::TYPE => {
            if let (Some(work), Ok(m)) = (&work, event.decode::<pb::WorkCreated>()) {
                tx.prepare_cached("INSERT OR IGNORE INTO gw_works (work_id, org, project_id, title, summary, kind, status, created_at, updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)")?
                    .execute(params![work, org, project, m.title, m.summary, m.kind, OPEN, time])?;
            }
        }
        t if t == pb::WorkUpdated::TYPE => {
            if let (Some(work), Ok(m)) = (&work, event.decode::<pb::WorkUpdated>()) {
                tx.prepare_cached(
                    "UPDATE gw_works SET status = CASE WHEN ?1 = '' THEN status ELSE ?1 END,
                        summary = CASE WHEN ?2 = '' THEN summary ELSE ?2 END, updated_at = ?3
                     WHERE work_id = ?4 AND org = ?5 AND project_id = ?6",
                )?
                .execute(params![m.status, m.summary, time, work, org, project])?;
            }
        }
        t if t == pb::ThreadCreated::TYPE => {
            if let (Some(thread), Ok(m)) = (event.thread_id, event.decode::<pb::ThreadCreated>()) {
                tx.prepare_cached("INSERT OR IGNORE INTO gw_threads (thread_id, org, project_id, work_id, title, flow_type, status, summary, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, '', ?8)")?
                    .execute(params![thread.to_string(), org, project, work, m.title, m.flow_type, OPEN, time])?;
            }
        }
        t if t == pb::ThreadUpdated::TYPE => {
            if let (Some(thread), Ok(m)) = (event.thread_id, event.decode::<pb::ThreadUpdated>()) {
                tx.prepare_cached(
                    "UPDATE gw_threads SET status = CASE WHEN ?1 = '' THEN status ELSE ?1 END,
                        summary = CASE WHEN ?2 = '' THEN summary ELSE ?2 END
                     WHERE thread_id = ?3 AND org = ?4 AND project_id = ?5",
                )?
                .execute(params![
                    m.status,
                    m.summary,
                    thread.to_string(),
                    org,
                    project
                ])?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// One Work of the organization's project.
pub fn find(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
    work: &str,
) -> rusqlite::Result<Option<WorkRow>> {
    conn.prepare_cached(
        "SELECT work_id, project_id, title, summary, kind, status, created_at, updated_at FROM gw_works
         WHERE work_id = ?1 AND org = ?2 AND project_id = ?3",
    )?
    .query_row(params![work, org.as_str(), project.to_string()], |row| {
        Ok(WorkRow {
            work_id: row.get(0)?,
            project_id: row.get(1)?,
            title: row.get(2)?,
            summary: row.get(3)?,
            kind: row.get(4)?,
            status: row.get(5)?,
            created_at: row.get(6)?,
            updated_at: row.get(7)?,
        })
    })
    .optional()
}

/// The Threads of a Work, oldest first (at most 1000).
pub fn threads(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
    work: &str,
) -> rusqlite::Result<Vec<ThreadRow>> {
    conn.prepare_cached(
        "SELECT thread_id, work_id, title, flow_type, status, summary, created_at FROM gw_threads
         WHERE work_id = ?1 AND org = ?2 AND project_id = ?3 ORDER BY created_at, thread_id LIMIT 1000",
    )?
    .query_map(params![work, org.as_str(), project.to_string()], |row| {
        Ok(ThreadRow {
            thread_id: row.get(0)?,
            work_id: row.get(1)?,
            title: row.get(2)?,
            flow_type: row.get(3)?,
            status: row.get(4)?,
            summary: row.get(5)?,
            created_at: row.get(6)?,
        })
    })?
    .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::read_model::tests::{TestStore, envelope};
    use zopu_schema::{ThreadId, WorkId};

    #[test]
    fn a_work_is_created_once_and_updates_keep_what_they_leave_empty() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap();
        let work = WorkId::new();
        let of_work = |mut event: Envelope| {
            event.work_id = Some(work);
            event
        };
        let created = |title: &str| pb::WorkCreated {
            title: title.into(),
            summary: "first look".into(),
            kind: "explore".into(),
            ..Default::default()
        };
        store.apply(&[
            of_work(envelope("acme", project, &created("Explore auth"), 1)),
            of_work(envelope("acme", project, &created("A redelivery"), 2)),
            of_work(envelope(
                "acme",
                project,
                &pb::WorkUpdated {
                    status: "working".into(),
                    ..Default::default()
                },
                3,
            )),
        ]);
        let row = find(&store.connection, &org, &project, &work.to_string())
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                row.title.as_str(),
                row.summary.as_str(),
                row.status.as_str()
            ),
            ("Explore auth", "first look", "working")
        );
        assert_ne!(row.created_at, row.updated_at);
        assert!(
            find(
                &store.connection,
                &"other".parse().unwrap(),
                &project,
                &work.to_string()
            )
            .unwrap()
            .is_none()
        );
        assert!(
            find(
                &store.connection,
                &org,
                &ProjectId::new(),
                &work.to_string()
            )
            .unwrap()
            .is_none()
        );
    }

    #[test]
    fn threads_are_listed_under_their_work() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap();
        let work = WorkId::new();
        let thread = ThreadId::new();
        let of_thread = |mut event: Envelope| {
            event.work_id = Some(work);
            event.thread_id = Some(thread);
            event
        };
        store.apply(&[
            of_thread(envelope(
                "acme",
                project,
                &pb::ThreadCreated {
                    title: "Read the login path".into(),
                    flow_type: "explore".into(),
                },
                1,
            )),
            of_thread(envelope(
                "acme",
                project,
                &pb::ThreadUpdated {
                    status: "done".into(),
                    summary: "found it".into(),
                },
                2,
            )),
        ]);
        let threads = threads(&store.connection, &org, &project, &work.to_string()).unwrap();
        assert_eq!(
            threads,
            vec![ThreadRow {
                thread_id: thread.to_string(),
                work_id: Some(work.to_string()),
                title: "Read the login path".into(),
                flow_type: "explore".into(),
                status: "done".into(),
                summary: "found it".into(),
                created_at: threads[0].created_at.clone(),
            }]
        );
        assert!(
            super::threads(
                &store.connection,
                &"other".parse().unwrap(),
                &project,
                &work.to_string()
            )
            .unwrap()
            .is_empty()
        );
    }
}
