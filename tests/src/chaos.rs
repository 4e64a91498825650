//! A seeded chaos run (issue 13, item 8): a three-node JetStream cluster
//! (R3, `sync_interval: always`, `no_advertise`), several `zopu run`
//! instances of every service each behind its own TCP proxies to the
//! nodes, a failing and slow fake model, N projects × M messages sent in
//! waves with `zopu send` and through the gateway's HTTP API — while the
//! schedule kills and restarts instances, kills and restarts nodes (the
//! stream leader included, one node at a time), and cuts instances off
//! NATS. Afterwards everything is healed and every promise is checked
//! from the stream (`crate::invariants`), by `zopu audit verify`, and on
//! the servers' connection lists (no service bypassed its proxies).
//!
//! The whole schedule comes from the seed ([`schedule::Schedule::derive`]):
//! `ZOPU_CHAOS_SEED` replays a run's faults and model answers (the
//! interleaving with the services' own timing is, of course, the
//! machine's). The run's directory (fleet logs, data dirs) is kept and
//! printed when it fails.

mod faults;
pub mod llm;
pub mod proxy;
pub mod schedule;
mod send;
pub mod tracker;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use tokio::task::JoinSet;
use zopu_runtime::nats::Bus;
use zopu_schema::{OrgId, ProjectId};

use crate::fleet::{Fleet, FleetConfig};
use crate::{CLUSTER_SIZE, NatsCluster, fixtures, invariants};
use faults::{run_instance_faults, run_node_faults, supervise};
use schedule::{Instance, Rng, Scale, Schedule};
use send::Send;

/// Instances per service in a chaos run.
pub const TOPOLOGY: [(&str, usize); 6] = [
    ("setup", 2),
    ("dispatch", 3),
    ("conversation", 3),
    ("specialists", 3),
    ("artifacts", 3),
    ("gateway", 3),
];

/// The organization every project of a run belongs to.
pub const ORG: &str = "chaos";

/// The variable holding the fake model's key (not a `ZOPU_` setting).
const MODEL_KEY_VARIABLE: &str = "CHAOS_MODEL_KEY";

/// How long any one message may take to end, and the heal phase to settle.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(300);
const SETTLE_TIMEOUT: Duration = Duration::from_secs(180);

/// How long an instance may take to reconnect once the faults are over
/// (async-nats backs off up to a few seconds between attempts).
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// What a run did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub seed: u64,
    pub scale: String,
    pub duration: Duration,
    pub messages: usize,
    pub through_gateway: usize,
    pub answered: usize,
    pub visible_failures: BTreeMap<String, usize>,
    pub instance_kills: usize,
    pub cuts: usize,
    pub node_kills: usize,
    pub leader_kills: usize,
    pub refused_connections: u64,
    pub proxied_connections: u64,
    pub model: llm::Counts,
    pub events: usize,
    /// Instances that exited on their own (restarted by the run's
    /// supervisor, as an orchestrator would): name, status, last log line.
    pub exited: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "chaos run: seed {} (replay: ZOPU_CHAOS_SEED={} ZOPU_CHAOS_SCALE={}), {:.1}s",
            self.seed,
            self.seed,
            self.scale,
            self.duration.as_secs_f64()
        )?;
        writeln!(
            f,
            "  messages: {} ({} through the gateway, {} with zopu send); answered {}, visible failures {:?}",
            self.messages,
            self.through_gateway,
            self.messages - self.through_gateway,
            self.answered,
            self.visible_failures
        )?;
        writeln!(
            f,
            "  faults: {} instance kills, {} network cuts ({} connections refused during cuts, {} proxied), {} node kills ({} of the stream leader)",
            self.instance_kills,
            self.cuts,
            self.refused_connections,
            self.proxied_connections,
            self.node_kills,
            self.leader_kills
        )?;
        writeln!(
            f,
            "  model: {} calls, {} answered 500, {} slow, {} to poisoned messages; {} events in the stream",
            self.model.calls, self.model.errors, self.model.slow, self.model.poisoned, self.events
        )?;
        writeln!(
            f,
            "  instances that exited on their own: {}",
            self.exited.len()
        )?;
        for exit in &self.exited {
            writeln!(f, "    {exit}")?;
        }
        Ok(())
    }
}

/// A run's world: cluster, fleet, proxies, fake model.
#[derive(Debug)]
pub struct Chaos {
    pub scale: Scale,
    pub seed: u64,
    pub schedule: Schedule,
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    cluster: Option<NatsCluster>,
    pub bus: Bus,
    fleet: Arc<Mutex<Fleet>>,
    proxies: Arc<BTreeMap<Instance, Vec<proxy::Proxy>>>,
    model: llm::FakeModel,
    faults: llm::Faults,
    gateways: Vec<u16>,
    token: String,
    pub org: OrgId,
    pub projects: Vec<ProjectId>,
}

fn lock(fleet: &Mutex<Fleet>) -> MutexGuard<'_, Fleet> {
    fleet
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Every instance of the topology.
pub fn instances() -> Vec<Instance> {
    TOPOLOGY
        .iter()
        .flat_map(|(service, count)| (1..=*count).map(move |n| Instance { service, n }))
        .collect()
}

impl Chaos {
    /// Sets the world up (services started, projects created and ready);
    /// prints the seed, the schedule and the run's directory.
    pub async fn start(scale: Scale, seed: u64) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("zopu-chaos-").tempdir()?;
        let root = dir.path().to_owned();
        let schedule = Schedule::derive(seed, &scale, &instances());
        eprintln!(
            "chaos: seed {seed} (replay with ZOPU_CHAOS_SEED={seed} ZOPU_CHAOS_SCALE={}); run directory {}",
            scale.name,
            root.display()
        );
        eprintln!("{schedule}");
        let cluster = tokio::task::block_in_place(|| NatsCluster::start_with(true))?;
        let bus = crate::bus(&cluster, Duration::from_secs(120)).await?;
        crate::partition_work(&cluster, 6).await?;
        let repo = fixtures::demo_repository(&root)?;
        let faults = llm::Faults {
            seed,
            error_percent: scale.llm_error_percent,
            slow_percent: scale.llm_slow_percent,
            poison_percent: scale.llm_poison_percent,
            slow_max: Duration::from_millis(3000),
        };
        let model = llm::FakeModel::start(faults).await?;
        let zopu = crate::zopu_binary(&crate::workspace_root())?;
        let link_key = format!("{:064x}", Rng::new(seed).fork("link key").next_u64());
        let mut fleet = Fleet::new(
            &zopu,
            &root.join("fleet"),
            FleetConfig {
                nats_url: cluster.url(),
                stream_replicas: CLUSTER_SIZE,
                partitions: 6,
                lease_ttl: Duration::from_secs(2),
                env: crate::fleet::variables(&[
                    ("ZOPU_GATEWAY_LINK_KEY", link_key.as_str()),
                    ("ZOPU_CONVERSATION__PROVIDER", "openai"),
                    ("ZOPU_CONVERSATION__OPENAI__BASE_URL", &model.base_url()),
                    ("ZOPU_CONVERSATION__OPENAI__MODEL", "chaos-model"),
                    ("ZOPU_CONVERSATION__OPENAI__API_KEY_ENV", MODEL_KEY_VARIABLE),
                    ("ZOPU_CONVERSATION__OPENAI__REQUEST_TIMEOUT", "2s"),
                    ("ZOPU_CONVERSATION__OPENAI__MAX_RETRIES", "2"),
                    ("ZOPU_CONVERSATION__OPENAI__BACKOFF_BASE", "100ms"),
                    ("ZOPU_CONVERSATION__OPENAI__BACKOFF_MAX", "1s"),
                    (MODEL_KEY_VARIABLE, "chaos-key"),
                ]),
            },
        )?;
        // Each instance reaches the nodes only through its own proxies.
        let mut proxies = BTreeMap::new();
        let mut gateways = Vec::new();
        for instance in instances() {
            let mut own = Vec::new();
            for node in 0..CLUSTER_SIZE {
                own.push(proxy::Proxy::start(cluster.node_port(node)).await?);
            }
            let urls: Vec<String> = own.iter().map(proxy::Proxy::url).collect();
            let mut env = vec![("ZOPU_NATS_URL".to_owned(), urls.join(","))];
            if instance.service == "gateway" {
                let port = fixtures::free_port()?;
                gateways.push(port);
                env.push((
                    "ZOPU_GATEWAY__LISTEN".to_owned(),
                    format!("127.0.0.1:{port}"),
                ));
            }
            fleet.set_instance_env(instance.service, instance.n, env);
            fleet.start(instance.service, instance.n)?;
            proxies.insert(instance, own);
        }
        let mut chaos = Self {
            scale,
            seed,
            schedule,
            dir: Some(dir),
            root,
            cluster: Some(cluster),
            bus,
            fleet: Arc::new(Mutex::new(fleet)),
            proxies: Arc::new(proxies),
            model,
            faults,
            gateways,
            token: String::new(),
            org: ORG.parse()?,
            projects: Vec::new(),
        };
        chaos.token = chaos.create_token().await?;
        chaos.wait_for_gateways().await?;
        chaos.projects = chaos.create_projects(&repo).await?;
        Ok(chaos)
    }

    /// The run's directory, kept (not deleted on drop) from now on.
    pub fn keep(&mut self) -> PathBuf {
        if let Some(dir) = self.dir.take() {
            let _kept = dir.keep();
        }
        self.root.clone()
    }

    /// The tails of every instance's log, for a failure message.
    pub fn log_tails(&self, lines: usize) -> String {
        let fleet = lock(&self.fleet);
        instances()
            .iter()
            .map(|instance| {
                let name = instance.to_string();
                format!("--- {name}\n{}", fleet.log_tail(&name, lines))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The data directory of instance `n` of `service`.
    pub fn data_dir(&self, service: &str, n: usize) -> PathBuf {
        self.root
            .join("fleet/data")
            .join(Fleet::instance(service, n))
    }

    /// SIGTERM to instance `n` of `service`; true if it exited cleanly.
    pub fn stop(&self, service: &str, n: usize) -> Result<bool> {
        lock(&self.fleet).stop(service, n)
    }

    async fn cli(&self, args: &[&str]) -> Result<std::process::Output> {
        let mut command = tokio::process::Command::from(lock(&self.fleet).command());
        command.args(args).kill_on_drop(true);
        tokio::time::timeout(MESSAGE_TIMEOUT, command.output())
            .await
            .with_context(|| format!("zopu {} did not finish", args.join(" ")))?
            .context("running zopu")
    }

    async fn create_token(&self) -> Result<String> {
        let output = self
            .cli(&["token", "create", "--org", ORG, "--user", "chaos"])
            .await?;
        ensure!(
            output.status.success(),
            "zopu token create failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        Ok(stdout
            .lines()
            .next()
            .context("no token printed")?
            .trim()
            .to_owned())
    }

    async fn wait_for_gateways(&self) -> Result<()> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let deadline = Instant::now() + Duration::from_secs(120);
        for port in &self.gateways {
            loop {
                let answer = client
                    .get(format!("http://127.0.0.1:{port}/healthz"))
                    .send()
                    .await;
                if answer.is_ok_and(|answer| answer.status().is_success()) {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "gateway on port {port} was not healthy within 120s"
                );
                // Polling the gateway's health endpoint while it starts.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    async fn create_projects(&self, repo: &std::path::Path) -> Result<Vec<ProjectId>> {
        let repo = repo.to_string_lossy().into_owned();
        let mut creating = JoinSet::new();
        for index in 0..self.scale.projects {
            let mut command = tokio::process::Command::from(lock(&self.fleet).command());
            command
                .args([
                    "--json",
                    "project",
                    "create",
                    "--org",
                    ORG,
                    "--repo",
                    &repo,
                    "--request-id",
                    &format!("chaos-{}-{index}", self.seed),
                ])
                .kill_on_drop(true);
            creating.spawn(async move {
                (
                    index,
                    tokio::time::timeout(MESSAGE_TIMEOUT, command.output()).await,
                )
            });
        }
        let mut projects = BTreeMap::new();
        while let Some(joined) = creating.join_next().await {
            let (index, output) = joined?;
            let output = output.context("zopu project create timed out")??;
            let stdout = String::from_utf8_lossy(&output.stdout);
            ensure!(
                output.status.success(),
                "project create failed: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let first: serde_json::Value =
                serde_json::from_str(stdout.lines().next().unwrap_or("{}"))?;
            let project: ProjectId = first["project"]
                .as_str()
                .context("no project id")?
                .parse()?;
            projects.insert(index, project);
        }
        Ok(projects.into_values().collect())
    }

    /// The message text for message `m` of project `p` (distinct words, so
    /// the near-duplicate guardrail never drops an acknowledgement).
    fn message_text(&self, p: usize, m: usize) -> String {
        const WORDS: [&str; 24] = [
            "greeting",
            "environment",
            "manifest",
            "edition",
            "readme",
            "entry point",
            "default value",
            "database url",
            "example file",
            "print statement",
            "build",
            "package name",
            "version",
            "source tree",
            "main function",
            "variable lookup",
            "fallback",
            "output",
            "configuration",
            "startup",
            "documentation",
            "dependencies",
            "error handling",
            "license",
        ];
        let mut rng = Rng::new(self.seed).fork(&format!("message {p} {m}"));
        let mut pick = || WORDS[usize::try_from(rng.below(WORDS.len() as u64)).unwrap_or(0)];
        format!(
            "Question {m} of project {p}: how does the {} shape the {} and the {}",
            pick(),
            pick(),
            pick()
        )
    }

    /// Sends every message in waves while the schedule's faults run, heals
    /// everything, waits until every message ended and every promise holds.
    pub async fn drive(&mut self) -> Result<Report> {
        let started = Instant::now();
        let mut report = Report {
            seed: self.seed,
            scale: self.scale.name.to_owned(),
            messages: self.scale.messages(),
            ..Report::default()
        };
        let tracker = Arc::new(tracker::Tracker::start(&self.bus, &self.org));
        let exits = Arc::new(Mutex::new(Vec::new()));
        let supervisor = tokio::spawn(supervise(Arc::clone(&self.fleet), Arc::clone(&exits)));
        // Faults: instances on the schedule's clock, nodes one at a time.
        let instance_faults = tokio::spawn(run_instance_faults(
            self.schedule.clone(),
            Arc::clone(&self.fleet),
            Arc::clone(&self.proxies),
        ));
        let cluster = self.cluster.take().context("the cluster is in use")?;
        let node_faults = tokio::spawn(run_node_faults(
            self.schedule.clone(),
            cluster,
            self.bus.clone(),
        ));
        // Messages, in waves spread over the fault window.
        let mut sending = JoinSet::new();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()?;
        let per_wave = self.scale.messages_per_project.div_ceil(self.scale.waves);
        let t0 = tokio::time::Instant::now();
        let mut m = 0;
        for wave in 0..self.scale.waves {
            let at = self
                .scale
                .window
                .mul_f64(wave as f64 / self.scale.waves as f64);
            tokio::time::sleep_until(t0 + at).await;
            let end = (m + per_wave).min(self.scale.messages_per_project);
            for (p, project) in self.projects.iter().enumerate() {
                for message in m..end {
                    let text = self.message_text(p, message);
                    let via_gateway = Rng::new(self.seed)
                        .fork(&format!("route {p} {message}"))
                        .below(100)
                        < self.scale.gateway_percent;
                    let send = Send {
                        project: *project,
                        text,
                        request_id: format!("chaos-{}-{p}-{message}", self.seed),
                    };
                    if via_gateway {
                        report.through_gateway += 1;
                        sending.spawn(send.through_gateway(
                            client.clone(),
                            self.gateways.clone(),
                            self.token.clone(),
                            Arc::clone(&tracker),
                        ));
                    } else {
                        let command = lock(&self.fleet).command();
                        sending.spawn(send.with_cli(command, Arc::clone(&tracker)));
                    }
                }
            }
            m = end;
        }
        let mut errors = Vec::new();
        while let Some(joined) = sending.join_next().await {
            match joined? {
                Ok(None) => report.answered += 1,
                Ok(Some(code)) => *report.visible_failures.entry(code).or_default() += 1,
                Err(error) => errors.push(format!("{error:#}")),
            }
        }
        // Heal: every fault over, every node and instance up.
        let (kills, cuts) = instance_faults.await??;
        report.instance_kills = kills;
        report.cuts = cuts;
        let (cluster, node_kills, leader_kills) = node_faults.await??;
        report.node_kills = node_kills;
        report.leader_kills = leader_kills;
        self.cluster = Some(cluster);
        supervisor.abort();
        let _aborted = supervisor.await;
        self.heal(&exits)?;
        report.exited = exits.lock().map(|exits| exits.clone()).unwrap_or_default();
        if !errors.is_empty() {
            let diagnosis = diagnose_unended(&self.bus, &self.org, &tracker.unended()).await;
            bail!(
                "{} messages failed to be sent or to end:\n{}\n{diagnosis}",
                errors.len(),
                errors.join("\n")
            );
        }
        // Every promise, once the last turns and flows settled.
        let violations =
            invariants::check_settled(&self.bus, &self.org, &self.projects, SETTLE_TIMEOUT).await?;
        ensure!(violations.is_empty(), "invariants broken:\n{violations}");
        let audit = self.cli(&["audit", "verify"]).await?;
        ensure!(
            audit.status.success(),
            "zopu audit verify failed: {}{}",
            String::from_utf8_lossy(&audit.stdout),
            String::from_utf8_lossy(&audit.stderr)
        );
        self.check_connections_were_proxied().await?;
        for own in self.proxies.values() {
            for proxy in own {
                let (forwarded, refused) = proxy.counts();
                report.proxied_connections += forwarded;
                report.refused_connections += refused;
            }
        }
        report.model = self.model.counts();
        report.events = crate::history(&self.bus, &zopu_schema::subjects::all_events())
            .await?
            .len();
        report.duration = started.elapsed();
        Ok(report)
    }

    /// Starts every instance that is not running.
    fn heal(&mut self, exits: &Mutex<Vec<String>>) -> Result<()> {
        let mut fleet = lock(&self.fleet);
        for (name, status) in fleet.reap_exited() {
            let tail = fleet.log_tail(&name, 1);
            if let Ok(mut exits) = exits.lock() {
                exits.push(format!("{name} ({status}): {tail}"));
            }
        }
        let running = fleet.running();
        for instance in instances() {
            if !running.contains(&instance.to_string()) {
                eprintln!("chaos: heal: starting {instance}");
                fleet.start(instance.service, instance.n)?;
            }
        }
        Ok(())
    }

    /// Every connection of a service on every node came through one of its
    /// proxies (the nodes advertise no URLs, so none could reconnect
    /// around), and every instance is connected through its own. An
    /// instance whose cut ended a moment ago may still be in its reconnect
    /// back-off, so that part is awaited (bounded); a bypass fails at once.
    async fn check_connections_were_proxied(&mut self) -> Result<()> {
        let deadline = Instant::now() + RECONNECT_TIMEOUT;
        loop {
            let unconnected = self.instances_without_a_proxied_connection()?;
            if unconnected.is_empty() {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "instances with no connection through their proxies {}s after the faults ended: {unconnected:?}",
                RECONNECT_TIMEOUT.as_secs()
            );
            // Polling the nodes' /connz while clients reconnect.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The instances with no live connection through their own proxies;
    /// an error if any service connection bypassed its proxies.
    fn instances_without_a_proxied_connection(&mut self) -> Result<Vec<String>> {
        // Keyed by node and local port: two connections to two nodes may
        // share a local port (the kernel picks one per destination), so a
        // port alone once named the wrong instance.
        let owner: BTreeMap<(usize, u16), &Instance> = self
            .proxies
            .iter()
            .flat_map(|(instance, own)| {
                own.iter().enumerate().flat_map(move |(node, proxy)| {
                    proxy
                        .live_upstream_ports()
                        .into_iter()
                        .map(move |port| ((node, port), instance))
                })
            })
            .collect();
        let ever_proxied: BTreeSet<(usize, u16)> = self
            .proxies
            .values()
            .flat_map(|own| {
                own.iter().enumerate().flat_map(|(node, proxy)| {
                    proxy
                        .upstream_ports()
                        .into_iter()
                        .map(move |port| (node, port))
                })
            })
            .collect();
        let services: BTreeSet<String> = TOPOLOGY
            .iter()
            .map(|(service, _)| format!("zopu-{service}"))
            .collect();
        let cluster = self.cluster.as_mut().context("no cluster")?;
        let mut connected = BTreeSet::new();
        let mut bypassed = Vec::new();
        for node in 0..CLUSTER_SIZE {
            let connz = cluster
                .connections(node)
                .with_context(|| format!("node {node} answered no /connz"))?;
            for connection in connz["connections"].as_array().into_iter().flatten() {
                let name = connection["name"].as_str().unwrap_or_default();
                let port = connection["port"]
                    .as_u64()
                    .and_then(|port| u16::try_from(port).ok())
                    .unwrap_or(0);
                if let Some(instance) = owner.get(&(node, port)) {
                    connected.insert(instance.to_string());
                } else if services.contains(name) && !ever_proxied.contains(&(node, port)) {
                    bypassed.push(format!("{name} from port {port} on node {node}"));
                }
            }
        }
        ensure!(
            bypassed.is_empty(),
            "service connections bypassed their proxies: {bypassed:?}"
        );
        Ok(instances()
            .iter()
            .map(ToString::to_string)
            .filter(|name| !connected.contains(name))
            .collect())
    }

    /// The failing model's settings (for a report or a test).
    pub fn model_faults(&self) -> llm::Faults {
        self.faults
    }
}

/// What the stream holds of each message that got no ending: where it is
/// stored, the events it caused, and its project's last events, so a red
/// run says where a message stopped without its fleet logs.
async fn diagnose_unended(bus: &Bus, org: &OrgId, unended: &[String]) -> String {
    use std::fmt::Write as _;
    let history = match crate::history(bus, &zopu_schema::subjects::org_events(org)).await {
        Ok(history) => history,
        Err(error) => return format!("diagnosis: the history is unreadable: {error:#}"),
    };
    let mut out = String::from("diagnosis of the messages with no ending:\n");
    for message in unended {
        let Some((sequence, stored)) = history
            .iter()
            .find(|(_, event)| event.id.to_string() == *message)
        else {
            let _ = writeln!(out, "  {message}: not on the stream");
            continue;
        };
        let caused: Vec<String> = history
            .iter()
            .filter(|(_, event)| {
                event.correlation_id == stored.correlation_id && event.id != stored.id
            })
            .map(|(sequence, event)| format!("{}@{sequence}", event.event_type))
            .collect();
        let project: Vec<String> = history
            .iter()
            .filter(|(_, event)| event.project_id == stored.project_id)
            .map(|(sequence, event)| format!("{}@{sequence}", event.event_type))
            .collect();
        let tail = &project[project.len().saturating_sub(6)..];
        let _ = writeln!(
            out,
            "  {message}: {} at {sequence} of project {}; caused: [{}]; the project's last events: [{}]",
            stored.event_type,
            stored.project_id,
            caused.join(", "),
            tail.join(", ")
        );
    }
    out
}
