//! Read-only connections to the projection file for the HTTP handlers.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags};

/// Each pooled read connection's page cache, in KiB.
const READ_CACHE_KIB: i64 = 256;

/// A few read-only connections to the projection file, so queries never wait
/// for the projection writer (SQLite WAL: readers see the last commit).
#[derive(Debug, Clone)]
pub struct ReadPool {
    path: PathBuf,
    idle: Arc<Mutex<Vec<Connection>>>,
    idle_max: usize,
}

impl ReadPool {
    pub fn new(path: &Path, idle_max: usize) -> Self {
        Self {
            path: path.to_owned(),
            idle: Arc::new(Mutex::new(Vec::new())),
            idle_max,
        }
    }

    fn open(&self) -> rusqlite::Result<Connection> {
        let connection = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )?;
        connection.busy_timeout(std::time::Duration::from_secs(2))?;
        // The file's pages stay in the OS's cache; a page cache of SQLite's
        // default size (2 MiB) in each of up to `idle_max` connections made
        // a gateway's memory grow with the history it served (by 20–30 MB a
        // minute over `zopu-bench soak`, towards 64 × 2 MiB).
        connection.pragma_update(None, "cache_size", -READ_CACHE_KIB)?;
        Ok(connection)
    }

    /// Runs a query on a pooled connection (blocking: call from `spawn_blocking`).
    pub fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let connection = match pooled {
            Some(connection) => connection,
            None => self.open()?,
        };
        let result = f(&connection);
        // A connection that saw a schema change (rebuild) is dropped rather than reused.
        if result.is_ok() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < self.idle_max {
                idle.push(connection);
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_read_connections_keep_a_small_page_cache_and_are_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("projection.sqlite");
        Connection::open(&path)
            .unwrap()
            .execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x INTEGER);")
            .unwrap();
        let pool = ReadPool::new(&path, 1);
        let cache = |pool: &ReadPool| {
            pool.with(|connection| {
                connection.pragma_query_value(None, "cache_size", |row| row.get::<_, i64>(0))
            })
            .unwrap()
        };
        assert_eq!(cache(&pool), -READ_CACHE_KIB);
        // The second query runs on the pooled connection, still limited.
        assert_eq!(cache(&pool), -READ_CACHE_KIB);
        assert_eq!(pool.idle.lock().unwrap().len(), 1);
    }
}
