//! THE git command builder ([`Git::command`]) and the runner that bounds
//! every invocation: cleared environment, hardened configuration, a
//! wall-clock timeout and, for clones, a watch on the bytes written.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

use crate::egress::Pin;

use super::{CloneLimit, Error, Git};

/// Bytes of git's stdout kept in memory (records beyond it are only counted).
pub(super) const STDOUT_KEPT_BYTES_MAX: usize = 1024 * 1024;
/// Bytes of git's stderr kept for classification and error details.
pub(super) const STDERR_KEPT_BYTES_MAX: usize = 16 * 1024;
/// The only `PATH` git sees.
const MINIMAL_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// How often the size of a clone in progress is measured.
const CLONE_WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// Output of one git invocation.
#[derive(Debug)]
pub(crate) struct GitOutput {
    pub(crate) status: ExitStatus,
    /// The first [`STDOUT_KEPT_BYTES_MAX`] bytes of stdout.
    pub(crate) stdout: Vec<u8>,
    /// NUL bytes seen on stdout (records of `-z` output), all of it.
    pub(crate) stdout_nul_count: usize,
    /// The first [`STDERR_KEPT_BYTES_MAX`] bytes of stderr, lossily decoded.
    pub(crate) stderr: String,
}

/// An empty, private, per-invocation `HOME`, removed on drop.
#[derive(Debug)]
pub(crate) struct EmptyHome(pub(super) PathBuf);

impl EmptyHome {
    pub(crate) fn create() -> Result<Self, Error> {
        let path = std::env::temp_dir().join(format!("zopu-git-home-{}", uuid::Uuid::now_v7()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| Error::io("create git home", &path, e))?;
        Ok(Self(path))
    }
}

impl Drop for EmptyHome {
    fn drop(&mut self) {
        // Best effort: an empty directory in the temp dir is harmless.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where a command runs: nowhere in particular (clone) or in a repository
/// whose git directory is given explicitly, so no discovery walks upwards.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target<'a> {
    None,
    Repository(&'a Path),
}

impl Git {
    /// THE git command builder: every invocation of this module goes through
    /// it. `allow_file` enables the `file` transport (local clones only).
    pub(crate) fn command(
        &self,
        home: &EmptyHome,
        target: Target<'_>,
        allow_file: bool,
    ) -> Command {
        let mut command = Command::new(&self.options.program);
        command
            .env_clear()
            .env("PATH", MINIMAL_PATH)
            .env("HOME", &home.0)
            .env("XDG_CONFIG_HOME", &home.0)
            .env("LC_ALL", "C")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_ASKPASS", "")
            .env("SSH_ASKPASS", "")
            .env("GIT_PAGER", "cat")
            .env("PAGER", "cat")
            .env("GIT_EDITOR", "true")
            .env("GIT_NO_REPLACE_OBJECTS", "1")
            .env("GIT_OPTIONAL_LOCKS", "0")
            .env("GIT_PROTOCOL_FROM_USER", "0")
            .env(
                "GIT_ALLOW_PROTOCOL",
                if allow_file { "https:file" } else { "https" },
            )
            .env("GIT_SSH_COMMAND", "false");
        if let Target::Repository(path) = target {
            command
                .env("GIT_DIR", path.join(".git"))
                .env("GIT_WORK_TREE", path)
                .env(
                    "GIT_CEILING_DIRECTORIES",
                    path.parent().unwrap_or(Path::new("/")),
                )
                .current_dir(path);
        } else {
            command.current_dir(&home.0);
        }
        let file_policy = if allow_file { "always" } else { "never" };
        let settings: [(&str, &str); 23] = [
            ("core.hooksPath", "/dev/null"),
            ("core.fsmonitor", "false"),
            ("core.untrackedCache", "false"),
            ("core.pager", "cat"),
            ("core.editor", "true"),
            ("core.askPass", ""),
            ("core.sshCommand", "false"),
            ("core.gitProxy", ""),
            ("core.symlinks", "true"),
            ("credential.helper", ""),
            ("protocol.allow", "never"),
            ("protocol.https.allow", "always"),
            ("protocol.file.allow", file_policy),
            ("protocol.ext.allow", "never"),
            ("protocol.ssh.allow", "never"),
            ("protocol.git.allow", "never"),
            ("submodule.recurse", "false"),
            ("init.templateDir", ""),
            ("advice.detachedHead", "false"),
            // A redirect could lead to a host nobody checked.
            ("http.followRedirects", "false"),
            ("http.proxy", ""),
            // One pack file, whose growth the clone watch measures.
            ("fetch.unpackLimit", "1"),
            ("transfer.unpackLimit", "1"),
        ];
        command.arg("--no-pager");
        for (key, value) in settings {
            command.arg("-c").arg(format!("{key}={value}"));
        }
        if let Some(bundle) = &self.options.repository_ca_file {
            // Replaces the system bundle for https remotes (a private git
            // server with its own CA).
            command
                .arg("-c")
                .arg(format!("http.sslCAInfo={}", bundle.display()));
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a stop also stops the helpers git
            // starts (remote-https, index-pack).
            .process_group(0)
            .kill_on_drop(true);
        command
    }

    /// Pins the command's connections for `pin`'s host to its address
    /// (before the subcommand: it adds a `-c`).
    pub(crate) fn pinned(command: &mut Command, pin: Option<&Pin>) {
        if let Some(pin) = pin {
            command
                .arg("-c")
                .arg(format!("http.curloptResolve={}", pin.curl_resolve()));
        }
    }

    /// Runs a prepared command with a timeout, killing it when it expires.
    pub(crate) async fn run(
        &self,
        command: Command,
        operation: &'static str,
        timeout: Duration,
    ) -> Result<GitOutput, Error> {
        self.run_watched(command, operation, timeout, None).await
    }

    /// [`Git::run`] that also stops git (with [`Error::TooLarge`]) as soon
    /// as `watch` (a directory git writes into) holds more than
    /// [`GitOptions::clone_bytes_max`] bytes.
    pub(crate) async fn run_watched(
        &self,
        mut command: Command,
        operation: &'static str,
        timeout: Duration,
        watch: Option<&Path>,
    ) -> Result<GitOutput, Error> {
        let mut child = command.spawn().map_err(Error::Spawn)?;
        let group = child.id();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let collect = async {
            let (stdout, stderr) = tokio::join!(
                read_capped(stdout, STDOUT_KEPT_BYTES_MAX),
                read_capped(stderr, STDERR_KEPT_BYTES_MAX),
            );
            let status = child.wait().await;
            (stdout, stderr, status)
        };
        let bytes_max = self.options.clone_bytes_max;
        let outgrown = async {
            let Some(directory) = watch else {
                return std::future::pending().await;
            };
            let mut interval = tokio::time::interval(CLONE_WATCH_INTERVAL);
            loop {
                interval.tick().await;
                let directory = directory.to_path_buf();
                let size =
                    tokio::task::spawn_blocking(move || directory_bytes(&directory, bytes_max))
                        .await
                        .unwrap_or(0);
                if size > bytes_max {
                    return;
                }
            }
        };
        let stopped = tokio::select! {
            result = tokio::time::timeout(timeout, collect) => match result {
                Ok(((stdout, stdout_nul_count), (stderr, _), status)) => {
                    return Ok(GitOutput {
                        status: status.map_err(Error::Spawn)?,
                        stdout,
                        stdout_nul_count,
                        stderr: String::from_utf8_lossy(&stderr).into_owned(),
                    });
                }
                Err(_) => Error::TimedOut {
                    operation,
                    after: timeout,
                },
            },
            () = outgrown => Error::TooLarge {
                limit: CloneLimit::Bytes(bytes_max),
            },
        };
        kill_group(group);
        Err(stopped)
    }

    /// Runs `args` in `repository` and returns its output if git succeeded.
    pub(crate) async fn run_in(
        &self,
        repository: &Path,
        operation: &'static str,
        args: &[&str],
    ) -> Result<GitOutput, Error> {
        let home = EmptyHome::create()?;
        let mut command = self.command(&home, Target::Repository(repository), false);
        command.args(args);
        self.run(command, operation, self.options.command_timeout)
            .await
    }
}

/// Stops a git process group (ESRCH, already gone, is the normal case).
pub(super) fn kill_group(group: Option<u32>) {
    if let Some(pid) = group
        .and_then(|id| i32::try_from(id).ok())
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// Bytes of the regular files under `directory` (not following links),
/// counting stops once past `stop_after`.
fn directory_bytes(directory: &Path, stop_after: u64) -> u64 {
    let mut total = 0u64;
    let mut pending = vec![directory.to_path_buf()];
    while let Some(current) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&current) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            if metadata.is_dir() {
                pending.push(entry.path());
            } else if metadata.is_file() {
                total = total.saturating_add(metadata.len());
                if total > stop_after {
                    return total;
                }
            }
        }
    }
    total
}

/// Reads a pipe to its end, keeping at most `kept_max` bytes and counting
/// NUL bytes over all of it.
pub(super) async fn read_capped<R: tokio::io::AsyncRead + Unpin>(
    reader: Option<R>,
    kept_max: usize,
) -> (Vec<u8>, usize) {
    let mut kept = Vec::new();
    let mut nul_count = 0usize;
    let Some(mut reader) = reader else {
        return (kept, nul_count);
    };
    let mut buffer = [0u8; 8192];
    loop {
        match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let chunk = &buffer[..n];
                nul_count += chunk.iter().filter(|&&b| b == 0).count();
                let room = kept_max.saturating_sub(kept.len());
                kept.extend_from_slice(&chunk[..room.min(n)]);
            }
        }
    }
    (kept, nul_count)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::git::GitOptions;

    fn environment(command: &Command) -> HashMap<String, Option<String>> {
        command
            .as_std()
            .get_envs()
            .map(|(key, value)| {
                (
                    key.to_string_lossy().into_owned(),
                    value.map(|value| value.to_string_lossy().into_owned()),
                )
            })
            .collect()
    }

    fn settings(command: &Command) -> Vec<String> {
        let args: Vec<String> = command
            .as_std()
            .get_args()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect();
        args.windows(2)
            .filter(|pair| pair[0] == "-c")
            .map(|pair| pair[1].clone())
            .collect()
    }

    #[test]
    fn every_command_runs_with_a_cleared_environment_and_no_hooks() {
        let git = Git::new(GitOptions::default());
        let home = EmptyHome::create().unwrap();
        let command = git.command(&home, Target::None, false);
        let environment = environment(&command);
        assert_eq!(
            environment.get("PATH").cloned().flatten().as_deref(),
            Some(MINIMAL_PATH)
        );
        assert_eq!(
            environment
                .get("GIT_ALLOW_PROTOCOL")
                .cloned()
                .flatten()
                .as_deref(),
            Some("https")
        );
        assert_eq!(
            environment
                .get("GIT_TERMINAL_PROMPT")
                .cloned()
                .flatten()
                .as_deref(),
            Some("0")
        );
        let settings = settings(&command);
        for expected in [
            "core.hooksPath=/dev/null",
            "core.fsmonitor=false",
            "credential.helper=",
            "protocol.file.allow=never",
            "protocol.ext.allow=never",
            "http.followRedirects=false",
            "submodule.recurse=false",
        ] {
            assert!(settings.iter().any(|s| s == expected), "{expected}");
        }
        assert_eq!(
            command.as_std().get_current_dir(),
            Some(home.0.as_path()),
            "a clone runs in the empty home"
        );
    }

    #[test]
    fn a_configured_ca_bundle_replaces_the_system_one() {
        let home = EmptyHome::create().unwrap();
        let plain = Git::new(GitOptions::default()).command(&home, Target::None, false);
        assert!(
            !settings(&plain)
                .iter()
                .any(|s| s.starts_with("http.sslCAInfo="))
        );
        let git = Git::new(GitOptions {
            repository_ca_file: Some("/etc/zopu/git-ca.pem".into()),
            ..GitOptions::default()
        });
        let command = git.command(&home, Target::None, false);
        assert!(
            settings(&command)
                .iter()
                .any(|s| s == "http.sslCAInfo=/etc/zopu/git-ca.pem")
        );
    }

    #[test]
    fn the_file_transport_is_enabled_only_when_asked() {
        let git = Git::new(GitOptions::default());
        let home = EmptyHome::create().unwrap();
        let command = git.command(&home, Target::None, true);
        assert_eq!(
            environment(&command)
                .get("GIT_ALLOW_PROTOCOL")
                .cloned()
                .flatten()
                .as_deref(),
            Some("https:file")
        );
        assert!(
            settings(&command)
                .iter()
                .any(|s| s == "protocol.file.allow=always")
        );
    }

    #[test]
    fn a_repository_command_names_its_git_directory_and_stops_discovery() {
        let git = Git::new(GitOptions::default());
        let home = EmptyHome::create().unwrap();
        let repository = Path::new("/srv/workspaces/p1/repo");
        let command = git.command(&home, Target::Repository(repository), false);
        let environment = environment(&command);
        assert_eq!(
            environment.get("GIT_DIR").cloned().flatten().as_deref(),
            Some("/srv/workspaces/p1/repo/.git")
        );
        assert_eq!(
            environment
                .get("GIT_CEILING_DIRECTORIES")
                .cloned()
                .flatten()
                .as_deref(),
            Some("/srv/workspaces/p1")
        );
        assert_eq!(command.as_std().get_current_dir(), Some(repository));
    }

    #[test]
    fn the_empty_home_is_private_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let home = EmptyHome::create().unwrap();
        let path = home.0.clone();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        drop(home);
        assert!(!path.exists());
    }
}
