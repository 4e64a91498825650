//! What a service needs to run: a connection with its streams checked, its
//! store with the key index, a publisher, and helpers to start the two
//! consumer loops as tracked tasks.

use std::time::Duration;

use crate::clock::Clock;
use crate::config::{CoreConfig, ScaleConfig};
use crate::nats::{self, Bus};
use crate::publish::Publisher;
use crate::reaction::{self, Reaction, ReactionConfig};
use crate::shutdown::Shutdown;
use crate::store::{KeyIndex, Projection, Store};
use crate::{Error, projection, streams};

/// How long a starting service retries reading the streams while the
/// cluster does not answer (a node restarting, a leader election).
const STREAMS_RETRY: Duration = Duration::from_secs(60);

/// Checks that `streams/` is on the server as defined ([`streams::check`]),
/// retrying JetStream errors (timeouts, no leader yet) for up to
/// [`STREAMS_RETRY`]; a missing stream, drift and bad definitions fail at
/// once. A service never creates or changes a stream.
async fn check_streams(bus: &Bus, config: &CoreConfig) -> Result<(), Error> {
    let settings = streams::StreamSettings::from(config);
    let deadline = tokio::time::Instant::now() + STREAMS_RETRY;
    loop {
        match streams::check(bus, &settings).await {
            Err(error @ Error::JetStream { .. }) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(%error, "cannot read the streams yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            result => return result,
        }
    }
}

/// One service's runtime.
#[derive(Clone, Debug)]
pub struct Runtime {
    pub service: String,
    pub bus: Bus,
    pub store: Store,
    pub publisher: Publisher,
    pub shutdown: Shutdown,
    /// How this instance shares the service's reactions with the others.
    pub scale: ScaleConfig,
    /// The wall clock and fresh-id source (the publisher stamps events with it).
    pub clock: Clock,
}

impl Runtime {
    /// Connects, checks `streams/` (never creates them), opens `<data_dir>/<service>.sqlite` and
    /// starts its key index.
    pub async fn start(
        service: &str,
        config: &CoreConfig,
        shutdown: Shutdown,
    ) -> Result<Self, Error> {
        let runtime = Self::connect(service, config, shutdown).await?;
        runtime.spawn_projections(vec![Box::new(runtime.key_index())]);
        Ok(runtime)
    }

    /// [`Runtime::start`] for a service with its own projection: one
    /// consumer feeds both the key index and `projection` (each event is
    /// received and decoded once).
    pub async fn start_with<P: Projection>(
        service: &str,
        config: &CoreConfig,
        shutdown: Shutdown,
        projection: P,
    ) -> Result<Self, Error> {
        let runtime = Self::connect(service, config, shutdown).await?;
        runtime.spawn_projections(vec![Box::new(runtime.key_index()), Box::new(projection)]);
        Ok(runtime)
    }

    async fn connect(
        service: &str,
        config: &CoreConfig,
        shutdown: Shutdown,
    ) -> Result<Self, Error> {
        config.validate()?;
        let bus = nats::connect(
            &config.nats_url,
            &format!("zopu-{service}"),
            Duration::from_secs(30),
        )
        .await?;
        check_streams(&bus, config).await?;
        let store = Store::open_for_service(&config.data_dir, service)?;
        let publisher = Publisher::new(bus.clone(), service, Some(store.clone()))
            .with_clock(config.clock.clone());
        Ok(Self {
            service: service.to_owned(),
            bus,
            store,
            publisher,
            shutdown,
            scale: config.scale.clone(),
            clock: config.clock.clone(),
        })
    }

    fn key_index(&self) -> KeyIndex {
        KeyIndex::of_source(self.publisher.source())
    }

    /// Runs projections of this service's store from one consumer, as a
    /// tracked task; the consumer keeps the publisher's project heads current.
    fn spawn_projections(&self, projections: Vec<Box<dyn Projection>>) {
        let (bus, store, shutdown) = (self.bus.clone(), self.store.clone(), self.shutdown.clone());
        let track_heads = Some(self.publisher.clone());
        let on_error = self.shutdown.clone();
        self.shutdown.spawn(async move {
            if let Err(error) =
                projection::run_all(bus, store, projections, track_heads, shutdown).await
            {
                tracing::error!(%error, "projection stopped; stopping the service");
                on_error.cancel();
            }
        });
    }

    /// Runs a reaction as a tracked task.
    pub fn spawn_reaction<R: Reaction>(&self, config: ReactionConfig, reaction: R) {
        let runtime = self.clone();
        let on_error = self.shutdown.clone();
        self.shutdown.spawn(async move {
            let service = runtime.service.clone();
            if let Err(error) = reaction::run(runtime, config, reaction).await {
                tracing::error!(%service, %error, "reaction stopped; stopping the service");
                on_error.cancel();
            }
        });
    }
}
