//! The record of tool calls, which the flow runner publishes as
//! `flow.progress` tool-call events. Bounded: past [`MAX_RECORDS`] the oldest
//! records are dropped (and counted); the denial count is never dropped.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Most records kept in memory between two `drain` calls.
pub const MAX_RECORDS: usize = 4_096;

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolOutcome {
    Allowed,
    Denied,
    Truncated,
    Failed,
}

/// One tool call, as it goes on the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    pub tool: String,
    pub arguments_json: String,
    pub outcome: ToolOutcome,
    /// The denial or failure reason (`code: message`).
    pub detail: Option<String>,
    pub duration_ms: u64,
    /// Hex SHA-256 of the output JSON (absent when there is no output).
    pub output_sha256: Option<String>,
    pub output_bytes: u64,
}

#[derive(Debug, Default)]
struct Inner {
    records: VecDeque<ToolCallRecord>,
    dropped: u64,
    denials: u64,
    calls: u64,
}

/// Collects [`ToolCallRecord`]s for one flow.
#[derive(Debug, Default)]
pub struct ToolRecorder {
    inner: Mutex<Inner>,
}

impl ToolRecorder {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock only means another call panicked mid-push; the
        // records themselves are still consistent.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn push(&self, record: ToolCallRecord) {
        let mut inner = self.lock();
        inner.calls += 1;
        if record.outcome == ToolOutcome::Denied {
            inner.denials += 1;
        }
        if inner.records.len() == MAX_RECORDS {
            inner.records.pop_front();
            inner.dropped += 1;
        }
        inner.records.push_back(record);
    }

    /// Takes the records collected since the last drain.
    pub fn drain(&self) -> Vec<ToolCallRecord> {
        self.lock().records.drain(..).collect()
    }

    /// A copy of the records not yet drained.
    pub fn snapshot(&self) -> Vec<ToolCallRecord> {
        self.lock().records.iter().cloned().collect()
    }

    /// Denied calls in this flow.
    pub fn denials(&self) -> u64 {
        self.lock().denials
    }

    /// All calls in this flow.
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// Records dropped because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }
}
