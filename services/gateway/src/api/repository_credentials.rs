//! An organization's repository credentials: a token (and the user name it
//! is sent with) per repository host, which setup's and the specialists'
//! hardened clone sends to that host and nowhere else. The token goes only
//! to the secret store (`zopu_core::secret_store`: sealed, the
//! `zopu-secrets` bucket); no response, event or log carries it. A clone
//! that used one records the host and the credential's version in
//! `project.repository.cloned`. Admin scope: a credential reaches every
//! repository of the organization on that host.

use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use zopu_core::secret_store::{self, TOKEN_USERNAME_DEFAULT};
use zopu_secrets::{Credential, Secret};

use super::secret_store as store;
use crate::AppState;
use crate::http::{ApiError, Caller, ErrorBody, body_error, parse_json};
use crate::tokens::Scope;

/// `PUT /v1/repository-credentials/{host}` body.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetRepositoryCredential {
    /// The token (or password), 1 to 8 KiB. Stored sealed; never returned.
    pub token: String,
    /// The user name sent with it (default `x-access-token`, which GitHub
    /// and Gitea expect with a token; GitLab accepts any).
    #[serde(default)]
    pub username: Option<String>,
}

impl std::fmt::Debug for SetRepositoryCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetRepositoryCredential")
            .field("token", &"***")
            .field("username", &self.username)
            .finish()
    }
}

/// A stored credential, without its token.
#[derive(Debug, Serialize, ToSchema)]
pub struct RepositoryCredentialView {
    /// `host` or `host:port`, as in the repository's https URL.
    pub host: String,
    pub username: String,
    /// The secret store's version of the credential; a replaced one has a higher one.
    pub version: u64,
    /// A keyed fingerprint: equal for the same token, telling nothing of it.
    pub fingerprint: String,
}

/// `GET /v1/repository-credentials`.
#[derive(Debug, Serialize, ToSchema)]
pub struct RepositoryCredentialList {
    pub credentials: Vec<RepositoryCredentialView>,
}

/// What a write did (never the token).
#[derive(Debug, Serialize, ToSchema)]
pub struct RepositoryCredentialChanged {
    pub host: String,
    /// `set` or `deleted`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<RepositoryCredentialView>,
}

/// The organization's repository credentials (hosts and user names, never tokens).
#[utoipa::path(get, path = "/v1/repository-credentials", tag = "repository credentials",
    responses((status = 200, body = RepositoryCredentialList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 503, body = ErrorBody, description = "No secrets key configured (ZOPU_SECRETS_KEY), or the store is unreachable")),
    security(("bearer" = [])))]
pub async fn list_repository_credentials(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<axum::Json<RepositoryCredentialList>, ApiError> {
    caller.require(Scope::Admin, "listing repository credentials")?;
    let secrets = store(&state)?;
    let org = &caller.0.org;
    let unavailable = |error| ApiError::unavailable("secret store", error);
    let mut credentials = Vec::new();
    for host in secrets.repository_hosts(org).await.map_err(unavailable)? {
        // A credential deleted between the listing and the read is skipped.
        if let Some((credential, stored)) = secrets
            .repository_credential(org, &host)
            .await
            .map_err(unavailable)?
        {
            credentials.push(RepositoryCredentialView {
                host,
                username: credential.username,
                version: stored.version,
                fingerprint: stored.fingerprint,
            });
        }
    }
    Ok(axum::Json(RepositoryCredentialList { credentials }))
}

/// Store (or replace) the organization's token for a repository host.
#[utoipa::path(put, path = "/v1/repository-credentials/{host}", tag = "repository credentials",
    params(("host" = String, Path, description = "`host` or `host:port`, as in the repository's https URL")),
    request_body = SetRepositoryCredential,
    responses((status = 200, body = RepositoryCredentialChanged), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn set_repository_credential(
    State(state): State<AppState>,
    caller: Caller,
    Path(host): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Admin, "storing a repository credential")?;
    let body = body.map_err(body_error)?;
    let set: SetRepositoryCredential = parse_json(&body)?;
    let host = checked_host(&host)?;
    let credential = Credential {
        username: set
            .username
            .unwrap_or_else(|| TOKEN_USERNAME_DEFAULT.to_owned()),
        password: Secret::new(set.token),
    };
    let secrets = store(&state)?;
    let org = &caller.0.org;
    let stored = secrets
        .put_repository_credential(org, &host, &credential)
        .await
        .map_err(|error| match error {
            secret_store::SecretStoreError::Username => {
                ApiError::invalid("username", error.to_string())
            }
            secret_store::SecretStoreError::Value => ApiError::invalid("token", error.to_string()),
            other => ApiError::unavailable("secret store", other),
        })?;
    tracing::info!(%org, %host, username = %credential.username, version = stored.version, by = %caller.0.user, "repository credential stored");
    let body = RepositoryCredentialChanged {
        host: host.clone(),
        status: "set".to_owned(),
        credential: Some(RepositoryCredentialView {
            host,
            username: credential.username,
            version: stored.version,
            fingerprint: stored.fingerprint,
        }),
    };
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

/// Remove the organization's token for a repository host.
#[utoipa::path(delete, path = "/v1/repository-credentials/{host}", tag = "repository credentials",
    params(("host" = String, Path, description = "`host` or `host:port`, as in the repository's https URL")),
    responses((status = 200, body = RepositoryCredentialChanged), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "No credential stored for the host"),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete_repository_credential(
    State(state): State<AppState>,
    caller: Caller,
    Path(host): Path<String>,
) -> Result<Response, ApiError> {
    caller.require(Scope::Admin, "removing a repository credential")?;
    let host = checked_host(&host)?;
    let secrets = store(&state)?;
    let org = &caller.0.org;
    let removed = secrets
        .delete(&secret_store::repository_entry(org, &host))
        .await
        .map_err(|error| ApiError::unavailable("secret store", error))?;
    if !removed {
        return Err(ApiError::not_found("repository credential"));
    }
    tracing::info!(%org, %host, by = %caller.0.user, "repository credential removed");
    let body = RepositoryCredentialChanged {
        host,
        status: "deleted".to_owned(),
        credential: None,
    };
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

fn checked_host(host: &str) -> Result<String, ApiError> {
    secret_store::check_repository_host(host)
        .map_err(|problem| ApiError::invalid("host", problem.to_string()))
}
