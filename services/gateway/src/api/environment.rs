//! A project's environment values: for the names its `.env.example` lists,
//! a user stores (`PUT`), rotates (`PUT` again) or removes (`DELETE`) a value.
//! The value goes only to the secret store (`zopu_core::secret_store`: sealed,
//! the `zopu-secrets` bucket); the event records the name, the store's
//! version and the keyed fingerprint. No response, event or log carries a
//! value; `GET` lists which names are set.

use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use zopu_core::commands;
use zopu_core::secret_store::{self, SecretValue};

use super::append::append;
use super::{invalid, owned_project, requester, secret_store as store};
use crate::AppState;
use crate::http::{ApiError, Caller, ErrorBody, RequestId, body_error, parse_json};
use crate::tokens::Scope;
use crate::views::{EnvironmentValue, ProjectView};

/// `PUT /v1/projects/{id}/environment/{name}` body.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetEnvironmentValue {
    /// The value (1 to 8192 bytes, no NUL). Stored sealed; never returned.
    pub value: String,
}

impl std::fmt::Debug for SetEnvironmentValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SetEnvironmentValue { value: *** }")
    }
}

/// One environment name of the project and whether a value is stored.
#[derive(Debug, Serialize, ToSchema)]
pub struct EnvironmentName {
    pub name: String,
    pub set: bool,
    /// The stored value's version, fingerprint and author, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<EnvironmentValue>,
}

/// `GET /v1/projects/{id}/environment`.
#[derive(Debug, Serialize, ToSchema)]
pub struct EnvironmentList {
    /// The names of the repository's `.env.example`, in its order.
    pub names: Vec<EnvironmentName>,
}

/// What a write stored (never the value).
#[derive(Debug, Serialize, ToSchema)]
pub struct EnvironmentChanged {
    pub name: String,
    /// `set` or `deleted`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    pub event_id: String,
    pub sequence: u64,
    pub request_id: String,
}

/// The project's environment names and which hold a value.
#[utoipa::path(get, path = "/v1/projects/{id}/environment", tag = "environment",
    params(("id" = String, Path, description = "Project id")),
    responses((status = 200, body = EnvironmentList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_environment(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<axum::Json<EnvironmentList>, ApiError> {
    caller.require(Scope::Read, "reading the environment names")?;
    let (_, project) = owned_project(&state, &caller.0.org, &id).await?;
    Ok(axum::Json(names_of(project)))
}

fn names_of(project: ProjectView) -> EnvironmentList {
    let setup = project.setup;
    let names = setup
        .environment_names
        .into_iter()
        .map(|name| {
            let value = setup
                .environment_values
                .iter()
                .find(|value| value.name == name)
                .cloned();
            EnvironmentName {
                set: value.is_some(),
                name,
                value,
            }
        })
        .collect();
    EnvironmentList { names }
}

/// Store (or rotate) the value of one of the project's environment names.
#[utoipa::path(put, path = "/v1/projects/{id}/environment/{name}", tag = "environment",
    params(("id" = String, Path, description = "Project id"), ("name" = String, Path, description = "A name from the project's .env.example")),
    request_body = SetEnvironmentValue,
    responses((status = 202, body = EnvironmentChanged), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody, description = "No secrets key configured (ZOPU_SECRETS_KEY), or the store is unreachable")),
    security(("bearer" = [])))]
pub async fn set_environment_value(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path((id, name)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Write, "storing an environment value")?;
    let body = body.map_err(body_error)?;
    let set: SetEnvironmentValue = parse_json(&body)?;
    let value = SecretValue::new(set.value)
        .map_err(|problem| ApiError::invalid("value", problem.to_string()))?;
    let (project, view) = owned_project(&state, &caller.0.org, &id).await?;
    known_name(&view, &name)?;
    let secrets = store(&state)?;
    let entry = secret_store::environment_entry(&caller.0.org, &project, &name);
    let stored = secrets
        .put(&entry, &value)
        .await
        .map_err(|error| ApiError::unavailable("secret store", error))?;
    let event =
        commands::record_environment_value(&requester(&caller, &request), project, &name, &stored)
            .map_err(invalid)?;
    let accepted = append(&state, event, &request).await?;
    let body = EnvironmentChanged {
        name,
        status: "set".to_owned(),
        version: Some(stored.version),
        fingerprint: Some(stored.fingerprint),
        event_id: accepted.event_id,
        sequence: accepted.sequence,
        request_id: accepted.request_id,
    };
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

/// Remove the stored value of an environment name.
#[utoipa::path(delete, path = "/v1/projects/{id}/environment/{name}", tag = "environment",
    params(("id" = String, Path, description = "Project id"), ("name" = String, Path, description = "A name from the project's .env.example")),
    responses((status = 202, body = EnvironmentChanged), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "Unknown project, or no value stored for the name"),
        (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete_environment_value(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path((id, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Write, "removing an environment value")?;
    let (project, view) = owned_project(&state, &caller.0.org, &id).await?;
    known_name(&view, &name)?;
    let secrets = store(&state)?;
    let event =
        commands::record_environment_deletion(&requester(&caller, &request), project, &name)
            .map_err(invalid)?;
    let entry = secret_store::environment_entry(&caller.0.org, &project, &name);
    let removed = secrets
        .delete(&entry)
        .await
        .map_err(|error| ApiError::unavailable("secret store", error))?;
    if !removed {
        return Err(ApiError::not_found("environment value"));
    }
    let accepted = append(&state, event, &request).await?;
    let body = EnvironmentChanged {
        name,
        status: "deleted".to_owned(),
        version: None,
        fingerprint: None,
        event_id: accepted.event_id,
        sequence: accepted.sequence,
        request_id: accepted.request_id,
    };
    Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response())
}

/// Only the names the repository's `.env.example` lists take a value.
fn known_name(view: &ProjectView, name: &str) -> Result<(), ApiError> {
    secret_store::check_name(name)
        .map_err(|problem| ApiError::invalid("name", problem.to_string()))?;
    if view
        .setup
        .environment_names
        .iter()
        .any(|known| known == name)
    {
        return Ok(());
    }
    Err(ApiError::invalid(
        "name",
        format!(
            "{name} is not among the names in the repository's .env.example ({})",
            view.setup.environment_names.join(", ")
        ),
    ))
}
