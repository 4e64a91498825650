//! `GET /healthz`: the NATS connection and the read model's checkpoint.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::AppState;

/// 200 while connected to NATS, 503 otherwise.
pub async fn healthz(State(state): State<AppState>) -> Response {
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
