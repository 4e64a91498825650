//! A fleet of service processes: `zopu run <service>` children, several
//! instances of each, every one with its own data directory and instance
//! id, as on separate machines. A test can kill -9 any of them, stop it
//! with SIGTERM, and start it again; every child is killed when the fleet
//! is dropped. Each child's log goes to `<root>/logs/<instance>.log`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};

/// How the fleet's processes are configured (environment, as an operator
/// would set it).
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub nats_url: String,
    pub stream_replicas: usize,
    pub partitions: u32,
    pub lease_ttl: Duration,
    /// Extra `ZOPU_*` variables for every process (e.g. an LLM endpoint).
    pub env: Vec<(String, String)>,
}

/// Variables as a fleet takes them, from literal pairs.
pub fn variables(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}

impl FleetConfig {
    /// One instance of each service on one nats-server: R1 streams, one
    /// partition, 3 s leases, and `env` for every process.
    pub fn single_node(nats_url: String, env: Vec<(String, String)>) -> Self {
        Self {
            nats_url,
            stream_replicas: 1,
            partitions: 1,
            lease_ttl: Duration::from_secs(3),
            env,
        }
    }
}

#[derive(Debug)]
pub struct Fleet {
    zopu: PathBuf,
    root: PathBuf,
    config: FleetConfig,
    /// Variables of one instance (`<service>-<n>`), set after the fleet's.
    instance_env: BTreeMap<String, Vec<(String, String)>>,
    children: BTreeMap<String, Child>,
}

/// `ZOPU_*` variables the tests themselves read: not settings, so a child
/// must not inherit them (it would refuse them as unknown keys).
/// The services a message's whole path runs through (no gateway, no
/// executor): what most fleets start one or more instances of.
pub const REACTION_SERVICES: [&str; 5] = [
    "setup",
    "dispatch",
    "conversation",
    "specialists",
    "artifacts",
];

const TEST_VARIABLES: &[&str] = &[
    "ZOPU_BIN",
    "ZOPU_CHAOS_SEED",
    "ZOPU_CHAOS_SCALE",
    "ZOPU_TEST_NATS",
    "ZOPU_TEST_NATS_IMAGE",
    "ZOPU_REQUIRE_LLAMA_SERVER",
    "ZOPU_FUZZ_CASES",
];

impl Fleet {
    pub fn new(zopu: &Path, root: &Path, config: FleetConfig) -> Result<Self> {
        std::fs::create_dir_all(root.join("logs"))?;
        Ok(Self {
            zopu: zopu.to_owned(),
            root: root.to_owned(),
            config,
            instance_env: BTreeMap::new(),
            children: BTreeMap::new(),
        })
    }

    /// `<service>-<n>`: the instance id and the name of its data directory.
    pub fn instance(service: &str, n: usize) -> String {
        format!("{service}-{n}")
    }

    /// Extra variables for instance `n` of `service` (its own NATS URLs, its
    /// listen address ...), used from its next start on.
    pub fn set_instance_env(&mut self, service: &str, n: usize, env: Vec<(String, String)>) {
        self.instance_env.insert(Self::instance(service, n), env);
    }

    /// Where the instances' logs are (`<instance>.log`).
    pub fn log_dir(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// A `zopu` command with the fleet's settings (for the CLI: project
    /// create, send, audit verify ...), logging to stderr at warn.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.zopu);
        self.configure(&mut command, &self.root.join("data/cli"));
        command.env("ZOPU_LOG", "warn");
        command
    }

    /// Runs `zopu ARGS` with the fleet's settings; its output, whatever its
    /// exit status, within `timeout`.
    pub async fn cli(&self, args: &[&str], timeout: Duration) -> Result<std::process::Output> {
        let mut command = tokio::process::Command::from(self.command());
        command.args(args).kill_on_drop(true);
        tokio::time::timeout(timeout, command.output())
            .await
            .with_context(|| {
                format!(
                    "zopu {} did not finish within {}s",
                    args.join(" "),
                    timeout.as_secs()
                )
            })?
            .context("running zopu")
    }

    /// Runs `zopu ARGS`; its standard output when it exits with one of `codes`.
    pub async fn cli_exiting(
        &self,
        args: &[&str],
        codes: &[i32],
        timeout: Duration,
    ) -> Result<String> {
        let output = self.cli(args, timeout).await?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        ensure!(
            output
                .status
                .code()
                .is_some_and(|code| codes.contains(&code)),
            "zopu {} exited with {}: {stdout}\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(stdout)
    }

    /// `zopu --json send --org ORG PROJECT TEXT --timeout SECONDS` (the CLI
    /// waits up to `answer_within` for the final answer); its standard output
    /// when it exits with one of `codes` (1: the answer was a visible failure).
    pub async fn send(
        &self,
        org: &str,
        project: &str,
        text: &str,
        answer_within: Duration,
        codes: &[i32],
    ) -> Result<String> {
        let seconds = answer_within.as_secs().to_string();
        let args = [
            "--json",
            "send",
            "--org",
            org,
            project,
            text,
            "--timeout",
            &seconds,
        ];
        self.cli_exiting(&args, codes, answer_within + Duration::from_secs(30))
            .await
    }

    /// Creates a project of `org` from the local repository `repo` with
    /// `zopu project create` (which waits for its setup); its id.
    pub async fn create_project(
        &self,
        org: &str,
        repo: &Path,
        timeout: Duration,
    ) -> Result<String> {
        let repo = repo.to_string_lossy();
        let args = ["--json", "project", "create", "--org", org, "--repo", &repo];
        let created = self.cli_exiting(&args, &[0], timeout).await?;
        let first: serde_json::Value =
            serde_json::from_str(created.lines().next().unwrap_or("{}"))?;
        Ok(first["project"]
            .as_str()
            .context("no project id")?
            .to_owned())
    }

    fn configure(&self, command: &mut Command, data_dir: &Path) {
        for name in TEST_VARIABLES {
            command.env_remove(name);
        }
        command
            .env_remove("ZOPU_CONFIG")
            .env("ZOPU_NATS_URL", &self.config.nats_url)
            .env("ZOPU_DATA_DIR", data_dir)
            .env(
                "ZOPU_STREAM_REPLICAS",
                self.config.stream_replicas.to_string(),
            )
            .env("ZOPU_SCALE__PARTITIONS", self.config.partitions.to_string())
            .env(
                "ZOPU_SCALE__LEASE_TTL",
                format!("{}ms", self.config.lease_ttl.as_millis()),
            )
            .env("ZOPU_SANDBOX__ALLOW_LOCAL_REPOSITORIES", "true")
            // Fixture repositories live in temporary directories (TOML list).
            .env(
                "ZOPU_SANDBOX__LOCAL_REPOSITORY_ROOTS",
                format!("[{:?}]", std::env::temp_dir().display().to_string()),
            )
            .env("ZOPU_SHUTDOWN_GRACE", "20s");
        for (name, value) in &self.config.env {
            command.env(name, value);
        }
    }

    /// Starts instance `n` of `service` (again, after a kill: same data dir).
    pub fn start(&mut self, service: &str, n: usize) -> Result<()> {
        let name = Self::instance(service, n);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("logs").join(format!("{name}.log")))?;
        let mut command = Command::new(&self.zopu);
        self.configure(&mut command, &self.root.join("data").join(&name));
        command
            .args(["run", service])
            // An instance's own variables may set another level.
            .env("ZOPU_LOG", "info")
            .envs(self.instance_env.get(&name).cloned().unwrap_or_default())
            .env("ZOPU_SCALE__INSTANCE_ID", &name)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = command
            .spawn()
            .with_context(|| format!("starting {name} ({})", self.zopu.display()))?;
        self.children.insert(name, child);
        Ok(())
    }

    /// SIGKILL: the instance stops mid-work, releases nothing.
    pub fn kill(&mut self, service: &str, n: usize) {
        if let Some(mut child) = self.children.remove(&Self::instance(service, n)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The process id of instance `n` of `service`, while it runs.
    pub fn pid(&self, service: &str, n: usize) -> Option<u32> {
        self.children
            .get(&Self::instance(service, n))
            .map(Child::id)
    }

    /// SIGTERM and wait: the instance finishes what it holds and releases
    /// its partitions. True if it exited successfully.
    pub fn stop(&mut self, service: &str, n: usize) -> Result<bool> {
        let Some(mut child) = self.children.remove(&Self::instance(service, n)) else {
            return Ok(true);
        };
        let pid = i32::try_from(child.id()).context("pid")?;
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -TERM {pid} failed");
        Ok(child.wait()?.success())
    }

    /// Whether instance `n` of `service` was started and not killed or stopped.
    pub fn is_started(&self, service: &str, n: usize) -> bool {
        self.children.contains_key(&Self::instance(service, n))
    }

    /// Instances that exited on their own since the last call (not killed
    /// or stopped by the test), with how; they are forgotten, so
    /// [`Fleet::start`] can start them again.
    pub fn reap_exited(&mut self) -> Vec<(String, std::process::ExitStatus)> {
        let exited: Vec<(String, std::process::ExitStatus)> = self
            .children
            .iter_mut()
            .filter_map(|(name, child)| match child.try_wait() {
                Ok(Some(status)) => Some((name.clone(), status)),
                _ => None,
            })
            .collect();
        for (name, _) in &exited {
            self.children.remove(name);
        }
        exited
    }

    /// Names of the instances that are running (exited ones are reaped).
    pub fn running(&mut self) -> Vec<String> {
        self.children
            .iter_mut()
            .filter_map(|(name, child)| matches!(child.try_wait(), Ok(None)).then(|| name.clone()))
            .collect()
    }

    /// The tail of an instance's log, for failure messages.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.root.join("logs").join(format!("{name}.log")))
            .unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
