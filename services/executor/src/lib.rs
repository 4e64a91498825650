//! The execution layer (`zopu run executor`): carries out an approved
//! action once a human granted it, and records its one outcome.
//!
//! Agents recommend and never act: an effect outside the runtime starts as
//! an `approval.requested` with the proposed action and its parameters. This
//! service consumes `approval.granted` and executes exactly the parameters
//! that were approved. The first action is [`PUBLISH_ISSUE`]: the drafted
//! issue is created on the tracker (GitHub's REST API shape, base URL
//! configurable) and recorded as `tracker.issue.created` with its URL.
//!
//! Invariants:
//! - Nothing executes without an `approval.granted` that is the approval's
//!   first decision, made before its expiry (the projection folds the
//!   decisions as every reader does); anything else is refused visibly
//!   (`executor.not_granted`).
//! - At most one outcome per approval: `execution.dry_run`,
//!   `execution.failed` and `tracker.issue.created` share the key
//!   [`keys::approval_execution`], and an approval already executed is
//!   skipped on redelivery or replay.
//! - One issue per approval on the tracker, even when the executor dies
//!   between the tracker's answer and storing the event: the issue's body
//!   carries [`approval::issue_marker`], and every attempt first looks the
//!   marker up among the issues updated since shortly before the grant (a
//!   found issue is recorded with `found_existing`). What this cannot
//!   close: two instances creating at the same instant (one partition is
//!   worked by one instance at a time, so only a stalled owner whose lease
//!   expired mid-request can), and a tracker whose listing lags its creates.
//! - Dry-run is the default (`executor.dry_run = true`): the request it
//!   would have sent is recorded (`execution.dry_run`: method, URL, body)
//!   and nothing is sent. An approval requested in dry-run
//!   (`conversation.dry_run`) also executes as a dry run.
//! - The kill switch holds here too: a grant for a project whose agent is
//!   disabled ends as `execution.failed` (`executor.kill_switch`), nothing
//!   sent.
//! - Bounded retries: a transient tracker failure (network, timeout, 408,
//!   429, 5xx, GitHub's 403 rate limit, an unreadable 2xx) is retried
//!   `max_attempts` times with doubling backoff, each attempt looking the
//!   marker up first; past them (or without a token) the grant goes back to
//!   the reaction, which retries it later and, past `max_deliver`, records
//!   `execution.failed` (`executor.gave_up`). A refusal (401, 403, 404, 422)
//!   ends at once as `execution.failed` (`executor.tracker_refused`).
//! - The token is read from the environment variable (or file) named in
//!   config, checked at start in real mode, and sent only in the
//!   `Authorization` header; it never enters an event or a log line.

mod state;
pub mod tracker;

use std::time::Duration;

use zopu_llm::{ApiKey, KeySource};
use zopu_runtime::config::{ConfigError, CoreConfig};
use zopu_runtime::{HandlerError, NewEvent, Reaction, ReactionConfig, ReactionContext, Shutdown};
use zopu_schema::approval::{self, PUBLISH_ISSUE, PublishIssue};
use zopu_schema::{Envelope, Event, keys, pb, subjects};

pub use state::ExecutorState;
use tracker::{Tracker, TrackerError};

/// Service name (`zopu/executor`, `executor.sqlite`).
pub const SERVICE: &str = "executor";

/// Default tracker API (GitHub).
pub const DEFAULT_TRACKER_URL: &str = "https://api.github.com";
/// Default environment variable holding the tracker token.
pub const DEFAULT_TOKEN_ENV: &str = "GITHUB_TOKEN";

/// Settings of the executor (`[executor]`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Record what an approved action would do instead of doing it.
    pub dry_run: bool,
    pub tracker: TrackerConfig,
    /// Tracker requests per approval before it fails (transient failures only).
    pub max_attempts: u32,
    /// Wait before the second attempt; doubles per attempt.
    #[serde(with = "zopu_runtime::config::duration")]
    pub retry_backoff: Duration,
    /// Granted approvals in flight across projects.
    pub max_ack_pending: i64,
    /// Deliveries of one grant before it is dead-lettered.
    pub max_deliver: i64,
    /// Upper bound of executing one approval (every attempt included).
    #[serde(with = "zopu_runtime::config::duration")]
    pub handler_timeout: Duration,
}

/// The tracker issues are published to (`[executor.tracker]`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrackerConfig {
    /// The REST API's base: `https://api.github.com`, or GitHub
    /// Enterprise's `https://<host>/api/v3`. `http://` only on loopback.
    pub base_url: String,
    /// The environment variable holding the token.
    pub token_env: String,
    /// A file holding the token instead (a mounted secret); wins over `token_env`.
    pub token_file: String,
    /// Limit on one tracker request.
    #[serde(with = "zopu_runtime::config::duration")]
    pub request_timeout: Duration,
    /// Listing pages (100 issues each, newest first) searched for an
    /// earlier attempt's issue before creating one.
    pub lookup_pages: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            dry_run: true,
            tracker: TrackerConfig::default(),
            max_attempts: 3,
            retry_backoff: Duration::from_secs(1),
            max_ack_pending: 64,
            max_deliver: 10,
            handler_timeout: Duration::from_secs(600),
        }
    }
}

impl Default for TrackerConfig {
    fn default() -> Self {
        Self {
            base_url: DEFAULT_TRACKER_URL.into(),
            token_env: DEFAULT_TOKEN_ENV.into(),
            token_file: String::new(),
            request_timeout: Duration::from_secs(30),
            lookup_pages: 3,
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.reaction().validate(SERVICE)?;
        if !(1..=10).contains(&self.max_attempts) {
            return Err(ConfigError::setting(
                "executor.max_attempts",
                "must be between 1 and 10",
            ));
        }
        if self.retry_backoff > Duration::from_secs(60) {
            return Err(ConfigError::setting(
                "executor.retry_backoff",
                "must be at most 1m",
            ));
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&self.handler_timeout) {
            return Err(ConfigError::setting(
                "executor.handler_timeout",
                "must be between 1s and 1h",
            ));
        }
        let tracker = &self.tracker;
        check_base_url(&tracker.base_url)
            .map_err(|reason| ConfigError::setting("executor.tracker.base_url", reason))?;
        let worst = self.worst_case();
        if worst > self.handler_timeout {
            return Err(ConfigError::setting(
                "executor.handler_timeout",
                format!(
                    "must cover every attempt: max_attempts × (lookup_pages + 1) × tracker.request_timeout plus the backoffs is {}s",
                    worst.as_secs()
                ),
            ));
        }
        if tracker.token_file.is_empty() && tracker.token_env.trim().is_empty() {
            return Err(ConfigError::setting(
                "executor.tracker.token_env",
                "names no environment variable (and executor.tracker.token_file is empty)",
            ));
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&tracker.request_timeout) {
            return Err(ConfigError::setting(
                "executor.tracker.request_timeout",
                "must be between 1s and 10m",
            ));
        }
        if !(1..=20).contains(&tracker.lookup_pages) {
            return Err(ConfigError::setting(
                "executor.tracker.lookup_pages",
                "must be between 1 and 20",
            ));
        }
        Ok(())
    }

    /// The longest one approval's attempts can take.
    fn worst_case(&self) -> Duration {
        let requests = self.max_attempts * (self.tracker.lookup_pages + 1);
        let backoffs = (1..self.max_attempts).fold(Duration::ZERO, |sum, n| {
            sum + self.retry_backoff.saturating_mul(1 << (n - 1))
        });
        self.tracker.request_timeout.saturating_mul(requests) + backoffs
    }

    /// The key naming where the token comes from.
    fn token_key(&self) -> &'static str {
        if self.tracker.token_file.is_empty() {
            "executor.tracker.token_env"
        } else {
            "executor.tracker.token_file"
        }
    }

    /// The consumer of granted approvals.
    pub fn reaction(&self) -> ReactionConfig {
        ReactionConfig {
            max_ack_pending: self.max_ack_pending,
            max_deliver: self.max_deliver,
            handler_timeout: self.handler_timeout,
            ..ReactionConfig::new(
                subjects::durable(SERVICE, "grants"),
                vec![subjects::events_of_type(pb::ApprovalGranted::TYPE)],
            )
        }
    }

    fn key_source(&self) -> KeySource {
        if self.tracker.token_file.is_empty() {
            KeySource::Env(self.tracker.token_env.trim().to_owned())
        } else {
            KeySource::File(self.tracker.token_file.clone().into())
        }
    }
}

/// `https://…`, or `http://` to a loopback host (a token never crosses a
/// network in clear text); no credentials, query or fragment.
fn check_base_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|error| format!("not a URL: {error}"))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(
            "must not carry credentials (the token comes from executor.tracker.token_env)".into(),
        );
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err("must not have a query or fragment".into());
    }
    let Some(host) = parsed.host_str() else {
        return Err("names no host".into());
    };
    let loopback = host == "localhost"
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        "http" => Err("must be https:// (http:// only to a loopback host)".into()),
        other => Err(format!("scheme must be https, not {other}")),
    }
}

/// What can stop the executor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Core(#[from] zopu_runtime::Error),
    #[error("{0}")]
    Tracker(String),
}

/// Runs the executor until `shutdown`.
pub async fn run(core: CoreConfig, config: Config, shutdown: Shutdown) -> Result<(), Error> {
    config.validate()?;
    let key_source = config.key_source();
    if !config.dry_run {
        // Real mode needs its token now, not at the first approval.
        key_source.load().await.map_err(|error| {
            ConfigError::setting(
                config.token_key(),
                format!("real mode (executor.dry_run = false) needs the tracker token: {error}"),
            )
        })?;
    }
    let tracker = Tracker::new(&config.tracker.base_url, config.tracker.request_timeout)
        .map_err(Error::Tracker)?;
    let runtime =
        zopu_runtime::Runtime::start_with(SERVICE, &core, shutdown.clone(), ExecutorState).await?;
    tracing::info!(dry_run = config.dry_run, tracker = %config.tracker.base_url, "executor running");
    runtime.spawn_reaction(
        config.reaction(),
        Executor {
            config,
            key_source,
            tracker,
        },
    );
    shutdown.cancelled().await;
    Ok(())
}

/// The reaction: one outcome per granted approval.
#[derive(Debug)]
pub struct Executor {
    config: Config,
    key_source: KeySource,
    tracker: Tracker,
}

/// How an approved action ends.
#[derive(Debug)]
enum Outcome {
    DryRun(pb::ExecutionDryRun),
    Created(pb::TrackerIssueCreated),
    Failed(pb::ExecutionFailed),
}

fn failed(
    approval_id: &str,
    action: &str,
    code: &str,
    message: String,
    attempts: u32,
    retryable: bool,
) -> Outcome {
    Outcome::Failed(failure(
        approval_id,
        action,
        code,
        message,
        attempts,
        retryable,
    ))
}

fn failure(
    approval_id: &str,
    action: &str,
    code: &str,
    message: String,
    attempts: u32,
    retryable: bool,
) -> pb::ExecutionFailed {
    pb::ExecutionFailed {
        approval_id: approval_id.to_owned(),
        action: action.to_owned(),
        reason: Some(pb::FailureReason {
            code: code.to_owned(),
            message: zopu_secrets::redact(&zopu_runtime::text::clip_chars(&message, 500)),
            retryable,
        }),
        attempts,
    }
}

impl Executor {
    async fn execute(
        &self,
        event: &Envelope,
        approval_id: &str,
        ctx: &ReactionContext,
    ) -> Result<Outcome, HandlerError> {
        let (org, project) = (event.org_id.to_string(), event.project_id.to_string());
        let id = approval_id.to_owned();
        let (requested, disabled) = ctx
            .store
            .query(move |conn| {
                Ok((
                    state::requested(conn, &org, &project, &id)?,
                    state::is_disabled(conn, &org, &project)?,
                ))
            })
            .await?;
        let Some(requested) = requested else {
            return Ok(failed(
                approval_id,
                "",
                "executor.unknown_approval",
                "The granted approval was never requested in this project; nothing was done."
                    .into(),
                0,
                false,
            ));
        };
        let action = requested.action.as_str();
        let expired = zopu_schema::envelope::parse_time(&requested.expires_at)
            .is_some_and(|expires| event.time > expires);
        if requested.status != approval::Status::Approved || expired {
            return Ok(failed(
                approval_id,
                action,
                "executor.not_granted",
                format!(
                    "This grant is not the approval's decision (it stands {}); nothing was done.",
                    if expired {
                        "past the expiry".to_owned()
                    } else {
                        format!("as {}", requested.status.as_str())
                    }
                ),
                0,
                false,
            ));
        }
        if disabled {
            return Ok(failed(approval_id, action, "executor.kill_switch",
                "The project's agent is disabled (kill switch); the approved action was not carried out.".into(), 0, false));
        }
        if action != PUBLISH_ISSUE {
            return Ok(failed(
                approval_id,
                action,
                "executor.unknown_action",
                format!(
                    "The executor cannot carry out {action:?}; it knows only {PUBLISH_ISSUE:?}."
                ),
                0,
                false,
            ));
        }
        let parameters = match PublishIssue::parse(&requested.parameters_json) {
            Ok(parameters) => parameters,
            Err(problem) => {
                return Ok(failed(
                    approval_id,
                    action,
                    "executor.invalid_parameters",
                    format!("The approved parameters cannot be published: {problem}."),
                    0,
                    false,
                ));
            }
        };
        let body = serde_json::json!({
            "title": parameters.title,
            "body": format!("{}\n\n{}", parameters.body, approval::issue_marker(approval_id)).trim_start().to_owned(),
        });
        let dry_run_by = if self.config.dry_run {
            Some("executor")
        } else if requested.dry_run {
            Some("request")
        } else {
            None
        };
        if let Some(dry_run_by) = dry_run_by {
            return Ok(Outcome::DryRun(pb::ExecutionDryRun {
                approval_id: approval_id.to_owned(),
                action: action.to_owned(),
                dry_run_by: dry_run_by.into(),
                method: "POST".into(),
                url: self.tracker.issues_url(&parameters.repository),
                body_json: body.to_string(),
            }));
        }
        self.publish(event, approval_id, &parameters, &body, ctx)
            .await
    }

    /// Creates the issue unless an earlier attempt did, retrying transient
    /// failures.
    async fn publish(
        &self,
        granted: &Envelope,
        approval_id: &str,
        parameters: &PublishIssue,
        body: &serde_json::Value,
        ctx: &ReactionContext,
    ) -> Result<Outcome, HandlerError> {
        // Transient: the reaction retries later, and past max_deliver records
        // executor.gave_up.
        let token = match self.key_source.load().await {
            Ok(Some(token)) => token,
            Ok(None) | Err(_) => {
                return Err(HandlerError::Transient(format!(
                    "the tracker token is not available ({}); nothing was sent",
                    self.config.token_key()
                )));
            }
        };
        // An earlier attempt created its issue after the grant, so it was
        // updated since (a margin for clock skew between us and the tracker).
        let since = lookup_since(granted.time);
        let marker = approval::issue_marker(approval_id);
        let repository = parameters.repository.as_str();
        let mut backoff = self.config.retry_backoff;
        let mut last = String::new();
        for attempt in 1..=self.config.max_attempts {
            if attempt > 1 {
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = ctx.shutdown.cancelled() => return Err(HandlerError::Interrupted),
                }
                backoff = backoff.saturating_mul(2);
            }
            match self
                .attempt(&token, repository, (&marker, &since), body, ctx)
                .await?
            {
                Ok((issue, found_existing)) => {
                    tracing::info!(
                        approval_id,
                        repository,
                        number = issue.number,
                        found_existing,
                        "tracker answered: the issue exists"
                    );
                    return Ok(Outcome::Created(pb::TrackerIssueCreated {
                        approval_id: approval_id.to_owned(),
                        artifact_id: parameters.artifact_id.clone(),
                        repository: repository.to_owned(),
                        number: issue.number,
                        url: issue.html_url,
                        found_existing,
                    }));
                }
                Err(TrackerError::Refused(reason)) => {
                    return Ok(failed(
                        approval_id,
                        PUBLISH_ISSUE,
                        "executor.tracker_refused",
                        reason,
                        attempt,
                        false,
                    ));
                }
                Err(TrackerError::Transient(reason)) => {
                    let reason = zopu_secrets::redact(&reason);
                    tracing::warn!(approval_id, attempt, %reason, "tracker attempt failed");
                    last = reason;
                }
            }
        }
        Err(HandlerError::Transient(format!(
            "the tracker failed {} attempts; the last: {last}",
            self.config.max_attempts
        )))
    }

    /// One attempt: the marker's issue if an earlier attempt created it,
    /// else a new one.
    async fn attempt(
        &self,
        token: &ApiKey,
        repository: &str,
        (marker, since): (&str, &str),
        body: &serde_json::Value,
        ctx: &ReactionContext,
    ) -> Result<Result<(tracker::Issue, bool), TrackerError>, HandlerError> {
        let pages = self.config.tracker.lookup_pages;
        match self
            .tracker
            .find(token, repository, marker, (since, pages))
            .await
        {
            Ok(Some(found)) => return Ok(tracker::checked(found).map(|issue| (issue, true))),
            Ok(None) => {}
            Err(error) => return Ok(Err(error)),
        }
        // A stopping instance creates nothing: the grant goes back whole.
        if ctx.shutdown.is_cancelled() {
            return Err(HandlerError::Interrupted);
        }
        Ok(self
            .tracker
            .create(token, repository, body)
            .await
            .and_then(tracker::checked)
            .map(|issue| (issue, false)))
    }
}

/// `since` of the marker lookup: five minutes before the grant, whole
/// seconds (`YYYY-MM-DDTHH:MM:SSZ`, as GitHub documents it).
fn lookup_since(granted: time::OffsetDateTime) -> String {
    let since = (granted - Duration::from_secs(300)).to_offset(time::UtcOffset::UTC);
    let format =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    since.format(&format).unwrap_or_default()
}

impl Reaction for Executor {
    async fn handle(&self, event: &Envelope, ctx: &ReactionContext) -> Result<(), HandlerError> {
        let granted = event.decode::<pb::ApprovalGranted>()?;
        let key = keys::approval_execution(&event.project_id, &granted.approval_id);
        // The request precedes its grant; the kill switch may have flipped since.
        ctx.caught_up_to_end(zopu_runtime::reaction::CATCH_UP_MAX)
            .await?;
        if ctx.store.key_sequence(&key)?.is_some() {
            tracing::debug!(approval_id = %granted.approval_id, "already executed");
            return Ok(());
        }
        let outcome = self.execute(event, &granted.approval_id, ctx).await?;
        let appended = match outcome {
            Outcome::DryRun(dry_run) => {
                tracing::info!(approval_id = %granted.approval_id, url = %dry_run.url, "dry run: recorded, nothing sent");
                ctx.publisher
                    .append(NewEvent::caused_by(&event.context(), &dry_run, key))
                    .await?
            }
            Outcome::Created(created) => {
                ctx.publisher
                    .append(NewEvent::caused_by(&event.context(), &created, key))
                    .await?
            }
            Outcome::Failed(failure) => {
                tracing::warn!(approval_id = %granted.approval_id, reason = ?failure.reason, "execution failed");
                ctx.publisher
                    .append(NewEvent::caused_by(&event.context(), &failure, key))
                    .await?
            }
        };
        tracing::debug!(event = %appended.event_id, duplicate = appended.duplicate, "execution recorded");
        Ok(())
    }

    async fn already_handled(
        &self,
        event: &Envelope,
        ctx: &ReactionContext,
    ) -> Result<bool, HandlerError> {
        let granted = event.decode::<pb::ApprovalGranted>()?;
        Ok(ctx
            .store
            .key_sequence(&keys::approval_execution(
                &event.project_id,
                &granted.approval_id,
            ))?
            .is_some())
    }

    fn failure_event(&self, event: &Envelope, reason: &str) -> Option<NewEvent> {
        let granted = event.decode::<pb::ApprovalGranted>().ok()?;
        let gave_up = failure(
            &granted.approval_id,
            "",
            "executor.gave_up",
            reason.to_owned(),
            0,
            true,
        );
        Some(NewEvent::caused_by(
            &event.context(),
            &gave_up,
            keys::approval_execution(&event.project_id, &granted.approval_id),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names_the_bad_key() {
        assert!(Config::default().validate().is_ok());
        let bad = |change: fn(&mut Config)| {
            let mut config = Config::default();
            change(&mut config);
            config.validate().unwrap_err().to_string()
        };
        assert!(bad(|c| c.max_attempts = 0).contains("executor.max_attempts"));
        assert!(
            bad(|c| c.tracker.base_url = "http://tracker.example".into())
                .contains("executor.tracker.base_url")
        );
        assert!(
            bad(|c| c.tracker.base_url = "https://user:pw@ghe.example".into())
                .contains("executor.tracker.base_url")
        );
        assert!(bad(|c| c.tracker.lookup_pages = 0).contains("executor.tracker.lookup_pages"));
        assert!(bad(|c| c.tracker.token_env = " ".into()).contains("executor.tracker.token_env"));
    }

    #[test]
    fn the_base_url_is_https_or_loopback_http() {
        for ok in [
            "https://api.github.com",
            "https://ghe.example/api/v3",
            "http://127.0.0.1:8080",
            "http://[::1]:9/x",
            "http://localhost:1",
        ] {
            assert!(check_base_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://10.0.0.1",
            "ftp://x",
            "api.github.com",
            "https://h/?q",
            "https://",
        ] {
            assert!(check_base_url(bad).is_err(), "{bad}");
        }
    }
}
