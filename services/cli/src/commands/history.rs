//! `zopu history PROJECT --at SEQ|TIME`: a project's state as it was at a
//! stream sequence or a time, rebuilt from the project's history by
//! [`zopu_gateway::history`] (the web's history slider shows the same).

use std::process::ExitCode;

use clap::Args;
use zopu_gateway::history::{Cut, PastState, state_at};
use zopu_schema::{OrgId, ProjectId};

use crate::Context;

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

pub async fn run(context: &Context, args: HistoryArgs) -> anyhow::Result<ExitCode> {
    let cut: Cut = args
        .at
        .parse()
        .map_err(|error| anyhow::anyhow!("--at {error}"))?;
    let bus = context.connect().await?;
    if !context.json {
        eprintln!("rebuilding the project's state from its history ...");
    }
    let state = state_at(&bus, args.org.as_ref(), args.project, cut)
        .await
        .map_err(|error| match error {
            zopu_gateway::history::HistoryError::NoEvents(_) => {
                anyhow::anyhow!("{error} (check the id, and --org if given)")
            }
            other => anyhow::Error::new(other),
        })?;
    if context.json {
        println!("{}", serde_json::to_string(&state)?);
    } else {
        print(&state);
    }
    Ok(ExitCode::SUCCESS)
}

fn print(state: &PastState) {
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
