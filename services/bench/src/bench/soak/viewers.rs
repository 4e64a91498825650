//! The soak's live-timeline viewers: streams held open through the
//! gateway, each on a token shared by at most the gateway's per-token
//! limit of them; tokens are revoked and issued throughout, and a revoked
//! token's streams must end within [`REVOCATION_BUDGET`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use zopu_gateway::tokens::TokenStore;
use zopu_schema::{OrgId, ProjectId};

/// A revoked token's streams end within this (the revocation promise).
pub(super) const REVOCATION_BUDGET: Duration = Duration::from_secs(1);

/// How long a rotation waits for a revoked token's streams before it
/// counts them as left open and stops them itself.
const GIVE_UP: Duration = Duration::from_secs(10);

/// What the viewers saw, shared with their tasks.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// Timeline items received over every stream.
    pub items: AtomicU64,
    /// Streams opened (reconnections after a gateway restart included).
    pub opened: AtomicU64,
    /// Streams open now.
    pub open: AtomicU64,
}

/// The tokens in use, oldest first, each with its streams.
pub(super) struct Viewers {
    tokens: TokenStore,
    http: reqwest::Client,
    base: String,
    org: OrgId,
    held: VecDeque<Held>,
    pub seen: Arc<Seen>,
    /// How long each revoked token's last stream took to end.
    pub revocation_closes: Vec<Duration>,
    /// Streams still open [`REVOCATION_BUDGET`] after their token's revocation.
    pub left_open: usize,
}

/// One token and the streams it holds open.
struct Held {
    token_id: String,
    /// The project each of its streams follows.
    projects: Vec<ProjectId>,
    streams: JoinSet<()>,
    /// Set once the token is revoked: a stream that ends then is done,
    /// one that ends before reconnects (the gateway restarted).
    revoked: Arc<AtomicBool>,
}

impl Viewers {
    /// Opens `streams` streams over `projects` (round robin), `per_token`
    /// per token, against the gateway at `base`.
    pub(super) async fn open(
        tokens: TokenStore,
        base: String,
        org: OrgId,
        projects: &[ProjectId],
        streams: usize,
        per_token: usize,
    ) -> anyhow::Result<Self> {
        let mut viewers = Self {
            tokens,
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .build()?,
            base,
            org,
            held: VecDeque::new(),
            seen: Arc::default(),
            revocation_closes: Vec::new(),
            left_open: 0,
        };
        let mut targets = projects.iter().cycle().take(streams).copied().peekable();
        while targets.peek().is_some() {
            let batch: Vec<ProjectId> = targets.by_ref().take(per_token).collect();
            viewers.hold(batch).await?;
        }
        Ok(viewers)
    }

    /// Revokes the oldest token, measures how long its streams take to end,
    /// then issues a new token that opens as many streams on the same
    /// projects.
    pub(super) async fn rotate(&mut self) -> anyhow::Result<()> {
        let Some(mut oldest) = self.held.pop_front() else {
            return Ok(());
        };
        let projects = std::mem::take(&mut oldest.projects);
        oldest.revoked.store(true, Ordering::SeqCst);
        let revoked_at = Instant::now();
        self.tokens.revoke(&oldest.token_id).await?;
        let ended = tokio::time::timeout(GIVE_UP, async {
            while oldest.streams.join_next().await.is_some() {}
        })
        .await;
        let took = revoked_at.elapsed();
        if ended.is_err() {
            self.left_open += oldest.streams.len();
            oldest.streams.abort_all();
        } else if took > REVOCATION_BUDGET {
            self.left_open += 1;
        }
        self.revocation_closes.push(took);
        self.hold(projects).await
    }

    /// Ends every stream.
    pub(super) fn close(&mut self) {
        for held in &mut self.held {
            held.streams.abort_all();
        }
        self.held.clear();
    }

    async fn hold(&mut self, projects: Vec<ProjectId>) -> anyhow::Result<()> {
        let issued = self
            .tokens
            .issue(&self.org, "soak-viewer", Duration::from_secs(24 * 3600))
            .await?;
        let secret: Arc<str> = issued.expose().into();
        let revoked = Arc::new(AtomicBool::new(false));
        let mut streams = JoinSet::new();
        for project in &projects {
            let follow = Follow {
                http: self.http.clone(),
                url: format!("{}/v1/projects/{project}/events", self.base),
                token: secret.clone(),
                revoked: revoked.clone(),
                seen: self.seen.clone(),
            };
            streams.spawn(follow.run());
        }
        self.held.push_back(Held {
            token_id: issued.info.id.clone(),
            projects,
            streams,
            revoked,
        });
        Ok(())
    }
}

/// One live stream, reconnected whenever it ends before its token is revoked.
struct Follow {
    http: reqwest::Client,
    url: String,
    token: Arc<str>,
    revoked: Arc<AtomicBool>,
    seen: Arc<Seen>,
}

impl Follow {
    async fn run(self) {
        let mut after = 0u64;
        while !self.revoked.load(Ordering::SeqCst) {
            let response = self
                .http
                .get(&self.url)
                .bearer_auth(&*self.token)
                .header("last-event-id", after.to_string())
                .send()
                .await;
            let mut response = match response {
                Ok(response) if response.status().is_success() => response,
                // Refused or unreachable (the gateway restarting, or the
                // token revoked): the loop's condition decides.
                _ => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            self.seen.opened.fetch_add(1, Ordering::Relaxed);
            self.seen.open.fetch_add(1, Ordering::Relaxed);
            let mut line = Vec::new();
            while let Ok(Some(chunk)) = response.chunk().await {
                for byte in chunk {
                    if byte != b'\n' {
                        line.push(byte);
                        continue;
                    }
                    if line.starts_with(b"data:") {
                        self.seen.items.fetch_add(1, Ordering::Relaxed);
                    } else if let Some(id) = line.strip_prefix(b"id:") {
                        after = std::str::from_utf8(id)
                            .ok()
                            .and_then(|id| id.trim().parse().ok())
                            .unwrap_or(after);
                    }
                    line.clear();
                }
            }
            self.seen.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
