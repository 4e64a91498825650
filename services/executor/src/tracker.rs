//! The issue tracker, in the GitHub REST API's shape: `POST
//! /repos/{owner}/{repo}/issues` creates, `GET /repos/{owner}/{repo}/issues`
//! lists (newest first) for the lookup that makes a retry find the issue an
//! earlier attempt created. The base URL is configurable (GitHub
//! Enterprise: `https://ghe.example/api/v3`; compatible servers).
//!
//! The token goes into the `Authorization` header and nowhere else:
//! redirects are not followed (a redirect would carry it elsewhere), and
//! error messages name the status and the tracker's own message, never a
//! header.

use std::time::Duration;

use serde::Deserialize;
use zopu_llm::ApiKey;

/// Longest tracker answer read (a page of 100 issues of long bodies fits).
const RESPONSE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Issues per listing page (GitHub's maximum).
const PAGE_SIZE: u32 = 100;

/// An issue on the tracker.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Issue {
    pub number: u64,
    pub html_url: String,
    #[serde(default)]
    pub body: Option<String>,
    /// Set on pull requests, which GitHub's issue listing includes.
    #[serde(default)]
    pub pull_request: Option<serde_json::Value>,
}

/// Why a tracker call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrackerError {
    /// Worth another attempt: the network, a timeout, 429 or a 5xx.
    #[error("{0}")]
    Transient(String),
    /// Another attempt cannot help: refused (401, 403, 404, 422) or an
    /// answer that is not an issue.
    #[error("{0}")]
    Refused(String),
}

/// A client of one tracker.
#[derive(Debug, Clone)]
pub struct Tracker {
    http: reqwest::Client,
    base_url: String,
}

impl Tracker {
    pub fn new(base_url: &str, request_timeout: Duration) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("zopu-executor/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| format!("cannot build the tracker's HTTP client: {error}"))?;
        Ok(Self {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
        })
    }

    /// `{base}/repos/{owner}/{repo}/issues`; `repository` is a checked
    /// `owner/name` ([`zopu_schema::approval::is_repository_slug`]).
    pub fn issues_url(&self, repository: &str) -> String {
        format!("{}/repos/{repository}/issues", self.base_url)
    }

    /// The oldest issue (not a pull request) updated since `since` (RFC
    /// 3339) among the first `pages` listing pages whose body holds
    /// `marker`: an earlier attempt for the same approval created it after
    /// the grant, so it was updated since.
    pub async fn find(
        &self,
        token: &ApiKey,
        repository: &str,
        marker: &str,
        (since, pages): (&str, u32),
    ) -> Result<Option<Issue>, TrackerError> {
        for page in 1..=pages {
            let request = self.http.get(self.issues_url(repository)).query(&[
                ("state", "all".to_owned()),
                ("since", since.to_owned()),
                ("sort", "created".to_owned()),
                ("direction", "asc".to_owned()),
                ("per_page", PAGE_SIZE.to_string()),
                ("page", page.to_string()),
            ]);
            let issues: Vec<Issue> = self.send(request, token, "listing the issues").await?;
            let full = issues.len() >= PAGE_SIZE as usize;
            if let Some(found) = issues.into_iter().find(|issue| {
                issue.pull_request.is_none()
                    && issue
                        .body
                        .as_deref()
                        .is_some_and(|body| body.contains(marker))
            }) {
                return Ok(Some(found));
            }
            if !full {
                break;
            }
        }
        Ok(None)
    }

    /// Creates the issue.
    pub async fn create(
        &self,
        token: &ApiKey,
        repository: &str,
        body: &serde_json::Value,
    ) -> Result<Issue, TrackerError> {
        let request = self.http.post(self.issues_url(repository)).json(body);
        self.send(request, token, "creating the issue").await
    }

    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        token: &ApiKey,
        doing: &str,
    ) -> Result<T, TrackerError> {
        let response = request
            .bearer_auth(token.expose())
            .header("Accept", "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28")
            .send()
            .await
            .map_err(|error| {
                let text = format!("{doing}: the tracker did not answer ({})", describe(&error));
                if error.is_builder() {
                    TrackerError::Refused(text)
                } else {
                    TrackerError::Transient(text)
                }
            })?;
        let status = response.status();
        let rate_limited = response.headers().contains_key("retry-after")
            || response
                .headers()
                .get("x-ratelimit-remaining")
                .is_some_and(|remaining| remaining.as_bytes() == b"0");
        let bytes = read_capped(response).await.map_err(|error| {
            TrackerError::Transient(format!(
                "{doing}: reading the tracker's answer failed ({error})"
            ))
        })?;
        if !status.is_success() {
            let message = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|value| {
                    value
                        .get("message")
                        .and_then(|m| m.as_str())
                        .map(str::to_owned)
                })
                .unwrap_or_default();
            let text = format!(
                "{doing}: the tracker answered {status}{}",
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", scrub(&message, token))
                }
            );
            return Err(if is_transient(status.as_u16(), rate_limited) {
                TrackerError::Transient(text)
            } else {
                TrackerError::Refused(text)
            });
        }
        // A 2xx that does not read as the API's answer is retried: after a
        // create, the issue may exist, and the next attempt's lookup finds it.
        serde_json::from_slice(&bytes).map_err(|error| {
            TrackerError::Transient(format!(
                "{doing}: the tracker's answer ({status}) is not what the API returns: {error}"
            ))
        })
    }
}

/// Whether a failed status is worth another attempt: 408, 429, 5xx, and a
/// 403 that is GitHub's rate limit (`Retry-After` or no requests remaining).
pub fn is_transient(status: u16, rate_limited: bool) -> bool {
    matches!(status, 408 | 429 | 500..=599) || (status == 403 && rate_limited)
}

/// A tracker's message as it may be logged and stored: clipped, the token
/// removed wherever it was echoed, anything secret-looking redacted.
fn scrub(message: &str, token: &ApiKey) -> String {
    let clipped = zopu_runtime::text::clip_chars(message, 300);
    let without_token = if token.expose().is_empty() {
        clipped
    } else {
        clipped.replace(token.expose(), "[redacted]")
    };
    zopu_secrets::redact(&without_token)
}

/// A transport error without its URL's query or anything from the request.
fn describe(error: &reqwest::Error) -> &'static str {
    if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "connection failed"
    } else if error.is_redirect() {
        "redirected"
    } else {
        "transport error"
    }
}

async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| describe(&error).to_owned())?
    {
        if body.len() + chunk.len() > RESPONSE_BYTES_MAX {
            return Err(format!("longer than {RESPONSE_BYTES_MAX} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Checks an issue the tracker returned: a positive number and an
/// `http(s)` page URL.
pub fn checked(issue: Issue) -> Result<Issue, TrackerError> {
    let url_ok = (issue.html_url.starts_with("https://") || issue.html_url.starts_with("http://"))
        && issue.html_url.len() <= 2048
        && !issue
            .html_url
            .chars()
            .any(|c| c.is_control() || c.is_whitespace());
    if issue.number == 0 || !url_ok {
        return Err(TrackerError::Transient(
            "the tracker's issue has no number or no http(s) html_url".into(),
        ));
    }
    Ok(issue)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_failures_are_the_ones_worth_retrying() {
        for status in [408, 429, 500, 502, 503] {
            assert!(is_transient(status, false), "{status}");
        }
        assert!(is_transient(403, true), "GitHub's rate limit");
        for status in [400, 401, 403, 404, 410, 422] {
            assert!(!is_transient(status, false), "{status}");
        }
    }

    #[test]
    fn an_echoed_token_never_reaches_a_message() {
        let token = ApiKey::new("tok_0123456789abcdefXYZ");
        let text = scrub("bad credentials: Bearer tok_0123456789abcdefXYZ", &token);
        assert!(!text.contains("tok_0123456789abcdefXYZ"), "{text}");
    }

    #[test]
    fn an_issue_the_tracker_returns_is_checked() {
        let issue = |number, html_url: &str| Issue {
            number,
            html_url: html_url.into(),
            body: None,
            pull_request: None,
        };
        assert!(checked(issue(7, "https://github.com/a/b/issues/7")).is_ok());
        assert!(checked(issue(0, "https://github.com/a/b/issues/0")).is_err());
        assert!(checked(issue(7, "javascript:alert(1)")).is_err());
        assert!(
            checked(issue(7, "https://x/\nEvil")).is_err(),
            "a control character"
        );
    }
}
