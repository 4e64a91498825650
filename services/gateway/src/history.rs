//! A project's state as it was at a stream sequence or a time, rebuilt from
//! history: the project's events up to the cut applied by the gateway's
//! read model ([`GatewayProjection`]) to a scratch store (each verified by
//! the store's chain ledger, as a service's store verifies them), then the
//! project, its timeline, its Works with their threads and its agent's
//! memory read from it as the API reads them. `zopu history --at` prints
//! it; `GET /v1/projects/{id}/history?at=` serves it to the web's slider.
//! A project's read model is built from its own events alone, so one
//! project's past costs its own history, not the deployment's.

use serde::Serialize;
use zopu_core::memory::Entry;
use zopu_runtime::nats::Bus;
use zopu_runtime::{Error, Store, projection};
use zopu_schema::{OrgId, ProjectId, subjects};

use crate::read_model::GatewayProjection;
use crate::views::{ProjectView, ThreadView, TimelineItem, WorkView, queries};

/// Timeline items a past state holds at most.
pub const ITEMS_MAX: usize = 10_000;

/// Where a history is cut: the state after the last event at or before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    Sequence(u64),
    Time(time::OffsetDateTime),
}

impl std::str::FromStr for Cut {
    type Err = String;

    /// A stream sequence (`#N` as `zopu replay` prints it, or `N`), or an
    /// RFC 3339 time.
    fn from_str(at: &str) -> Result<Self, String> {
        if let Ok(sequence) = at.trim_start_matches('#').parse::<u64>() {
            return Ok(Self::Sequence(sequence));
        }
        time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
            .map(Self::Time)
            .map_err(|error| {
                format!(
                    "{at:?} is neither a stream sequence nor an RFC 3339 time (2026-12-06T12:00:00Z): {error}"
                )
            })
    }
}

/// A project as it was.
#[derive(Debug, Clone, Serialize)]
pub struct PastState {
    /// The stream sequence the state is as of.
    pub at_sequence: u64,
    /// The project's first and last events' sequences (a slider's ends).
    pub first_sequence: u64,
    pub last_sequence: u64,
    /// The project's last event at or before the cut: its time and type.
    pub last_event_time: String,
    pub last_event_type: String,
    pub project: ProjectView,
    pub works: Vec<WorkState>,
    pub timeline: Vec<TimelineItem>,
    pub memory: Vec<Entry>,
}

/// A Work with its threads.
#[derive(Debug, Clone, Serialize)]
pub struct WorkState {
    pub work: WorkView,
    pub threads: Vec<ThreadView>,
}

/// Why there is no past state to show.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("project {0} has no events")]
    NoEvents(ProjectId),
    #[error("project {project} had no events yet at {at} (its first is #{first} at {first_time})")]
    NotYet {
        project: ProjectId,
        at: String,
        first: u64,
        first_time: String,
    },
    #[error("no scratch directory for the rebuilt state: {0}")]
    Scratch(std::io::Error),
    #[error(transparent)]
    Runtime(#[from] Error),
}

/// The state of `project` (of `org`, or of any organization) after its last
/// event at or before `cut`.
pub async fn state_at(
    bus: &Bus,
    org: Option<&OrgId>,
    project: ProjectId,
    cut: Cut,
) -> Result<PastState, HistoryError> {
    let filter = match org {
        Some(org) => subjects::project_events(org, &project),
        None => subjects::project_events_any_org(&project),
    };
    let mut events = zopu_runtime::log::events(bus, filter).await?;
    let (Some((first_sequence, first)), Some((last_sequence, _))) = (events.first(), events.last())
    else {
        return Err(HistoryError::NoEvents(project));
    };
    let (first_sequence, last_sequence) = (*first_sequence, *last_sequence);
    let org = first.org_id.clone();
    let first_time = zopu_schema::envelope::format_time(first.time);
    events.retain(|(sequence, event)| match cut {
        Cut::Sequence(at) => *sequence <= at,
        Cut::Time(at) => event.time <= at,
    });
    let Some((at_sequence, last)) = events.last().cloned() else {
        return Err(HistoryError::NotYet {
            project,
            at: match cut {
                Cut::Sequence(at) => format!("#{at}"),
                Cut::Time(at) => zopu_schema::envelope::format_time(at),
            },
            first: first_sequence,
            first_time,
        });
    };
    let scratch = tempfile::tempdir().map_err(HistoryError::Scratch)?;
    let store = Store::open(&scratch.path().join("history.sqlite"))?;
    projection::apply_in_memory(
        &store,
        GatewayProjection,
        projection::InMemory::from_events(events),
    )
    .await?;
    // Memory entries unexpired as of the last event's time.
    let as_of_ms = i64::try_from(last.time.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
    let (view, works, timeline, memory) = store
        .query(move |conn| {
            let Some(view) = queries::project(conn, &org, &project)? else {
                return Ok(None);
            };
            let timeline = queries::timeline(conn, &org, &project, None, 0, ITEMS_MAX)?;
            let mut work_ids: Vec<String> = timeline
                .iter()
                .filter_map(|item| item.work.as_ref().map(|work| work.work_id.clone()))
                .collect();
            work_ids.sort();
            work_ids.dedup();
            let mut works = Vec::new();
            for work_id in work_ids {
                if let Some(work) = queries::work(conn, &org, &project, &work_id)? {
                    let threads = queries::threads(conn, &org, &project, &work_id)?;
                    works.push(WorkState { work, threads });
                }
            }
            let memory = zopu_core::memory::entries(conn, &org, &project, None, as_of_ms)?;
            Ok(Some((view, works, timeline, memory)))
        })
        .await?
        .ok_or_else(|| HistoryError::NotYet {
            project,
            at: format!("#{at_sequence}"),
            first: first_sequence,
            first_time: first_time.clone(),
        })?;
    Ok(PastState {
        at_sequence,
        first_sequence,
        last_sequence,
        last_event_time: zopu_schema::envelope::format_time(last.time),
        last_event_type: last.event_type.clone(),
        project: view,
        works,
        timeline,
        memory,
    })
}
