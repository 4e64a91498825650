//! One cancellation token and one task tracker per process.
//!
//! The first Ctrl-C or SIGTERM cancels the token: consumers stop taking
//! messages and settle the ones in hand; the process waits for tracked tasks
//! up to a grace period. A second signal exits at once.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    token: CancellationToken,
    tracker: TaskTracker,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    pub async fn cancelled(&self) {
        self.token.cancelled().await;
    }

    pub fn cancel(&self) {
        self.token.cancel();
    }

    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// A child whose cancellation does not cancel the parent (e.g. one service of many).
    pub fn child(&self) -> Self {
        Self {
            token: self.token.child_token(),
            tracker: self.tracker.clone(),
        }
    }

    /// Spawns a tracked task.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tracker.spawn(task)
    }

    /// Waits for every tracked task, at most `grace`. Returns false on timeout.
    pub async fn wait(&self, grace: Duration) -> bool {
        self.tracker.close();
        tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_ok()
    }

    /// Cancels on the first SIGINT/SIGTERM; exits the process on the second.
    pub fn cancel_on_signals(&self) {
        let token = self.token.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutting down: finishing in-flight work (signal again to exit now)");
            token.cancel();
            wait_for_signal().await;
            tracing::warn!("second signal: exiting now");
            std::process::exit(130);
        });
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
