use std::time::Duration;

/// Everything that can go wrong talking to a model. No variant ever carries the API key: bodies
/// echoed by the server are redacted before they are stored here.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is unusable; `field` names the setting.
    #[error("invalid LLM config `{field}`: {reason}")]
    InvalidConfig { field: &'static str, reason: String },

    /// The request was rejected before anything was sent.
    #[error("invalid chat request: {reason}")]
    InvalidRequest { reason: String },

    /// The key source (environment variable, file) gave no usable key. Names the source only.
    #[error("LLM API key unavailable: {reason}")]
    ApiKeyUnavailable { reason: String },

    /// One attempt took longer than `request_timeout`.
    #[error("model call timed out after {after:?}")]
    Timeout { after: Duration },

    /// Connecting, sending or reading failed below HTTP.
    #[error("could not reach the model endpoint: {reason}")]
    Connection { reason: String },

    /// The endpoint answered with a non-success status.
    #[error("model endpoint answered HTTP {status}: {body_excerpt}")]
    Status {
        status: u16,
        retry_after: Option<Duration>,
        body_excerpt: String,
    },

    /// The body grew past `max_response_bytes`; reading stopped there.
    #[error("model response exceeded {limit_bytes} bytes")]
    ResponseTooLarge { limit_bytes: usize },

    /// The body is not JSON.
    #[error("model response is not valid JSON: {reason}")]
    MalformedJson { reason: String },

    /// The body is JSON but not a chat completion.
    #[error("model response has an unexpected shape: {reason}")]
    MalformedResponse { reason: String },

    /// The completion has no `choices`.
    #[error("model response has no choices")]
    MissingChoices,

    /// A tool call's arguments are not a complete JSON object (cut off or garbled).
    #[error("tool call `{tool}` has incomplete arguments: {reason}")]
    TruncatedToolCall { tool: String, reason: String },

    /// The model called a tool that was not offered in the request.
    #[error("model called tool `{name}`, which was not offered")]
    UnknownTool { name: String },

    /// `finish_reason: "length"`: the output was cut off at the token limit.
    #[error("model output was cut off at the token limit")]
    Truncated,

    /// `finish_reason: "content_filter"` or a refusal.
    #[error("model output was withheld: {detail}")]
    ContentFiltered { detail: String },

    /// JSON output was requested but the content is not a JSON object.
    #[error("model content is not the requested JSON object: {reason}")]
    InvalidJsonContent { reason: String },

    /// Every allowed attempt failed with a retryable error; `last` is the final one.
    #[error("gave up after {attempts} attempts: {last}")]
    RetriesExhausted {
        attempts: u32,
        #[source]
        last: Box<Error>,
    },
}

impl Error {
    /// True when the same call may succeed later (timeouts, connection failures, 408/409/425/429,
    /// 5xx). A handler should nak with backoff on a retryable error and dead-letter otherwise.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::Connection { .. } => true,
            Error::Status { status, .. } => {
                matches!(status, 408 | 409 | 425 | 429) || (500..=599).contains(status)
            }
            Error::RetriesExhausted { last, .. } => last.is_retryable(),
            Error::InvalidConfig { .. }
            | Error::InvalidRequest { .. }
            | Error::ApiKeyUnavailable { .. }
            | Error::ResponseTooLarge { .. }
            | Error::MalformedJson { .. }
            | Error::MalformedResponse { .. }
            | Error::MissingChoices
            | Error::TruncatedToolCall { .. }
            | Error::UnknownTool { .. }
            | Error::Truncated
            | Error::ContentFiltered { .. }
            | Error::InvalidJsonContent { .. } => false,
        }
    }

    /// The error that ended the call: `last` for [`Error::RetriesExhausted`], otherwise `self`.
    pub fn root(&self) -> &Error {
        match self {
            Error::RetriesExhausted { last, .. } => last.root(),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryability() {
        let status = |status| Error::Status {
            status,
            retry_after: None,
            body_excerpt: String::new(),
        };
        assert!(status(429).is_retryable());
        assert!(status(503).is_retryable());
        assert!(!status(400).is_retryable());
        assert!(!status(401).is_retryable());
        assert!(
            Error::Timeout {
                after: Duration::from_secs(1)
            }
            .is_retryable()
        );
        assert!(!Error::Truncated.is_retryable());
        let exhausted = Error::RetriesExhausted {
            attempts: 3,
            last: Box::new(status(500)),
        };
        assert!(exhausted.is_retryable());
        assert!(matches!(
            exhausted.root(),
            Error::Status { status: 500, .. }
        ));
    }
}
