use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::Error;

/// Environment variable the API key is read from unless configured otherwise.
pub const DEFAULT_API_KEY_ENV: &str = "ZOPU_LLM_API_KEY";

const REQUEST_TIMEOUT_MAX: Duration = Duration::from_secs(600);
const MAX_RETRIES_MAX: u32 = 10;
const MAX_RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;
const KEY_FILE_BYTES_MAX: u64 = 8 * 1024;

/// A secret API key. `Debug` and `Display` print `***`; only [`ApiKey::expose`] reveals it.
/// Deliberately not `Serialize`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key itself, for the `Authorization` header and nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// An in-process key that can be swapped while the client runs (e.g. by a secrets watcher).
#[derive(Clone)]
pub struct RotatingKey(Arc<RwLock<ApiKey>>);

impl RotatingKey {
    pub fn new(key: ApiKey) -> Self {
        Self(Arc::new(RwLock::new(key)))
    }

    /// Replace the key; the next attempt of any client sharing this handle uses it.
    pub fn rotate(&self, key: ApiKey) {
        *self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = key;
    }

    pub fn current(&self) -> ApiKey {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl fmt::Debug for RotatingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RotatingKey(***)")
    }
}

/// Where the key comes from. It is read again before every HTTP attempt, so rotating the key
/// (new environment value, rewritten file, [`RotatingKey::rotate`]) needs no restart.
#[derive(Clone, Debug)]
pub enum KeySource {
    /// Name of an environment variable.
    Env(String),
    /// A file holding the key (surrounding whitespace is trimmed), e.g. a mounted secret.
    File(PathBuf),
    /// A handle shared with whoever rotates the key.
    Rotating(RotatingKey),
    /// No `Authorization` header, for local endpoints that need no key.
    Unauthenticated,
}

impl Default for KeySource {
    fn default() -> Self {
        KeySource::Env(DEFAULT_API_KEY_ENV.to_owned())
    }
}

impl KeySource {
    /// The current key, `None` for [`KeySource::Unauthenticated`]. Errors name the source, never
    /// its contents.
    pub async fn load(&self) -> Result<Option<ApiKey>, Error> {
        let key = match self {
            KeySource::Unauthenticated => return Ok(None),
            KeySource::Rotating(handle) => handle.current(),
            KeySource::Env(name) => match std::env::var(name) {
                Ok(value) => ApiKey::new(value.trim()),
                Err(std::env::VarError::NotPresent) => {
                    return Err(unavailable(format!(
                        "environment variable {name} is not set"
                    )));
                }
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(unavailable(format!(
                        "environment variable {name} is not UTF-8"
                    )));
                }
            },
            KeySource::File(path) => {
                let shown = path.display();
                let metadata = tokio::fs::metadata(path).await.map_err(|error| {
                    unavailable(format!("cannot read key file {shown}: {error}"))
                })?;
                if metadata.len() > KEY_FILE_BYTES_MAX {
                    return Err(unavailable(format!(
                        "key file {shown} is larger than {KEY_FILE_BYTES_MAX} bytes"
                    )));
                }
                let text = tokio::fs::read_to_string(path).await.map_err(|error| {
                    unavailable(format!("cannot read key file {shown}: {error}"))
                })?;
                ApiKey::new(text.trim())
            }
        };
        if key.expose().is_empty() {
            return Err(unavailable(format!(
                "{} holds an empty key",
                self.describe()
            )));
        }
        Ok(Some(key))
    }

    fn describe(&self) -> String {
        match self {
            KeySource::Env(name) => format!("environment variable {name}"),
            KeySource::File(path) => format!("key file {}", path.display()),
            KeySource::Rotating(_) => "the rotating key".to_owned(),
            KeySource::Unauthenticated => "no key source".to_owned(),
        }
    }
}

fn unavailable(reason: String) -> Error {
    Error::ApiKeyUnavailable { reason }
}

/// Settings of the OpenAI-compatible client. `Debug` is safe to log: the key source prints only
/// its name.
#[derive(Clone, Debug)]
pub struct OpenAiConfig {
    /// Base of the API, e.g. `https://api.openai.com/v1`; `/chat/completions` is appended.
    pub base_url: String,
    pub model: String,
    pub key_source: KeySource,
    /// Recorded in replies as `provider_label`.
    pub label: String,
    /// Limit on one HTTP attempt, body included: the upper bound of the timeout that follows
    /// the server's measured speed (until it is measured, the timeout).
    pub request_timeout: Duration,
    /// Retries after the first attempt (so at most `max_retries + 1` calls).
    pub max_retries: u32,
    /// First backoff; doubles per retry, with jitter.
    pub backoff_base: Duration,
    /// Cap on any backoff, including a server's `Retry-After`.
    pub backoff_max: Duration,
    /// Cap on a response body; reading stops past it.
    pub max_response_bytes: usize,
    /// The model's context window in tokens, which prompts and completion budgets are fitted
    /// to; 0: read it from the server (`/models` `meta.n_ctx`, or llama.cpp's `/props`), and
    /// fit nothing when it does not say.
    pub context_tokens: u32,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".to_owned(),
            model: "gpt-4o-mini".to_owned(),
            key_source: KeySource::default(),
            label: "openai".to_owned(),
            request_timeout: Duration::from_secs(60),
            max_retries: 3,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            max_response_bytes: 4 * 1024 * 1024,
            context_tokens: 0,
        }
    }
}

impl OpenAiConfig {
    /// Checks every setting; the error names the first bad one.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |field: &'static str, reason: String| Err(Error::InvalidConfig { field, reason });
        let url = match reqwest::Url::parse(&self.base_url) {
            Ok(url) => url,
            Err(error) => return bad("base_url", format!("not a URL: {error}")),
        };
        if !matches!(url.scheme(), "http" | "https") {
            return bad(
                "base_url",
                format!("scheme must be http or https, not {}", url.scheme()),
            );
        }
        if !url.username().is_empty() || url.password().is_some() {
            return bad(
                "base_url",
                "must not carry credentials; use key_source".to_owned(),
            );
        }
        if url.query().is_some() || url.fragment().is_some() {
            return bad("base_url", "must not have a query or fragment".to_owned());
        }
        if self.model.trim().is_empty() {
            return bad("model", "must not be empty".to_owned());
        }
        if self.label.trim().is_empty() {
            return bad("label", "must not be empty".to_owned());
        }
        if let KeySource::Env(name) = &self.key_source
            && (name.is_empty() || name.contains(['=', '\0']))
        {
            return bad(
                "key_source",
                format!("{name:?} is not a valid environment variable name"),
            );
        }
        if self.request_timeout.is_zero() || self.request_timeout > REQUEST_TIMEOUT_MAX {
            return bad(
                "request_timeout",
                format!("must be within (0, {REQUEST_TIMEOUT_MAX:?}]"),
            );
        }
        if self.max_retries > MAX_RETRIES_MAX {
            return bad("max_retries", format!("must be at most {MAX_RETRIES_MAX}"));
        }
        if self.backoff_base.is_zero() {
            return bad("backoff_base", "must be greater than zero".to_owned());
        }
        if self.backoff_max < self.backoff_base {
            return bad("backoff_max", "must be at least backoff_base".to_owned());
        }
        if self.max_response_bytes == 0 || self.max_response_bytes > MAX_RESPONSE_BYTES_MAX {
            return bad(
                "max_response_bytes",
                format!("must be within [1, {MAX_RESPONSE_BYTES_MAX}]"),
            );
        }
        Ok(())
    }

    pub(crate) fn completions_url(&self) -> String {
        format!("{}/chat/completions", self.base_url.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_bad_field() {
        let base = OpenAiConfig::default();
        assert!(base.validate().is_ok());
        let cases: Vec<(&str, OpenAiConfig)> = vec![
            (
                "base_url",
                OpenAiConfig {
                    base_url: "not a url".into(),
                    ..base.clone()
                },
            ),
            (
                "base_url",
                OpenAiConfig {
                    base_url: "ftp://x/v1".into(),
                    ..base.clone()
                },
            ),
            (
                "base_url",
                OpenAiConfig {
                    base_url: "https://u:p@x/v1".into(),
                    ..base.clone()
                },
            ),
            (
                "model",
                OpenAiConfig {
                    model: " ".into(),
                    ..base.clone()
                },
            ),
            (
                "label",
                OpenAiConfig {
                    label: String::new(),
                    ..base.clone()
                },
            ),
            (
                "key_source",
                OpenAiConfig {
                    key_source: KeySource::Env(String::new()),
                    ..base.clone()
                },
            ),
            (
                "request_timeout",
                OpenAiConfig {
                    request_timeout: Duration::ZERO,
                    ..base.clone()
                },
            ),
            (
                "max_retries",
                OpenAiConfig {
                    max_retries: 99,
                    ..base.clone()
                },
            ),
            (
                "backoff_base",
                OpenAiConfig {
                    backoff_base: Duration::ZERO,
                    ..base.clone()
                },
            ),
            (
                "backoff_max",
                OpenAiConfig {
                    backoff_max: Duration::from_millis(1),
                    ..base.clone()
                },
            ),
            (
                "max_response_bytes",
                OpenAiConfig {
                    max_response_bytes: 0,
                    ..base.clone()
                },
            ),
        ];
        for (expected, config) in cases {
            match config.validate() {
                Err(Error::InvalidConfig { field, .. }) => assert_eq!(field, expected),
                other => panic!("{expected}: expected InvalidConfig, got {other:?}"),
            }
        }
    }

    #[test]
    fn key_never_prints() {
        let key = ApiKey::new("sk-secret-123");
        let handle = RotatingKey::new(key.clone());
        let config = OpenAiConfig {
            key_source: KeySource::Rotating(handle),
            ..Default::default()
        };
        for shown in [
            format!("{key:?}"),
            format!("{key}"),
            format!("{config:?}"),
            format!("{config:#?}"),
        ] {
            assert!(!shown.contains("sk-secret"), "{shown}");
        }
    }

    #[test]
    fn completions_url_joins_cleanly() {
        let config = OpenAiConfig {
            base_url: "http://h:1/v1/".into(),
            ..Default::default()
        };
        assert_eq!(config.completions_url(), "http://h:1/v1/chat/completions");
    }
}
