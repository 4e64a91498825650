//! Read-only connections to the projection file for the HTTP handlers.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags};

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
