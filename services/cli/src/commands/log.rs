//! Reading the log: `zopu tail`, `zopu replay`, `zopu audit verify`.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use zopu_runtime::log::{Logged, Reader, Start};
use zopu_schema::{Envelope, OrgId, ProjectId, subjects};

use crate::Context;

#[derive(Debug, Args)]
pub struct TailArgs {
    /// An event type pattern (`project.ready`, `artifact.>`) or a full subject filter (`zopu.evt.acme.>`)
    filter: Option<String>,
    /// Only this project's events
    #[arg(long)]
    project: Option<ProjectId>,
    /// With --project: its organization (default: any)
    #[arg(long)]
    org: Option<OrgId>,
    /// Start from the beginning of the log instead of new events only
    #[arg(long)]
    from_start: bool,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The project whose history to print
    #[arg(long)]
    project: ProjectId,
    /// Its organization (default: any)
    #[arg(long)]
    org: Option<OrgId>,
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Check every project's version sequence and hash chain over the whole stream
    #[command(
        after_help = "Exit code 0: clean. 1: findings (gaps, forks, tampering, undecodable messages)."
    )]
    Verify {
        /// Only this project
        #[arg(long)]
        project: Option<ProjectId>,
        /// With --project: its organization (default: any)
        #[arg(long)]
        org: Option<OrgId>,
    },
    /// Write a self-contained bundle of a project's (or an organization's) history that a
    /// third party verifies without Zopu: the events, a manifest with the chain heads and
    /// digests, the proto files and a Python verifier (standard library, and protobuf to
    /// decode payloads)
    #[command(
        after_help = "Example:\n  zopu audit export --project 0190... --out bundle\n  python3 bundle/verify.py bundle"
    )]
    Export {
        /// The project to export
        #[arg(
            long,
            conflicts_with = "whole_org",
            required_unless_present = "whole_org"
        )]
        project: Option<ProjectId>,
        /// The organization: with --project, the project's (default: any); alone, every
        /// project of it
        #[arg(long)]
        org: Option<OrgId>,
        /// Every project of --org
        #[arg(long, requires = "org")]
        whole_org: bool,
        /// Where to write the bundle (a new or empty directory)
        #[arg(long)]
        out: std::path::PathBuf,
    },
}

fn scope_filter(project: Option<ProjectId>, org: Option<&OrgId>) -> Option<String> {
    project.map(|project| match org {
        Some(org) => subjects::project_events(org, &project),
        None => subjects::project_events_any_org(&project),
    })
}

/// The JSON view of an event: envelope attributes and the decoded payload.
pub fn event_json(sequence: u64, envelope: &Envelope) -> serde_json::Value {
    let data = zopu_schema::catalogue::to_json(&envelope.data_schema, &envelope.data)
        .unwrap_or_else(|error| serde_json::json!({ "undecodable": error.to_string() }));
    serde_json::json!({
        "sequence": sequence,
        "id": envelope.id.to_string(),
        "type": envelope.event_type,
        "source": envelope.source,
        "time": zopu_schema::envelope::format_time(envelope.time),
        "org": envelope.org_id.to_string(),
        "project": envelope.project_id.to_string(),
        "version": envelope.project_version,
        "correlation": envelope.correlation_id.to_string(),
        "causation": envelope.causation_id.to_string(),
        "work": envelope.work_id.map(|id| id.to_string()),
        "thread": envelope.thread_id.map(|id| id.to_string()),
        "flow_run": envelope.flow_run_id.map(|id| id.to_string()),
        "dispatch": envelope.dispatch_id.map(|id| id.to_string()),
        "data": data,
    })
}

fn print_event(context: &Context, sequence: u64, envelope: &Envelope) {
    let json = event_json(sequence, envelope);
    if context.json {
        println!("{json}");
    } else {
        println!(
            "#{sequence} v{} {} {} {}",
            envelope.project_version,
            zopu_schema::envelope::format_time(envelope.time),
            envelope.event_type,
            json["data"]
        );
    }
}

pub async fn run_tail(context: &Context, args: TailArgs) -> anyhow::Result<ExitCode> {
    let bus = context.connect().await?;
    let filter = match (args.filter, scope_filter(args.project, args.org.as_ref())) {
        (Some(filter), _) if subjects::is_subject_filter(&filter) => filter,
        (Some(pattern), _) => subjects::events_of_type(&pattern),
        (None, Some(project)) => project,
        (None, None) => subjects::all_events(),
    };
    let start = if args.from_start {
        Start::Beginning
    } else {
        Start::New
    };
    let mut reader = Reader::open(&bus, filter, start).await?;
    while let Some(logged) = reader.next().await {
        print_logged(context, logged?);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_logged(context: &Context, logged: Logged) {
    match logged.event {
        Ok(envelope) => print_event(context, logged.sequence, &envelope),
        Err(error) => eprintln!(
            "#{} {}: not a valid event: {error}",
            logged.sequence, logged.subject
        ),
    }
}

pub async fn run_replay(context: &Context, args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let bus = context.connect().await?;
    let filter =
        scope_filter(Some(args.project), args.org.as_ref()).unwrap_or_else(subjects::all_events);
    let history = zopu_runtime::log::history(&bus, filter).await?;
    if history.is_empty() {
        anyhow::bail!(
            "project {} has no events (check the id, and --org if given)",
            args.project
        );
    }
    for logged in history {
        print_logged(context, logged);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn run_audit(context: &Context, command: AuditCommand) -> anyhow::Result<ExitCode> {
    let (project, org) = match command {
        AuditCommand::Verify { project, org } => (project, org),
        AuditCommand::Export {
            project,
            org,
            whole_org: _,
            out,
        } => {
            let scope = match (project, org) {
                (Some(project), org) => super::export::Scope::Project { project, org },
                (None, Some(org)) => super::export::Scope::Org(org),
                (None, None) => anyhow::bail!("name --project, or --org with --whole-org"),
            };
            return super::export::run(context, scope, out).await;
        }
    };
    let bus = context.connect().await?;
    let report = zopu_runtime::audit::verify(&bus, scope_filter(project, org.as_ref())).await?;
    if context.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "checked {} events of {} projects up to sequence {}: {}",
            report.events,
            report.projects,
            report.last_sequence,
            if report.is_clean() {
                "clean".to_owned()
            } else {
                format!("{} finding(s)", report.findings.len())
            }
        );
        for finding in &report.findings {
            match finding {
                zopu_runtime::audit::Finding::Gap {
                    project,
                    sequence,
                    expected,
                    found,
                } => {
                    println!(
                        "  gap       #{sequence} {project}: expected version {expected}, found {found}"
                    )
                }
                zopu_runtime::audit::Finding::Fork {
                    project,
                    sequence,
                    version,
                    first_sequence,
                } => {
                    println!(
                        "  fork      #{sequence} {project}: version {version} already used at #{first_sequence}"
                    )
                }
                zopu_runtime::audit::Finding::Tampered {
                    project,
                    sequence,
                    version,
                    previous_sequence,
                } => println!(
                    "  tampered  #{sequence} {project}: version {version} does not chain to #{previous_sequence}"
                ),
                zopu_runtime::audit::Finding::Undecodable {
                    sequence,
                    subject,
                    reason,
                } => {
                    println!("  invalid   #{sequence} {subject}: {reason}")
                }
            }
        }
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
