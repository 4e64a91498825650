//! `zopu send`, `zopu agent disable|enable`, `zopu timeline`: talk to a
//! project's conversation agent (client API in `zopu_conversation::client`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use zopu_conversation::Reply;
use zopu_runtime::log::{Reader, Start};
use zopu_runtime::publish::Publisher;
use zopu_schema::{CorrelationId, EventId, OrgId, ProjectId, subjects};

/// `zopu send PROJECT "message"`
#[derive(Debug, clap::Args)]
pub struct SendArgs {
    /// Project id.
    pub project: ProjectId,
    /// The message (at most 8000 characters).
    pub message: String,
    /// The organization the project belongs to
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    pub org: OrgId,
    /// Seconds to wait for the acknowledgement and the final message.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

/// `zopu agent disable|enable PROJECT`
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    #[command(subcommand)]
    pub action: AgentAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum AgentAction {
    /// Kill switch: the agent takes no new work; running flows halt.
    Disable(SwitchArgs),
    /// Lets the agent work again.
    Enable(SwitchArgs),
    /// The registered agents (`agents_dir`, or the built-in registry) with their versions and prompt packages
    List,
    /// One registered agent's definition and prompt package
    Show(ShowArgs),
    /// The Agent API keys of external agents: create, list, rotate, revoke
    Key(super::agent_key::KeyArgs),
    /// The reference external runtime: drafts replies to its candidates with an OpenAI-compatible model (dry-run by default)
    RunExternal(super::agent_runtime::RunExternalArgs),
    /// Checks an external runtime's key, fetches one candidate and drafts one reply, writing nothing
    Smoke(super::agent_runtime::SmokeArgs),
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// The agent's registry key, e.g. `explorer`.
    pub key: String,
    /// Also print the prompt package's text.
    #[arg(long)]
    pub package: bool,
}

#[derive(Debug, clap::Args)]
pub struct SwitchArgs {
    /// The project id (as `zopu project create` or `zopu dev` printed it)
    pub project: ProjectId,
    /// The organization the project belongs to
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    pub org: OrgId,
    /// Shown to users while the agent is paused (disable only).
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// `zopu timeline PROJECT [--follow]`
#[derive(Debug, clap::Args)]
pub struct TimelineArgs {
    /// The project id (as `zopu project create` or `zopu dev` printed it)
    pub project: ProjectId,
    /// The organization the project belongs to
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    pub org: OrgId,
    /// Keep printing new events.
    #[arg(long)]
    pub follow: bool,
}

pub(super) fn print_line(ctx: &crate::Context, kind: &str, text: &str, extra: serde_json::Value) {
    if ctx.json {
        let mut object = serde_json::json!({"kind": kind, "text": text});
        if let (Some(map), serde_json::Value::Object(more)) = (object.as_object_mut(), extra) {
            map.extend(more);
        }
        println!("{object}");
    } else {
        println!("{text}");
    }
}

/// An ordered reader of one project's events from `start` (inclusive).
async fn project_events(
    bus: &zopu_runtime::nats::Bus,
    org: &OrgId,
    project: &ProjectId,
    start: u64,
) -> Result<Reader> {
    let start = if start <= 1 {
        Start::Beginning
    } else {
        Start::After(start - 1)
    };
    Ok(Reader::open(bus, subjects::project_events(org, project), start).await?)
}

pub async fn run_send(ctx: &crate::Context, args: SendArgs) -> Result<ExitCode> {
    let bus = ctx.connect().await?;
    let publisher = Publisher::new(bus.clone(), "cli", None);
    let request = CorrelationId::from(EventId::new());
    let sent = zopu_conversation::send_message(
        &publisher,
        &args.org,
        &args.project,
        &args.message,
        ctx.operator()?,
        request.as_str(),
    )
    .await?;
    print_line(
        ctx,
        "sent",
        &format!("sent {}", sent.event_id),
        serde_json::json!({"event_id": sent.event_id.to_string()}),
    );
    let mut events = project_events(&bus, &args.org, &args.project, sent.sequence).await?;
    let waiting = async {
        while let Some(logged) = events.next().await {
            let Ok(event) = logged?.event else {
                continue;
            };
            match zopu_conversation::reply_to(&event, &request) {
                Some(Reply::Line(text)) => print_line(
                    ctx,
                    "agent",
                    &format!("agent: {text}"),
                    serde_json::json!({"event_id": event.id.to_string()}),
                ),
                Some(Reply::Final { text, artifact_ids }) => {
                    let suffix = if artifact_ids.is_empty() {
                        String::new()
                    } else {
                        format!(" [artifacts: {}]", artifact_ids.join(", "))
                    };
                    print_line(
                        ctx,
                        "final",
                        &format!("agent: {text}{suffix}"),
                        serde_json::json!({"artifact_ids": artifact_ids}),
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                Some(Reply::Done(outcome)) => {
                    let outcome = outcome.unwrap_or_default();
                    if !ctx.json {
                        // The reply itself was already printed.
                    } else {
                        print_line(ctx, "done", &outcome, serde_json::json!({}));
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                Some(Reply::Failed { code, message }) => {
                    print_line(
                        ctx,
                        "failed",
                        &format!("failed ({code}): {message}"),
                        serde_json::json!({"code": code}),
                    );
                    return Ok(ExitCode::FAILURE);
                }
                None => {}
            }
        }
        anyhow::Ok(ExitCode::FAILURE)
    };
    match tokio::time::timeout(Duration::from_secs(args.timeout), waiting).await {
        Ok(outcome) => outcome,
        Err(_) => {
            print_line(
                ctx,
                "timeout",
                &format!(
                    "no final message within {}s (the message is stored; see `zopu timeline`)",
                    args.timeout
                ),
                serde_json::json!({}),
            );
            Ok(ExitCode::from(2))
        }
    }
}

pub async fn run_agent(ctx: &crate::Context, args: AgentArgs) -> Result<ExitCode> {
    match args.action {
        AgentAction::List => super::agents::list(ctx),
        AgentAction::Show(show) => super::agents::show(ctx, &show.key, show.package),
        AgentAction::Key(key) => super::agent_key::run(ctx, key).await,
        AgentAction::RunExternal(args) => super::agent_runtime::run(ctx, args).await,
        AgentAction::Smoke(args) => super::agent_runtime::smoke(ctx, args).await,
        AgentAction::Disable(switch) => kill_switch(ctx, switch, true).await,
        AgentAction::Enable(switch) => kill_switch(ctx, switch, false).await,
    }
}

async fn kill_switch(ctx: &crate::Context, switch: SwitchArgs, disable: bool) -> Result<ExitCode> {
    let bus = ctx.connect().await?;
    let publisher = Publisher::new(bus, "cli", None);
    let (kind, appended) = if disable {
        (
            "disabled",
            zopu_conversation::disable_agent(
                &publisher,
                &switch.org,
                &switch.project,
                &switch.reason,
                ctx.operator()?,
            )
            .await?,
        )
    } else {
        (
            "enabled",
            zopu_conversation::enable_agent(
                &publisher,
                &switch.org,
                &switch.project,
                ctx.operator()?,
            )
            .await?,
        )
    };
    print_line(
        ctx,
        kind,
        &format!("agent {kind} ({})", appended.event_id),
        serde_json::json!({"event_id": appended.event_id.to_string()}),
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn run_timeline(ctx: &crate::Context, args: TimelineArgs) -> Result<ExitCode> {
    let bus = ctx.connect().await?;
    let last = zopu_runtime::publish::last_sequence(&bus).await?;
    let mut events = project_events(&bus, &args.org, &args.project, 1).await?;
    loop {
        let next = if args.follow {
            events.next().await
        } else {
            match tokio::time::timeout(Duration::from_secs(2), events.next()).await {
                Ok(next) => next,
                Err(_) => break,
            }
        };
        let Some(logged) = next else { break };
        let logged = logged.context("reading the timeline")?;
        let (sequence, pending) = (logged.sequence, logged.pending);
        if let Ok(event) = logged.event
            && let Some(line) = zopu_conversation::timeline_line(&event)
        {
            let time = zopu_schema::envelope::format_time(event.time);
            print_line(
                ctx,
                &event.event_type,
                &format!("{} {line}", &time[..19]),
                serde_json::json!({"event_id": event.id.to_string(), "type": event.event_type}),
            );
        }
        if !args.follow && (pending == 0 || sequence >= last) {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}
