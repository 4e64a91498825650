//! The span of one model call, after the OpenTelemetry GenAI semantic
//! conventions: `chat <model>` with the operation, the provider, the
//! requested and answering model, tokens in and out and the finish reason
//! (its duration is the span's). Never the prompt, the reply or the key;
//! what the provider reports goes through `zopu_secrets::redact_label`.

use opentelemetry::{Array, StringValue, Value};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::chat::{ChatReply, ChatRequest, FinishReason};
use crate::{Error, Provider};

/// The target `zopu_runtime::telemetry` exports spans of (the two are checked
/// equal there).
pub const TRACE_TARGET: &str = "zopu::trace";

/// Calls `provider` inside a model-call span.
pub async fn complete_traced(
    provider: &dyn Provider,
    request: ChatRequest,
) -> Result<ChatReply, Error> {
    let requested_model = provider.requested_model().unwrap_or(provider.label());
    let span = tracing::info_span!(
        target: TRACE_TARGET,
        "chat",
        otel.name = format!("chat {requested_model}"),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.system = provider.label(),
        gen_ai.provider.name = provider.label(),
        gen_ai.request.model = requested_model,
        gen_ai.response.model = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    let outcome = provider.complete(request).instrument(span.clone()).await;
    match &outcome {
        Ok(reply) => {
            span.record(
                "gen_ai.response.model",
                zopu_secrets::redact_label(&reply.model),
            );
            span.record(
                "gen_ai.usage.input_tokens",
                i64::from(reply.usage.prompt_tokens),
            );
            span.record(
                "gen_ai.usage.output_tokens",
                i64::from(reply.usage.completion_tokens),
            );
            span.set_attribute(
                "gen_ai.response.finish_reasons",
                Value::Array(Array::String(vec![StringValue::from(finish_reason(
                    &reply.finish_reason,
                ))])),
            );
        }
        Err(error) => {
            span.record("error.type", error_type(error));
        }
    }
    outcome
}

/// The convention's spelling of a finish reason.
fn finish_reason(reason: &FinishReason) -> String {
    match reason {
        FinishReason::Stop => "stop".to_owned(),
        FinishReason::ToolCalls => "tool_calls".to_owned(),
        FinishReason::Other(other) => zopu_secrets::redact_label(other),
    }
}

/// A low-cardinality name of the failure (never its text).
fn error_type(error: &Error) -> &'static str {
    match error {
        Error::InvalidConfig { .. } => "invalid_config",
        Error::InvalidRequest { .. } => "invalid_request",
        Error::ApiKeyUnavailable { .. } => "api_key_unavailable",
        Error::Timeout { .. } => "timeout",
        Error::Connection { .. } => "connection",
        Error::Status { .. } => "http_status",
        Error::ResponseTooLarge { .. } => "response_too_large",
        Error::MalformedJson { .. } => "malformed_json",
        Error::MalformedResponse { .. } => "malformed_response",
        Error::MissingChoices => "missing_choices",
        Error::TruncatedToolCall { .. } => "truncated_tool_call",
        Error::UnknownTool { .. } => "unknown_tool",
        Error::Truncated => "truncated",
        Error::ContentFiltered { .. } => "content_filtered",
        Error::InvalidJsonContent { .. } => "invalid_json_content",
        Error::RetriesExhausted { .. } => "retries_exhausted",
    }
}
