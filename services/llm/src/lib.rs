//! Model access for Zopu: one object-safe [`Provider`] trait and the OpenAI-compatible
//! chat-completions client ([`openai::OpenAiProvider`]). Product rules live with their product
//! part: the conversation's offline rules are a `Provider` in the conversation crate.
//!
//! Invariants:
//! - A [`ChatReply`] is only ever built from a fully validated response: a cut-off or garbled tool
//!   call, a call to a tool that was not offered, `finish_reason: "length"`, a content-filter stop
//!   or an oversized body is a typed [`Error`], never a reply. Replies are `Serialize` so they can
//!   be recorded as events; a replay reads the recorded reply and never calls the model again.
//! - Every call is bounded: a timeout per attempt, a bounded number of retries (exponential
//!   backoff with jitter, `Retry-After` honoured up to `backoff_max`), and a body size cap.
//! - The API key is read from its [`openai::KeySource`] before every attempt (rotation needs no
//!   restart), is sent only as a sensitive `Authorization` header, and never appears in `Debug`,
//!   `Display`, logs or errors.
//! - Callers call the model through [`complete_traced`], whose span carries the GenAI
//!   attributes (models, tokens, finish reason) and nothing of the prompt or the reply.

mod chat;
mod error;
pub mod openai;
mod structured;
#[cfg(feature = "test-support")]
pub mod test_support;
mod trace;

use std::future::Future;
use std::pin::Pin;

pub use chat::{
    ChatMessage, ChatReply, ChatRequest, DEFAULT_MAX_TOKENS, FinishReason, Role, ToolCall,
    ToolSpec, Usage, redact_value,
};
pub use error::Error;
pub use openai::{ApiKey, KeySource, OpenAiConfig, OpenAiProvider, RotatingKey};
pub use structured::{ANSWER_ACTION, Structured, strict_schema};
pub use trace::{TRACE_TARGET, complete_traced};

/// A boxed, sendable future, so that [`Provider`] stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Something that answers chat requests. Object-safe: hold it as `Arc<dyn Provider>` and inject
/// the rules (or a test double) where no model is configured.
pub trait Provider: Send + Sync + std::fmt::Debug {
    /// Recorded as `provider_label` in replies and cited by artifacts (`openai`, `offline`, ...).
    fn label(&self) -> &str;

    /// True when a reply is a pure function of the request and costs nothing (rules, not a
    /// model): such replies are not recorded as events, since a replay asks again and gets the
    /// same answer, and they use no model budget.
    fn is_deterministic(&self) -> bool {
        false
    }

    /// Answers `request`. Implementations validate the request first and never return a partial
    /// tool call.
    fn complete(&self, request: ChatRequest) -> BoxFuture<'_, Result<ChatReply, Error>>;

    /// The model requests name, when the provider has one (traced as
    /// `gen_ai.request.model`; the label otherwise).
    fn requested_model(&self) -> Option<&str> {
        None
    }
}
