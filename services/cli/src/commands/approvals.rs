//! `zopu approvals list|approve|reject`: what a project's agent asked to do
//! outside the runtime, and the operator's decision on it (built by
//! `zopu_core::commands::decide_approval`, as the gateway does, under the
//! approval's one decision key).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use zopu_core::commands::{Decision, Requester};
use zopu_runtime::log::{Reader, Start};
use zopu_runtime::publish::Publisher;
use zopu_schema::approval::{self, Status};
use zopu_schema::envelope::parse_time;
use zopu_schema::{Envelope, Event, EventId, OrgId, ProjectId, pb, subjects};

use super::conversation::print_line;
use super::table::Table;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  zopu approvals list 0190... --status pending\n  zopu approvals approve 0190... approval:0191...:issue.publish\n  zopu approvals reject 0190... approval:0191...:issue.publish --reason \"Not this sprint\""
)]
pub struct ApprovalsArgs {
    #[command(subcommand)]
    pub action: ApprovalsAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum ApprovalsAction {
    /// The project's approvals, oldest first, with their status
    List(ListArgs),
    /// Approve a pending approval (stored as `approval.granted`, you as the reviewer)
    Approve(DecideArgs),
    /// Reject a pending approval (stored as `approval.denied`)
    Reject(DecideArgs),
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// The project id (as `zopu project create` or `zopu dev` printed it)
    pub project: ProjectId,
    /// The organization the project belongs to
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    pub org: OrgId,
    /// Only approvals with this status: pending, approved, rejected, expired
    #[arg(long, value_parser = ["pending", "approved", "rejected", "expired"])]
    pub status: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct DecideArgs {
    /// The project id (as `zopu project create` or `zopu dev` printed it)
    pub project: ProjectId,
    /// The approval id `zopu approvals list` shows.
    pub approval: String,
    /// The organization the project belongs to
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    pub org: OrgId,
    /// Why (reject only; at most 500 characters).
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// One approval as its events tell it.
#[derive(Debug, Clone, serde::Serialize)]
struct Approval {
    approval_id: String,
    action: String,
    detail: String,
    dry_run: bool,
    expires_at: String,
    requested_sequence: u64,
    /// `pending`, `approved`, `rejected` or `expired`: the first decision.
    status: &'static str,
    decided_by: String,
    reason: String,
}

const APPROVAL_TYPES: [&str; 4] = [
    pb::ApprovalRequested::TYPE,
    pb::ApprovalGranted::TYPE,
    pb::ApprovalDenied::TYPE,
    pb::ApprovalExpired::TYPE,
];

pub async fn run(ctx: &crate::Context, args: ApprovalsArgs) -> Result<ExitCode> {
    if !matches!(args.action, ApprovalsAction::List(_)) {
        // Who decides, before anything is read or written.
        ctx.operator()?;
    }
    let bus = ctx.connect().await?;
    match args.action {
        ApprovalsAction::List(list) => {
            let approvals = read(&bus, &list.org, &list.project).await?;
            let mut table = Table::new(&[
                "APPROVAL", "ACTION", "STATUS", "BY", "EXPIRES", "DRY RUN", "REASON", "DETAIL",
            ]);
            for approval in approvals.values() {
                if list.status.as_deref().is_some_and(|s| s != approval.status) {
                    continue;
                }
                let or_dash = |text: &str| {
                    if text.is_empty() {
                        "-".to_owned()
                    } else {
                        text.to_owned()
                    }
                };
                let mut json = serde_json::to_value(approval)?;
                if let Some(object) = json.as_object_mut() {
                    object.insert("kind".to_owned(), "approval".into());
                }
                table.row(
                    vec![
                        approval.approval_id.clone(),
                        approval.action.clone(),
                        approval.status.to_owned(),
                        or_dash(&approval.decided_by),
                        approval.expires_at.clone(),
                        if approval.dry_run { "yes" } else { "no" }.to_owned(),
                        or_dash(&approval.reason),
                        approval.detail.clone(),
                    ],
                    json,
                );
            }
            if table.is_empty() && !ctx.json {
                eprintln!(
                    "project {} has no approvals{} (the agent asks for one before anything leaves the runtime, e.g. publishing an issue draft)",
                    list.project,
                    list.status
                        .as_deref()
                        .map(|status| format!(" {status}"))
                        .unwrap_or_default()
                );
            } else {
                table.print(ctx.json);
            }
            Ok(ExitCode::SUCCESS)
        }
        ApprovalsAction::Approve(decide) => decide_one(ctx, &bus, decide, Decision::Approve).await,
        ApprovalsAction::Reject(decide) => {
            let reason = decide.reason.clone();
            decide_one(ctx, &bus, decide, Decision::Reject { reason }).await
        }
    }
}

async fn decide_one(
    ctx: &crate::Context,
    bus: &zopu_runtime::nats::Bus,
    args: DecideArgs,
    decision: Decision,
) -> Result<ExitCode> {
    let approvals = read(bus, &args.org, &args.project).await?;
    let Some(approval) = approvals.get(&args.approval) else {
        bail!(
            "project {} has no approval {:?} (see `zopu approvals list {}`)",
            args.project,
            args.approval,
            args.project
        );
    };
    if approval.status != Status::Pending.as_str() {
        bail!(
            "approval {} is already {}",
            approval.approval_id,
            approval.status
        );
    }
    if parse_time(&approval.expires_at)
        .is_some_and(|expires| expires <= time::OffsetDateTime::now_utc())
    {
        bail!("approval {} is already expired", approval.approval_id);
    }
    let request = EventId::new();
    let requester = Requester::new(args.org.clone(), request.into(), ctx.operator()?);
    let event =
        zopu_core::commands::decide_approval(&requester, args.project, &args.approval, &decision)
            .map_err(|problem| anyhow::anyhow!("{}: {problem}", problem.field()))?;
    let appended = Publisher::new(bus.clone(), "cli", None)
        .append(event)
        .await?;
    if appended.duplicate {
        bail!(
            "approval {} was decided by someone else meanwhile",
            approval.approval_id
        );
    }
    let status = match decision {
        Decision::Approve => Status::Approved,
        Decision::Reject { .. } => Status::Rejected,
    }
    .as_str();
    print_line(
        ctx,
        status,
        &format!(
            "approval {} {status} ({})",
            approval.approval_id, appended.event_id
        ),
        serde_json::json!({"approval_id": approval.approval_id, "event_id": appended.event_id.to_string(), "sequence": appended.sequence}),
    );
    Ok(ExitCode::SUCCESS)
}

/// Every approval of the project, by id, folded from its approval events
/// (the first decision of a pending approval counts).
async fn read(
    bus: &zopu_runtime::nats::Bus,
    org: &OrgId,
    project: &ProjectId,
) -> Result<BTreeMap<String, Approval>> {
    let last = zopu_runtime::publish::last_sequence(bus).await?;
    let filters = APPROVAL_TYPES
        .iter()
        .map(|event_type| subjects::event(org, project, event_type))
        .collect();
    let mut events = Reader::open_filters(bus, filters, Start::Beginning).await?;
    let mut approvals = BTreeMap::new();
    loop {
        // A project without approvals has nothing to deliver: stop when quiet.
        let Ok(next) = tokio::time::timeout(Duration::from_secs(2), events.next()).await else {
            break;
        };
        let Some(logged) = next else { break };
        let logged = logged.context("reading the project's approvals")?;
        if let Ok(event) = &logged.event {
            fold(&mut approvals, event, logged.sequence);
        }
        if logged.pending == 0 || logged.sequence >= last {
            break;
        }
    }
    Ok(approvals)
}

fn fold(approvals: &mut BTreeMap<String, Approval>, event: &Envelope, sequence: u64) {
    if let Ok(m) = event.decode::<pb::ApprovalRequested>() {
        approvals.entry(m.approval_id.clone()).or_insert(Approval {
            approval_id: m.approval_id,
            action: m.action,
            detail: m.detail,
            dry_run: m.dry_run,
            expires_at: m.expires_at,
            requested_sequence: sequence,
            status: Status::Pending.as_str(),
            decided_by: String::new(),
            reason: String::new(),
        });
    } else if let Some(decided) = approval::decision_of(event)
        && let Some(approval) = approvals.get_mut(&decided.approval_id)
        && approval.status == Status::Pending.as_str()
    {
        approval.status = decided.status.as_str();
        approval.decided_by = decided.by.unwrap_or_default();
        approval.reason = decided.reason;
    }
}
