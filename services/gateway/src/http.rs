//! HTTP plumbing: the error body, the JSON extractor that names the bad
//! field, the request id, and the bearer-token extractor.

use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;
use zopu_schema::CorrelationId;

use crate::AppState;
use crate::tokens::{Principal, Scope};

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `invalid_field`, `not_found`.
    pub code: String,
    pub message: String,
    /// The request field at fault (JSON path, header or query parameter), if any.
    pub field: Option<String>,
}

/// An error response: status plus `{"error": {code, message, field}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
    /// Seconds for the `Retry-After` header (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after: None,
        }
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds.max(1));
        self
    }

    /// 403: the token is valid but lacks `scope`, which `what` needs.
    pub fn missing_scope(scope: Scope, what: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "missing_scope",
            format!(
                "this token lacks the `{}` scope, which {what} needs (the operator issues one with: zopu token create --scope {})",
                scope.as_str(),
                scope.as_str()
            ),
        )
    }

    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// 422 for a field that parsed but is not acceptable.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", message).field(field)
    }

    /// 404: also what another organization's resources look like.
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }

    pub fn agent_unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid agent key is required (Authorization: Bearer zak_...; ask the operator: zopu agent key create)",
        )
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required (Authorization: Bearer zpt_...; ask the operator: zopu token create)",
        )
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// 503 for a dependency that failed; the cause is logged, not returned.
    pub fn unavailable(context: &'static str, error: impl std::fmt::Display) -> Self {
        tracing::warn!(context, %error, "request failed on a dependency");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("{context} is unavailable; try again"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
                field: self.field,
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// A JSON body whose errors name the field: 413 over the cap, 415 without a
/// JSON content type, 400 when it is not JSON, 422 when a field is missing,
/// unknown or of the wrong type.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(|value| {
                value
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .eq_ignore_ascii_case("application/json")
            })
            .unwrap_or(false);
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be JSON (Content-Type: application/json)",
            )
            .field("Content-Type"));
        }
        let bytes = bytes::Bytes::from_request(request, state)
            .await
            .map_err(body_error)?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// The error for a body that could not be read: too large (413) or broken
/// off (400), naming the body.
pub fn body_error(rejection: axum::extract::rejection::BytesRejection) -> ApiError {
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

/// An optional body: `T::default()` when it is empty or blank, else [`parse_json`].
pub fn parse_optional_json<T: DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse_json(bytes)
}

/// Deserializes `bytes`, naming the field at fault.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let parsed = serde_path_to_error::deserialize::<_, T>(&mut deserializer);
    if parsed.is_ok()
        && let Err(error) = deserializer.end()
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("the body is not valid JSON: {error}"),
        )
        .field("body"));
    }
    parsed.map_err(|error| {
        let path = error.path().to_string();
        let inner = error.inner();
        let parent = if path == "." { String::new() } else { path };
        let join = |name: &str| {
            if parent.is_empty() {
                name.to_owned()
            } else {
                format!("{parent}.{name}")
            }
        };
        let message = inner.to_string();
        match inner.classify() {
            serde_json::error::Category::Syntax
            | serde_json::error::Category::Eof
            | serde_json::error::Category::Io => ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("the body is not valid JSON: {message}"),
            )
            .field(if parent.is_empty() {
                "body".to_owned()
            } else {
                parent
            }),
            serde_json::error::Category::Data => {
                if let Some(name) = backticked(&message, "missing field `") {
                    ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "missing_field",
                        format!("{} is required", join(&name)),
                    )
                    .field(join(&name))
                } else if let Some(name) = backticked(&message, "unknown field `") {
                    // The path already ends at the unknown key.
                    let field = if parent == name || parent.ends_with(&format!(".{name}")) {
                        parent.clone()
                    } else {
                        join(&name)
                    };
                    ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "unknown_field",
                        format!("{field} is not a known field"),
                    )
                    .field(field)
                } else {
                    let field = if parent.is_empty() {
                        "body".to_owned()
                    } else {
                        parent
                    };
                    ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "invalid_field",
                        format!("{field}: {}", strip_position(&message)),
                    )
                    .field(field)
                }
            }
        }
    })
}

fn backticked(message: &str, prefix: &str) -> Option<String> {
    let rest = message.strip_prefix(prefix)?;
    rest.split('`').next().map(str::to_owned)
}

fn strip_position(message: &str) -> &str {
    message.split(" at line ").next().unwrap_or(message)
}

/// The request id of this request: the caller's `X-Request-Id` or a new UUIDv7.
/// It becomes the correlation id of the events the request causes.
#[derive(Debug, Clone)]
pub struct RequestId(pub CorrelationId);

/// Reads or creates (from the service's id source) the request id and echoes it on the response.
pub async fn request_id(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let given = request.headers().get(&REQUEST_ID).map(|value| {
        value
            .to_str()
            .ok()
            .and_then(|v| v.parse::<CorrelationId>().ok())
    });
    let id = match given {
        Some(Some(id)) => id,
        Some(None) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_header",
                format!(
                    "X-Request-Id must be 1-{} printable ASCII characters without spaces",
                    CorrelationId::MAX_LEN
                ),
            )
            .field("X-Request-Id")
            .into_response();
        }
        None => match state.runtime.clock.fresh_uuid().to_string().parse() {
            Ok(id) => id,
            Err(_) => {
                return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "request id")
                    .into_response();
            }
        },
    };
    let header = HeaderValue::from_str(id.as_str()).ok();
    request.extensions_mut().insert(RequestId(id));
    let mut response = next.run(request).await;
    if let Some(header) = header {
        response.headers_mut().insert(REQUEST_ID, header);
    }
    response
}

impl<S: Send + Sync> FromRequestParts<S> for RequestId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<RequestId>().cloned().ok_or_else(|| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "request id layer missing",
            )
        })
    }
}

/// The caller, from `Authorization: Bearer zpt_...`.
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

/// An external agent calling the Agent API, from `Authorization: Bearer zak_...`.
#[derive(Debug, Clone)]
pub struct AgentCaller(pub crate::agent_keys::AgentPrincipal);

impl FromRequestParts<AppState> for AgentCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let key = bearer(parts).ok_or_else(ApiError::agent_unauthorized)?;
        if key.starts_with(crate::tokens::TOKEN_PREFIX) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "user_token",
                "the Agent API takes an agent key (Authorization: Bearer zak_...; zopu agent key create), not a user token",
            ));
        }
        let api = state.agent_api.as_ref().ok_or_else(|| {
            ApiError::unavailable(
                "agent api",
                "this gateway was started without the Agent API",
            )
        })?;
        let verified = tokio::time::timeout(state.config.request_timeout, api.keys.verify(&key))
            .await
            .map_err(|_| ApiError::unavailable("token store", "read timed out"))?
            .map_err(|error| ApiError::unavailable("token store", error))?;
        verified
            .map(AgentCaller)
            .ok_or_else(ApiError::agent_unauthorized)
    }
}

impl Caller {
    /// 403 unless the caller's token has `scope`; `what` names the action
    /// in the error ("sending a message").
    pub fn require(&self, scope: Scope, what: &str) -> Result<(), ApiError> {
        require(&self.0, scope, what)
    }
}

/// 403 unless `principal`'s token has `scope`.
pub fn require(principal: &Principal, scope: Scope, what: &str) -> Result<(), ApiError> {
    if principal.scopes.contains(scope) {
        Ok(())
    } else {
        Err(ApiError::missing_scope(scope, what))
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = bearer(parts).ok_or_else(ApiError::unauthorized)?;
        if token.starts_with(crate::agent_keys::KEY_PREFIX) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "agent_key",
                "an agent key works only on the Agent API (/v1/agent/...); this route takes a user token (zpt_...)",
            ));
        }
        authenticate(state, &token).await.map(Caller)
    }
}

/// The bearer token of a request, if it has one.
pub fn bearer(parts: &Parts) -> Option<String> {
    let value = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}

/// Resolves a token to its principal; 401 when it is not valid, revoked or expired.
pub async fn authenticate(state: &AppState, token: &str) -> Result<Principal, ApiError> {
    let verified = tokio::time::timeout(state.config.request_timeout, state.tokens.verify(token))
        .await
        .map_err(|_| ApiError::unavailable("token store", "read timed out"))?
        .map_err(|error| ApiError::unavailable("token store", error))?;
    verified.ok_or_else(ApiError::unauthorized)
}
