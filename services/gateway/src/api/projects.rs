//! Projects: create one from a repository, list and read them, retry a
//! failed setup, read the summary.

use axum::extract::{Path, State};
use axum::http::header::LOCATION;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use zopu_core::commands::{self, ProjectSetup};

use super::append::{append, append_first};
use super::artifacts::read_blob;
use super::{invalid, owned_project, read, requester};
use crate::AppState;
use crate::http::{ApiError, ApiJson, Caller, ErrorBody, RequestId};
use crate::quotas::Action;
use crate::tokens::Scope;
use crate::views::{ProjectView, SummaryView, queries, setup_state};

/// Most projects one list returns.
pub const PROJECTS_LIST_MAX: usize = 500;

/// `POST /v1/projects` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProject {
    /// An `https://` URL, or an absolute local path when the operator allows local repositories.
    pub repository: String,
    /// Branch to clone (default `main`).
    #[serde(default)]
    pub branch: Option<String>,
    /// Display name (default: the repository's last path segment).
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProjectCreated {
    pub project_id: String,
    pub setup_revision: u32,
    pub event_id: String,
    pub sequence: u64,
    /// True when this request id had already created the project (nothing new was stored).
    pub duplicate: bool,
    pub request_id: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProjectList {
    pub projects: Vec<ProjectView>,
}

impl CreateProject {
    /// What the project is set up from (defaults applied by the command).
    fn setup(&self) -> ProjectSetup {
        ProjectSetup {
            repository: self.repository.clone(),
            branch: self.branch.clone(),
            name: self.name.clone(),
            repository_connection_id: String::new(),
        }
    }
}

/// Create a project from a repository; setup starts at once. The project id
/// is derived from the organization and the request id (`X-Request-Id`), so
/// repeating a request, even concurrently or on another gateway instance,
/// returns the same project (`duplicate: true`) and stores nothing new.
#[utoipa::path(post, path = "/v1/projects", tag = "projects", request_body = CreateProject,
    params(("X-Request-Id" = Option<String>, Header, description = "Idempotency key of the creation: the same id always names the same project. Default: a new UUIDv7 (echoed in the response).")),
    responses((status = 201, body = ProjectCreated), (status = 401, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_project(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    ApiJson(body): ApiJson<CreateProject>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Write, "creating a project")?;
    state
        .quotas
        .admit(&caller.0, Action::CreateProject, std::time::Instant::now())?;
    let event = commands::create_project(
        &requester(&caller, &request),
        &body.setup(),
        state.config.allow_local_repositories,
    )
    .map_err(invalid)?;
    let project = event.context.project_id;
    let accepted = append_first(&state, event, &request).await?;
    let created = ProjectCreated {
        project_id: project.to_string(),
        setup_revision: 1,
        event_id: accepted.event_id,
        sequence: accepted.sequence,
        duplicate: accepted.duplicate,
        request_id: accepted.request_id,
    };
    let location = HeaderValue::from_str(&format!("/v1/projects/{project}")).ok();
    let mut response = (StatusCode::CREATED, axum::Json(created)).into_response();
    if let Some(location) = location {
        response.headers_mut().insert(LOCATION, location);
    }
    Ok(response)
}

/// The caller's organization's projects, newest first.
#[utoipa::path(get, path = "/v1/projects", tag = "projects",
    responses((status = 200, body = ProjectList), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list_projects(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<axum::Json<ProjectList>, ApiError> {
    caller.require(Scope::Read, "listing projects")?;
    let org = caller.0.org.clone();
    let projects = read(&state, move |conn| {
        queries::projects(conn, &org, PROJECTS_LIST_MAX)
    })
    .await?;
    Ok(axum::Json(ProjectList { projects }))
}

/// A project with its setup status (creating_workspace → cloning → checking → ready, or failed).
#[utoipa::path(get, path = "/v1/projects/{id}", tag = "projects", params(("id" = String, Path, description = "Project id")),
    responses((status = 200, body = ProjectView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get_project(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<axum::Json<ProjectView>, ApiError> {
    caller.require(Scope::Read, "reading a project")?;
    owned_project(&state, &caller.0.org, &id)
        .await
        .map(|(_, view)| axum::Json(view))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SetupRetried {
    pub setup_revision: u32,
    pub event_id: String,
    pub sequence: u64,
    pub request_id: String,
}

/// Retry a failed setup (a new setup revision).
#[utoipa::path(post, path = "/v1/projects/{id}/setup/retry", tag = "projects", params(("id" = String, Path, description = "Project id")),
    responses((status = 202, body = SetupRetried), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn retry_setup(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Write, "retrying setup")?;
    let (project, view) = owned_project(&state, &caller.0.org, &id).await?;
    if view.setup.state != setup_state::FAILED {
        return Err(ApiError::conflict(format!(
            "setup is {}; only a failed setup can be retried",
            view.setup.state
        )));
    }
    let revision = view.setup.revision + 1;
    let setup = ProjectSetup {
        repository: view.repository,
        branch: Some(view.branch),
        name: Some(view.name).filter(|name| !name.is_empty()),
        repository_connection_id: String::new(),
    };
    // Keyed by revision: two concurrent retries of the same failure store one request.
    let event = commands::request_setup(
        &requester(&caller, &request),
        project,
        &setup,
        revision,
        state.config.allow_local_repositories,
    )
    .map_err(invalid)?;
    let accepted = append(&state, event, &request).await?;
    let body = SetupRetried {
        setup_revision: revision,
        event_id: accepted.event_id,
        sequence: accepted.sequence,
        request_id: accepted.request_id,
    };
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

/// The current project summary (summary.md).
#[utoipa::path(get, path = "/v1/projects/{id}/summary", tag = "projects", params(("id" = String, Path, description = "Project id")),
    responses((status = 200, body = SummaryView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get_summary(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<axum::Json<SummaryView>, ApiError> {
    caller.require(Scope::Read, "reading the project summary")?;
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let org = caller.0.org.clone();
    let record = read(&state, move |conn| queries::summary(conn, &org, &project))
        .await?
        .ok_or_else(|| ApiError::not_found("summary"))?;
    let mut view = record.view;
    if view.body.is_empty()
        && let Some(blob) = record.blob
    {
        let bytes = read_blob(
            &state,
            &blob.bucket,
            &blob.name,
            &blob.sha256,
            blob.size_bytes,
        )
        .await?;
        view.body = String::from_utf8_lossy(&bytes).into_owned();
    }
    Ok(axum::Json(view))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::http::parse_json;
    use zopu_core::commands::{Invalid, Requester};
    use zopu_schema::{Event, pb};

    fn requester() -> Requester {
        Requester::user("acme".parse().unwrap(), "req-1".parse().unwrap(), "ada")
    }

    #[test]
    fn a_creation_body_becomes_the_setup_command() {
        let body: CreateProject = parse_json(
            br#"{"repository": "https://example.com/a/b.git", "branch": "dev", "name": " Shop "}"#,
        )
        .unwrap();
        let event = commands::create_project(&requester(), &body.setup(), false).unwrap();
        assert_eq!(event.event_type, pb::ProjectSetupRequested::TYPE);
        let request = <pb::ProjectSetupRequested as prost::Message>::decode(event.data).unwrap();
        assert_eq!(
            (
                request.repository_url.as_str(),
                request.branch.as_str(),
                request.project_name.as_str(),
                request.requested_by.unwrap().id.as_str()
            ),
            ("https://example.com/a/b.git", "dev", "Shop", "ada")
        );
    }

    #[test]
    fn repository_and_branch_errors_name_their_field() {
        let body = |json: &[u8]| parse_json::<CreateProject>(json).unwrap().setup();
        let error = commands::create_project(
            &requester(),
            &body(br#"{"repository": "ext::sh -c x"}"#),
            false,
        )
        .map_err(invalid)
        .unwrap_err();
        assert_eq!(
            (error.status, error.field.as_deref()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("repository"))
        );
        let setup = body(br#"{"repository": "https://example.com/a/b.git", "branch": "-x"}"#);
        let error = commands::create_project(&requester(), &setup, false).unwrap_err();
        assert!(matches!(error, Invalid::Branch(_)));
        assert_eq!(invalid(error).field.as_deref(), Some("branch"));
    }
}
