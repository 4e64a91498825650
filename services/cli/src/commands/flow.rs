//! `zopu flow cancel`: stop a running specialist flow, as the web's Cancel
//! control and `POST /v1/projects/{id}/flows/{flow}/cancel` do. The request
//! is built by `zopu_core::commands::cancel_flow` (the flow's one cancel
//! key); the flow's status is read from the run log the gateway projects.

use std::process::ExitCode;

use anyhow::{Result, bail};
use zopu_core::commands::Requester;
use zopu_gateway::read_model::runs;
use zopu_runtime::publish::Publisher;
use zopu_schema::{EventId, FlowRunId, OrgId, ProjectId};

use super::conversation::print_line;
use super::runs::fold_run_log;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  zopu flow cancel 0190... 0191...\n  zopu flow cancel 0190... 0191... --reason \"Wrong question\"\n\nThe flow id is a run id of kind `flow` in `zopu runs --project <project> --status running`."
)]
pub struct FlowArgs {
    #[command(subcommand)]
    pub action: FlowAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum FlowAction {
    /// Stop a running flow: its model call is aborted, its tool killed, and it ends `flow.cancelled`
    Cancel(CancelArgs),
}

#[derive(Debug, clap::Args)]
pub struct CancelArgs {
    /// The project id (as `zopu project create` or `zopu dev` printed it)
    pub project: ProjectId,
    /// The flow run id.
    pub flow: FlowRunId,
    /// The organization the project belongs to
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    pub org: OrgId,
    /// Why (shown with the cancellation; at most 500 characters).
    #[arg(long, default_value = "")]
    pub reason: String,
}

pub async fn run(ctx: &crate::Context, args: FlowArgs) -> Result<ExitCode> {
    let FlowAction::Cancel(cancel) = args.action;
    let requester = Requester::new(cancel.org.clone(), EventId::new().into(), ctx.operator()?);
    let event =
        zopu_core::commands::cancel_flow(&requester, cancel.project, cancel.flow, &cancel.reason)
            .map_err(|problem| anyhow::anyhow!("{}: {problem}", problem.field()))?;
    let bus = ctx.connect().await?;
    let (_dir, conn) = fold_run_log(&bus, &cancel.org, Some(&cancel.project)).await?;
    let Some(flow) = runs::get(&conn, &cancel.org, &cancel.flow.to_string())?
        .filter(|run| run.kind == runs::FLOW && run.project_id == cancel.project.to_string())
    else {
        bail!(
            "project {} has no flow {} (see `zopu runs --project {} --status running`)",
            cancel.project,
            cancel.flow,
            cancel.project
        );
    };
    match flow.status.as_str() {
        runs::RUNNING => {}
        runs::CANCELLED => {
            print_line(
                ctx,
                runs::CANCELLED,
                &format!("flow {} is already cancelled", flow.run_id),
                serde_json::json!({"flow_run_id": flow.run_id, "status": runs::CANCELLED}),
            );
            return Ok(ExitCode::SUCCESS);
        }
        ended => bail!("flow {} already {ended}; nothing to cancel", flow.run_id),
    }
    let appended = Publisher::new(bus.clone(), "cli", None)
        .append(event)
        .await?;
    let already = if appended.duplicate {
        " (already requested)"
    } else {
        ""
    };
    print_line(
        ctx,
        "cancel_requested",
        &format!(
            "cancel of flow {} requested{already} ({})",
            flow.run_id, appended.event_id
        ),
        serde_json::json!({"flow_run_id": flow.run_id, "status": "cancel_requested", "event_id": appended.event_id.to_string(), "sequence": appended.sequence, "duplicate": appended.duplicate}),
    );
    Ok(ExitCode::SUCCESS)
}
