//! Which project changed: wakes a live-timeline stream only for its own project.
//!
//! The projection runs through [`NotifyingProjection`], which tells
//! [`ProjectChanges`] the stream sequence of every event it applies, per
//! project. A stream watches its project alone: an event of another project
//! never wakes it, so it queries the read model only when something of its
//! own was applied. Applied is not yet committed, so a woken stream first
//! waits (without a query) until the store's checkpoint has reached the
//! sequence it was told. Nothing is kept for a project nobody watches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::Transaction;
use tokio::sync::watch;
use zopu_schema::{Envelope, ProjectId};

use crate::read_model::GatewayProjection;

#[derive(Debug, Default)]
struct Inner {
    watched: Mutex<HashMap<ProjectId, watch::Sender<u64>>>,
    /// The highest sequence applied, of any project.
    last_applied: AtomicU64,
}

/// Per-project change notifications. Cloning shares them.
#[derive(Debug, Clone, Default)]
pub struct ProjectChanges(Arc<Inner>);

impl ProjectChanges {
    /// Records that the event at `sequence` of `project` was applied.
    pub fn applied(&self, project: &ProjectId, sequence: u64) {
        self.0.last_applied.fetch_max(sequence, Ordering::AcqRel);
        let watched = self.0.watched.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sender) = watched.get(project) {
            sender.send_if_modified(|latest| {
                let newer = sequence > *latest;
                *latest = (*latest).max(sequence);
                newer
            });
        }
    }

    /// Starts watching `project`. Returns the watch and the highest sequence
    /// applied before it began: a stream waits for that one to be committed
    /// before its first query, so an event applied (but not yet committed)
    /// just before it subscribed is not missed.
    pub fn watch(&self, project: ProjectId) -> (ProjectWatch, u64) {
        let receiver = {
            let mut watched = self.0.watched.lock().unwrap_or_else(|p| p.into_inner());
            watched
                .entry(project)
                .or_insert_with(|| watch::channel(0).0)
                .subscribe()
        };
        let before = self.0.last_applied.load(Ordering::Acquire);
        (
            ProjectWatch {
                changes: self.clone(),
                project,
                receiver,
            },
            before,
        )
    }

    /// How many projects are watched (for tests).
    pub fn watched(&self) -> usize {
        self.0
            .watched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// One stream's watch on its project; dropping the last one of a project
/// forgets the project.
#[derive(Debug)]
pub struct ProjectWatch {
    changes: ProjectChanges,
    project: ProjectId,
    receiver: watch::Receiver<u64>,
}

impl ProjectWatch {
    /// Waits until an event of this project is applied after the last call;
    /// returns its sequence, or `None` if the notifications ended.
    pub async fn changed(&mut self) -> Option<u64> {
        self.receiver.changed().await.ok()?;
        Some(*self.receiver.borrow_and_update())
    }
}

impl Drop for ProjectWatch {
    fn drop(&mut self) {
        let mut watched = self
            .changes
            .0
            .watched
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // This receiver still counts: it is the last one when the count is 1.
        if watched
            .get(&self.project)
            .is_some_and(|sender| sender.receiver_count() <= 1)
        {
            watched.remove(&self.project);
        }
    }
}

/// The gateway projection, telling [`ProjectChanges`] what it applies.
#[derive(Debug)]
pub struct NotifyingProjection {
    inner: GatewayProjection,
    changes: ProjectChanges,
}

impl NotifyingProjection {
    pub fn new(changes: ProjectChanges) -> Self {
        Self {
            inner: GatewayProjection,
            changes,
        }
    }
}

impl zopu_runtime::Projection for NotifyingProjection {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn schema_version(&self) -> u32 {
        self.inner.schema_version()
    }

    fn tables(&self) -> &'static [&'static str] {
        self.inner.tables()
    }

    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        self.inner.migrate(tx)
    }

    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        sequence: u64,
    ) -> rusqlite::Result<()> {
        self.inner.apply(tx, event, sequence)?;
        self.changes.applied(&event.project_id, sequence);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_wakes_only_for_its_own_project_and_is_forgotten_when_dropped() {
        let changes = ProjectChanges::default();
        let (mine, other) = (ProjectId::new(), ProjectId::new());
        changes.applied(&other, 3);
        let (mut watch, before) = changes.watch(mine);
        assert_eq!(before, 3);
        changes.applied(&other, 4);
        assert!(
            !watch.receiver.has_changed().unwrap(),
            "another project's event woke the stream"
        );
        changes.applied(&mine, 5);
        changes.applied(&mine, 6);
        assert_eq!(watch.changed().await, Some(6));
        let (second, _) = changes.watch(mine);
        drop(watch);
        assert_eq!(changes.watched(), 1);
        drop(second);
        assert_eq!(changes.watched(), 0);
    }
}
