//! `zopu runs`: the AgentRun log — every run of every agent of an
//! organization (conversation turns and specialist flows) with the fields
//! the Numu plan names — read from the stream and folded by the gateway's
//! own run-log projection (`zopu_gateway::read_model::runs`) into a
//! throwaway SQLite file, and printed as the gateway's own views, so the
//! CLI and `GET /v1/runs` never disagree.

use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};
use zopu_gateway::api::{HandoffView, NoteView, RunDetail, RunView};
use zopu_gateway::read_model::runs::{self, RunFilter};
use zopu_schema::{OrgId, ProjectId, agent_registry, subjects};

use super::table::Table;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  zopu runs\n  zopu runs --project 0190... --agent explorer --status failed\n  zopu runs --run 0191...   # one run with its internal notes and handoffs"
)]
pub struct RunsArgs {
    /// The organization the project belongs to
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    pub org: OrgId,
    /// Only this project's runs.
    #[arg(long)]
    pub project: Option<ProjectId>,
    /// Only this agent's runs (a registry key, e.g. `explorer`).
    #[arg(long)]
    pub agent: Option<String>,
    /// Only runs with this status.
    #[arg(long, value_parser = runs::STATUSES)]
    pub status: Option<String>,
    /// Show one run (a dispatch id or a flow run id) with its notes and handoffs.
    #[arg(long, conflicts_with_all = ["project", "agent", "status"])]
    pub run: Option<String>,
    /// At most this many runs (the latest).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
}

/// The organization's run log (or one project's), folded from the stream by
/// the gateway's run-log projection into a throwaway SQLite file (kept while
/// the returned directory lives).
pub async fn fold_run_log(
    bus: &zopu_runtime::nats::Bus,
    org: &OrgId,
    project: Option<&ProjectId>,
) -> Result<(tempfile::TempDir, rusqlite::Connection)> {
    let filters = runs::EVENT_TYPES
        .iter()
        .map(|event_type| match project {
            Some(project) => subjects::event(org, project, event_type),
            None => subjects::org_events_of_type(org, event_type),
        })
        .collect();
    let history = zopu_runtime::log::history_of(bus, filters)
        .await
        .context("reading the run events")?;
    let dir = tempfile::tempdir().context("a temporary directory for the run log")?;
    let mut conn = rusqlite::Connection::open(dir.path().join("runs.sqlite"))?;
    let tx = conn.transaction()?;
    tx.execute_batch(runs::SCHEMA)?;
    let mut undecodable = 0usize;
    for logged in &history {
        match &logged.event {
            Ok(event) => runs::apply(&tx, event, logged.sequence)?,
            Err(_) => undecodable += 1,
        }
    }
    tx.commit()?;
    if undecodable > 0 {
        tracing::warn!(
            undecodable,
            "messages on the run subjects that are not events were skipped"
        );
    }
    Ok((dir, conn))
}

pub async fn run(ctx: &crate::Context, args: RunsArgs) -> Result<ExitCode> {
    if let Some(agent) = &args.agent
        && !agent_registry::is_agent_key(agent)
    {
        bail!("--agent {agent:?} is not a registry key (lowercase letters, digits and -)");
    }
    if args.limit == 0 {
        bail!("--limit must be at least 1");
    }
    let bus = ctx.connect().await?;
    let (_dir, conn) = fold_run_log(&bus, &args.org, args.project.as_ref()).await?;
    if let Some(run_id) = &args.run {
        let Some(row) = runs::get(&conn, &args.org, run_id)? else {
            bail!("organization {} has no run {run_id:?}", args.org);
        };
        let notes = runs::notes(&conn, &args.org, &row.project_id, &row.run_id)?;
        let handoffs = runs::handoffs(&conn, &args.org, &row.project_id, &row.run_id)?;
        let detail = serde_json::to_value(RunDetail {
            run: row.into(),
            notes: notes.into_iter().map(NoteView::from).collect(),
            handoffs: handoffs.into_iter().map(HandoffView::from).collect(),
        })?;
        if ctx.json {
            println!("{detail}");
        } else {
            println!("{}", serde_json::to_string_pretty(&detail)?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let filter = RunFilter {
        project_id: args.project.map(|project| project.to_string()),
        agent_key: args.agent.clone(),
        status: args.status.clone(),
        after: 0,
        limit: u32::MAX,
    };
    let rows = runs::list(&conn, &args.org, &filter)?;
    let skip = rows.len().saturating_sub(args.limit as usize);
    if rows.is_empty() && !ctx.json {
        eprintln!("no runs in organization {} match", args.org);
    }
    let mut table = Table::new(&[
        "STARTED", "RUN", "KIND", "AGENT", "STATUS", "PACKAGE", "MODEL", "BY", "OUTCOME",
    ]);
    for row in &rows[skip..] {
        let outcome = match (&row.error_code, &row.recommendation) {
            (Some(code), _) => code.clone(),
            (None, Some(action)) => format!(
                "recommends {action} ({})",
                row.approval_status.as_deref().unwrap_or("pending")
            ),
            (None, None) => "-".to_owned(),
        };
        let json = serde_json::to_value(RunView::from(row.clone()))?;
        table.row(
            vec![
                row.created_at.clone(),
                row.run_id.clone(),
                row.kind.clone(),
                row.agent_key.clone(),
                row.status.clone(),
                row.prompt_package_version.clone(),
                if row.model.is_empty() {
                    "-".to_owned()
                } else {
                    row.model.clone()
                },
                if row.created_by.is_empty() {
                    "-".to_owned()
                } else {
                    row.created_by.clone()
                },
                outcome,
            ],
            json,
        );
    }
    table.print(ctx.json);
    Ok(ExitCode::SUCCESS)
}
