//! Artifacts: the stored HTML (digest-verified, served with a script-free
//! CSP) and short-lived signed links to it.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use utoipa::{IntoParams, ToSchema};
use zopu_schema::{OrgId, subjects};

use super::{query_error, read};
use crate::AppState;
use crate::http::{ApiError, Caller, ErrorBody};
use crate::tokens::Scope;
use crate::views::{ArtifactRecord, ArtifactView, queries};

/// Content-Security-Policy of stored artifact HTML: no scripts at all, and
/// `sandbox` (with no `allow-*` token): the page runs in an opaque origin,
/// so even a script that slipped past validation could neither run nor
/// reach the gateway origin's storage, cookies or API.
pub const ARTIFACT_CSP: &str = "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'self'";

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
pub async fn get_artifact(
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
    let now = state.runtime.clock.unix_seconds();
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
pub async fn artifact_link(
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
    let expires = state.runtime.clock.unix_seconds() + state.config.artifact_link_ttl.as_secs();
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
