//! The gateway's read side: one projection rebuilt from the stream, split by
//! aggregate. Each aggregate owns its tables, how events change them and the
//! queries over them: [`projects`] (projects, setup status, agent state,
//! running flows, the summary document), [`works`] (Works and their
//! Threads), [`artifacts`] (stored revisions and their cards) and
//! [`timeline`] (one item per event a user sees), [`approvals`] (what
//! the agents asked to do outside the runtime, and the decisions) and
//! [`runs`] (the AgentRun log: every run of every agent, its internal
//! notes and the handoffs between agents, none of it on the timeline). Rows are plain columns and
//! child tables, never serialized API types: the JSON the API answers with is
//! built from them at the HTTP edge (`crate::views`).
//!
//! Invariants: every row carries the organization it belongs to and every
//! query filters on it, so a caller scoped to one organization never reads
//! another's rows. A timeline item's id is the stream sequence of the event
//! it shows, so "items after N" is gapless and duplicate-free. Any change to
//! a table bumps [`SCHEMA_VERSION`]: the runtime's store then drops every table in
//! [`GatewayProjection`]'s list and replays the stream into the new ones.

use std::collections::HashMap;

use rusqlite::Transaction;
use zopu_schema::{Envelope, pb};

pub mod approvals;
pub mod artifacts;
mod pool;
pub mod projects;
pub mod runs;
pub mod timeline;
pub mod works;

pub use pool::ReadPool;

/// Bump to rebuild the projection (tables are dropped and the stream replayed).
/// 1: API types stored as JSON; 2: rows as columns; 3: approvals; 4: their
/// expiry; 5: their execution; 6: the run log; 8: the agents' memory;
/// 9: a flow request's item names its requester (`author`).
const SCHEMA_VERSION: u32 = 10;

const TABLE_COUNT: usize = projects::TABLES.len()
    + works::TABLES.len()
    + artifacts::TABLES.len()
    + timeline::TABLES.len()
    + approvals::TABLES.len()
    + runs::TABLES.len()
    + 1;

/// Every aggregate's tables: the ones a rebuild drops. Version 1's tables
/// (`gw_projects`, `gw_timeline`, `gw_works`, `gw_threads`, `gw_flows`,
/// `gw_artifacts`, `gw_summaries`) keep their names, so a data directory
/// written by it is dropped and rebuilt, never read with the old columns.
static TABLES: [&str; TABLE_COUNT] = concat_tables([
    projects::TABLES,
    works::TABLES,
    artifacts::TABLES,
    timeline::TABLES,
    approvals::TABLES,
    runs::TABLES,
    &[zopu_core::memory::TABLE],
]);

const fn concat_tables<const N: usize>(parts: [&[&'static str]; 7]) -> [&'static str; N] {
    let mut tables = [""; N];
    let mut filled = 0;
    let mut part = 0;
    while part < parts.len() {
        let mut index = 0;
        while index < parts[part].len() {
            tables[filled] = parts[part][index];
            filled += 1;
            index += 1;
        }
        part += 1;
    }
    assert!(filled == N, "TABLE_COUNT counts every aggregate's tables");
    tables
}

/// A failure as stored: the reason of a failed setup, flow or turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureRow {
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

impl From<&pb::FailureReason> for FailureRow {
    fn from(reason: &pb::FailureReason) -> Self {
        Self {
            code: reason.code.clone(),
            message: reason.message.clone(),
            retryable: reason.retryable,
        }
    }
}

impl FailureRow {
    /// Reads the three failure columns starting at `first` (code, message,
    /// retryable); no code means no failure.
    fn from_columns(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<Option<Self>> {
        let Some(code) = row.get::<_, Option<String>>(first)? else {
            return Ok(None);
        };
        Ok(Some(Self {
            code,
            message: row.get::<_, Option<String>>(first + 1)?.unwrap_or_default(),
            retryable: row.get::<_, Option<bool>>(first + 2)?.unwrap_or(false),
        }))
    }
}

/// The stored name of a flow type (the names the API shows).
pub fn flow_type_name(value: i32) -> &'static str {
    zopu_schema::keys::flow_type_name(
        pb::FlowType::try_from(value).unwrap_or(pb::FlowType::Unspecified),
    )
}

fn empty_to_none(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

/// Replaces the ordered list of `values` stored under `key` in a child table
/// `(<key column>, position, <value column>)`.
fn replace_list(
    tx: &Transaction<'_>,
    table: &str,
    key_column: &str,
    value_column: &str,
    key: &dyn rusqlite::ToSql,
    values: &[impl AsRef<str>],
) -> rusqlite::Result<()> {
    tx.prepare_cached(&format!("DELETE FROM {table} WHERE {key_column} = ?1"))?
        .execute([key])?;
    let mut insert = tx.prepare_cached(&format!(
        "INSERT INTO {table} ({key_column}, position, {value_column}) VALUES (?1, ?2, ?3)"
    ))?;
    for (position, value) in values.iter().enumerate() {
        insert.execute(rusqlite::params![key, position as i64, value.as_ref()])?;
    }
    Ok(())
}

/// The ordered list stored under `key` in a child table written by [`replace_list`].
fn read_list(
    conn: &rusqlite::Connection,
    table: &str,
    key_column: &str,
    value_column: &str,
    key: &dyn rusqlite::ToSql,
) -> rusqlite::Result<Vec<String>> {
    conn.prepare_cached(&format!(
        "SELECT {value_column} FROM {table} WHERE {key_column} = ?1 ORDER BY position"
    ))?
    .query_map([key], |row| row.get(0))?
    .collect()
}

/// The sequences `keys` as one SQL parameter: a JSON array that a query
/// reads with `IN (SELECT value FROM json_each(?))`, so a page's child rows
/// come in one cached statement however many keys the page has.
fn sequence_keys(keys: &[u64]) -> String {
    let keys: Vec<String> = keys.iter().map(u64::to_string).collect();
    format!("[{}]", keys.join(","))
}

/// The ordered lists stored under each of the sequences `keys` in a child
/// table `(sequence, position, <value column>)` written by [`replace_list`],
/// by sequence (one query); a sequence with no values is absent.
fn read_lists(
    conn: &rusqlite::Connection,
    table: &str,
    value_column: &str,
    keys: &[u64],
) -> rusqlite::Result<HashMap<u64, Vec<String>>> {
    let mut lists: HashMap<u64, Vec<String>> = HashMap::new();
    if keys.is_empty() {
        return Ok(lists);
    }
    let mut select = conn.prepare_cached(&format!(
        "SELECT sequence, {value_column} FROM {table}
         WHERE sequence IN (SELECT value FROM json_each(?1)) ORDER BY sequence, position"
    ))?;
    let mut rows = select.query([sequence_keys(keys)])?;
    while let Some(row) = rows.next()? {
        let sequence = row.get::<_, i64>(0)?.max(0) as u64;
        lists.entry(sequence).or_default().push(row.get(1)?);
    }
    Ok(lists)
}

/// The gateway projection.
#[derive(Debug, Default)]
pub struct GatewayProjection;

impl zopu_runtime::Projection for GatewayProjection {
    fn name(&self) -> &'static str {
        "gateway"
    }

    fn schema_version(&self) -> u32 {
        SCHEMA_VERSION
    }

    fn tables(&self) -> &'static [&'static str] {
        &TABLES
    }

    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(projects::SCHEMA)?;
        tx.execute_batch(works::SCHEMA)?;
        tx.execute_batch(artifacts::SCHEMA)?;
        tx.execute_batch(approvals::SCHEMA)?;
        tx.execute_batch(runs::SCHEMA)?;
        tx.execute_batch(zopu_core::memory::SCHEMA)?;
        tx.execute_batch(timeline::SCHEMA)
    }

    /// The timeline goes last: a setup item shows the project's setup status
    /// after the event, and a Work update shows the updated Work.
    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        sequence: u64,
    ) -> rusqlite::Result<()> {
        projects::apply(tx, event, sequence)?;
        works::apply(tx, event)?;
        artifacts::apply(tx, event, sequence)?;
        approvals::apply(tx, event, sequence)?;
        runs::apply(tx, event, sequence)?;
        zopu_core::memory::apply(tx, event, sequence)?;
        timeline::apply(tx, event, sequence)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use bytes::Bytes;
    use rusqlite::Connection;
    use zopu_runtime::Projection;
    use zopu_schema::{CorrelationId, Event, EventId, ProjectId};

    /// An event of `org` and `project` at project version `version`.
    pub(crate) fn envelope<E: Event>(
        org: &str,
        project: ProjectId,
        payload: &E,
        version: u64,
    ) -> Envelope {
        let id = EventId::new();
        Envelope {
            id,
            source: "zopu/test".into(),
            event_type: E::TYPE.into(),
            time: time::OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(version as i64),
            data_schema: E::SCHEMA.into(),
            org_id: org.parse().unwrap(),
            project_id: project,
            correlation_id: CorrelationId::from(id),
            causation_id: id,
            work_id: None,
            thread_id: None,
            flow_run_id: None,
            dispatch_id: None,
            traceparent: None,
            idempotency_key: format!("k:{id}"),
            project_version: version,
            previous_hash: None,
            data: Bytes::from(prost::Message::encode_to_vec(payload)),
        }
    }

    /// A projection file in a temporary directory, with the tables created.
    pub(crate) struct TestStore {
        pub connection: Connection,
        next_sequence: u64,
        _dir: tempfile::TempDir,
    }

    impl TestStore {
        pub(crate) fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let mut connection = Connection::open(dir.path().join("gateway.sqlite")).unwrap();
            let tx = connection.transaction().unwrap();
            GatewayProjection.migrate(&tx).unwrap();
            tx.commit().unwrap();
            Self {
                connection,
                next_sequence: 1,
                _dir: dir,
            }
        }

        /// Applies `events` in one transaction at the next stream sequences;
        /// returns the sequence of the last one.
        pub(crate) fn apply(&mut self, events: &[Envelope]) -> u64 {
            let tx = self.connection.transaction().unwrap();
            for event in events {
                GatewayProjection
                    .apply(&tx, event, self.next_sequence)
                    .unwrap();
                self.next_sequence += 1;
            }
            tx.commit().unwrap();
            self.next_sequence - 1
        }
    }

    #[test]
    fn the_declared_tables_are_exactly_the_ones_created() {
        let store = TestStore::new();
        let mut created: Vec<String> = store
            .connection
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        created.sort();
        let mut declared: Vec<String> = GatewayProjection
            .tables()
            .iter()
            .map(|table| (*table).to_owned())
            .collect();
        declared.sort();
        assert_eq!(created, declared);
    }

    #[test]
    fn a_data_dir_of_the_json_version_is_rebuilt_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.sqlite");
        {
            // What version 1 left behind: its checkpoint and an item as JSON.
            let connection = Connection::open(&path).unwrap();
            connection
                .execute_batch(
                    "CREATE TABLE zopu_projection (name TEXT PRIMARY KEY, schema_version INTEGER NOT NULL, checkpoint INTEGER NOT NULL);
                     INSERT INTO zopu_projection VALUES ('gateway', 1, 42);
                     CREATE TABLE gw_timeline (sequence INTEGER PRIMARY KEY, org TEXT NOT NULL, project_id TEXT NOT NULL, work_id TEXT, item TEXT NOT NULL);
                     CREATE INDEX gw_timeline_project ON gw_timeline (project_id, sequence);
                     INSERT INTO gw_timeline VALUES (7, 'acme', 'p', NULL, '{\"sequence\":7}');
                     CREATE TABLE gw_artifacts (artifact_id TEXT NOT NULL, revision INTEGER NOT NULL, view TEXT NOT NULL, PRIMARY KEY (artifact_id, revision));",
                )
                .unwrap();
        }
        let store = zopu_runtime::Store::open(&path).unwrap();
        let checkpoint = store.prepare(&GatewayProjection).unwrap();
        assert_eq!(checkpoint, 0, "the old version's checkpoint was kept");
        let (items, has_kind): (i64, bool) = store
            .read(|conn| {
                let items =
                    conn.query_row("SELECT COUNT(*) FROM gw_timeline", [], |row| row.get(0))?;
                let has_kind = conn.prepare("SELECT kind FROM gw_timeline").is_ok();
                Ok((items, has_kind))
            })
            .unwrap();
        assert_eq!((items, has_kind), (0, true));
    }
}
