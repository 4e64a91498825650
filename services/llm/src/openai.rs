//! OpenAI-compatible chat-completions client: one POST per attempt, a timeout on each attempt,
//! bounded retries with exponential backoff and jitter (honouring `Retry-After`), a cap on the
//! body size and strict validation of the reply.

mod capacity;
mod config;
mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rand::Rng;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};

pub use config::{ApiKey, DEFAULT_API_KEY_ENV, KeySource, OpenAiConfig, RotatingKey};

use crate::chat::{ChatReply, ChatRequest};
use crate::{BoxFuture, Error, Provider};

/// Characters of an error body kept in [`Error::Status`].
const BODY_EXCERPT_MAX_CHARS: usize = 300;
/// Upper bound on connection set-up, below the per-attempt timeout.
const CONNECT_TIMEOUT_MAX: Duration = Duration::from_secs(10);
/// Limit of one request that reads the server's context window.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest model-supplied name copied into an error.
const NAME_IN_ERROR_MAX_CHARS: usize = 64;

/// A provider speaking the OpenAI chat-completions protocol (OpenAI, Azure-compatible proxies,
/// vLLM, Ollama, LiteLLM, ...). Cheap to clone.
///
/// Requests asking for [`crate::Structured`] output go out with `response_format` (a strict
/// JSON schema) until the server refuses it once with a 400 naming it; from then on this client
/// (and its clones) sends them as plain tool-calling requests, which the log says once. Prompts
/// and completion budgets are fitted to the server's context window and measured speed
/// (`capacity`), and each attempt's timeout follows that speed, never past `request_timeout`.
#[derive(Clone, Debug)]
pub struct OpenAiProvider {
    config: OpenAiConfig,
    http: reqwest::Client,
    learned: Arc<Learned>,
}

/// What the client learned about its server; shared by clones.
#[derive(Debug, Default)]
struct Learned {
    capacity: capacity::Capacity,
    /// The server refused `response_format` with a JSON schema.
    structured_refused: AtomicBool,
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
        Ok(Self {
            config,
            http,
            learned: Arc::default(),
        })
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The server's context window in tokens: `context_tokens` when configured, else what the
    /// server reported (read once), else `None`.
    pub fn context_tokens(&self) -> Option<u32> {
        match self.config.context_tokens {
            0 => self.learned.capacity.known_context(),
            configured => Some(configured),
        }
    }

    /// Whether the server refused structured output (and requests go without it).
    pub fn structured_refused(&self) -> bool {
        self.learned.structured_refused.load(Ordering::Relaxed)
    }

    /// Sends `request`, retrying transient failures; see the module docs.
    pub async fn complete(&self, request: ChatRequest) -> Result<ChatReply, Error> {
        request.validate()?;
        let mut request = request;
        if self.structured_refused() {
            request.structured = None;
        }
        let context = match self.config.context_tokens {
            0 => self.learned.capacity.context(self.discover_context()).await,
            configured => Some(configured),
        };
        let model = self.config.model.clone();
        let prompt_chars = move |request: &ChatRequest| prompt_chars(&model, request);
        let fitted = self.learned.capacity.fit(
            &mut request,
            context,
            self.config.request_timeout,
            &prompt_chars,
        );
        if fitted.clipped > 0 {
            tracing::info!(
                provider = %self.config.label,
                clipped = fitted.clipped,
                context_tokens = context.unwrap_or_default(),
                max_tokens = request.max_tokens,
                "model prompt clipped to fit the context window"
            );
        }
        let mut body = wire::request_body(&self.config.model, &request).to_string();
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let started = Instant::now();
            let error = match self.attempt(&body, &request, fitted.timeout).await {
                Ok(parsed) => {
                    self.learned.capacity.observe(
                        prompt_chars(&request),
                        parsed.usage.prompt_tokens,
                        parsed.usage.completion_tokens,
                        parsed.timings,
                        started.elapsed(),
                    );
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
            if request.structured.is_some() && refuses_structured(&error) {
                self.refuse_structured(&error);
                request.structured = None;
                body = wire::request_body(&self.config.model, &request).to_string();
                attempt -= 1;
                continue;
            }
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

    /// Remembers that the server refuses structured output; the first time, says so.
    fn refuse_structured(&self, error: &Error) {
        if !self
            .learned
            .structured_refused
            .swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                provider = %self.config.label,
                model = %self.config.model,
                %error,
                "the model server refuses response_format with a JSON schema; asking without it (tool calls and prompting) from now on"
            );
        }
    }

    /// Reads the context window from the server: the OpenAI-compatible `/models` listing, then
    /// llama.cpp's `/props`. `Err` when the server could not be reached (tried again later).
    async fn discover_context(&self) -> Result<Option<u32>, ()> {
        let base = self.config.base_url.trim_end_matches('/');
        let models = self.get_json(&format!("{base}/models")).await?;
        if let Some(tokens) = capacity::context_of(models.as_ref(), None, &self.config.model) {
            return Ok(Some(tokens));
        }
        let origin = base.strip_suffix("/v1").unwrap_or(base);
        let props = self.get_json(&format!("{origin}/props")).await?;
        let tokens = capacity::context_of(None, props.as_ref(), &self.config.model);
        tracing::info!(
            provider = %self.config.label,
            context_tokens = tokens.unwrap_or_default(),
            "model context window read from the server (0: it does not say)"
        );
        Ok(tokens)
    }

    /// A small JSON document from the server: `Ok(None)` for any answer that is not one.
    async fn get_json(&self, url: &str) -> Result<Option<serde_json::Value>, ()> {
        let key = self.config.key_source.load().await.ok().flatten();
        let mut builder = self.http.get(url).timeout(DISCOVERY_TIMEOUT);
        if let Some(key) = &key
            && let Ok(value) = bearer(key)
        {
            builder = builder.header(AUTHORIZATION, value);
        }
        let Ok(mut response) = builder.send().await else {
            return Err(());
        };
        if !response.status().is_success() {
            return Ok(None);
        }
        let limit = self.config.max_response_bytes.min(1024 * 1024);
        let bytes = read_capped(&mut response, limit, DISCOVERY_TIMEOUT)
            .await
            .map_err(|_| ())?;
        Ok(serde_json::from_slice(&bytes).ok())
    }

    /// One HTTP exchange under the per-attempt timeout.
    async fn attempt(
        &self,
        body: &str,
        request: &ChatRequest,
        timeout: Duration,
    ) -> Result<wire::Parsed, Error> {
        let key = self.config.key_source.load().await?;
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

/// The size of what a request puts in the prompt: its body without the schema (a server
/// enforces the schema, it does not show it to the model).
fn prompt_chars(model: &str, request: &ChatRequest) -> usize {
    let mut body = wire::request_body(model, request);
    if let Some(object) = body.as_object_mut() {
        object.remove("response_format");
    }
    body.to_string().len()
}

/// A 400 that names `response_format` (or its JSON schema): the server does not take it.
fn refuses_structured(error: &Error) -> bool {
    matches!(error, Error::Status { status: 400, body_excerpt, .. }
        if body_excerpt.contains("response_format") || body_excerpt.contains("json_schema"))
}

/// A name the model wrote, clipped for an error.
pub(crate) fn clip_name(name: &str) -> String {
    wire::clip(name, NAME_IN_ERROR_MAX_CHARS)
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
