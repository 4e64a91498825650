//! The conversation instances a scale run starts and kills: each its own
//! runtime, data directory and instance id, optionally capped at a number of
//! turns at once, and the partition claims they hold.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use zopu_runtime::config::CoreConfig;
use zopu_runtime::nats::Bus;
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::{HandlerError, Reaction, ReactionContext, Shutdown};
use zopu_schema::{Envelope, OrgId, ProjectId, pb, subjects};

use super::LONG;

/// Registers one conversation agent per project, as setup does, with
/// projects drawn until each partition has `projects / partitions` of them.
pub(super) async fn register(
    bus: &Bus,
    org: &OrgId,
    projects: usize,
    partitions: u32,
) -> anyhow::Result<BTreeMap<u32, Vec<ProjectId>>> {
    let per_partition = projects / partitions as usize;
    let mut by_partition: BTreeMap<u32, Vec<ProjectId>> =
        (0..partitions).map(|p| (p, Vec::new())).collect();
    while by_partition.values().any(|p| p.len() < per_partition) {
        let project = ProjectId::new();
        let partition = subjects::partition_of(org.as_str(), &project.to_string(), partitions);
        if let Some(bucket) = by_partition.get_mut(&partition)
            && bucket.len() < per_partition
        {
            bucket.push(project);
        }
    }
    let setup = Publisher::new(bus.clone(), "setup", None);
    for project in by_partition.values().flatten() {
        super::super::ack::register_agent(&setup, org, project).await?;
    }
    Ok(by_partition)
}

/// The partitions' current claims (partition → instance; empty: free).
pub(super) async fn claims(
    bus: &Bus,
    durable: &str,
    partitions: u32,
) -> anyhow::Result<BTreeMap<u32, String>> {
    let kv = bus.jetstream.get_key_value(subjects::LEASES_BUCKET).await?;
    let mut owners = BTreeMap::new();
    for partition in 0..partitions {
        let owner = match kv
            .get(subjects::lease_claim_key(durable, partition))
            .await?
        {
            Some(value) => <pb::PartitionClaim as prost::Message>::decode(value)
                .map(|claim| claim.instance)
                .unwrap_or_default(),
            None => String::new(),
        };
        owners.insert(partition, owner);
    }
    Ok(owners)
}

/// Waits until every partition of `durable` is claimed by one of
/// `instances` and each holds its fair share.
pub(super) async fn wait_for_shares(
    bus: &Bus,
    durable: &str,
    instances: &[String],
    partitions: u32,
) -> anyhow::Result<()> {
    let kv = bus.jetstream.get_key_value(subjects::LEASES_BUCKET).await?;
    let mut watch = kv
        .watch_with_history(subjects::lease_keys_of(durable))
        .await?;
    let mut owners: BTreeMap<u32, String> = BTreeMap::new();
    let most = (partitions as usize).div_ceil(instances.len());
    let least = partitions as usize / instances.len();
    let waiting = async {
        while let Some(entry) = watch.next().await {
            let entry = entry?;
            if let Some(subjects::LeaseKey::Claim { partition, .. }) =
                subjects::parse_lease_key(&entry.key)
            {
                let owner = match entry.operation {
                    async_nats::jetstream::kv::Operation::Put => {
                        <pb::PartitionClaim as prost::Message>::decode(entry.value.clone())
                            .map(|claim| claim.instance)
                            .unwrap_or_default()
                    }
                    _ => String::new(),
                };
                owners.insert(partition, owner);
            }
            let spread = owners.len() == partitions as usize
                && instances.iter().all(|instance| {
                    let held = owners.values().filter(|owner| *owner == instance).count();
                    (least..=most).contains(&held)
                })
                && owners.values().all(|owner| instances.contains(owner));
            if spread {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("the leases watch ended")
    };
    tokio::time::timeout(LONG, waiting)
        .await
        .map_err(|_| anyhow::anyhow!("claims never spread over {instances:?}: {owners:?}"))?
}

/// One conversation instance on its own runtime, as on
/// its own machine.
pub(super) struct Instance {
    pub(super) id: String,
    pub(super) runtime: Option<tokio::runtime::Runtime>,
    pub(super) shutdown: Shutdown,
}

impl Instance {
    /// `threads`: its runtime's worker threads (0: one per core, as `zopu
    /// run` gives a service).
    pub(super) fn start(
        id: &str,
        core: CoreConfig,
        config: zopu_conversation::Config,
        cap: Option<usize>,
        threads: usize,
    ) -> anyhow::Result<Self> {
        let mut runtime = tokio::runtime::Builder::new_multi_thread();
        if threads > 0 {
            runtime.worker_threads(threads);
        }
        let runtime = runtime
            .thread_name(format!("zopu-{id}"))
            .enable_all()
            .build()?;
        let shutdown = Shutdown::new();
        let (service, stop) = (shutdown.clone(), shutdown.clone());
        {
            // The service's tasks spawn onto the runtime they run on: this one.
            let _entered = runtime.enter();
            shutdown.spawn(async move {
                if let Err(error) = conversation(core, config, cap, service).await {
                    tracing::error!(error = %format!("{error:#}"), "conversation instance stopped");
                    stop.cancel();
                }
            });
        }
        Ok(Self {
            id: id.to_owned(),
            runtime: Some(runtime),
            shutdown,
        })
    }

    /// Everything stops at once, mid-handler: a kill -9 as the server sees it.
    pub(super) fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// A clean stop: handlers in hand finish, claims are released.
    pub(super) async fn stop(&mut self) {
        self.shutdown.cancel();
        if !self.shutdown.wait(LONG).await {
            tracing::warn!(instance = %self.id, "did not stop within its grace");
        }
        self.kill();
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The conversation service as `zopu_conversation::run` starts it, with
/// the agent optionally capped at `cap` turns at once.
pub(super) async fn conversation(
    core: CoreConfig,
    config: zopu_conversation::Config,
    cap: Option<usize>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let Some(cap) = cap else {
        return Ok(zopu_conversation::run(core, config, shutdown).await?);
    };
    config.validate()?;
    let runtime = zopu_runtime::Runtime::start_with(
        zopu_conversation::SERVICE,
        &core,
        shutdown.clone(),
        zopu_conversation::ConversationState,
    )
    .await?;
    let capped = Capped {
        inner: config.agent(Arc::new(zopu_core::registry::Registry::configured(
            None, &core,
        )?))?,
        permits: Arc::new(tokio::sync::Semaphore::new(cap)),
    };
    runtime.spawn_reaction(config.reaction(), capped);
    shutdown.cancelled().await;
    Ok(())
}

/// A reaction that runs at most `permits` handlers at once in this
/// instance: a machine's capacity, which the runner itself does not bound.
pub(super) struct Capped<R> {
    pub(super) inner: R,
    pub(super) permits: Arc<tokio::sync::Semaphore>,
}

impl<R: Reaction> Reaction for Capped<R> {
    async fn handle(
        &self,
        event: &Envelope,
        context: &ReactionContext,
    ) -> Result<(), HandlerError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| HandlerError::Interrupted)?;
        self.inner.handle(event, context).await
    }

    async fn already_handled(
        &self,
        event: &Envelope,
        context: &ReactionContext,
    ) -> Result<bool, HandlerError> {
        self.inner.already_handled(event, context).await
    }

    fn failure_event(&self, event: &Envelope, reason: &str) -> Option<NewEvent> {
        self.inner.failure_event(event, reason)
    }
}
