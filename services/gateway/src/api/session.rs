//! Signing in with a link: `POST /v1/session` exchanges a single-use
//! sign-in ticket (the one `zopu dev` prints in its link's fragment, see
//! `tickets`) for a new session token of the ticket's user and scopes. The
//! ticket works once and for minutes; the session token lives
//! [`SESSION_TTL`] and travels only in this response's body.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AppState;
use crate::http::{ApiError, ApiJson, ErrorBody};
use crate::tokens::Scopes;

/// How long a session token made from a sign-in link lives.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// `POST /v1/session` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// The sign-in ticket (`zpk_...`) from the link's `#signin=` fragment.
    pub ticket: String,
}

/// A session: a bearer token for the API, kept by the web for the tab.
#[derive(Serialize, ToSchema)]
pub struct Session {
    /// `zpt_...`: send it as `Authorization: Bearer`.
    pub token: String,
    pub org: String,
    pub user: String,
    /// Unix seconds.
    pub expires_at: i64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("token", &"***")
            .field("org", &self.org)
            .field("user", &self.user)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Exchange a sign-in link's single-use ticket for a session token.
#[utoipa::path(post, path = "/v1/session", tag = "session",
    request_body = SessionRequest,
    responses((status = 201, body = Session), (status = 401, body = ErrorBody, description = "The link was already used, has expired or is not a sign-in link (`sign_in_link_invalid`)"), (status = 422, body = ErrorBody)))]
pub async fn create_session(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SessionRequest>,
) -> Result<Response, ApiError> {
    let redeemed = tokio::time::timeout(
        state.config.request_timeout,
        state.tickets.redeem_sign_in(body.ticket.trim()),
    )
    .await
    .map_err(|_| ApiError::unavailable("ticket store", "read timed out"))?
    .map_err(|error| ApiError::unavailable("ticket store", error))?;
    let Some(sign_in) = redeemed else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "sign_in_link_invalid",
            "this sign-in link was already used or has expired (it works once, for 10 minutes): restart `make run` for a new one, or paste a token from `zopu token create`",
        ));
    };
    let scopes = Scopes::parse(&sign_in.scopes)
        .map_err(|error| ApiError::unavailable("ticket store", error))?;
    let issued = state
        .tokens
        .issue_scoped(&sign_in.org, &sign_in.user, SESSION_TTL, scopes)
        .await
        .map_err(|error| ApiError::unavailable("token store", error))?;
    let session = Session {
        token: issued.expose().to_owned(),
        org: issued.info.org.to_string(),
        user: issued.info.user.clone(),
        expires_at: issued.info.expires_at.unix_timestamp(),
    };
    Ok((StatusCode::CREATED, axum::Json(session)).into_response())
}
