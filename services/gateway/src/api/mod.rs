//! The `/v1/` API: the router and the OpenAPI document generated from the
//! handlers' annotations (so `/openapi.json` cannot drift from the routes),
//! with one module per resource: `projects` (create, list, read, retry
//! setup, summary), `timeline` (messages, card actions, timeline pages),
//! `works` (Works, Threads and their timelines), `artifacts` (stored HTML and
//! signed links), `history` (why an event happened: its causes,
//! consequences and correlation tree; the project as it was at a sequence
//! or time), `agent` (the kill switch), `flows` (cancel a running flow), `environment`
//! (environment values into the secret store), `memory` (what the agent
//! remembers: list, search, write, forget, clear), `approvals` (list, approve,
//! reject), `runs` (the AgentRun log), `session` (a sign-in link's ticket
//! exchanged for a session token), `health`. Every write builds its
//! event with `zopu_core::commands`, as the CLI does, and appends it through
//! `append`.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::QueryRejection;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::get;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use zopu_core::commands::{Invalid, Requester};
use zopu_schema::{OrgId, ProjectId};

use crate::AppState;
use crate::http::{ApiError, Caller, ErrorBody, RequestId};
use crate::views::{ProjectView, queries};

mod agent;
mod agent_api;
mod append;
mod approvals;
mod artifacts;
mod environment;
mod flows;
mod health;
mod history;
mod memory;
mod projects;
mod repository_credentials;
mod runs;
pub mod session;
mod timeline;
mod works;

pub use agent::{AgentSwitch, AgentSwitched};
pub use append::Accepted;
pub use approvals::{ApprovalDecided, ApprovalList, ApprovalView, Rejection};
pub use artifacts::{ARTIFACT_CSP, ArtifactLink, ArtifactQuery, LinkQuery, sha256_hex};
pub use environment::{EnvironmentChanged, EnvironmentList, EnvironmentName, SetEnvironmentValue};
pub use flows::{CancelFlow, FlowCancelAccepted};
pub use memory::{MemoryEntry, MemoryList, MemoryRemoved, SetMemory};
pub use projects::{CreateProject, PROJECTS_LIST_MAX, ProjectCreated, ProjectList, SetupRetried};
pub use repository_credentials::{
    RepositoryCredentialChanged, RepositoryCredentialList, RepositoryCredentialView,
    SetRepositoryCredential,
};
pub use runs::{HandoffView, NoteView, RunDetail, RunList, RunView};
pub use timeline::{SendAction, SendMessage, TimelinePage, TimelineQuery};
pub use works::ThreadList;

#[derive(OpenApi)]
#[openapi(
    info(title = "Zopu gateway API", version = "1", description = "Projects, setup, the timeline, Works, Threads, artifacts, the agent kill switch, cancelling a flow, environment values and repository credentials (kept in the secret store, never returned), the agent's memory, approvals, the Agent API for external agents (`/v1/agent/...` with an agent key `zak_...`), and the agent run log. Every /v1 route but `POST /v1/session` (which exchanges a sign-in link's single-use ticket for a token) needs `Authorization: Bearer zpt_...` and is scoped to the token's organization."),
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
        // The Agent API's keys (`zak_...`), a bearer credential of their own.
        components.add_security_scheme(
            "agent_key",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The OpenAPI document `/openapi.json` serves, built from the routes.
pub fn openapi() -> utoipa::openapi::OpenApi {
    documented_routes().1
}

/// The documented API routes and their OpenAPI document, one from the other.
fn documented_routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(projects::list_projects, projects::create_project))
        .routes(routes!(projects::get_project))
        .routes(routes!(projects::retry_setup))
        .routes(routes!(projects::get_summary))
        .routes(routes!(timeline::send_message))
        .routes(routes!(timeline::send_action))
        .routes(routes!(timeline::global_timeline))
        .routes(routes!(history::why))
        .routes(routes!(history::project_at))
        .routes(routes!(works::get_work))
        .routes(routes!(works::list_threads))
        .routes(routes!(works::work_timeline))
        .routes(routes!(artifacts::get_artifact))
        .routes(routes!(artifacts::artifact_link))
        .routes(routes!(agent::disable_agent))
        .routes(routes!(agent::enable_agent))
        .routes(routes!(approvals::list_approvals))
        .routes(routes!(approvals::approve))
        .routes(routes!(approvals::reject))
        .routes(routes!(flows::cancel_flow))
        .routes(routes!(environment::list_environment))
        .routes(routes!(
            environment::set_environment_value,
            environment::delete_environment_value
        ))
        .routes(routes!(agent_api::agent_config))
        .routes(routes!(agent_api::agent_candidates))
        .routes(routes!(agent_api::agent_timeline))
        .routes(routes!(agent_api::actions::agent_action))
        .routes(routes!(memory::list_memory, memory::clear_memory))
        .routes(routes!(memory::set_memory, memory::delete_memory))
        .routes(routes!(repository_credentials::list_repository_credentials))
        .routes(routes!(
            repository_credentials::set_repository_credential,
            repository_credentials::delete_repository_credential
        ))
        .routes(routes!(runs::list_runs))
        .routes(routes!(runs::get_run))
        .routes(routes!(crate::sse::events))
        .routes(routes!(crate::sse::ticket))
        .routes(routes!(session::create_session))
        .split_for_parts()
}

pub fn router(state: AppState) -> Router {
    let (api, openapi) = documented_routes();
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
        .route("/healthz", get(health::healthz))
        .layer(axum::middleware::map_response(api_headers));
    let app = api
        .merge(crate::web::routes())
        .fallback(|| async { ApiError::not_found("route") })
        .layer(DefaultBodyLimit::max(body_max))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::http::request_id,
        ))
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
            .allow_methods([
                axum::http::Method::GET,
                axum::http::Method::POST,
                axum::http::Method::PUT,
                axum::http::Method::DELETE,
            ])
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

// ---------------------------------------------------------------- shared by the routes

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

/// The requester of a command the caller sends with this request: the
/// token's organization and user, the request id as correlation id.
fn requester(caller: &Caller, request: &RequestId) -> Requester {
    Requester::user(caller.0.org.clone(), request.0.clone(), &caller.0.user)
}

/// The secret store, or 503 `secrets_unavailable` when this gateway has
/// no secrets key.
fn secret_store(state: &AppState) -> Result<&zopu_core::secret_store::SecretStore, ApiError> {
    state.secrets.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "secrets_unavailable",
            format!(
                "this gateway has no secrets key: set {} (the same on every instance) to store environment values and repository credentials",
                zopu_core::secret_store::SECRETS_KEY_VARIABLE
            ),
        )
    })
}

/// A command the request described wrongly: 422 naming the field.
fn invalid(problem: Invalid) -> ApiError {
    ApiError::invalid(problem.field(), problem.to_string())
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeSet;

    /// Every operation's path parameters are exactly its path's `{name}`
    /// placeholders, and the rest of its parameters are query parameters:
    /// a query struct documented without `parameter_in = Query` shows up as
    /// required path parameters the path does not have (the candidates
    /// endpoint's `project`, `after`, `limit` did).
    #[test]
    fn path_parameters_are_the_path_placeholders_and_the_others_are_query() {
        let document = serde_json::to_value(super::openapi()).unwrap();
        let paths = document["paths"].as_object().unwrap();
        let mut wrong = Vec::new();
        for (path, operations) in paths {
            let placeholders: BTreeSet<&str> = path
                .split('/')
                .filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
                .collect();
            for (method, operation) in operations.as_object().unwrap() {
                let parameters = operation["parameters"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let declared: BTreeSet<&str> = parameters
                    .iter()
                    .filter(|p| p["in"] == "path")
                    .filter_map(|p| p["name"].as_str())
                    .collect();
                if declared != placeholders {
                    wrong.push(format!(
                        "{method} {path}: path parameters {declared:?}, placeholders {placeholders:?}"
                    ));
                }
                for parameter in &parameters {
                    if !matches!(parameter["in"].as_str(), Some("path" | "query" | "header")) {
                        wrong.push(format!("{method} {path}: {parameter}"));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
        let candidates = &document["paths"]["/v1/agent/candidates"]["get"]["parameters"];
        let query: Vec<(&str, bool)> = candidates
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                assert_eq!(p["in"], "query", "{p}");
                (p["name"].as_str().unwrap(), p["required"] == true)
            })
            .collect();
        assert_eq!(
            query,
            [("project", false), ("after", false), ("limit", false)]
        );
    }
}
