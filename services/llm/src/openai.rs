//! OpenAI-compatible chat-completions client: one POST per attempt, a timeout on each attempt,
//! bounded retries with exponential backoff and jitter (honouring `Retry-After`), a cap on the
//! body size and strict validation of the reply.

mod config;
mod wire;

use std::time::{Duration, SystemTime};

use rand::Rng;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};

pub use config::{ApiKey, DEFAULT_API_KEY_ENV, KeySource, OpenAiConfig, RotatingKey};

use crate::chat::{ChatReply, ChatRequest};
use crate::{BoxFuture, Error, Provider};

/// Characters of an error body kept in [`Error::Status`].
const BODY_EXCERPT_MAX_CHARS: usize = 300;
/// Upper bound on connection set-up, below the per-attempt timeout.
const CONNECT_TIMEOUT_MAX: Duration = Duration::from_secs(10);

/// A provider speaking the OpenAI chat-completions protocol (OpenAI, Azure-compatible proxies,
/// vLLM, Ollama, LiteLLM, ...). Cheap to clone.
#[derive(Clone, Debug)]
pub struct OpenAiProvider {
    config: OpenAiConfig,
    http: reqwest::Client,
}

impl OpenAiProvider {
    /// Validates `config` and builds the HTTP client. The key is not read here but before every
    /// attempt, so a missing key fails the call, not the start-up.
    pub fn new(config: OpenAiConfig) -> Result<Self, Error> {
        config.validate()?;
        let http = reqwest::Client::builder()
            .connect_timeout(config.request_timeout.min(CONNECT_TIMEOUT_MAX))
            .build()
            .map_err(|error| Error::InvalidConfig {
                field: "http_client",
                reason: error.without_url().to_string(),
            })?;
        Ok(Self { config, http })
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// Sends `request`, retrying transient failures; see the module docs.
    pub async fn complete(&self, request: ChatRequest) -> Result<ChatReply, Error> {
        request.validate()?;
        let body = wire::request_body(&self.config.model, &request).to_string();
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let error = match self.attempt(&body, &request).await {
                Ok(parsed) => {
                    return Ok(ChatReply {
                        content: parsed.content,
                        tool_calls: parsed.tool_calls,
                        finish_reason: parsed.finish_reason,
                        usage: parsed.usage,
                        attempts: attempt,
                        model: parsed.model.unwrap_or_else(|| self.config.model.clone()),
                        provider_label: self.config.label.clone(),
                    });
                }
                Err(error) => error,
            };
            if !error.is_retryable() {
                return Err(error);
            }
            if attempt > self.config.max_retries {
                return Err(Error::RetriesExhausted {
                    attempts: attempt,
                    last: Box::new(error),
                });
            }
            let retry_after = match &error {
                Error::Status { retry_after, .. } => *retry_after,
                _ => None,
            };
            let delay = retry_delay(
                attempt,
                retry_after,
                self.config.backoff_base,
                self.config.backoff_max,
                rand::rng().random::<f64>(),
            );
            tracing::warn!(
                provider = %self.config.label,
                attempt,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                %error,
                "model call failed; retrying"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// One HTTP exchange under the per-attempt timeout.
    async fn attempt(&self, body: &str, request: &ChatRequest) -> Result<wire::Parsed, Error> {
        let key = self.config.key_source.load().await?;
        let timeout = self.config.request_timeout;
        let exchange = async {
            let mut builder = self
                .http
                .post(self.config.completions_url())
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_owned());
            if let Some(key) = &key {
                builder = builder.header(AUTHORIZATION, bearer(key)?);
            }
            let mut response = builder
                .send()
                .await
                .map_err(|error| transport_error(error, timeout))?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| parse_retry_after(value, SystemTime::now()));
            let bytes = read_capped(&mut response, self.config.max_response_bytes, timeout).await?;
            if !status.is_success() {
                let text = String::from_utf8_lossy(&bytes);
                let text = match &key {
                    Some(key) => text.replace(key.expose(), "***"),
                    None => text.into_owned(),
                };
                return Err(Error::Status {
                    status: status.as_u16(),
                    retry_after,
                    body_excerpt: wire::clip(text.trim(), BODY_EXCERPT_MAX_CHARS),
                });
            }
            wire::parse_reply(&bytes, request)
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_elapsed) => Err(Error::Timeout { after: timeout }),
        }
    }
}

impl Provider for OpenAiProvider {
    fn label(&self) -> &str {
        &self.config.label
    }

    fn complete(&self, request: ChatRequest) -> BoxFuture<'_, Result<ChatReply, Error>> {
        Box::pin(OpenAiProvider::complete(self, request))
    }

    fn requested_model(&self) -> Option<&str> {
        Some(&self.config.model)
    }
}

fn bearer(key: &ApiKey) -> Result<HeaderValue, Error> {
    let mut value =
        HeaderValue::from_str(&format!("Bearer {}", key.expose())).map_err(|_invalid| {
            Error::ApiKeyUnavailable {
                reason: "the key contains characters not allowed in a header".into(),
            }
        })?;
    value.set_sensitive(true);
    Ok(value)
}

/// Reads the body chunk by chunk and stops as soon as it grows past `limit_bytes`.
async fn read_capped(
    response: &mut reqwest::Response,
    limit_bytes: usize,
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    let too_large = Error::ResponseTooLarge { limit_bytes };
    if response
        .content_length()
        .is_some_and(|length| length > limit_bytes as u64)
    {
        return Err(too_large);
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| transport_error(error, timeout))?
    {
        if bytes.len() + chunk.len() > limit_bytes {
            return Err(too_large);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

fn transport_error(error: reqwest::Error, timeout: Duration) -> Error {
    if error.is_timeout() {
        return Error::Timeout { after: timeout };
    }
    // The URL is configuration, not secret, but it is dropped anyway; the key is only ever in a
    // sensitive header, which no error formats.
    let error = error.without_url();
    let mut reason = error.to_string();
    let mut cause = std::error::Error::source(&error);
    while let Some(inner) = cause {
        reason.push_str(": ");
        reason.push_str(&inner.to_string());
        cause = inner.source();
    }
    Error::Connection { reason }
}

/// `Retry-After` as seconds or an HTTP date, relative to `now`. A date in the past means "now".
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Delay before retry number `attempt` (1-based). A server's `Retry-After` wins but is capped by
/// `max`; otherwise `base * 2^(attempt-1)` capped by `max`, of which the upper half is jittered
/// by `jitter` (in `[0, 1)`).
pub(crate) fn retry_delay(
    attempt: u32,
    retry_after: Option<Duration>,
    base: Duration,
    max: Duration,
    jitter: f64,
) -> Duration {
    if let Some(wait) = retry_after {
        return wait.min(max);
    }
    let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
    let ceiling = base.saturating_mul(factor).min(max);
    ceiling / 2 + (ceiling / 2).mul_f64(jitter.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(30))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn backoff_grows_is_capped_and_honours_retry_after() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        assert_eq!(
            retry_delay(1, None, base, max, 0.0),
            Duration::from_millis(50)
        );
        assert_eq!(
            retry_delay(1, None, base, max, 1.0),
            Duration::from_millis(100)
        );
        assert_eq!(
            retry_delay(3, None, base, max, 1.0),
            Duration::from_millis(400)
        );
        assert_eq!(retry_delay(30, None, base, max, 1.0), max);
        let jittered = retry_delay(2, None, base, max, 0.5);
        assert!(jittered >= Duration::from_millis(100) && jittered <= Duration::from_millis(200));
        assert_eq!(
            retry_delay(1, Some(Duration::from_millis(700)), base, max, 0.9),
            Duration::from_millis(700)
        );
        assert_eq!(
            retry_delay(1, Some(Duration::from_secs(120)), base, max, 0.0),
            max
        );
    }
}
