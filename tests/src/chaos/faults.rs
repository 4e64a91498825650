//! The chaos run's fault loops: the supervisor that notices instances that
//! exit on their own, the instance faults (kill, restart, cut off NATS) and
//! the node faults (kill and restart one node at a time, the stream leader
//! included), each following the seed's schedule.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use zopu_runtime::nats::Bus;

use super::schedule::{Instance, InstanceAction, NodeTarget, Schedule};
use super::{instances, lock, proxy};
use crate::NatsCluster;
use crate::fleet::Fleet;

/// Restarts instances that exited on their own (as an orchestrator would),
/// recording each exit with the last line of its log.
pub(super) async fn supervise(
    fleet: Arc<Mutex<Fleet>>,
    exits: Arc<Mutex<Vec<String>>>,
) -> Result<()> {
    loop {
        // Polling the children, as a process supervisor does.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut fleet = lock(&fleet);
        for (name, status) in fleet.reap_exited() {
            let tail = fleet.log_tail(&name, 1);
            eprintln!("chaos: {name} exited on its own ({status}): {tail}; restarting it");
            if let Ok(mut exits) = exits.lock() {
                exits.push(format!("{name} ({status}): {tail}"));
            }
            if let Some((service, n)) = name.rsplit_once('-')
                && let Some(instance) = instances()
                    .into_iter()
                    .find(|instance| instance.service == service && n == instance.n.to_string())
            {
                fleet.start(instance.service, instance.n)?;
            }
        }
    }
}

/// Applies the instance faults on the schedule's clock; returns (kills, cuts).
pub(super) async fn run_instance_faults(
    schedule: Schedule,
    fleet: Arc<Mutex<Fleet>>,
    proxies: Arc<BTreeMap<Instance, Vec<proxy::Proxy>>>,
) -> Result<(usize, usize)> {
    let t0 = tokio::time::Instant::now();
    let mut restarts: Vec<(tokio::time::Instant, Instance)> = Vec::new();
    let mut last_end = t0;
    let (mut kills, mut cuts) = (0, 0);
    for fault in &schedule.instance_faults {
        let at = t0 + fault.at;
        // Restarts due before this fault first.
        restarts.sort_by_key(|(when, _)| *when);
        while restarts.first().is_some_and(|(when, _)| *when <= at) {
            let (when, instance) = restarts.remove(0);
            tokio::time::sleep_until(when).await;
            eprintln!("chaos: t+{}ms start {instance}", (when - t0).as_millis());
            lock(&fleet).start(instance.service, instance.n)?;
        }
        tokio::time::sleep_until(at).await;
        let instance = &fault.instance;
        match fault.action {
            InstanceAction::Kill { down } => {
                eprintln!("chaos: t+{}ms kill -9 {instance}", fault.at.as_millis());
                lock(&fleet).kill(instance.service, instance.n);
                restarts.push((at + down, instance.clone()));
                kills += 1;
                last_end = last_end.max(at + down);
            }
            InstanceAction::Cut { duration } => {
                eprintln!(
                    "chaos: t+{}ms cut {instance} for {}ms",
                    fault.at.as_millis(),
                    duration.as_millis()
                );
                for proxy in proxies.get(instance).into_iter().flatten() {
                    proxy.cut(duration);
                }
                cuts += 1;
                last_end = last_end.max(at + duration);
            }
        }
    }
    restarts.sort_by_key(|(when, _)| *when);
    for (when, instance) in restarts {
        tokio::time::sleep_until(when).await;
        eprintln!("chaos: t+{}ms start {instance}", (when - t0).as_millis());
        lock(&fleet).start(instance.service, instance.n)?;
    }
    // The last cut is over once its time passed.
    tokio::time::sleep_until(last_end).await;
    Ok((kills, cuts))
}

/// Kills and restarts nodes one at a time, each only once the cluster is
/// healthy again; returns the cluster, node kills and leader kills.
pub(super) async fn run_node_faults(
    schedule: Schedule,
    mut cluster: NatsCluster,
    bus: Bus,
) -> Result<(NatsCluster, usize, usize)> {
    let t0 = tokio::time::Instant::now();
    let (mut kills, mut leader_kills) = (0, 0);
    for (index, fault) in schedule.node_faults.iter().enumerate() {
        tokio::time::sleep(fault.pause).await;
        let node = match fault.target {
            NodeTarget::StreamLeader => {
                leader_kills += 1;
                cluster
                    .kill_stream_leader(&bus, Duration::from_secs(60))
                    .await?
            }
            NodeTarget::Node(node) => {
                cluster.kill(node);
                node
            }
        };
        kills += 1;
        eprintln!(
            "chaos: t+{}ms node fault {}: kill -9 n{}",
            t0.elapsed().as_millis(),
            index + 1,
            node + 1
        );
        tokio::time::sleep(fault.down).await;
        cluster.restart(node)?;
        tokio::task::block_in_place(|| cluster.wait_healthy(Duration::from_secs(90)))
            .with_context(|| format!("after node fault {}", index + 1))?;
        cluster
            .wait_for_stream_leader(&bus, Duration::from_secs(60))
            .await?;
        eprintln!(
            "chaos: t+{}ms node fault {}: n{} back, cluster healthy",
            t0.elapsed().as_millis(),
            index + 1,
            node + 1
        );
    }
    Ok((cluster, kills, leader_kills))
}
