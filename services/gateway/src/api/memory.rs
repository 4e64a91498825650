//! What the project's conversation agent remembers (`zopu_core::memory`):
//! `GET /v1/projects/{id}/memory` lists (or, with `q`, searches) its
//! entries, `PUT .../memory/{key}` writes one, `DELETE .../memory/{key}`
//! forgets one and `DELETE .../memory` clears them all. Each write is one
//! event on the project's subjects, attributed to the caller and keyed by
//! the request, so a retried request writes nothing twice; the answer comes
//! after this gateway's projection applied it.

use std::time::Duration;

use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use zopu_core::memory::{self, Memory, MemoryError, MemoryProvider, Tier, Write};
use zopu_schema::{AgentId, ProjectId};

use super::{owned_project, query_error, requester};
use crate::AppState;
use crate::http::{ApiError, Caller, ErrorBody, RequestId, body_error, parse_json};
use crate::tokens::Scope;

/// One remembered entry.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemoryEntry {
    /// E.g. `preference.language`.
    pub key: String,
    /// E.g. "Answer in German".
    pub value: String,
    /// `long_term` or `working`.
    pub tier: String,
    /// When it is forgotten by itself (Unix ms), if ever.
    pub expires_at_unix_ms: Option<i64>,
    /// When it was written (Unix ms).
    pub set_at_unix_ms: i64,
    /// Who wrote it: `agent:<id>` (a preference the user stated) or `user:<name>`.
    pub set_by: String,
    /// The stream sequence of the write (its `agent.memory.set`).
    pub sequence: u64,
}

impl From<memory::Entry> for MemoryEntry {
    fn from(entry: memory::Entry) -> Self {
        Self {
            key: entry.key,
            value: entry.value,
            tier: entry.tier.as_str().to_owned(),
            expires_at_unix_ms: entry.expires_at_unix_ms,
            set_at_unix_ms: entry.set_at_unix_ms,
            set_by: entry.set_by,
            sequence: entry.sequence,
        }
    }
}

/// `GET /v1/projects/{id}/memory`.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemoryList {
    /// The agent whose memory it is.
    pub agent_id: String,
    /// By key; with `q`, the matches, most recently written first.
    pub entries: Vec<MemoryEntry>,
}

/// `GET /v1/projects/{id}/memory` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MemoryQuery {
    /// Only entries whose key or value holds every word (case-insensitive).
    pub q: Option<String>,
}

/// `PUT /v1/projects/{id}/memory/{key}` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetMemory {
    /// Plain text, 1 to 500 characters; never a credential.
    pub value: String,
    /// `long_term` (default) or `working` (always expires, 1 hour by default, at most 24).
    #[serde(default)]
    pub tier: Option<String>,
    /// Seconds until it is forgotten (long-term: optional, at most 366 days).
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

/// What a delete or clear removed.
#[derive(Debug, Serialize, ToSchema)]
pub struct MemoryRemoved {
    /// How many entries were removed.
    pub removed: usize,
    pub request_id: String,
}

fn namespace(state: &AppState, caller: &Caller, request: &RequestId, project: ProjectId) -> Memory {
    let agent = AgentId::conversation(&caller.0.org, &project).to_string();
    Memory::new(
        state.runtime.publisher.clone(),
        state.runtime.store.clone(),
        project,
        agent,
        requester(caller, request),
    )
}

/// A memory operation within the request timeout, its refusal as a typed error.
async fn within<T>(
    state: &AppState,
    operation: impl Future<Output = Result<T, MemoryError>>,
) -> Result<T, ApiError> {
    let outcome = tokio::time::timeout(state.config.request_timeout, operation)
        .await
        .map_err(|_| ApiError::unavailable("memory", "the request timed out"))?;
    outcome.map_err(|error| match error {
        MemoryError::Key(_) | MemoryError::SecretKey(_) => {
            ApiError::invalid("key", error.to_string())
        }
        MemoryError::Value(_) | MemoryError::Secret(_) => {
            ApiError::invalid("value", error.to_string())
        }
        MemoryError::Ttl(_) => ApiError::invalid("ttl_seconds", error.to_string()),
        MemoryError::Query(_) => ApiError::invalid("q", error.to_string()),
        MemoryError::Full => ApiError::conflict(error.to_string()),
        MemoryError::Command(_) => ApiError::invalid("author", error.to_string()),
        MemoryError::Runtime(error) => ApiError::unavailable("memory", error),
    })
}

/// What the project's agent remembers.
#[utoipa::path(get, path = "/v1/projects/{id}/memory", tag = "memory",
    params(("id" = String, Path, description = "Project id"), MemoryQuery),
    responses((status = 200, body = MemoryList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_memory(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path(id): Path<String>,
    query: Result<Query<MemoryQuery>, QueryRejection>,
) -> Result<axum::Json<MemoryList>, ApiError> {
    caller.require(Scope::Read, "reading the agent's memory")?;
    let Query(query) = query.map_err(query_error)?;
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let memory = namespace(&state, &caller, &request, project);
    let entries = match query.q.as_deref() {
        Some(text) => within(&state, memory.search(text)).await?,
        None => within(&state, memory.list()).await?,
    };
    Ok(axum::Json(MemoryList {
        agent_id: AgentId::conversation(&caller.0.org, &project).to_string(),
        entries: entries.into_iter().map(MemoryEntry::from).collect(),
    }))
}

/// Write one entry of the agent's memory.
#[utoipa::path(put, path = "/v1/projects/{id}/memory/{key}", tag = "memory",
    params(("id" = String, Path, description = "Project id"), ("key" = String, Path, description = "Entry key, e.g. preference.language")),
    request_body = SetMemory,
    responses((status = 200, body = MemoryEntry), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "Long-term memory is full"),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn set_memory(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path((id, key)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<MemoryEntry>, ApiError> {
    caller.require(Scope::Write, "writing the agent's memory")?;
    let body = body.map_err(body_error)?;
    let set: SetMemory = parse_json(&body)?;
    let tier = match set.tier.as_deref() {
        None => Tier::LongTerm,
        Some(text) => Tier::parse(text).ok_or_else(|| {
            ApiError::invalid("tier", format!("{text:?} is neither long_term nor working"))
        })?,
    };
    let write = Write {
        tier,
        ttl: set.ttl_seconds.map(Duration::from_secs),
    };
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let memory = namespace(&state, &caller, &request, project);
    let entry = within(&state, memory.set(&key, &set.value, write)).await?;
    tracing::info!(%project, key = %entry.key, tier = entry.tier.as_str(), "memory entry written");
    Ok(axum::Json(entry.into()))
}

/// Forget one entry.
#[utoipa::path(delete, path = "/v1/projects/{id}/memory/{key}", tag = "memory",
    params(("id" = String, Path, description = "Project id"), ("key" = String, Path, description = "Entry key")),
    responses((status = 200, body = MemoryRemoved), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "Unknown project, or nothing remembered under the key"),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete_memory(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path((id, key)): Path<(String, String)>,
) -> Result<axum::Json<MemoryRemoved>, ApiError> {
    caller.require(Scope::Write, "changing the agent's memory")?;
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let memory = namespace(&state, &caller, &request, project);
    if !within(&state, memory.delete(&key)).await? {
        return Err(ApiError::not_found("memory entry"));
    }
    Ok(axum::Json(MemoryRemoved {
        removed: 1,
        request_id: request.0.to_string(),
    }))
}

/// Forget everything the agent remembers in the project.
#[utoipa::path(delete, path = "/v1/projects/{id}/memory", tag = "memory",
    params(("id" = String, Path, description = "Project id")),
    responses((status = 200, body = MemoryRemoved), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn clear_memory(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    Path(id): Path<String>,
) -> Result<axum::Json<MemoryRemoved>, ApiError> {
    caller.require(Scope::Write, "clearing the agent's memory")?;
    let (project, _) = owned_project(&state, &caller.0.org, &id).await?;
    let memory = namespace(&state, &caller, &request, project);
    let removed = within(&state, memory.clear()).await?;
    tracing::info!(%project, removed, "memory cleared");
    Ok(axum::Json(MemoryRemoved {
        removed,
        request_id: request.0.to_string(),
    }))
}
