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

/// Longest tracker answer read.
const RESPONSE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Issues per listing page (GitHub's maximum).
const PAGE_SIZE: u32 = 100;

/// An issue on the tracker.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Issue {
    pub number: u64,
    pub html_url: String,
    #[serde(default)]
    pub body: Option<String>,
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

    /// The newest issue among the first `pages` listing pages whose body
    /// holds `marker`.
    pub async fn find(
        &self,
        token: &ApiKey,
        repository: &str,
        marker: &str,
        pages: u32,
    ) -> Result<Option<Issue>, TrackerError> {
        for page in 1..=pages {
            let request = self
                .http
                .get(self.issues_url(repository))
                .query(&[
                    ("state", "all".to_owned()),
                    ("sort", "created".to_owned()),
                    ("direction", "desc".to_owned()),
                    ("per_page", PAGE_SIZE.to_string()),
                    ("page", page.to_string()),
                ]);
            let issues: Vec<Issue> = self.send(request, token, "listing the issues").await?;
            let full = issues.len() >= PAGE_SIZE as usize;
            if let Some(found) = issues
                .into_iter()
                .find(|issue| issue.body.as_deref().is_some_and(|body| body.contains(marker)))
            {
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
                TrackerError::Transient(format!(
                    "{doing}: the tracker did not answer ({})",
                    describe(&error)
                ))
            })?;
        let status = response.status();
        let bytes = read_capped(response).await.map_err(|error| {
            TrackerError::Transient(format!("{doing}: reading the tracker's answer failed ({error})"))
        })?;
        if !status.is_success() {
            let message = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|value| value.get("message").and_then(|m| m.as_str()).map(str::to_owned))
                .unwrap_or_default();
            let text = format!(
                "{doing}: the tracker answered {status}{}",
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", zopu_core::text::clip_chars(&message, 300))
                }
            );
            let transient = status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408;
            return Err(if transient {
                TrackerError::Transient(text)
            } else {
                TrackerError::Refused(text)
            });
        }
        serde_json::from_slice(&bytes).map_err(|error| {
            TrackerError::Refused(format!("{doing}: the tracker's answer ({status}) is not what the API returns: {error}"))
        })
    }
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
    while let Some(chunk) = response.chunk().await.map_err(|error| describe(&error).to_owned())? {
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
        && !issue.html_url.chars().any(|c| c.is_control() || c.is_whitespace());
    if issue.number == 0 || !url_ok {
        return Err(TrackerError::Refused(
            "the tracker's issue has no number or no http(s) html_url".into(),
        ));
    }
    Ok(issue)
}
