//! Ending what a token opened when the token ends.
//!
//! A live timeline stream outlives the request that authenticated it, so
//! checking the token once is not enough: every gateway instance watches
//! the replicated `zopu-gateway-tokens` bucket ([`run`]), and a token whose
//! entry is revoked, deleted or purged ends every stream it opened on that
//! instance at once ([`Revocations::follow`]); a stream also ends when its
//! token expires (the stream's own deadline). Tickets are checked against
//! the token when they are redeemed (`sse`), and every other request reads
//! the token anew, so nothing a token opened outlives it by more than the
//! bucket's replication. A watch that fails is set up again from the last
//! change it saw, so no revocation in between is missed.
//!
//! Invariant: [`Revocations`] holds token ids only (never a token) and one
//! entry per token id that has an open stream here, removed when it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::watch;
use zopu_runtime::Shutdown;

use crate::tokens::TokenStore;

/// How long to wait before watching the bucket again after the watch failed.
const REWATCH_DELAY: Duration = Duration::from_millis(500);

/// The tokens with open streams on this instance, each with the signal
/// that ends them.
#[derive(Debug, Default, Clone)]
pub struct Revocations(Arc<Mutex<HashMap<String, watch::Sender<bool>>>>);

/// Resolves when the token it follows was revoked or deleted.
#[derive(Debug)]
pub struct Ended(watch::Receiver<bool>);

impl Ended {
    /// Waits until the token ended (or the instance stopped following it).
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|ended| *ended).await;
    }

    /// Whether the token ended already.
    pub fn happened(&self) -> bool {
        *self.0.borrow()
    }
}

impl Revocations {
    /// The signal that ends a stream opened by `token_id`.
    pub fn follow(&self, token_id: &str) -> Ended {
        let mut followed = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let sender = followed
            .entry(token_id.to_owned())
            .or_insert_with(|| watch::channel(false).0);
        Ended(sender.subscribe())
    }

    /// Ends every stream `token_id` opened here.
    pub fn end(&self, token_id: &str) {
        let mut followed = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sender) = followed.remove(token_id) {
            sender.send_replace(true);
            tracing::info!(
                token = token_id,
                streams = sender.receiver_count(),
                "token ended: closing its live streams"
            );
        }
    }

    /// Forgets tokens none of whose streams is open any more.
    fn prune(&self) {
        let mut followed = self.0.lock().unwrap_or_else(|p| p.into_inner());
        followed.retain(|_, sender| sender.receiver_count() > 0);
    }
}

/// Watches the token bucket until `shutdown`, ending the streams of every
/// token revoked, deleted or purged on any instance.
pub async fn run(tokens: TokenStore, revocations: Revocations, shutdown: Shutdown) {
    // The last change seen: a watch set up again resumes after it, so a
    // revocation while it was down is not missed.
    let mut seen: Option<u64> = None;
    loop {
        let watched = tokio::select! {
            watched = tokens.watch_ended(seen) => watched,
            () = shutdown.cancelled() => return,
        };
        match watched {
            Ok(ended) => {
                let mut ended = std::pin::pin!(ended);
                loop {
                    tokio::select! {
                        next = ended.next() => match next {
                            Some((revision, token)) => {
                                seen = Some(revision);
                                if let Some(token_id) = token {
                                    revocations.end(&token_id);
                                    revocations.prune();
                                }
                            }
                            None => break,
                        },
                        () = shutdown.cancelled() => return,
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot watch the token bucket; retrying");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(REWATCH_DELAY) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ending_a_token_ends_its_streams_only() {
        let revocations = Revocations::default();
        let mut first = revocations.follow("aaaa");
        let second = revocations.follow("aaaa");
        let other = revocations.follow("bbbb");
        revocations.end("aaaa");
        tokio::time::timeout(Duration::from_secs(1), first.wait())
            .await
            .unwrap();
        assert!(second.happened());
        assert!(!other.happened());
        // A stream opened later follows afresh.
        assert!(!revocations.follow("aaaa").happened());
        drop(other);
        revocations.prune();
        assert!(!revocations.0.lock().unwrap().contains_key("bbbb"));
    }
}
