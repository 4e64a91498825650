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
use crate::snapshot::{self, Restore};
use crate::store::{KeyIndex, Projection, Store};
use crate::{Error, projection, streams};

/// Checks that `streams/` is on the server as defined ([`streams::check`]),
/// retrying JetStream errors (timeouts, no leader yet) for up to
/// [`nats::STARTING_RETRY`]; a missing stream, drift and bad definitions
/// fail at once. A service never creates or changes a stream.
async fn check_streams(bus: &Bus, config: &CoreConfig) -> Result<(), Error> {
    let settings = streams::StreamSettings::from(config);
    nats::while_unanswered(
        "read the streams",
        |error| matches!(error, Error::JetStream { .. }),
        || streams::check(bus, &settings),
    )
    .await
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
    /// What the store's start made of the service's snapshot ([`snapshot`]):
    /// restored (and from which sequence on it replays), or skipped and why.
    pub snapshot: Restore,
}

impl Runtime {
    /// Connects, checks `streams/` (never creates them), opens `<data_dir>/<service>.sqlite` and
    /// starts its key index.
    pub async fn start(
        service: &str,
        config: &CoreConfig,
        shutdown: Shutdown,
    ) -> Result<Self, Error> {
        Self::connect(service, config, shutdown, Vec::new()).await
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
        Self::connect(service, config, shutdown, vec![Box::new(projection)]).await
    }

    /// Connects, restores the store from a snapshot when one is further
    /// on, opens it and starts the service's key index beside
    /// `projections`, and the snapshot taker.
    async fn connect(
        service: &str,
        config: &CoreConfig,
        shutdown: Shutdown,
        mut projections: Vec<Box<dyn Projection>>,
    ) -> Result<Self, Error> {
        config.validate()?;
        let bus = nats::connect(
            &config.nats_url,
            &format!("zopu-{service}"),
            Duration::from_secs(30),
        )
        .await?;
        check_streams(&bus, config).await?;
        projections.insert(
            0,
            Box::new(KeyIndex::of_source(crate::publish::source_of(service))),
        );
        let versions: Vec<snapshot::ProjectionVersion> = projections
            .iter()
            .map(|projection| (projection.name(), projection.schema_version()))
            .collect();
        let path = Store::path_for_service(&config.data_dir, service)?;
        let restore = if config.snapshots.enabled {
            tokio::time::timeout(
                snapshot::RESTORE_TIMEOUT,
                snapshot::restore(&bus, &path, service, &versions),
            )
            .await
            .unwrap_or_else(|_| {
                tracing::warn!(%service, "restoring the snapshot took too long; replaying the stream instead");
                Restore::Skipped("timed out".into())
            })
        } else {
            Restore::Skipped("snapshots.enabled is off".into())
        };
        // A projection whose schema version changed is rebuilt in a shadow
        // copy of the file, which replaces it once caught up.
        let changed = snapshot::changed_projections(&path, &versions);
        if !changed.is_empty() {
            tracing::info!(%service, projections = ?changed, "schema version changed; rebuilding in a shadow file");
            projections =
                projection::rebuild_in_shadow(&bus, &path, projections, &shutdown).await?;
        }
        let store = Store::open(&path)?;
        let publisher = Publisher::new(bus.clone(), service, Some(store.clone()))
            .with_clock(config.clock.clone());
        let runtime = Self {
            service: service.to_owned(),
            bus,
            store,
            publisher,
            shutdown,
            scale: config.scale.clone(),
            clock: config.clock.clone(),
            snapshot: restore,
        };
        let since = runtime.store.checkpoint();
        runtime.spawn_projections(projections);
        if config.snapshots.enabled {
            snapshot::Taker {
                bus: runtime.bus.clone(),
                store: runtime.store.clone(),
                service: service.to_owned(),
                projections: versions,
                config: config.snapshots.clone(),
                made_by: config.scale.resolved_instance_id(),
            }
            .spawn(since, &runtime.shutdown);
        }
        Ok(runtime)
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
