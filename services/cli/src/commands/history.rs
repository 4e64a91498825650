//! `zopu history PROJECT --at SEQ|TIME`: a project's state as it was at a
//! stream sequence or a time, rebuilt from history: the gateway's read
//! model replayed into a scratch store up to that point (every event of the
//! log up to it, verified by the store's chain ledger as a service's store
//! is), then the project, its timeline, its Works with their threads and
//! its agent's memory read from it as the API reads them.

use std::process::ExitCode;

use clap::Args;
use zopu_gateway::read_model::GatewayProjection;
use zopu_gateway::views::{ProjectView, ThreadView, TimelineItem, WorkView, queries};
use zopu_schema::{OrgId, ProjectId, subjects};

use crate::Context;

/// Timeline items a history prints at most.
const ITEMS_MAX: usize = 10_000;

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The project
    project: ProjectId,
    /// Its organization (default: any)
    #[arg(long)]
    org: Option<OrgId>,
    /// A stream sequence (`#N` as `zopu replay` prints it, or `N`), or a time
    /// (`2026-12-06T12:00:00Z`): the state after the last event at or before it
    #[arg(long)]
    at: String,
}

#[derive(Debug, serde::Serialize)]
struct State {
    /// The stream sequence the state is as of.
    at_sequence: u64,
    /// The project's last event at or before it: its time and type.
    last_event_time: String,
    last_event_type: String,
    project: ProjectView,
    works: Vec<WorkState>,
    timeline: Vec<TimelineItem>,
    memory: Vec<zopu_core::memory::Entry>,
}

#[derive(Debug, serde::Serialize)]
struct WorkState {
    work: WorkView,
    threads: Vec<ThreadView>,
}

/// Where `--at` cuts: a sequence, or a time.
enum Cut {
    Sequence(u64),
    Time(time::OffsetDateTime),
}

fn cut_of(at: &str) -> anyhow::Result<Cut> {
    if let Ok(sequence) = at.trim_start_matches('#').parse::<u64>() {
        return Ok(Cut::Sequence(sequence));
    }
    time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .map(Cut::Time)
        .map_err(|error| {
            anyhow::anyhow!(
                "--at {at:?} is neither a stream sequence nor an RFC 3339 time (2026-12-06T12:00:00Z): {error}"
            )
        })
}

pub async fn run(context: &Context, args: HistoryArgs) -> anyhow::Result<ExitCode> {
    let cut = cut_of(&args.at)?;
    let bus = context.connect().await?;
    let filter = match &args.org {
        Some(org) => subjects::project_events(org, &args.project),
        None => subjects::project_events_any_org(&args.project),
    };
    let events = zopu_core::log::events(&bus, filter).await?;
    let Some((_, first)) = events.first() else {
        anyhow::bail!(
            "project {} has no events (check the id, and --org if given)",
            args.project
        );
    };
    let org = first.org_id.clone();
    let Some((at_sequence, last)) = events
        .iter()
        .take_while(|(sequence, event)| match cut {
            Cut::Sequence(at) => *sequence <= at,
            Cut::Time(at) => event.time <= at,
        })
        .last()
    else {
        anyhow::bail!(
            "project {} had no events yet at {} (its first is #{} at {})",
            args.project,
            args.at,
            events[0].0,
            zopu_schema::envelope::format_time(first.time)
        );
    };
    let scratch = tempfile::tempdir()?;
    let store = zopu_core::Store::open(&scratch.path().join("history.sqlite"))?;
    if !context.json {
        eprintln!("rebuilding the project's state up to #{at_sequence} from the log ...");
    }
    zopu_core::projection::catch_up_to(&bus, &store, GatewayProjection, *at_sequence).await?;
    let project = args.project;
    // Memory entries unexpired as of the last event's time.
    let as_of_ms = i64::try_from(last.time.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
    let state = store
        .query({
            let org = org.clone();
            move |conn| {
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
            }
        })
        .await?;
    let Some((project_view, works, timeline, memory)) = state else {
        anyhow::bail!(
            "project {} did not exist yet at #{at_sequence}",
            args.project
        );
    };
    let state = State {
        at_sequence: *at_sequence,
        last_event_time: zopu_schema::envelope::format_time(last.time),
        last_event_type: last.event_type.clone(),
        project: project_view,
        works,
        timeline,
        memory,
    };
    if context.json {
        println!("{}", serde_json::to_string(&state)?);
    } else {
        print(&state);
    }
    Ok(ExitCode::SUCCESS)
}

fn print(state: &State) {
    let project = &state.project;
    println!(
        "project {} ({}) as of #{} ({} at {})",
        project.name,
        project.project_id,
        state.at_sequence,
        state.last_event_type,
        state.last_event_time
    );
    println!(
        "  setup: {} (revision {}); agent: {}",
        project.setup.state,
        project.setup.revision,
        match (&project.agent_id, project.agent_enabled) {
            (Some(agent), true) => format!("{agent}, enabled"),
            (Some(agent), false) => format!("{agent}, disabled"),
            (None, _) => "none yet".to_owned(),
        }
    );
    println!();
    println!("works ({}):", state.works.len());
    for work in &state.works {
        println!(
            "  {} [{}] {}: {}",
            work.work.work_id, work.work.status, work.work.kind, work.work.title
        );
        for thread in &work.threads {
            println!(
                "    thread {} [{}] {}: {}",
                thread.thread_id, thread.status, thread.flow_type, thread.title
            );
        }
    }
    println!();
    println!("timeline ({} items):", state.timeline.len());
    for item in &state.timeline {
        let text = item.text.as_deref().unwrap_or("");
        let text: String = text.chars().take(100).collect();
        println!(
            "  #{:<6} {} {:<28} {}",
            item.sequence, item.time, item.event_type, text
        );
    }
    println!();
    println!("memory ({} entries):", state.memory.len());
    for entry in &state.memory {
        println!("  {} {} = {}", entry.agent_id, entry.key, entry.value);
    }
}
