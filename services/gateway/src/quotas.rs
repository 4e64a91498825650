//! Quotas: what one token or one organization may ask of this gateway.
//!
//! Messages and card actions (each may start a model turn) and project
//! creation are rate-limited per token and per organization with token
//! buckets: a bucket holds up to its limit and refills at the limit per
//! period, so a client may burst up to the limit and then continues at the
//! period's pace. A request over a limit is refused with 429 and a
//! `Retry-After` naming when one more would be accepted; nothing is stored
//! for it. Live-timeline streams are capped per token as well as in total.
//! Reads of a project's history (why an event happened, the project as it
//! was), each a replay of the project's events, run at most
//! `gateway.history_reads_max` at once.
//!
//! The counters are this instance's: a deployment of N gateways admits up
//! to N times a limit (set the limits per instance accordingly). They are
//! kept in memory, bounded by [`BUCKETS_MAX`] keys (idle full buckets are
//! dropped first), so a flood of distinct keys cannot grow them without end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;

use crate::http::ApiError;
use crate::tokens::Principal;

/// Most keys one limiter tracks.
pub const BUCKETS_MAX: usize = 100_000;

/// A limit: `count` requests per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub period: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Requests available (fractional while refilling).
    available: f64,
    updated: Instant,
}

/// Token buckets keyed by a string (a token id or an organization).
#[derive(Debug)]
pub struct RateLimiter {
    rate: Rate,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    pub fn new(rate: Rate) -> Self {
        Self {
            rate,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn refilled(&self, bucket: Bucket, now: Instant) -> f64 {
        let per_second = f64::from(self.rate.count) / self.rate.period.as_secs_f64();
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        (bucket.available + elapsed * per_second).min(f64::from(self.rate.count))
    }

    /// How long until `key` may make one request (zero: now), without taking it.
    pub fn wait(&self, key: &str, now: Instant) -> Duration {
        let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let available = buckets
            .get(key)
            .map_or(f64::from(self.rate.count), |bucket| {
                self.refilled(*bucket, now)
            });
        if available >= 1.0 {
            return Duration::ZERO;
        }
        let per_second = f64::from(self.rate.count) / self.rate.period.as_secs_f64();
        Duration::from_secs_f64((1.0 - available) / per_second)
    }

    /// Takes one request from `key`'s bucket.
    pub fn take(&self, key: &str, now: Instant) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= BUCKETS_MAX && !buckets.contains_key(key) {
            let full = f64::from(self.rate.count);
            buckets.retain(|_, bucket| self.refilled(*bucket, now) < full);
            if buckets.len() >= BUCKETS_MAX {
                // Every tracked key is mid-burst: forget the oldest one.
                if let Some(oldest) = buckets
                    .iter()
                    .min_by_key(|(_, bucket)| bucket.updated)
                    .map(|(key, _)| key.clone())
                {
                    buckets.remove(&oldest);
                }
            }
        }
        let current = buckets.get(key).copied();
        let available = current.map_or(f64::from(self.rate.count), |bucket| {
            self.refilled(bucket, now)
        });
        buckets.insert(
            key.to_owned(),
            Bucket {
                available: (available - 1.0).max(0.0),
                updated: now,
            },
        );
    }
}

/// Which limited action a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A timeline message or card action (each may start a model turn).
    Message,
    /// A new project (each clones a repository and runs onboarding).
    CreateProject,
}

impl Action {
    fn what(self) -> &'static str {
        match self {
            Self::Message => "messages",
            Self::CreateProject => "new projects",
        }
    }
}

/// The limits of one gateway instance.
#[derive(Debug)]
pub struct Quotas {
    messages_per_token: RateLimiter,
    messages_per_org: RateLimiter,
    projects_per_token: RateLimiter,
    projects_per_org: RateLimiter,
    /// Open live-timeline streams per token id.
    streams: Arc<Mutex<HashMap<String, usize>>>,
    streams_per_token_max: usize,
    /// Project-history reads running now (`gateway.history_reads_max`).
    history_reads: Arc<tokio::sync::Semaphore>,
    history_reads_max: usize,
}

impl Quotas {
    pub fn new(config: &crate::Config) -> Self {
        let minute = Duration::from_secs(60);
        let hour = Duration::from_secs(3600);
        let rate = |count, period| RateLimiter::new(Rate { count, period });
        Self {
            messages_per_token: rate(config.messages_per_minute_per_token, minute),
            messages_per_org: rate(config.messages_per_minute_per_org, minute),
            projects_per_token: rate(config.projects_per_hour_per_token, hour),
            projects_per_org: rate(config.projects_per_hour_per_org, hour),
            streams: Arc::new(Mutex::new(HashMap::new())),
            streams_per_token_max: config.sse_clients_per_token_max,
            history_reads: Arc::new(tokio::sync::Semaphore::new(config.history_reads_max)),
            history_reads_max: config.history_reads_max,
        }
    }

    /// One read of a project's history (each replays the project's
    /// events), or a 429 when `gateway.history_reads_max` run already; the
    /// slot is free again when the permit drops.
    pub fn read_history(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        self.history_reads.clone().try_acquire_owned().map_err(|_| {
            too_many(
                "history_busy",
                format!(
                    "{} reads of a project's history are running on this gateway, the most allowed at once (gateway.history_reads_max); try again in a second",
                    self.history_reads_max
                ),
                Duration::from_secs(1),
            )
        })
    }

    /// Admits one `action` of `caller` at `now`, or a 429 naming the limit
    /// and when to retry. Both the token's and the organization's buckets
    /// must have room; only then is one taken from each.
    pub fn admit(&self, caller: &Principal, action: Action, now: Instant) -> Result<(), ApiError> {
        self.admit_for(caller.org.as_str(), &caller.token_id, action, now)
    }

    /// [`Quotas::admit`] for the credential `token_id` of organization `org`
    /// (a user token's id or an agent key's).
    pub fn admit_for(
        &self,
        org: &str,
        token_id: &str,
        action: Action,
        now: Instant,
    ) -> Result<(), ApiError> {
        let (per_token, per_org, token_setting, org_setting) = match action {
            Action::Message => (
                &self.messages_per_token,
                &self.messages_per_org,
                "gateway.messages_per_minute_per_token",
                "gateway.messages_per_minute_per_org",
            ),
            Action::CreateProject => (
                &self.projects_per_token,
                &self.projects_per_org,
                "gateway.projects_per_hour_per_token",
                "gateway.projects_per_hour_per_org",
            ),
        };
        let token_wait = per_token.wait(token_id, now);
        let org_wait = per_org.wait(org, now);
        if token_wait.is_zero() && org_wait.is_zero() {
            per_token.take(token_id, now);
            per_org.take(org, now);
            return Ok(());
        }
        let (wait, whose, limit, setting) = if token_wait >= org_wait {
            (token_wait, "this token", per_token.rate, token_setting)
        } else {
            (org_wait, "this organization", per_org.rate, org_setting)
        };
        Err(too_many(
            "rate_limited",
            format!(
                "{whose} may send at most {} {} per {}; try again in {} s (the operator sets {setting})",
                limit.count,
                action.what(),
                if limit.period >= Duration::from_secs(3600) {
                    "hour"
                } else {
                    "minute"
                },
                retry_seconds(wait)
            ),
            wait,
        ))
    }

    /// Counts one more live stream for `token_id`, or a 429 when it has its maximum.
    pub fn open_stream(&self, token_id: &str) -> Result<StreamGuard, ApiError> {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let open = streams.entry(token_id.to_owned()).or_default();
        if *open >= self.streams_per_token_max {
            return Err(too_many(
                "too_many_streams_for_token",
                format!(
                    "this token already has {} live timeline connections open, the most allowed (gateway.sse_clients_per_token_max); close one",
                    self.streams_per_token_max
                ),
                Duration::from_secs(5),
            ));
        }
        *open += 1;
        Ok(StreamGuard {
            streams: self.streams.clone(),
            token_id: token_id.to_owned(),
        })
    }
}

/// Whole seconds to wait, at least 1.
fn retry_seconds(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// 429 `backed_off` with `Retry-After` for an agent key whose last `streak`
/// actions were rejected (the run is kept in `crate::agent_keys`, shared by
/// every instance).
pub fn backed_off(streak: u32, wait: Duration) -> ApiError {
    too_many(
        "backed_off",
        format!(
            "this agent's last {streak} actions were rejected; it is backed off for {} s",
            retry_seconds(wait)
        ),
        wait,
    )
}

fn too_many(code: &'static str, message: String, wait: Duration) -> ApiError {
    ApiError::new(StatusCode::TOO_MANY_REQUESTS, code, message).retry_after(retry_seconds(wait))
}

/// One open stream of a token; dropping it frees the slot.
#[derive(Debug)]
pub struct StreamGuard {
    streams: Arc<Mutex<HashMap<String, usize>>>,
    token_id: String,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(open) = streams.get_mut(&self.token_id) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                streams.remove(&self.token_id);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::tokens::Scopes;

    fn caller(token: &str, org: &str) -> Principal {
        Principal {
            org: org.parse().unwrap(),
            user: "ada".into(),
            token_id: token.into(),
            scopes: Scopes::all(),
            expires_at: time::OffsetDateTime::UNIX_EPOCH
                + std::time::Duration::from_secs(4_000_000_000),
        }
    }

    fn quotas(per_token: u32, per_org: u32) -> Quotas {
        Quotas::new(&crate::Config {
            messages_per_minute_per_token: per_token,
            messages_per_minute_per_org: per_org,
            sse_clients_per_token_max: 2,
            ..crate::Config::default()
        })
    }

    #[test]
    fn a_token_bursts_to_its_limit_then_refills_at_its_pace() {
        let quotas = quotas(3, 100);
        let ada = caller("00000000000000aa", "acme");
        let start = Instant::now();
        for _ in 0..3 {
            quotas.admit(&ada, Action::Message, start).unwrap();
        }
        let refused = quotas.admit(&ada, Action::Message, start).unwrap_err();
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.retry_after, Some(20));
        assert!(
            refused.message.contains("this token"),
            "{}",
            refused.message
        );
        // Another token of the same organization is not affected.
        quotas
            .admit(&caller("00000000000000bb", "acme"), Action::Message, start)
            .unwrap();
        // 20 s later one more (a third of the limit per minute) is accepted.
        let later = start + Duration::from_secs(20);
        quotas.admit(&ada, Action::Message, later).unwrap();
        assert!(quotas.admit(&ada, Action::Message, later).is_err());
        // Project creation has its own buckets.
        quotas.admit(&ada, Action::CreateProject, later).unwrap();
    }

    #[test]
    fn an_organization_is_limited_across_its_tokens() {
        let quotas = quotas(10, 4);
        let now = Instant::now();
        for index in 0..4 {
            let token = format!("{index:016x}");
            quotas
                .admit(&caller(&token, "acme"), Action::Message, now)
                .unwrap();
        }
        let refused = quotas
            .admit(&caller("00000000000000ff", "acme"), Action::Message, now)
            .unwrap_err();
        assert!(
            refused.message.contains("this organization")
                && refused
                    .message
                    .contains("gateway.messages_per_minute_per_org"),
            "{}",
            refused.message
        );
        quotas
            .admit(&caller("00000000000000ff", "other"), Action::Message, now)
            .unwrap();
    }

    #[test]
    fn streams_are_capped_per_token_and_freed_on_drop() {
        let quotas = quotas(10, 10);
        let first = quotas.open_stream("a").unwrap();
        let _second = quotas.open_stream("a").unwrap();
        let refused = quotas.open_stream("a").unwrap_err();
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        let _other = quotas.open_stream("b").unwrap();
        drop(first);
        quotas.open_stream("a").unwrap();
    }

    #[test]
    fn a_flood_of_keys_stays_bounded() {
        let limiter = RateLimiter::new(Rate {
            count: 1,
            period: Duration::from_secs(3600),
        });
        let now = Instant::now();
        for index in 0..(BUCKETS_MAX + 10) {
            limiter.take(&index.to_string(), now);
        }
        assert!(limiter.buckets.lock().unwrap().len() <= BUCKETS_MAX);
    }
}
