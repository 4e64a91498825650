//! Works: a Work, its Threads and its timeline.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::Serialize;
use utoipa::ToSchema;
use zopu_schema::OrgId;

use super::timeline::{TimelinePage, TimelineQuery, timeline_page};
use super::{owned_project, project_id, query_error, read};
use crate::AppState;
use crate::http::{ApiError, Caller, ErrorBody};
use crate::tokens::Scope;
use crate::views::{ProjectView, ThreadView, WorkView, queries};

async fn owned_work(
    state: &AppState,
    org: &OrgId,
    project: &str,
    work: &str,
) -> Result<(ProjectView, WorkView), ApiError> {
    let (project, view) = owned_project(state, org, project).await?;
    if work.parse::<zopu_schema::WorkId>().is_err() {
        return Err(ApiError::not_found("work"));
    }
    let (org, work) = (org.clone(), work.to_owned());
    let found = read(state, move |conn| {
        queries::work(conn, &org, &project, &work)
    })
    .await?;
    found
        .map(|work| (view, work))
        .ok_or_else(|| ApiError::not_found("work"))
}

/// A Work.
#[utoipa::path(get, path = "/v1/projects/{id}/works/{work_id}", tag = "works",
    params(("id" = String, Path, description = "Project id"), ("work_id" = String, Path, description = "Work id")),
    responses((status = 200, body = WorkView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get_work(
    State(state): State<AppState>,
    caller: Caller,
    Path((id, work_id)): Path<(String, String)>,
) -> Result<axum::Json<WorkView>, ApiError> {
    caller.require(Scope::Read, "reading a Work")?;
    owned_work(&state, &caller.0.org, &id, &work_id)
        .await
        .map(|(_, work)| axum::Json(work))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ThreadList {
    pub threads: Vec<ThreadView>,
}

/// The Threads of a Work.
#[utoipa::path(get, path = "/v1/projects/{id}/works/{work_id}/threads", tag = "works",
    params(("id" = String, Path, description = "Project id"), ("work_id" = String, Path, description = "Work id")),
    responses((status = 200, body = ThreadList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list_threads(
    State(state): State<AppState>,
    caller: Caller,
    Path((id, work_id)): Path<(String, String)>,
) -> Result<axum::Json<ThreadList>, ApiError> {
    caller.require(Scope::Read, "reading a Work's threads")?;
    let (_, work) = owned_work(&state, &caller.0.org, &id, &work_id).await?;
    let project = project_id(&id)?;
    let org = caller.0.org.clone();
    let threads = read(&state, move |conn| {
        queries::threads(conn, &org, &project, &work.work_id)
    })
    .await?;
    Ok(axum::Json(ThreadList { threads }))
}

/// A Work's timeline.
#[utoipa::path(get, path = "/v1/projects/{id}/works/{work_id}/timeline", tag = "works",
    params(("id" = String, Path, description = "Project id"), ("work_id" = String, Path, description = "Work id"), TimelineQuery),
    responses((status = 200, body = TimelinePage), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn work_timeline(
    State(state): State<AppState>,
    caller: Caller,
    Path((id, work_id)): Path<(String, String)>,
    query: Result<Query<TimelineQuery>, QueryRejection>,
) -> Result<axum::Json<TimelinePage>, ApiError> {
    caller.require(Scope::Read, "reading a Work's timeline")?;
    let Query(query) = query.map_err(query_error)?;
    let (view, work) = owned_work(&state, &caller.0.org, &id, &work_id).await?;
    let project = project_id(&view.project_id)?;
    timeline_page(
        &state,
        &caller.0.org,
        project,
        view.running,
        Some(work.work_id),
        query,
    )
    .await
}
