//! The timeline: send a message or a card action, read the global timeline.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use zopu_core::commands;
use zopu_schema::{OrgId, ProjectId};

use super::append::{Accepted, append};
use super::{invalid, owned_project, project_id, query_error, read, requester};
use crate::AppState;
use crate::http::{ApiError, ApiJson, Caller, ErrorBody, RequestId};
use crate::quotas::Action;
use crate::tokens::Scope;
use crate::views::{TimelineItem, queries};

/// `POST /v1/projects/{id}/messages` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendMessage {
    /// The message (1-8000 characters).
    pub text: String,
    /// The event this message answers, if any.
    #[serde(default)]
    pub reply_to_event_id: Option<String>,
}

/// Send a message to the project's global timeline; returns the stored event at once.
#[utoipa::path(post, path = "/v1/projects/{id}/messages", tag = "timeline", params(("id" = String, Path, description = "Project id")),
    request_body = SendMessage,
    responses((status = 202, body = Accepted), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn send_message(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<SendMessage>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Write, "sending a message")?;
    state
        .quotas
        .admit(&caller.0, Action::Message, std::time::Instant::now())?;
    let project = project_id(&id)?;
    let event = commands::send_message(
        &requester(&caller, &request),
        project,
        &body.text,
        body.reply_to_event_id.as_deref(),
    )
    .map_err(invalid)?;
    owned_project(&state, &caller.0.org, &id).await?;
    let accepted = append(&state, event, &request).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(accepted)).into_response())
}

/// `POST /v1/projects/{id}/actions` body: a click on an artifact card action.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendAction {
    pub artifact_id: String,
    pub action_id: String,
}

/// Send a card action.
#[utoipa::path(post, path = "/v1/projects/{id}/actions", tag = "timeline", params(("id" = String, Path, description = "Project id")),
    request_body = SendAction,
    responses((status = 202, body = Accepted), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "the issue draft is already published (`already_published`, naming its address)"), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn send_action(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<SendAction>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Write, "sending a card action")?;
    state
        .quotas
        .admit(&caller.0, Action::Message, std::time::Instant::now())?;
    let project = project_id(&id)?;
    let event = commands::send_action(
        &requester(&caller, &request),
        project,
        &body.artifact_id,
        &body.action_id,
    )
    .map_err(invalid)?;
    owned_project(&state, &caller.0.org, &id).await?;
    let org = caller.0.org.clone();
    let artifact_id = body.artifact_id.clone();
    let found = read(&state, move |conn| {
        queries::artifact(conn, &org, &artifact_id, None)
    })
    .await?;
    let Some((_, view)) = found.filter(|(record, _)| record.project_id == project.to_string())
    else {
        return Err(ApiError::invalid(
            "artifact_id",
            "no such artifact in this project",
        ));
    };
    if body.action_id.trim() == zopu_schema::manifest::PUBLISH_ISSUE_ACTION
        && let Some(url) = &view.published_url
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_published",
            format!("this issue is already published: {url}"),
        ));
    }
    if !view
        .actions
        .iter()
        .any(|action| action.id == body.action_id.trim())
    {
        return Err(ApiError::invalid(
            "action_id",
            "the artifact card has no such action",
        ));
    }
    let accepted = append(&state, event, &request).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(accepted)).into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TimelineQuery {
    /// Return items after this stream sequence (exclusive); 0 or absent: from the start.
    pub after: Option<u64>,
    /// Most items to return (default and maximum: the configured page size).
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TimelinePage {
    pub items: Vec<TimelineItem>,
    /// Pass as `after` for the next page (the last item's sequence, or the given `after`).
    pub next_after: u64,
    /// True when more items may follow right away.
    pub more: bool,
    /// True while a specialist flow runs (the running indicator).
    pub running: bool,
}

fn page_params(state: &AppState, query: &TimelineQuery) -> Result<(u64, usize), ApiError> {
    let max = state.config.timeline_page_max;
    let limit = query.limit.unwrap_or(max);
    if limit == 0 || limit > max {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("limit must be between 1 and {max}"),
        )
        .field("limit"));
    }
    Ok((query.after.unwrap_or(0), limit))
}

pub(super) async fn timeline_page(
    state: &AppState,
    org: &OrgId,
    project: ProjectId,
    running: bool,
    work: Option<String>,
    query: TimelineQuery,
) -> Result<axum::Json<TimelinePage>, ApiError> {
    let (after, limit) = page_params(state, &query)?;
    let org = org.clone();
    let items = read(state, move |conn| {
        queries::timeline(conn, &org, &project, work.as_deref(), after, limit)
    })
    .await?;
    let next_after = items.last().map_or(after, |item| item.sequence);
    let more = items.len() == limit;
    Ok(axum::Json(TimelinePage {
        items,
        next_after,
        more,
        running,
    }))
}

/// The global timeline: messages, acknowledgements, agent posts, Work cards, flow state, artifact cards.
#[utoipa::path(get, path = "/v1/projects/{id}/timeline", tag = "timeline", params(("id" = String, Path, description = "Project id"), TimelineQuery),
    responses((status = 200, body = TimelinePage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn global_timeline(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<TimelineQuery>, QueryRejection>,
) -> Result<axum::Json<TimelinePage>, ApiError> {
    caller.require(Scope::Read, "reading the timeline")?;
    let Query(query) = query.map_err(query_error)?;
    let (project, view) = owned_project(&state, &caller.0.org, &id).await?;
    timeline_page(&state, &caller.0.org, project, view.running, None, query).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::http::parse_json;

    #[test]
    fn json_errors_name_the_field() {
        let error = parse_json::<SendMessage>(b"{}").unwrap_err();
        assert_eq!(
            (error.status, error.field.as_deref()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("text"))
        );
        let error = parse_json::<SendMessage>(br#"{"text": 3}"#).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("text"));
        let error = parse_json::<SendMessage>(br#"{"text": "x", "extra": 1}"#).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("extra"));
        let error = parse_json::<SendMessage>(b"{not json").unwrap_err();
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
    }
}
