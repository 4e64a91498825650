//! Projects: `zopu project create`, `zopu project list`, `zopu project
//! status`, `zopu project retry`.
//!
//! `create` and `retry` append a setup request (validated before anything is
//! appended) and then follow the project's setup as it happens, printing the
//! thin progression (creating workspace → cloning → checking → ready); they
//! exit non-zero with the reason when setup fails.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use zopu_runtime::Publisher;
use zopu_schema::{CorrelationId, EventId, OrgId, ProjectId};
use zopu_setup::client::{
    DEFAULT_BRANCH, SetupRequest, StatusWatch, read_setup_status, request_setup,
};
use zopu_setup::{SetupPhase, SetupStatus};

use super::table::Table;
use crate::Context;

/// Exit code when setup failed.
const EXIT_FAILED: u8 = 1;
/// Exit code when setup did not finish within `--timeout`.
const EXIT_TIMEOUT: u8 = 2;

#[derive(Debug, Subcommand)]
pub enum ProjectCommand {
    /// Create a project from a repository and follow its setup
    #[command(
        after_help = "Examples:\n  zopu project create --repo https://github.com/acme/shop.git --branch main\n  zopu project create --repo /path/to/repo   (local paths need sandbox.allow_local_repositories and sandbox.local_repository_roots)\n  zopu project create --repo https://github.com/acme/shop.git --request-id 0190...   (a safe retry: the same request id is the same project)"
    )]
    Create(CreateArgs),
    /// List an organization's projects: id, name, setup state and repository
    #[command(
        after_help = "Example:\n  zopu project list\n  zopu project list --json   (one JSON object per project)"
    )]
    List(ListArgs),
    /// Show a project's setup status
    Status(StatusArgs),
    /// Retry a project's setup as a new revision (repairs a broken workspace)
    Retry(RetryArgs),
}

#[derive(Debug, Args)]
pub struct Follow {
    /// Follow setup until it is ready or failed (default)
    #[arg(long, overrides_with = "no_wait")]
    wait: bool,
    /// Print the project id and return at once
    #[arg(long)]
    no_wait: bool,
    /// Give up following after this many seconds
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    timeout: u64,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Repository: an https:// URL without credentials, or a local path (when allowed)
    #[arg(long, value_name = "URL|PATH")]
    repo: String,
    /// Branch to clone
    #[arg(long, default_value = DEFAULT_BRANCH)]
    branch: String,
    /// Organization
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    org: OrgId,
    /// Display name of the project (default: the repository name)
    #[arg(long)]
    name: Option<String>,
    /// Idempotency key of this creation (default: a new one, printed). The
    /// same organization and request id always name the same project, so
    /// repeating the command with it never creates a second one.
    #[arg(long, value_name = "ID")]
    request_id: Option<CorrelationId>,
    #[command(flatten)]
    follow: Follow,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// The organization whose projects to list
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    org: OrgId,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The project id
    project: ProjectId,
    /// The organization the project belongs to
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    org: OrgId,
}

#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The project id
    project: ProjectId,
    /// The organization the project belongs to
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    org: OrgId,
    /// Clone this branch instead of the last requested one
    #[arg(long)]
    branch: Option<String>,
    #[command(flatten)]
    follow: Follow,
}

pub async fn run(ctx: &Context, command: ProjectCommand) -> anyhow::Result<ExitCode> {
    match command {
        ProjectCommand::Create(args) => run_create(ctx, args).await,
        ProjectCommand::List(args) => run_list(ctx, args).await,
        ProjectCommand::Status(args) => run_status(ctx, args).await,
        ProjectCommand::Retry(args) => run_retry(ctx, args).await,
    }
}

/// Local paths may be given relative to the current directory; URLs pass unchanged.
fn repository_location(input: &str) -> String {
    let path = std::path::Path::new(input);
    if !input.contains("://")
        && !input.starts_with('-')
        && !path.is_absolute()
        && path.is_dir()
        && let Ok(absolute) = std::path::absolute(path)
    {
        return absolute.display().to_string();
    }
    input.to_owned()
}

fn allow_local_repositories(ctx: &Context) -> bool {
    ctx.config.sandbox.allow_local_repositories
}

pub async fn run_create(ctx: &Context, args: CreateArgs) -> anyhow::Result<ExitCode> {
    let repository = repository_location(&args.repo);
    let request_id = match args.request_id {
        Some(request_id) => request_id,
        None => CorrelationId::from(EventId::new()),
    };
    let project = ProjectId::for_request(&args.org, &request_id);
    let mut request = SetupRequest::new(
        args.org.clone(),
        project,
        &repository,
        &args.branch,
        1,
        request_id.as_str(),
    )
    .allow_local_repositories(allow_local_repositories(ctx));
    // Empty: named after the repository (`zopu_core::commands::default_project_name`).
    request.project_name = args.name.unwrap_or_default();
    // Validate before connecting, so bad input fails fast and offline.
    zopu_setup::client::validate(&request)?;
    if !ctx.json {
        eprintln!("request id {request_id} (to retry safely: --request-id {request_id})");
    }
    let bus = ctx.connect().await?;
    let publisher = Publisher::new(bus.clone(), "cli", None);
    let watch = StatusWatch::start(&bus, &args.org, &project).await?;
    // The project id comes from the request id: if the project exists, this
    // request already made it (beyond JetStream's duplicate window too).
    let (event_id, revision, duplicate) = match read_setup_status(&bus, &args.org, &project).await?
    {
        Some(existing) => (None, existing.revision, true),
        None => (Some(request_setup(&publisher, &request).await?), 1, false),
    };
    if ctx.json {
        println!(
            "{}",
            serde_json::json!({ "project": project.to_string(), "org": args.org.to_string(), "revision": revision, "event_id": event_id.map(|id| id.to_string()), "request_id": request_id.to_string(), "duplicate": duplicate })
        );
    } else {
        println!("{project}");
        if duplicate {
            eprintln!(
                "project {project} was already created by request {request_id}; following its setup"
            );
        }
    }
    follow(ctx, watch, project, revision, &args.follow).await
}

pub async fn run_list(ctx: &Context, args: ListArgs) -> anyhow::Result<ExitCode> {
    let bus = ctx.connect().await?;
    let projects = zopu_setup::client::org_projects(&bus, &args.org).await?;
    if projects.is_empty() && !ctx.json {
        eprintln!(
            "no projects in organization {}; create one with `zopu project create --repo URL|PATH`",
            args.org
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&["PROJECT", "NAME", "SETUP", "REPOSITORY"]);
    for (project, status) in projects {
        let mut json = status_json(&project, &status);
        if let Some(object) = json.as_object_mut() {
            object.insert("org".to_owned(), args.org.to_string().into());
        }
        table.row(
            vec![
                project.to_string(),
                status.project_name.clone(),
                format!("{} (revision {})", status.phase.as_str(), status.revision),
                format!("{} (branch {})", status.repository_url, status.branch),
            ],
            json,
        );
    }
    table.print(ctx.json);
    Ok(ExitCode::SUCCESS)
}

pub async fn run_status(ctx: &Context, args: StatusArgs) -> anyhow::Result<ExitCode> {
    let bus = ctx.connect().await?;
    let Some(status) = read_setup_status(&bus, &args.org, &args.project).await? else {
        anyhow::bail!(
            "project {} has no setup in organization {}",
            args.project,
            args.org
        );
    };
    if ctx.json {
        println!("{}", status_json(&args.project, &status));
    } else {
        print_status(&args.project, &status);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn run_retry(ctx: &Context, args: RetryArgs) -> anyhow::Result<ExitCode> {
    let bus = ctx.connect().await?;
    let Some(last) = read_setup_status(&bus, &args.org, &args.project).await? else {
        anyhow::bail!(
            "project {} has no setup to retry in organization {}",
            args.project,
            args.org
        );
    };
    let revision = last.revision + 1;
    let branch = args.branch.unwrap_or(last.branch);
    let mut request = SetupRequest::new(
        args.org.clone(),
        args.project,
        &last.repository_url,
        &branch,
        revision,
        &EventId::new().to_string(),
    )
    .allow_local_repositories(allow_local_repositories(ctx));
    // A retry keeps the name chosen at creation.
    request.project_name = last.project_name;
    let publisher = Publisher::new(bus.clone(), "cli", None);
    let watch = StatusWatch::start(&bus, &args.org, &args.project).await?;
    let event_id = request_setup(&publisher, &request).await?;
    if ctx.json {
        println!(
            "{}",
            serde_json::json!({ "project": args.project.to_string(), "revision": revision, "event_id": event_id.to_string() })
        );
    } else {
        println!("{} (setup revision {revision})", args.project);
    }
    follow(ctx, watch, args.project, revision, &args.follow).await
}

/// Prints each phase of `revision` as it is reached, until ready or failed.
async fn follow(
    ctx: &Context,
    mut watch: StatusWatch,
    project: ProjectId,
    revision: u32,
    options: &Follow,
) -> anyhow::Result<ExitCode> {
    if options.no_wait {
        return Ok(ExitCode::SUCCESS);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(options.timeout);
    let mut shown: Option<SetupPhase> = None;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let Some(status) = watch.next(left).await? else {
            eprintln!(
                "setup is still running after {}s; follow it with `zopu project status {project}`",
                options.timeout
            );
            return Ok(ExitCode::from(EXIT_TIMEOUT));
        };
        if status.revision != revision || shown == Some(status.phase) {
            continue;
        }
        shown = Some(status.phase);
        if ctx.json {
            println!("{}", status_json(&project, &status));
        } else if !status.phase.is_terminal() {
            println!("{}…", status.phase.label());
        }
        match status.phase {
            SetupPhase::Ready => {
                if !ctx.json {
                    print_status(&project, &status);
                }
                return Ok(ExitCode::SUCCESS);
            }
            SetupPhase::Failed => {
                if !ctx.json {
                    print_status(&project, &status);
                }
                return Ok(ExitCode::from(EXIT_FAILED));
            }
            _ => {}
        }
    }
}

fn print_status(project: &ProjectId, status: &SetupStatus) {
    println!("project     {project}");
    println!("name        {}", status.project_name);
    println!(
        "setup       {} (revision {})",
        status.phase.label(),
        status.revision
    );
    println!(
        "repository  {} (branch {})",
        status.repository_url, status.branch
    );
    if let Some(commit) = &status.repository_commit {
        println!("commit      {commit}");
    }
    if let Some(agent) = &status.agent_id {
        println!("agent       {agent}");
    }
    if !status.environment_variable_names.is_empty() {
        println!(
            "optional configuration (.env.example): {}",
            status.environment_variable_names.join(", ")
        );
    }
    if let Some(reason) = &status.reason {
        eprintln!(
            "setup failed at {}: {} [{}]",
            reason.step, reason.message, reason.code
        );
        if reason.retryable {
            eprintln!("retry with: zopu project retry {project}");
        }
    }
}

fn status_json(project: &ProjectId, status: &SetupStatus) -> serde_json::Value {
    serde_json::json!({
        "project": project.to_string(),
        "name": status.project_name,
        "phase": status.phase.as_str(),
        "revision": status.revision,
        "repository_url": status.repository_url,
        "branch": status.branch,
        "repository_commit": status.repository_commit,
        "runtime_id": status.runtime_id,
        "agent_id": status.agent_id,
        "environment_variable_names": status.environment_variable_names,
        "reason": status.reason.as_ref().map(|reason| serde_json::json!({
            "step": reason.step,
            "code": reason.code,
            "message": reason.message,
            "retryable": reason.retryable,
        })),
    })
}
