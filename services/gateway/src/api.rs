//! The `/v1/` handlers, the router and the OpenAPI document generated from
//! the handlers' annotations (so `/openapi.json` cannot drift from the routes).

use axum::Router;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{IntoParams, Modify, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use zopu_core::NewEvent;
use zopu_schema::{AgentId, Event, EventId, OrgId, ProjectId, keys, pb, subjects};

use crate::AppState;
use crate::http::{ApiError, ApiJson, Caller, ErrorBody, RequestId, parse_json};
use crate::quotas::Action;
use crate::tokens::Scope;
use crate::views::{
    ArtifactRecord, ArtifactView, ProjectView, SummaryView, ThreadView, TimelineItem, WorkView,
    queries, setup_state,
};

/// Content-Security-Policy of stored artifact HTML: no scripts at all, and
/// `sandbox` (with no `allow-*` token): the page runs in an opaque origin,
/// so even a script that slipped past validation could neither run nor
/// reach the gateway origin's storage, cookies or API.
pub const ARTIFACT_CSP: &str = "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'self'";
/// Longest message text, in characters.
pub const MESSAGE_TEXT_MAX_CHARS: usize = 8000;
/// Longest project name, in characters.
pub const PROJECT_NAME_MAX_CHARS: usize = 100;
/// Longest kill-switch reason, in characters.
pub const REASON_MAX_CHARS: usize = 500;
/// Most projects one list returns.
pub const PROJECTS_LIST_MAX: usize = 500;

#[derive(OpenApi)]
#[openapi(
    info(title = "Zopu gateway API", version = "1", description = "Projects, setup, the timeline, Works, Threads, artifacts and the agent kill switch. Every /v1 route needs `Authorization: Bearer zpt_...` and is scoped to the token's organization."),
    modifiers(&BearerAuth),
    components(schemas(ErrorBody))
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The whole HTTP surface: API, OpenAPI, health, web timeline.
pub fn router(state: AppState) -> Router {
    let (api, openapi) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(list_projects, create_project))
        .routes(routes!(get_project))
        .routes(routes!(retry_setup))
        .routes(routes!(send_message))
        .routes(routes!(send_action))
        .routes(routes!(global_timeline))
        .routes(routes!(get_work))
        .routes(routes!(list_threads))
        .routes(routes!(work_timeline))
        .routes(routes!(get_artifact))
        .routes(routes!(artifact_link))
        .routes(routes!(get_summary))
        .routes(routes!(disable_agent))
        .routes(routes!(enable_agent))
        .routes(routes!(crate::sse::events))
        .routes(routes!(crate::sse::ticket))
        .split_for_parts();
    let openapi_json = serde_json::to_string(&openapi).unwrap_or_else(|_| "{}".to_owned());
    let body_max = state.config.body_max_bytes;
    let cors = cors_layer(&state.config.cors_allowed_origins);
    let api = api
        .route(
            "/openapi.json",
            get(move || async move { ([(CONTENT_TYPE, "application/json")], openapi_json) }),
        )
        // The event contract (generated from the catalogue, checked in as proto/asyncapi.json).
        .route(
            "/asyncapi.json",
            get(|| async {
                (
                    [(CONTENT_TYPE, "application/json")],
                    zopu_schema::asyncapi::CHECKED_IN,
                )
            }),
        )
        .route("/healthz", get(healthz))
        .layer(axum::middleware::map_response(api_headers));
    let app = api
        .merge(crate::web::routes())
        .fallback(|| async { ApiError::not_found("route") })
        .layer(DefaultBodyLimit::max(body_max))
        .layer(axum::middleware::from_fn(crate::http::request_id))
        .with_state(state);
    match cors {
        Some(cors) => app.layer(cors),
        None => app,
    }
}

fn cors_layer(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let origins: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    Some(
        tower_http::cors::CorsLayer::new()
            .allow_origin(origins)
            .allow_methods([axum::http::Method::GET, axum::http::Method::POST])
            .allow_headers([
                axum::http::header::AUTHORIZATION,
                CONTENT_TYPE,
                crate::http::REQUEST_ID,
            ])
            .expose_headers([crate::http::REQUEST_ID]),
    )
}

async fn api_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers
        .entry(CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

async fn healthz(State(state): State<AppState>) -> Response {
    let connected =
        state.runtime.bus.client.connection_state() == async_nats::connection::State::Connected;
    let body = serde_json::json!({ "status": if connected { "ok" } else { "degraded" }, "nats": connected, "checkpoint": state.runtime.store.checkpoint() });
    let status = if connected {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

// ---------------------------------------------------------------- helpers

/// Runs a read-model query off the async threads.
async fn read<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    let reads = state.reads.clone();
    tokio::task::spawn_blocking(move || reads.with(f))
        .await
        .map_err(|error| ApiError::unavailable("read model", error))?
        .map_err(|error| ApiError::unavailable("read model", error))
}

/// A project id from a path; anything that is not one is simply not found.
fn project_id(raw: &str) -> Result<ProjectId, ApiError> {
    raw.parse().map_err(|_| ApiError::not_found("project"))
}

/// The caller's project, or 404 (also for another organization's).
pub(crate) async fn owned_project(
    state: &AppState,
    org: &OrgId,
    raw: &str,
) -> Result<(ProjectId, ProjectView), ApiError> {
    let project = project_id(raw)?;
    let org = org.clone();
    let view = read(state, move |conn| queries::project(conn, &org, &project)).await?;
    view.map(|view| (project, view))
        .ok_or_else(|| ApiError::not_found("project"))
}

/// The idempotency key of an event a gateway request causes:
/// `project:<id>:request:<requestId>:<what>` (scoped to the project, so one
/// tenant's request ids can never collide with another's).
pub fn request_key(project: &ProjectId, request: &RequestId, what: &str) -> String {
    format!("project:{project}:request:{}:{what}", request.0)
}

/// What an append returned to the caller.
#[derive(Debug, Serialize, ToSchema)]
pub struct Accepted {
    /// The stored event's id.
    pub event_id: String,
    /// Its stream sequence (the timeline cursor).
    pub sequence: u64,
    /// True when the same request was already stored (same `X-Request-Id`).
    pub duplicate: bool,
    pub request_id: String,
}

async fn append(
    state: &AppState,
    event: NewEvent,
    request: &RequestId,
) -> Result<Accepted, ApiError> {
    let event_type = event.event_type;
    let appended = tokio::time::timeout(
        state.config.request_timeout,
        state.runtime.publisher.append(event),
    )
    .await
    .map_err(|_| ApiError::unavailable("event log", format!("append of {event_type} timed out")))?
    .map_err(|error| ApiError::unavailable("event log", error))?;
    let mut event_id = appended.event_id;
    if appended.duplicate {
        // A root event's id depends on when it was requested: report the stored one.
        if let Ok(stored) =
            zopu_core::publish::get_event(&state.runtime.bus, appended.sequence).await
        {
            event_id = stored.id;
        }
    }
    tracing::info!(event_type, event_id = %event_id, sequence = appended.sequence, duplicate = appended.duplicate, correlation_id = %request.0, "appended");
    Ok(Accepted {
        event_id: event_id.to_string(),
        sequence: appended.sequence,
        duplicate: appended.duplicate,
        request_id: request.0.to_string(),
    })
}

fn user(caller: &Caller) -> pb::Actor {
    pb::Actor {
        kind: pb::actor::Kind::User as i32,
        id: caller.0.user.clone(),
    }
}

fn check_text(field: &str, value: &str, max_chars: usize, required: bool) -> Result<(), ApiError> {
    if required && value.trim().is_empty() {
        return Err(ApiError::invalid(
            field,
            format!("{field} must not be empty"),
        ));
    }
    if value.chars().count() > max_chars {
        return Err(ApiError::invalid(
            field,
            format!("{field} must be at most {max_chars} characters"),
        ));
    }
    if value
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t' && c != '\r')
    {
        return Err(ApiError::invalid(
            field,
            format!("{field} contains control characters"),
        ));
    }
    Ok(())
}

fn query_error(rejection: QueryRejection) -> ApiError {
    let text = rejection.body_text();
    // "Failed to deserialize query string: limit: invalid digit found in string"
    let detail = text.split_once(": ").map(|(_, rest)| rest).unwrap_or(&text);
    let field = detail.split_once(": ").map(|(field, _)| field.to_owned());
    let error = ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_query",
        format!("invalid query string: {detail}"),
    );
    match field {
        Some(field) if !field.contains(' ') => error.field(field),
        _ => error.field("query"),
    }
}

fn body_error(rejection: BytesRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "the request body is larger than allowed",
        )
        .field("body")
    } else {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "unreadable_body",
            "the request body could not be read",
        )
        .field("body")
    }
}

// ---------------------------------------------------------------- projects

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

/// The repository location and branch as the setup service will see them.
fn validate_repository(
    body: &CreateProject,
    allow_local: bool,
) -> Result<(String, String, String), ApiError> {
    use zopu_sandbox::git::{BranchName, Error as GitError, RepositoryLocation};
    let location =
        RepositoryLocation::parse(&body.repository, allow_local).map_err(|error| match error {
            GitError::InvalidLocation(problem) => {
                ApiError::invalid("repository", problem.to_string())
            }
            other => ApiError::invalid("repository", other.to_string()),
        })?;
    let repository = match &location {
        RepositoryLocation::Https { url, .. } => url.clone(),
        RepositoryLocation::Local { path, .. } => path.display().to_string(),
    };
    let branch = body.branch.clone().unwrap_or_else(|| "main".to_owned());
    let branch = BranchName::parse(&branch).map_err(|error| match error {
        GitError::InvalidBranch(problem) => ApiError::invalid("branch", problem.to_string()),
        other => ApiError::invalid("branch", other.to_string()),
    })?;
    let name = match &body.name {
        Some(name) => {
            check_text("name", name, PROJECT_NAME_MAX_CHARS, true)?;
            name.trim().to_owned()
        }
        None => repository
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .map(|last| last.trim_end_matches(".git"))
            .filter(|last| !last.is_empty())
            .unwrap_or("project")
            .chars()
            .take(PROJECT_NAME_MAX_CHARS)
            .collect(),
    };
    Ok((repository, branch.as_str().to_owned(), name))
}

/// Create a project from a repository; setup starts at once. The project id
/// is derived from the organization and the request id (`X-Request-Id`), so
/// repeating a request, even concurrently or on another gateway instance,
/// returns the same project (`duplicate: true`) and stores nothing new.
#[utoipa::path(post, path = "/v1/projects", tag = "projects", request_body = CreateProject,
    params(("X-Request-Id" = Option<String>, Header, description = "Idempotency key of the creation: the same id always names the same project. Default: a new UUIDv7 (echoed in the response).")),
    responses((status = 201, body = ProjectCreated), (status = 401, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
async fn create_project(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    ApiJson(body): ApiJson<CreateProject>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Write, "creating a project")?;
    state
        .quotas
        .admit(&caller.0, Action::CreateProject, std::time::Instant::now())?;
    let (repository, branch, name) =
        validate_repository(&body, state.config.allow_local_repositories)?;
    let project = ProjectId::for_request(&caller.0.org, &request.0);
    let payload = pb::ProjectSetupRequested {
        repository_url: repository,
        branch,
        setup_revision: 1,
        project_name: name,
        requested_by: Some(user(&caller)),
        repository_connection_id: String::new(),
    };
    let event = NewEvent::root(
        caller.0.org.clone(),
        project,
        &payload,
        keys::setup_request(&project, 1),
        Some(request.0.clone()),
    );
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

/// Appends a project's first event only if the project has none yet. If it
/// has, the request that made it is this one (the project id is derived
/// from it; checked against the stored correlation id), so the stored event
/// is reported as a duplicate. Unlike `Nats-Msg-Id` deduplication, this
/// holds beyond the duplicate window and does not depend on the projection.
async fn append_first(
    state: &AppState,
    event: NewEvent,
    request: &RequestId,
) -> Result<Accepted, ApiError> {
    use zopu_core::publish::AppendAtError;
    let (org, project, event_type) = (
        event.context.org_id.clone(),
        event.context.project_id,
        event.event_type,
    );
    let appended = tokio::time::timeout(
        state.config.request_timeout,
        state.runtime.publisher.append_at(event, 0),
    )
    .await
    .map_err(|_| ApiError::unavailable("event log", format!("append of {event_type} timed out")))?;
    let (sequence, stored) = match appended {
        Ok(appended) if !appended.duplicate => {
            tracing::info!(event_type, event_id = %appended.event_id, sequence = appended.sequence, correlation_id = %request.0, "appended");
            return Ok(Accepted {
                event_id: appended.event_id.to_string(),
                sequence: appended.sequence,
                duplicate: false,
                request_id: request.0.to_string(),
            });
        }
        Ok(appended) => (
            appended.sequence,
            stored_event(state, appended.sequence).await?,
        ),
        Err(AppendAtError::Conflict { .. }) => {
            first_event_of_type(state, &org, &project, event_type)
                .await?
                .ok_or_else(|| {
                    ApiError::conflict(format!("project {project} exists; use another request id"))
                })?
        }
        Err(AppendAtError::Failed(error)) => return Err(ApiError::unavailable("event log", error)),
    };
    if stored.correlation_id != request.0 {
        return Err(ApiError::conflict(format!(
            "project {project} was created by another request; use another request id"
        )));
    }
    tracing::info!(event_type, event_id = %stored.id, sequence, correlation_id = %request.0, "already stored");
    Ok(Accepted {
        event_id: stored.id.to_string(),
        sequence,
        duplicate: true,
        request_id: request.0.to_string(),
    })
}

async fn stored_event(state: &AppState, sequence: u64) -> Result<zopu_schema::Envelope, ApiError> {
    tokio::time::timeout(
        state.config.request_timeout,
        zopu_core::publish::get_event(&state.runtime.bus, sequence),
    )
    .await
    .map_err(|_| ApiError::unavailable("event log", "read timed out"))?
    .map_err(|error| ApiError::unavailable("event log", error))
}

/// The first stored event of `event_type` of a project, with its sequence.
async fn first_event_of_type(
    state: &AppState,
    org: &OrgId,
    project: &ProjectId,
    event_type: &str,
) -> Result<Option<(u64, zopu_schema::Envelope)>, ApiError> {
    use async_nats::jetstream::stream::DirectGetErrorKind;
    let read = async {
        let stream = state
            .runtime
            .bus
            .jetstream
            .get_stream_no_info(subjects::EVENTS_STREAM)
            .await
            .map_err(|error| ApiError::unavailable("event log", error))?;
        match stream
            .direct_get_first_for_subject(subjects::event(org, project, event_type))
            .await
        {
            Ok(message) => Ok(Some(message.sequence)),
            Err(error) if error.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(error) => Err(ApiError::unavailable("event log", error)),
        }
    };
    let sequence = tokio::time::timeout(state.config.request_timeout, read)
        .await
        .map_err(|_| ApiError::unavailable("event log", "read timed out"))??;
    match sequence {
        Some(sequence) => Ok(Some((sequence, stored_event(state, sequence).await?))),
        None => Ok(None),
    }
}

/// The caller's organization's projects, newest first.
#[utoipa::path(get, path = "/v1/projects", tag = "projects",
    responses((status = 200, body = ProjectList), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
async fn list_projects(
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
async fn get_project(
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
async fn retry_setup(
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
    let payload = pb::ProjectSetupRequested {
        repository_url: view.repository,
        branch: view.branch,
        setup_revision: revision,
        project_name: view.name,
        requested_by: Some(user(&caller)),
        repository_connection_id: String::new(),
    };
    // Keyed by revision: two concurrent retries of the same failure store one request.
    let event = NewEvent::root(
        caller.0.org.clone(),
        project,
        &payload,
        keys::setup_request(&project, revision),
        Some(request.0.clone()),
    );
    let accepted = append(&state, event, &request).await?;
    let body = SetupRetried {
        setup_revision: revision,
        event_id: accepted.event_id,
        sequence: accepted.sequence,
        request_id: accepted.request_id,
    };
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

// ---------------------------------------------------------------- timeline writes

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
async fn send_message(
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
    check_text("text", &body.text, MESSAGE_TEXT_MAX_CHARS, true)?;
    if let Some(reply_to) = &body.reply_to_event_id {
        reply_to
            .parse::<EventId>()
            .map_err(|error| ApiError::invalid("reply_to_event_id", error.to_string()))?;
    }
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let payload = pb::TimelineMessageSent {
        timeline_id: "global".into(),
        text: body.text,
        author: Some(user(&caller)),
        reply_to_event_id: body.reply_to_event_id.unwrap_or_default(),
    };
    let key = request_key(&project, &request, "message");
    let event = NewEvent::root(
        caller.0.org.clone(),
        project,
        &payload,
        key,
        Some(request.0.clone()),
    );
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
    responses((status = 202, body = Accepted), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
async fn send_action(
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
    body.artifact_id
        .parse::<zopu_schema::ArtifactId>()
        .map_err(|error| ApiError::invalid("artifact_id", error.to_string()))?;
    check_text("action_id", &body.action_id, 100, true)?;
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let org = caller.0.org.clone();
    let artifact_id = body.artifact_id.clone();
    let found = read(&state, move |conn| {
        queries::artifact(conn, &org, &artifact_id, None)
    })
    .await?;
    let Some((record, view)) = found.filter(|(record, _)| record.project_id == project.to_string())
    else {
        return Err(ApiError::invalid(
            "artifact_id",
            "no such artifact in this project",
        ));
    };
    if !view
        .actions
        .iter()
        .any(|action| action.id == body.action_id)
    {
        return Err(ApiError::invalid(
            "action_id",
            "the artifact card has no such action",
        ));
    }
    let payload = pb::TimelineActionSent {
        timeline_id: "global".into(),
        action_id: body.action_id,
        artifact_id: record.artifact_id,
        author: Some(user(&caller)),
    };
    let event = NewEvent::root(
        caller.0.org.clone(),
        project,
        &payload,
        request_key(&project, &request, "action"),
        Some(request.0.clone()),
    );
    let accepted = append(&state, event, &request).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(accepted)).into_response())
}

// ---------------------------------------------------------------- timeline reads

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

async fn timeline_page(
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
async fn global_timeline(
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
async fn get_work(
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
async fn list_threads(
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
async fn work_timeline(
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

// ---------------------------------------------------------------- artifacts

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ArtifactQuery {
    /// Revision (default: the newest).
    pub revision: Option<u32>,
    /// Signed links only: the organization.
    pub org: Option<String>,
    /// Signed links only: expiry (Unix seconds).
    pub expires: Option<u64>,
    /// Signed links only: the signature.
    pub signature: Option<String>,
}

/// The stored HTML of an artifact, digest-verified, with a script-free CSP.
/// Authenticate with the bearer header, or open a signed link from `/link`.
#[utoipa::path(get, path = "/v1/artifacts/{id}", tag = "artifacts", params(("id" = String, Path, description = "Artifact id"), ArtifactQuery),
    responses((status = 200, content_type = "text/html", body = String), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
async fn get_artifact(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<ArtifactQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(query_error)?;
    let org = artifact_caller(&state, &headers, &id, &query).await?;
    if id.parse::<zopu_schema::ArtifactId>().is_err() {
        return Err(ApiError::not_found("artifact"));
    }
    let (artifact_id, revision) = (id.clone(), query.revision);
    let found = read(&state, move |conn| {
        queries::artifact(conn, &org, &artifact_id, revision)
    })
    .await?;
    let (record, _) = found.ok_or_else(|| ApiError::not_found("artifact"))?;
    let html = read_blob(
        &state,
        &record.bucket,
        &record.object_name,
        &record.sha256,
        record.size_bytes,
    )
    .await?;
    let mut response = (StatusCode::OK, html).into_response();
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static(ARTIFACT_CSP),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    headers.insert(
        CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=300"),
    );
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{}\"", record.sha256)) {
        headers.insert("etag", etag);
    }
    Ok(response)
}

/// Who may read the artifact: the bearer token's org, or a valid signed link's.
async fn artifact_caller(
    state: &AppState,
    headers: &HeaderMap,
    id: &str,
    query: &ArtifactQuery,
) -> Result<OrgId, ApiError> {
    let has_header = headers.contains_key(axum::http::header::AUTHORIZATION);
    if has_header {
        let value = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let token = value
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim());
        let token = token.ok_or_else(ApiError::unauthorized)?;
        let principal = crate::http::authenticate(state, token).await?;
        crate::http::require(&principal, Scope::Read, "opening an artifact")?;
        return Ok(principal.org);
    }
    let (Some(org), Some(expires), Some(signature), Some(revision)) =
        (&query.org, query.expires, &query.signature, query.revision)
    else {
        return Err(ApiError::unauthorized());
    };
    let org: OrgId = org.parse().map_err(|_| ApiError::unauthorized())?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp().max(0) as u64;
    if expires < now
        || !state
            .link_key
            .verify(&org, id, revision, expires, signature)
    {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "link_expired",
            "the artifact link is invalid or has expired; open it again from the timeline",
        ));
    }
    Ok(org)
}

/// Reads a blob from the object store, refusing it unless size and SHA-256 match.
pub(crate) async fn read_blob(
    state: &AppState,
    bucket: &str,
    name: &str,
    sha256: &str,
    size: u64,
) -> Result<Vec<u8>, ApiError> {
    if bucket != subjects::ARTIFACTS_BUCKET {
        tracing::error!(bucket, "artifact reference names an unexpected bucket");
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "integrity_error",
            "the stored artifact reference is invalid",
        ));
    }
    let max = state.config.artifact_max_bytes;
    if size > max {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "too_large",
            "the stored artifact is larger than this gateway serves",
        ));
    }
    let fetch = async {
        let mut object = state.artifacts.0.get(name).await.map_err(|error| {
            if error.kind() == async_nats::jetstream::object_store::GetErrorKind::NotFound {
                ApiError::not_found("artifact content")
            } else {
                ApiError::unavailable("artifact store", error)
            }
        })?;
        let mut bytes = Vec::with_capacity(size as usize);
        (&mut object)
            .take(max + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(|error| ApiError::unavailable("artifact store", error))?;
        Ok::<_, ApiError>(bytes)
    };
    let bytes = tokio::time::timeout(state.config.request_timeout, fetch)
        .await
        .map_err(|_| ApiError::unavailable("artifact store", "read timed out"))??;
    let digest = sha256_hex(&bytes);
    if bytes.len() as u64 != size || digest != sha256 {
        tracing::error!(bucket, name, expected = sha256, found = %digest, "artifact digest mismatch; refusing to serve it");
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "integrity_error",
            "the stored artifact failed its integrity check",
        ));
    }
    Ok(bytes)
}

/// Lowercase hex SHA-256, the digest format of `BlobRef.sha256`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LinkQuery {
    /// Revision (default: the newest).
    pub revision: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ArtifactLink {
    /// A relative URL that opens the artifact without a header until `expires_at`.
    pub url: String,
    pub expires_at: u64,
    pub artifact: ArtifactView,
}

/// A short-lived signed link to an artifact, for opening it in a browser tab.
#[utoipa::path(get, path = "/v1/artifacts/{id}/link", tag = "artifacts", params(("id" = String, Path, description = "Artifact id"), LinkQuery),
    responses((status = 200, body = ArtifactLink), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
async fn artifact_link(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<LinkQuery>, QueryRejection>,
) -> Result<axum::Json<ArtifactLink>, ApiError> {
    caller.require(Scope::Read, "opening an artifact")?;
    let Query(query) = query.map_err(query_error)?;
    if id.parse::<zopu_schema::ArtifactId>().is_err() {
        return Err(ApiError::not_found("artifact"));
    }
    let org = caller.0.org.clone();
    let (artifact_id, revision) = (id.clone(), query.revision);
    let found = read(&state, move |conn| {
        queries::artifact(conn, &org, &artifact_id, revision)
    })
    .await?;
    let (record, view): (ArtifactRecord, ArtifactView) =
        found.ok_or_else(|| ApiError::not_found("artifact"))?;
    let expires = time::OffsetDateTime::now_utc().unix_timestamp().max(0) as u64
        + state.config.artifact_link_ttl.as_secs();
    let org = &caller.0.org;
    let signature = state
        .link_key
        .sign(org, &record.artifact_id, record.revision, expires);
    let url = format!(
        "/v1/artifacts/{}?revision={}&org={org}&expires={expires}&signature={signature}",
        record.artifact_id, record.revision
    );
    Ok(axum::Json(ArtifactLink {
        url,
        expires_at: expires,
        artifact: view,
    }))
}

// ---------------------------------------------------------------- summary and agent

/// The current project summary (summary.md).
#[utoipa::path(get, path = "/v1/projects/{id}/summary", tag = "projects", params(("id" = String, Path, description = "Project id")),
    responses((status = 200, body = SummaryView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
async fn get_summary(
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

/// `POST /v1/projects/{id}/agent/disable` body (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentSwitch {
    /// Why (shown on the timeline; at most 500 characters).
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AgentSwitched {
    pub agent_id: String,
    pub enabled: bool,
    pub event_id: String,
    pub sequence: u64,
    pub request_id: String,
}

async fn switch_agent(
    state: AppState,
    caller: Caller,
    request: RequestId,
    id: String,
    body: Result<Bytes, BytesRejection>,
    enable: bool,
) -> Result<Response, ApiError> {
    caller.require(
        Scope::Admin,
        if enable {
            "enabling the agent"
        } else {
            "disabling the agent (the kill switch)"
        },
    )?;
    let body = body.map_err(body_error)?;
    let switch: AgentSwitch = if body.iter().all(u8::is_ascii_whitespace) {
        AgentSwitch::default()
    } else {
        parse_json(&body)?
    };
    let reason = switch.reason.unwrap_or_default();
    check_text("reason", &reason, REASON_MAX_CHARS, false)?;
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let agent = AgentId::conversation(&caller.0.org, &project);
    let by = Some(user(&caller));
    let event = if enable {
        let payload = pb::AgentEnabled {
            agent_id: agent.to_string(),
            by,
        };
        NewEvent::root(
            caller.0.org.clone(),
            project,
            &payload,
            request_key(&project, &request, pb::AgentEnabled::TYPE),
            Some(request.0.clone()),
        )
    } else {
        let payload = pb::AgentDisabled {
            agent_id: agent.to_string(),
            reason,
            by,
        };
        NewEvent::root(
            caller.0.org.clone(),
            project,
            &payload,
            request_key(&project, &request, pb::AgentDisabled::TYPE),
            Some(request.0.clone()),
        )
    };
    let accepted = append(&state, event, &request).await?;
    let body = AgentSwitched {
        agent_id: agent.to_string(),
        enabled: enable,
        event_id: accepted.event_id,
        sequence: accepted.sequence,
        request_id: accepted.request_id,
    };
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

/// Disable the project's agent (kill switch; respected mid-run).
#[utoipa::path(post, path = "/v1/projects/{id}/agent/disable", tag = "agent", params(("id" = String, Path, description = "Project id")),
    request_body(content = AgentSwitch, description = "Optional"),
    responses((status = 202, body = AgentSwitched), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
async fn disable_agent(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    switch_agent(state, caller, request, id, body, false).await
}

/// Enable the project's agent again.
#[utoipa::path(post, path = "/v1/projects/{id}/agent/enable", tag = "agent", params(("id" = String, Path, description = "Project id")),
    request_body(content = AgentSwitch, description = "Optional"),
    responses((status = 202, body = AgentSwitched), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
async fn enable_agent(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    switch_agent(state, caller, request, id, body, true).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn repository_and_branch_errors_name_their_field() {
        let body = |repository: &str, branch: Option<&str>| CreateProject {
            repository: repository.into(),
            branch: branch.map(Into::into),
            name: None,
        };
        let error = validate_repository(&body("ext::sh -c x", None), false).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("repository"));
        let error = validate_repository(&body("https://example.com/a/b.git", Some("-x")), false)
            .unwrap_err();
        assert_eq!(error.field.as_deref(), Some("branch"));
        let (url, branch, name) =
            validate_repository(&body("https://example.com/a/b.git", None), false).unwrap();
        assert_eq!(
            (url.as_str(), branch.as_str(), name.as_str()),
            ("https://example.com/a/b.git", "main", "b")
        );
    }

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
