//! Confined execution of programs on behalf of the agent.
//!
//! Every program runs in a child process with a cleared environment, stdin
//! from `/dev/null`, its own process group, rlimits (address space, file
//! size, open files, CPU time, core = 0) and the strongest kernel layers this
//! machine offers, chosen once by [`Confinement::probe`]:
//!
//! - **landlock** mode: a user + network namespace (`unshare(NEWUSER|NEWNET)`,
//!   uid/gid mapped to themselves: no interface but a down loopback, so no
//!   network at all), then a landlock domain: read-only access to the
//!   workspace and a few system directories, read-write access to `.zopu/`
//!   and a private temporary directory, *execute* only on the allowlisted
//!   program and the dynamic loader, no TCP bind/connect (ABI ≥ 4), no
//!   signals or abstract unix sockets outside the domain (ABI ≥ 6).
//! - **bubblewrap** mode (when landlock is missing, or preferred by config):
//!   `bwrap --unshare-all --die-with-parent` (its own environment, cleared and
//!   set by the parent, is the program's) with read-only binds
//!   of system directories and the workspace, a writable `.zopu/` bind and a
//!   tmpfs `/tmp`.
//! - otherwise programs are refused, unless the operator sets
//!   `sandbox.allow_unconfined_exec` (`ZOPU_SANDBOX__ALLOW_UNCONFINED_EXEC`).
//!
//! Landlock and bubblewrap are not stacked: a landlock domain forbids the
//! mounts bubblewrap needs.
//!
//! In landlock and unconfined modes a **seccomp** filter (x86_64, aarch64) is
//! installed last, right before `exec`: every system call is allowed except
//! a deny list a read-only tool never needs (ptrace, mount, namespaces,
//! kernel modules, bpf, keyrings, clock setting, ...) and `socket` for
//! `AF_INET`, `AF_INET6` and `AF_PACKET`; those fail with `EPERM`. The BPF
//! program is compiled once in the parent; the probe runs `true` under it
//! and reports the layer inactive if the kernel refuses it. It is not applied
//! in bubblewrap mode (bubblewrap itself needs `mount` and `unshare`).
//!
//! A wall-clock limit kills the whole process group; stdout and stderr are
//! captured up to a cap, and exceeding it also kills the group.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope, path_beneath_rules,
};
use rustix::process::{Pid, Signal};
use serde::Serialize;

use crate::policy::SandboxLimits;

mod child;
mod seccomp;

use seccomp::{seccomp_applies, seccomp_program};

/// Why a program was not run, or failed to run.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error(
        "no kernel confinement (landlock, bubblewrap) is available on this machine; refusing to run \
         programs. Set sandbox.allow_unconfined_exec = true (env ZOPU_SANDBOX__ALLOW_UNCONFINED_EXEC=true) \
         to accept running them with rlimits only"
    )]
    Unconfined,
    #[error("program path must be absolute: {0:?}")]
    ProgramNotAbsolute(PathBuf),
    #[error("could not build the landlock ruleset: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("could not spawn {program:?}: {source}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not prepare the private temporary directory: {0}")]
    TempDir(#[source] std::io::Error),
    #[error("waiting for the child failed: {0}")]
    Wait(#[source] std::io::Error),
    #[error("the run was aborted; no program is started after an abort")]
    Aborted,
}

/// Which layer set is used to run programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfinementMode {
    /// Namespaces (when usable) + landlock + rlimits.
    Landlock,
    /// bubblewrap namespaces + rlimits.
    Bubblewrap,
    /// rlimits only, by operator opt-out.
    Unconfined,
    /// No layer and no opt-out: programs are refused.
    Refused,
}

/// What the probe found and which layers are active.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfinementReport {
    /// Highest landlock ABI usable by this build (`None`: unavailable).
    pub landlock_abi: Option<u8>,
    /// Landlock denies TCP bind/connect (ABI ≥ 4).
    pub landlock_network: bool,
    /// Landlock scopes signals and abstract unix sockets (ABI ≥ 6).
    pub landlock_scope: bool,
    /// Unprivileged user + network namespaces work.
    pub network_namespace: bool,
    /// Path of a working `bwrap`, if any.
    pub bubblewrap: Option<PathBuf>,
    /// A seccomp deny-list filter is installed (landlock and unconfined
    /// modes only).
    pub seccomp: bool,
    /// rlimits are always set.
    pub rlimits: bool,
    /// The mode used to run programs.
    pub mode: ConfinementMode,
}

impl ConfinementReport {
    /// Whether a network-denying layer is active in the chosen mode.
    pub fn denies_network(&self) -> bool {
        match self.mode {
            ConfinementMode::Landlock => self.network_namespace || self.landlock_network,
            ConfinementMode::Bubblewrap => true,
            ConfinementMode::Unconfined | ConfinementMode::Refused => false,
        }
    }

    /// Names of the active layers, for records and logs.
    pub fn active_layers(&self) -> Vec<&'static str> {
        let mut layers = vec!["rlimits", "process_group", "cleared_env"];
        match self.mode {
            ConfinementMode::Landlock => {
                layers.push("landlock_fs");
                if self.landlock_network {
                    layers.push("landlock_net");
                }
                if self.landlock_scope {
                    layers.push("landlock_scope");
                }
                if self.network_namespace {
                    layers.push("user_net_namespace");
                }
            }
            ConfinementMode::Bubblewrap => layers.push("bubblewrap"),
            ConfinementMode::Unconfined | ConfinementMode::Refused => {}
        }
        if self.seccomp && seccomp_applies(self.mode) {
            layers.push("seccomp");
        }
        layers
    }
}

/// Machine capabilities, probed once per process.
#[derive(Debug, Clone)]
struct Capabilities {
    landlock_abi: Option<ABI>,
    network_namespace: bool,
    bubblewrap: Option<PathBuf>,
    seccomp: bool,
}

fn capabilities() -> &'static Capabilities {
    static CAPS: OnceLock<Capabilities> = OnceLock::new();
    CAPS.get_or_init(|| {
        let landlock_abi = [
            ABI::V7,
            ABI::V6,
            ABI::V5,
            ABI::V4,
            ABI::V3,
            ABI::V2,
            ABI::V1,
        ]
        .into_iter()
        .find(|abi| {
            Ruleset::default()
                .set_compatibility(CompatLevel::HardRequirement)
                .handle_access(AccessFs::from_all(*abi))
                .and_then(|r| r.create())
                .is_ok()
        });
        let network_namespace =
            probe_true(|cmd| child::install(cmd, child::Setup::namespaces_only()));
        let bubblewrap = find_program("bwrap").filter(|bwrap| {
            probe_true(|cmd| {
                let program = cmd.get_program().to_owned();
                let mut wrapped = Command::new(bwrap);
                wrapped
                    .args([
                        "--unshare-all",
                        "--die-with-parent",
                        "--ro-bind",
                        "/",
                        "/",
                        "--",
                    ])
                    .arg(program);
                *cmd = wrapped;
            })
        });
        let seccomp = seccomp_program().is_some_and(|program| {
            probe_true(|cmd| child::install(cmd, child::Setup::seccomp_only(program)))
        });
        Capabilities {
            landlock_abi,
            network_namespace,
            bubblewrap,
            seccomp,
        }
    })
}

fn probe_true(prepare: impl FnOnce(&mut Command)) -> bool {
    let Some(true_bin) = find_program("true") else {
        return false;
    };
    let mut cmd = Command::new(true_bin);
    prepare(&mut cmd);
    cmd.env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd.status().map(|s| s.success()).unwrap_or(false)
}

/// Finds `name` in the operator's standard binary directories (not `$PATH`,
/// which a caller could influence), canonicalized.
pub fn find_program(name: &str) -> Option<PathBuf> {
    ["/usr/local/bin", "/usr/bin", "/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
        .and_then(|p| p.canonicalize().ok())
}

fn dynamic_loaders() -> Vec<PathBuf> {
    [
        "/lib64/ld-linux-x86-64.so.2",
        "/lib/ld-linux-aarch64.so.1",
        "/lib/ld-linux-armhf.so.3",
        "/lib/ld-musl-x86_64.so.1",
        "/lib/ld-musl-aarch64.so.1",
    ]
    .iter()
    .filter_map(|p| Path::new(p).canonicalize().ok())
    .collect()
}

fn system_read_paths() -> Vec<PathBuf> {
    [
        "/usr",
        "/lib",
        "/lib64",
        "/bin",
        "/etc/ld.so.cache",
        "/etc/localtime",
    ]
    .iter()
    .filter_map(|p| Path::new(p).canonicalize().ok())
    .collect()
}

/// A program to run confined.
#[derive(Debug, Clone)]
pub struct ConfinedCommand {
    /// Absolute path of the program; the only executable (besides the
    /// dynamic loader and `exec_paths`) the child may execute.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Working directory (must be inside `read_paths`).
    pub cwd: PathBuf,
    /// The whole environment of the child.
    pub env: Vec<(String, String)>,
    /// Trees the child may read.
    pub read_paths: Vec<PathBuf>,
    /// Trees the child may write (must exist).
    pub write_paths: Vec<PathBuf>,
    /// Extra executables or trees the child may execute.
    pub exec_paths: Vec<PathBuf>,
    pub timeout: Duration,
    /// Cap on captured stdout and on captured stderr.
    pub output_cap: usize,
}

/// What a confined program did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub timed_out: bool,
    pub duration: Duration,
}

/// The confinement chosen for this machine and these limits.
#[derive(Debug, Clone)]
pub struct Confinement {
    report: ConfinementReport,
    limits: SandboxLimits,
    /// The process groups of the programs running now; clones share them.
    running: RunningGroups,
}

/// The process groups a [`Confinement`] is running, so an abort can kill
/// them; once aborted it starts nothing more.
#[derive(Debug, Clone, Default)]
struct RunningGroups(Arc<Mutex<Groups>>);

#[derive(Debug, Default)]
struct Groups {
    aborted: bool,
    pids: Vec<Pid>,
}

impl RunningGroups {
    fn lock(&self) -> std::sync::MutexGuard<'_, Groups> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Spawns `command` unless aborted, and keeps its group until it ends.
    fn spawn(&self, command: &mut Command, program: &Path) -> Result<Child, ConfineError> {
        let mut groups = self.lock();
        if groups.aborted {
            return Err(ConfineError::Aborted);
        }
        let child = command.spawn().map_err(|source| ConfineError::Spawn {
            program: program.to_owned(),
            source,
        })?;
        if let Some(pid) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) {
            groups.pids.push(pid);
        }
        Ok(child)
    }

    fn finished(&self, pid: Option<Pid>) {
        if let Some(pid) = pid {
            self.lock().pids.retain(|running| *running != pid);
        }
    }

    /// Kills every running group and refuses later spawns.
    fn abort(&self) {
        let mut groups = self.lock();
        groups.aborted = true;
        for pid in groups.pids.drain(..) {
            kill_group(Some(pid));
        }
    }
}

impl Confinement {
    /// Probes the machine (once per process) and picks the mode.
    pub fn probe(limits: &SandboxLimits) -> Self {
        let caps = capabilities();
        let abi = caps.landlock_abi;
        let mode = match (abi.is_some(), caps.bubblewrap.is_some()) {
            (_, true) if limits.prefer_bubblewrap || abi.is_none() => ConfinementMode::Bubblewrap,
            (true, _) => ConfinementMode::Landlock,
            _ if limits.allow_unconfined_exec => ConfinementMode::Unconfined,
            _ => ConfinementMode::Refused,
        };
        let report = ConfinementReport {
            landlock_abi: abi.map(|a| a as u8),
            landlock_network: abi.is_some_and(|a| a >= ABI::V4),
            landlock_scope: abi.is_some_and(|a| a >= ABI::V6),
            network_namespace: caps.network_namespace,
            bubblewrap: caps.bubblewrap.clone(),
            seccomp: caps.seccomp && seccomp_applies(mode),
            rlimits: true,
            mode,
        };
        tracing::info!(mode = ?report.mode, layers = ?report.active_layers(), "sandbox confinement probed");
        Self::with_report(report, limits)
    }

    /// A confinement with a given report, e.g. to pin a mode the operator
    /// chose or to exercise the refusal path; layers absent on the machine
    /// make `run` fail rather than silently weaken.
    pub fn with_report(report: ConfinementReport, limits: &SandboxLimits) -> Self {
        Self {
            report,
            limits: limits.clone(),
            running: RunningGroups::default(),
        }
    }

    /// Kills every program this confinement (and its clones) is running and
    /// refuses to start another: a cancelled run stops its tool at once
    /// instead of at the tool's timeout.
    pub fn abort(&self) {
        self.running.abort();
    }

    /// The same confinement with other limits (a check's larger CPU
    /// budget); an abort of either kills the programs of both.
    pub fn with_limits(&self, limits: &SandboxLimits) -> Self {
        Self {
            report: self.report.clone(),
            limits: limits.clone(),
            running: self.running.clone(),
        }
    }

    /// The probe result.
    pub fn report(&self) -> &ConfinementReport {
        &self.report
    }

    /// Runs `cmd` confined, enforcing its timeout and output cap.
    pub fn run(&self, cmd: &ConfinedCommand) -> Result<ExecOutput, ConfineError> {
        if !cmd.program.is_absolute() {
            return Err(ConfineError::ProgramNotAbsolute(cmd.program.clone()));
        }
        if self.report.mode == ConfinementMode::Refused {
            return Err(ConfineError::Unconfined);
        }
        let tmp = PrivateTemp::create()?;
        let mut env = cmd.env.clone();
        env.push((
            "TMPDIR".to_owned(),
            tmp.path().to_string_lossy().into_owned(),
        ));
        let rlimits = child::Rlimits::from_limits(&self.limits);
        let seccomp = if self.report.seccomp && seccomp_applies(self.report.mode) {
            // A report claiming seccomp on a build without it fails the run
            // rather than silently weakening it.
            Some(seccomp_program().ok_or_else(|| ConfineError::Spawn {
                program: cmd.program.clone(),
                source: std::io::Error::other("seccomp filter unavailable"),
            })?)
        } else {
            None
        };
        let mut command = match self.report.mode {
            ConfinementMode::Landlock => {
                let ruleset = self.landlock_ruleset(cmd, tmp.path())?;
                let mut command = Command::new(&cmd.program);
                command
                    .args(&cmd.args)
                    .current_dir(&cmd.cwd)
                    .env_clear()
                    .envs(env);
                let setup = child::Setup::full(
                    rlimits,
                    self.report.network_namespace,
                    Some(ruleset),
                    seccomp,
                );
                child::install(&mut command, setup);
                command
            }
            ConfinementMode::Bubblewrap => {
                let bwrap = self
                    .report
                    .bubblewrap
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("/usr/bin/bwrap"));
                let mut command = Command::new(bwrap);
                command.args(bwrap_args(cmd, tmp.path()));
                // bubblewrap hands its own environment to the program: the
                // values never travel on its argv (readable in /proc).
                command.env_clear().envs(env);
                child::install(&mut command, child::Setup::full(rlimits, false, None, None));
                command
            }
            ConfinementMode::Unconfined | ConfinementMode::Refused => {
                let mut command = Command::new(&cmd.program);
                command
                    .args(&cmd.args)
                    .current_dir(&cmd.cwd)
                    .env_clear()
                    .envs(env);
                child::install(
                    &mut command,
                    child::Setup::full(rlimits, false, None, seccomp),
                );
                command
            }
        };
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        supervise(command, cmd, &self.running)
    }

    fn landlock_ruleset(
        &self,
        cmd: &ConfinedCommand,
        tmp: &Path,
    ) -> Result<RulesetCreated, ConfineError> {
        let Some(abi) = self.report.landlock_abi.map(|v| ABI::from(i32::from(v))) else {
            return Err(ConfineError::Unconfined);
        };
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(abi))?;
        if abi >= ABI::V4 {
            ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
        }
        if abi >= ABI::V6 {
            ruleset = ruleset.scope(Scope::from_all(abi))?;
        }
        let read = AccessFs::from_read(abi);
        let mut reads = system_read_paths();
        reads.extend(cmd.read_paths.iter().cloned());
        let mut execs = vec![cmd.program.clone()];
        execs.extend(dynamic_loaders());
        execs.extend(cmd.exec_paths.iter().cloned());
        let mut writes = vec![tmp.to_path_buf()];
        writes.extend(cmd.write_paths.iter().cloned());
        let created = ruleset
            .create()?
            .set_compatibility(CompatLevel::BestEffort)
            .add_rules(path_beneath_rules(reads, read & !AccessFs::Execute))?
            .add_rules(path_beneath_rules(
                execs,
                AccessFs::Execute | AccessFs::ReadFile,
            ))?
            .add_rules(path_beneath_rules(
                writes,
                AccessFs::from_all(abi) & !AccessFs::Execute,
            ))?
            .add_rules(path_beneath_rules(
                ["/dev/null"],
                AccessFs::ReadFile | AccessFs::WriteFile,
            ))?
            .set_compatibility(CompatLevel::HardRequirement);
        Ok(created)
    }
}

fn bwrap_args(cmd: &ConfinedCommand, tmp: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "--unshare-all",
        "--die-with-parent",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let mut bind = |flag: &str, path: &Path| {
        args.extend([
            OsString::from(flag),
            path.as_os_str().to_owned(),
            path.as_os_str().to_owned(),
        ]);
    };
    for dir in [
        "/usr",
        "/lib",
        "/lib64",
        "/bin",
        "/sbin",
        "/etc/ld.so.cache",
        "/etc/localtime",
    ] {
        bind("--ro-bind-try", Path::new(dir));
    }
    for path in &cmd.read_paths {
        bind("--ro-bind", path);
    }
    for path in &cmd.write_paths {
        bind("--bind", path);
    }
    bind("--bind", tmp);
    args.extend([
        OsString::from("--chdir"),
        cmd.cwd.as_os_str().to_owned(),
        OsString::from("--"),
    ]);
    args.push(cmd.program.as_os_str().to_owned());
    args.extend(cmd.args.iter().cloned());
    args
}

/// A per-run temporary directory (mode 0700), removed on drop.
#[derive(Debug)]
struct PrivateTemp(PathBuf);

impl PrivateTemp {
    fn create() -> Result<Self, ConfineError> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!("zopu-sandbox-{}", uuid::Uuid::now_v7()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(ConfineError::TempDir)?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for PrivateTemp {
    fn drop(&mut self) {
        // `remove_dir_all` does not follow symlinks the child may have planted.
        if let Err(error) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!(path = ?self.0, %error, "could not remove sandbox temp dir");
        }
    }
}

struct Capture {
    bytes: Vec<u8>,
    truncated: bool,
}

fn kill_group(pid: Option<Pid>) {
    if let Some(pid) = pid {
        // ESRCH (group already gone) is the normal case after a clean exit.
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    }
}

fn supervise(
    mut command: Command,
    cmd: &ConfinedCommand,
    running: &RunningGroups,
) -> Result<ExecOutput, ConfineError> {
    let start = Instant::now();
    let deadline = start + cmd.timeout;
    let mut child = running.spawn(&mut command, &cmd.program)?;
    let pid = i32::try_from(child.id()).ok().and_then(Pid::from_raw);
    let (out_tx, out_rx) = mpsc::channel::<(bool, Capture)>();
    let spawn_reader = |stream: Option<Box<dyn Read + Send>>, is_stdout: bool| {
        let tx = out_tx.clone();
        let cap = cmd.output_cap;
        std::thread::spawn(move || {
            let mut capture = Capture {
                bytes: Vec::new(),
                truncated: false,
            };
            if let Some(mut stream) = stream {
                let mut buf = [0u8; 16 * 1024];
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let room = cap.saturating_sub(capture.bytes.len());
                            capture.bytes.extend_from_slice(&buf[..n.min(room)]);
                            if n > room {
                                capture.truncated = true;
                                kill_group(pid);
                                break;
                            }
                        }
                    }
                }
            }
            let _ = tx.send((is_stdout, capture));
        });
    };
    spawn_reader(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        true,
    );
    spawn_reader(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        false,
    );
    drop(out_tx);

    let (status_tx, status_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = status_tx.send(child.wait());
    });
    let mut timed_out = false;
    let status = match status_rx.recv_timeout(cmd.timeout) {
        Ok(status) => status,
        Err(_) => {
            timed_out = true;
            kill_group(pid);
            status_rx
                .recv()
                .unwrap_or_else(|_| Err(std::io::Error::other("waiter thread vanished")))
        }
    }
    .map_err(ConfineError::Wait)?;
    // Kill anything the program left behind in its group.
    kill_group(pid);
    running.finished(pid);

    let mut stdout = Capture {
        bytes: Vec::new(),
        truncated: false,
    };
    let mut stderr = Capture {
        bytes: Vec::new(),
        truncated: false,
    };
    let grace = Duration::from_millis(500);
    for _ in 0..2 {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(grace);
        match out_rx.recv_timeout(wait) {
            Ok((true, capture)) => stdout = capture,
            Ok((false, capture)) => stderr = capture,
            // A descendant that left the group still holds a pipe: give up on it.
            Err(_) => break,
        }
    }
    Ok(ExecOutput {
        exit_code: status.code(),
        signal: status.signal(),
        stdout: stdout.bytes,
        stderr: stderr.bytes,
        stdout_truncated: stdout.truncated,
        stderr_truncated: stderr.truncated,
        timed_out,
        duration: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_is_consistent() {
        let c = Confinement::probe(&SandboxLimits::default());
        let r = c.report();
        if r.mode == ConfinementMode::Landlock {
            assert!(r.landlock_abi.is_some());
        }
        assert!(r.rlimits);
    }
}
