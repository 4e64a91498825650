//! The AgentRun log: every run of every agent of the caller's organization
//! (conversation turns and specialist flows), with the registered
//! definition it ran under, its output, its recommendation and approval,
//! and — for one run — its internal notes and handoffs. Read-only; the
//! `read` scope suffices. Notes appear here and never on the timeline.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use zopu_schema::agent_registry;

use super::{query_error, read};
use crate::AppState;
use crate::http::{ApiError, Caller, ErrorBody};
use crate::read_model::runs::{self, HandoffRow, NoteRow, RunFilter, RunRow};
use crate::tokens::Scope;

/// Most runs one page returns.
pub const RUNS_PAGE_MAX: u32 = 200;

/// One run of an agent (the Numu plan's AgentRun fields).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunView {
    pub run_id: String,
    pub project_id: String,
    /// `conversation_turn` or `flow`.
    pub kind: String,
    pub agent_key: String,
    pub agent_version: String,
    pub definition_hash: String,
    pub prompt_package_version: String,
    pub knowledge_hash: String,
    /// `offline` or `openai:<model>`.
    pub model: String,
    /// The event the run worked on (a message, a card action, `project.ready`, a flow request's source).
    pub input_event_id: String,
    /// `user:<id>`, `agent:<id>` or `system`.
    pub created_by: String,
    /// `running`, `completed`, `failed` or `cancelled`.
    pub status: String,
    /// The validated structured output as JSON (a turn's decision, a flow's result).
    pub output: Option<serde_json::Value>,
    /// The action the run recommended (for example `issue.publish`).
    pub recommendation: Option<String>,
    pub approval_id: Option<String>,
    /// `pending`, `approved`, `rejected` or `expired`.
    pub approval_status: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    /// The stream sequence of the event that started the run (the cursor of `after`).
    pub sequence: u64,
    pub created_at: String,
    pub completed_at: Option<String>,
}

impl From<RunRow> for RunView {
    fn from(row: RunRow) -> Self {
        let output = row
            .output
            .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)));
        Self {
            run_id: row.run_id,
            project_id: row.project_id,
            kind: row.kind,
            agent_key: row.agent_key,
            agent_version: row.agent_version,
            definition_hash: row.definition_hash,
            prompt_package_version: row.prompt_package_version,
            knowledge_hash: row.knowledge_hash,
            model: row.model,
            input_event_id: row.input_event_id,
            created_by: row.created_by,
            status: row.status,
            output,
            recommendation: row.recommendation,
            approval_id: row.approval_id,
            approval_status: row.approval_status,
            error_code: row.error_code,
            error_message: row.error_message,
            sequence: row.started_sequence,
            created_at: row.created_at,
            completed_at: row.completed_at,
        }
    }
}

/// An internal note of a run.
#[derive(Debug, Serialize, ToSchema)]
pub struct NoteView {
    pub agent_key: String,
    pub text: String,
    pub recorded_at: String,
}

impl From<NoteRow> for NoteView {
    fn from(row: NoteRow) -> Self {
        Self {
            agent_key: row.agent_key,
            text: row.text,
            recorded_at: row.recorded_at,
        }
    }
}

/// A handoff between agents.
#[derive(Debug, Serialize, ToSchema)]
pub struct HandoffView {
    pub handoff_id: String,
    pub source_run_id: String,
    pub source_agent_key: String,
    pub target_agent_key: String,
    /// `onboarding`, `explore` or `issue`.
    pub flow: String,
    pub brief: String,
    /// The flow run it started.
    pub target_run_id: Option<String>,
    pub supersedes_handoff_id: Option<String>,
    pub correction: Option<String>,
    /// Set when a later handoff corrected this one.
    pub superseded_by: Option<String>,
    pub created_at: String,
}

impl From<HandoffRow> for HandoffView {
    fn from(row: HandoffRow) -> Self {
        Self {
            handoff_id: row.handoff_id,
            source_run_id: row.source_run_id,
            source_agent_key: row.source_agent_key,
            target_agent_key: row.target_agent_key,
            flow: row.flow,
            brief: row.brief,
            target_run_id: row.target_run_id,
            supersedes_handoff_id: row.supersedes_handoff_id,
            correction: row.correction,
            superseded_by: row.superseded_by,
            created_at: row.created_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RunList {
    pub runs: Vec<RunView>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next_after: Option<u64>,
}

/// One run with its internal notes and handoffs.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: RunView,
    pub notes: Vec<NoteView>,
    pub handoffs: Vec<HandoffView>,
}

/// `GET /v1/runs` query.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RunQuery {
    /// Only this project's runs.
    pub project: Option<String>,
    /// Only this agent's runs (a registry key, e.g. `explorer`).
    pub agent: Option<String>,
    /// Only runs with this status: `running`, `completed`, `failed` or `cancelled`.
    pub status: Option<String>,
    /// Runs started after this sequence (the previous page's `next_after`).
    #[serde(default)]
    pub after: u64,
    /// At most this many runs (1–200, default 50).
    pub limit: Option<u32>,
}

fn bad_query(field: &str, message: &str) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", message).field(field)
}

/// The organization's agent runs, oldest first.
#[utoipa::path(get, path = "/v1/runs", tag = "runs",
    params(RunQuery),
    responses((status = 200, body = RunList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_runs(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<RunQuery>, QueryRejection>,
) -> Result<axum::Json<RunList>, ApiError> {
    caller.require(Scope::Read, "listing agent runs")?;
    let Query(query) = query.map_err(query_error)?;
    if let Some(project) = &query.project
        && project.parse::<zopu_schema::ProjectId>().is_err()
    {
        return Err(bad_query("project", "project must be a project id"));
    }
    if let Some(agent) = &query.agent
        && !agent_registry::is_agent_key(agent)
    {
        return Err(bad_query(
            "agent",
            "agent must be a registry key (lowercase letters, digits and -)",
        ));
    }
    if let Some(status) = &query.status
        && !runs::STATUSES.contains(&status.as_str())
    {
        return Err(bad_query(
            "status",
            "status must be running, completed, failed or cancelled",
        ));
    }
    let limit = query.limit.unwrap_or(50);
    if !(1..=RUNS_PAGE_MAX).contains(&limit) {
        return Err(bad_query("limit", "limit must be between 1 and 200"));
    }
    let filter = RunFilter {
        project_id: query.project,
        agent_key: query.agent,
        status: query.status,
        after: query.after,
        limit,
    };
    let org = caller.0.org.clone();
    let rows = read(&state, move |conn| runs::list(conn, &org, &filter)).await?;
    let next_after = (rows.len() == limit as usize)
        .then(|| rows.last().map(|row| row.started_sequence))
        .flatten();
    Ok(axum::Json(RunList {
        runs: rows.into_iter().map(RunView::from).collect(),
        next_after,
    }))
}

/// One agent run with its internal notes and handoffs.
#[utoipa::path(get, path = "/v1/runs/{run_id}", tag = "runs",
    params(("run_id" = String, Path, description = "Run id (a dispatch id or a flow run id)")),
    responses((status = 200, body = RunDetail), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_run(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
) -> Result<axum::Json<RunDetail>, ApiError> {
    caller.require(Scope::Read, "reading an agent run")?;
    let org = caller.0.org.clone();
    let detail = read(&state, move |conn| {
        let Some(run) = runs::get(conn, &org, &run_id)? else {
            return Ok(None);
        };
        let notes = runs::notes(conn, &org, &run.project_id, &run.run_id)?;
        let handoffs = runs::handoffs(conn, &org, &run.project_id, &run.run_id)?;
        Ok(Some((run, notes, handoffs)))
    })
    .await?;
    let (run, notes, handoffs) = detail.ok_or_else(|| ApiError::not_found("run"))?;
    Ok(axum::Json(RunDetail {
        run: run.into(),
        notes: notes.into_iter().map(NoteView::from).collect(),
        handoffs: handoffs.into_iter().map(HandoffView::from).collect(),
    }))
}
