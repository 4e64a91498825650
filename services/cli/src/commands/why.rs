//! `zopu why EVENT_ID`: why an event happened (its causes back to the user
//! action or trigger that started it) and what it led to (its consequences
//! as a tree), then its correlation's whole tree as a waterfall, each step
//! with its service, time and the time since its cause
//! ([`zopu_runtime::causality`]).

use std::process::ExitCode;

use clap::Args;
use zopu_runtime::causality::{self, Step, Why};
use zopu_schema::{EventId, OrgId, ProjectId, subjects};

use crate::Context;

#[derive(Debug, Args)]
pub struct WhyArgs {
    /// The event to explain (its id, as `zopu replay` and the web show it)
    event: EventId,
    /// Its project (without it the whole log is read, which takes longer)
    #[arg(long)]
    project: Option<ProjectId>,
    /// With --project: its organization (default: any)
    #[arg(long)]
    org: Option<OrgId>,
}

pub async fn run(context: &Context, args: WhyArgs) -> anyhow::Result<ExitCode> {
    let bus = context.connect().await?;
    let filter = match (args.project, &args.org) {
        (Some(project), Some(org)) => subjects::project_events(org, &project),
        (Some(project), None) => subjects::project_events_any_org(&project),
        (None, _) => {
            eprintln!(
                "reading the whole log for {} (--project reads only its project)",
                args.event
            );
            subjects::all_events()
        }
    };
    let mut history = zopu_runtime::log::events(&bus, filter).await?;
    // Only the event's own project matters once it is found.
    if args.project.is_none()
        && let Some((_, found)) = history.iter().find(|(_, event)| event.id == args.event)
    {
        let (org, project) = (found.org_id.clone(), found.project_id);
        history.retain(|(_, event)| event.org_id == org && event.project_id == project);
    }
    let Some(why) = causality::explain(&history, args.event) else {
        anyhow::bail!(
            "no event {} in {} (check the id and --project)",
            args.event,
            args.project.map_or_else(
                || "the log".to_owned(),
                |project| format!("project {project}")
            )
        );
    };
    if context.json {
        println!("{}", serde_json::to_string(&why)?);
    } else {
        print(&why);
    }
    Ok(ExitCode::SUCCESS)
}

fn line(step: &Step, indent: usize) -> String {
    format!(
        "{:indent$}#{:<6} {:>+9} ms  {:<24} {:<34} {} (+{} ms after its cause)",
        "",
        step.sequence,
        step.offset_ms,
        step.source,
        step.event_type,
        step.time,
        step.after_cause_ms,
        indent = indent * 2
    )
}

fn print(why: &Why) {
    println!(
        "{} {} (#{}), appended by {} at {}",
        why.event.event_type, why.event.id, why.event.sequence, why.event.source, why.event.time
    );
    println!();
    if why.causes.is_empty() && why.missing_cause.is_none() {
        println!("caused by: nothing in the log (a user action or an external trigger)");
    } else {
        println!("caused by (back to what started it):");
        for cause in &why.causes {
            println!("{}", line(cause, 1));
        }
        match &why.missing_cause {
            Some(missing) => println!("  … then {missing}, which is not in this project's history"),
            None => println!("  (the last one is the root: a user action or an external trigger)"),
        }
    }
    println!();
    if why.consequences.is_empty() {
        println!("led to: nothing yet");
    } else {
        println!("led to:");
        for consequence in &why.consequences {
            println!("{}", line(consequence, consequence.depth));
        }
    }
    println!();
    let span = why
        .correlation
        .iter()
        .map(|step| step.offset_ms)
        .max()
        .unwrap_or(0);
    println!(
        "correlation {}: {} events over {} ms",
        why.correlation_id,
        why.correlation.len(),
        span
    );
    for step in &why.correlation {
        let marker = if step.id == why.event.id { "▶" } else { " " };
        println!("{marker}{}", line(step, step.depth + 1));
    }
}
