//! `run_check`: the project's own test command (`make test`), run once in a
//! scratch copy of the repository, confined like every program (no network,
//! no credentials, landlock or bubblewrap, seccomp, rlimits), with the
//! project's environment values as its only non-standard variables.
//!
//! Invariants: the values reach the program's environment and nothing else
//! — not its argv, not the tool's recorded input, not its output: every
//! occurrence of a value in any form a program could print it (re-spaced,
//! reversed, hex, base64, escaped: `zopu_secrets::KnownSecrets`), and a
//! value's beginning cut off where the capture stopped, is replaced by
//! `[redacted:env NAME]` before the output leaves this module, then the
//! secret detection rules run over it. The workspace
//! itself is never written: the program gets a copy of the tree (without
//! `.git`), removed when the check ends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use zopu_secrets::{KnownSecrets, Secret};

use super::{Error, ToolOutput};
use crate::confine::{ConfinedCommand, Confinement, find_program};
use crate::policy::{SandboxLimits, WorkspaceRoot};

/// Longest command accepted, in characters.
const COMMAND_CHARS_MAX: usize = 500;
/// Most bytes captured from each of standard output and error; more kills the check.
const CAPTURE_BYTES: usize = 4 * 1024 * 1024;
/// Values shorter than this are not searched for in the output: they cannot
/// be told apart from ordinary text (`1`, `dev`), and are no secret.
pub const REDACTED_VALUE_CHARS_MIN: usize = zopu_secrets::VALUE_CHARS_MIN;
/// Directories a check may execute programs from (those that exist).
const EXEC_DIRS: &[&str] = &[
    "/usr/local/bin",
    "/usr/bin",
    "/bin",
    "/usr/local/lib",
    "/usr/lib",
    "/usr/libexec",
];

/// The project's environment values handed to a check's program, and
/// found again by value in what any tool returns. Prints only the names.
#[derive(Clone, Default)]
pub struct ProgramEnvironment {
    values: Vec<(String, Secret)>,
    known: std::sync::Arc<KnownSecrets>,
}

impl ProgramEnvironment {
    /// Values by name (names as in `.env.example`).
    pub fn new(values: Vec<(String, Secret)>) -> Self {
        let known = KnownSecrets::new(
            values
                .iter()
                .map(|(name, value)| (format!("env {name}"), value)),
        );
        Self {
            values,
            known: std::sync::Arc::new(known),
        }
    }

    /// The names, in order.
    pub fn names(&self) -> Vec<String> {
        self.values.iter().map(|(name, _)| name.clone()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every value of at least [`REDACTED_VALUE_CHARS_MIN`]
    /// characters replaced by `[redacted:env NAME]` in any form a program
    /// could print it (as it is in any case, re-spaced, split across lines,
    /// reversed, hex, base64, URL-encoded, JSON- or shell-escaped: see
    /// [`KnownSecrets`]), and, when `cut_short`, a value's beginning at the
    /// very end removed too. Returns how many were replaced.
    pub fn redact(&self, text: &str, cut_short: bool) -> (String, u32) {
        let (mut text, mut replaced) = self.known.redact(text);
        if cut_short {
            for (name, value) in &self.values {
                if value.expose().chars().count() < REDACTED_VALUE_CHARS_MIN {
                    continue;
                }
                if let Some(start) = cut_prefix_start(&text, value.expose()) {
                    text.truncate(start);
                    text.push_str(&format!("[redacted:env {name}]"));
                    replaced = replaced.saturating_add(1);
                }
            }
        }
        (text, replaced)
    }

    /// A tool's output with every value redacted from each of its strings
    /// (any tool may return what a program or a file printed).
    pub(crate) fn redact_output<O: Serialize + serde::de::DeserializeOwned>(
        &self,
        output: O,
    ) -> Result<O, Error> {
        if self.known.is_empty() {
            return Ok(output);
        }
        let mut json = serde_json::to_value(&output).map_err(std::io::Error::other)?;
        if self.redact_strings(&mut json) == 0 {
            return Ok(output);
        }
        serde_json::from_value(json).map_err(|error| Error::Io(std::io::Error::other(error)))
    }

    fn redact_strings(&self, json: &mut serde_json::Value) -> u32 {
        match json {
            serde_json::Value::String(text) => {
                let (redacted, replaced) = self.known.redact(text);
                if replaced > 0 {
                    *text = redacted;
                }
                replaced
            }
            serde_json::Value::Array(items) => {
                items.iter_mut().map(|item| self.redact_strings(item)).sum()
            }
            serde_json::Value::Object(fields) => fields
                .values_mut()
                .map(|field| self.redact_strings(field))
                .sum(),
            _ => 0,
        }
    }

    fn variables(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.values
            .iter()
            .map(|(name, value)| (name.clone(), value.expose().to_owned()))
    }
}

impl std::fmt::Debug for ProgramEnvironment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ProgramEnvironment")
            .field(&self.names())
            .finish()
    }
}

/// Where `text` ends with the first [`REDACTED_VALUE_CHARS_MIN`] or more
/// characters of `value` (but not all of it).
fn cut_prefix_start(text: &str, value: &str) -> Option<usize> {
    let boundaries: Vec<usize> = value.char_indices().map(|(i, _)| i).skip(1).collect();
    boundaries
        .into_iter()
        .rev()
        .filter(|end| value[..*end].chars().count() >= REDACTED_VALUE_CHARS_MIN)
        .find(|end| text.ends_with(&value[..*end]))
        .map(|end| text.len() - end)
}

/// Input of `run_check`: one shell command line, as onboarding verified it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCheckInput {
    pub command: String,
}

/// Output of `run_check`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCheckOutput {
    pub command: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    /// The redacted tail of standard output, then standard error.
    pub output_tail: String,
    /// The output was longer than the tail (or its capture was cut).
    pub output_truncated: bool,
    /// Names of the values in the program's environment.
    pub environment: Vec<String>,
    /// Occurrences of values taken out of the output.
    pub values_redacted: u32,
    /// The confinement layers it ran under.
    pub confinement: Vec<String>,
}

impl ToolOutput for RunCheckOutput {
    fn truncated(&self) -> bool {
        self.output_truncated
    }
}

/// Checks the command line: not empty, at most [`COMMAND_CHARS_MAX`]
/// characters, one line, no control characters.
pub fn validate_command(command: &str) -> Result<&str, Error> {
    let command = command.trim();
    if command.is_empty() {
        return Err(Error::InvalidInput("the check command is empty".to_owned()));
    }
    if command.chars().count() > COMMAND_CHARS_MAX {
        return Err(Error::InvalidInput(format!(
            "the check command is longer than {COMMAND_CHARS_MAX} characters"
        )));
    }
    if command.chars().any(char::is_control) {
        return Err(Error::InvalidInput(
            "the check command holds a control character (one line only)".to_owned(),
        ));
    }
    Ok(command)
}

/// A check's scratch directory (`repo/` copy and `home/`), mode 0700,
/// removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn create() -> Result<Self, Error> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!("zopu-check-{}", uuid::Uuid::now_v7()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        let scratch = Self(path);
        std::fs::create_dir(scratch.home())?;
        Ok(scratch)
    }

    fn repo(&self) -> PathBuf {
        self.0.join("repo")
    }

    fn home(&self) -> PathBuf {
        self.0.join("home")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.0) {
            tracing::warn!(path = %self.0.display(), %error, "a check's scratch directory was not removed");
        }
    }
}

/// Copies the repository's tree (not `.git`) to `target`: directories and
/// files as they are, symbolic links as links (never followed), nothing
/// else; refuses a tree larger than `max_bytes`.
fn copy_tree(source: &Path, target: &Path, max_bytes: u64) -> Result<(), Error> {
    std::fs::create_dir(target)?;
    let walk = ignore::WalkBuilder::new(source)
        .standard_filters(false)
        .hidden(false)
        .follow_links(false)
        .filter_entry(|entry| entry.depth() != 1 || entry.file_name() != ".git")
        .build();
    let mut copied = 0u64;
    for entry in walk {
        let entry = entry.map_err(|error| Error::Io(std::io::Error::other(error.to_string())))?;
        let Ok(relative) = entry.path().strip_prefix(source) else {
            continue;
        };
        if relative.as_os_str().is_empty() {
            continue;
        }
        let destination = target.join(relative);
        let Some(file_type) = entry.file_type() else {
            continue;
        };
        if file_type.is_dir() {
            std::fs::create_dir(&destination)?;
        } else if file_type.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &destination)?;
        } else if file_type.is_file() {
            copied = copied.saturating_add(std::fs::copy(entry.path(), &destination)?);
            if copied > max_bytes {
                return Err(Error::InvalidInput(format!(
                    "the repository is larger than sandbox.check_copy_bytes ({max_bytes} bytes)"
                )));
            }
        }
    }
    Ok(())
}

/// The last `max_bytes` of `text` at a character boundary, from a line's
/// start when one is near; whether anything was cut.
fn tail(text: &str, max_bytes: usize) -> (String, bool) {
    if text.len() <= max_bytes {
        return (text.to_owned(), false);
    }
    let mut start = text.len() - max_bytes;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let rest = &text[start..];
    let from_line = rest
        .find('\n')
        .filter(|newline| *newline < 200)
        .map_or(rest, |newline| &rest[newline + 1..]);
    (from_line.to_owned(), true)
}

pub(crate) fn run_check(
    root: &WorkspaceRoot,
    limits: &SandboxLimits,
    confinement: &Confinement,
    environment: &ProgramEnvironment,
    input: &RunCheckInput,
) -> Result<RunCheckOutput, Error> {
    let command = validate_command(&input.command)?;
    let shell =
        find_program("sh").ok_or_else(|| Error::InvalidInput("sh is not installed".to_owned()))?;
    let scratch = Scratch::create()?;
    copy_tree(root.repo(), &scratch.repo(), limits.check_copy_bytes)?;
    let mut env = vec![
        ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
        (
            "HOME".to_owned(),
            scratch.home().to_string_lossy().into_owned(),
        ),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ("CI".to_owned(), "true".to_owned()),
    ];
    env.extend(environment.variables());
    let mut exec_paths: Vec<PathBuf> = EXEC_DIRS
        .iter()
        .map(PathBuf::from)
        .filter(|dir| dir.is_dir())
        .collect();
    exec_paths.push(scratch.repo());
    let confined = ConfinedCommand {
        program: shell,
        args: vec!["-c".into(), command.into()],
        cwd: scratch.repo(),
        env,
        read_paths: vec![scratch.0.clone()],
        write_paths: vec![scratch.0.clone()],
        exec_paths,
        timeout: Duration::from_millis(limits.check_timeout_ms),
        output_cap: CAPTURE_BYTES,
    };
    let check_limits = SandboxLimits {
        cpu_seconds: limits.check_cpu_seconds,
        ..limits.clone()
    };
    let output = confinement.with_limits(&check_limits).run(&confined)?;
    let captured_short = output.stdout_truncated || output.stderr_truncated;
    let (stdout, stdout_redacted) = environment.redact(
        &String::from_utf8_lossy(&output.stdout),
        output.stdout_truncated,
    );
    let (stderr, stderr_redacted) = environment.redact(
        &String::from_utf8_lossy(&output.stderr),
        output.stderr_truncated,
    );
    let combined = if stderr.trim().is_empty() {
        stdout
    } else {
        format!("{stdout}\n--- standard error ---\n{stderr}")
    };
    let (output_tail, cut) = tail(
        &zopu_secrets::redact(&combined),
        limits.check_output_tail_bytes,
    );
    Ok(RunCheckOutput {
        command: command.to_owned(),
        exit_code: output.exit_code,
        signal: output.signal,
        timed_out: output.timed_out,
        duration_ms: u64::try_from(output.duration.as_millis()).unwrap_or(u64::MAX),
        output_tail,
        output_truncated: cut || captured_short,
        environment: environment.names(),
        values_redacted: stdout_redacted.saturating_add(stderr_redacted),
        confinement: confinement
            .report()
            .active_layers()
            .into_iter()
            .map(str::to_owned)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn environment() -> ProgramEnvironment {
        ProgramEnvironment::new(vec![
            ("API_TOKEN".to_owned(), Secret::new("tok-4f9a-1234-abcd")),
            ("SHORT".to_owned(), Secret::new("1")),
            ("INNER".to_owned(), Secret::new("4f9a-1234")),
        ])
    }

    #[test]
    fn every_value_and_a_value_cut_at_the_end_leave_the_output() {
        let environment = environment();
        let (text, replaced) =
            environment.redact("token=tok-4f9a-1234-abcd and 4f9a-1234, 1 ok", false);
        assert_eq!(
            text,
            "token=[redacted:env API_TOKEN] and [redacted:env INNER], 1 ok"
        );
        assert_eq!(replaced, 2);
        let (text, replaced) = environment.redact("last line: tok-4f9a", true);
        assert_eq!(text, "last line: [redacted:env API_TOKEN]");
        assert_eq!(replaced, 1);
        // Not cut short: an ordinary word that starts like a value stays.
        assert_eq!(environment.redact("tok-4f9a", false).0, "tok-4f9a");
    }

    #[test]
    fn the_environment_prints_only_names() {
        let printed = format!("{:?}", environment());
        assert!(printed.contains("API_TOKEN"), "{printed}");
        assert!(!printed.contains("tok-4f9a"), "{printed}");
    }

    #[test]
    fn a_command_is_one_bounded_line() {
        assert_eq!(validate_command("  make test ").unwrap(), "make test");
        for bad in [
            "",
            "   ",
            "make test\nrm -rf /",
            "a\u{0}b",
            &"x".repeat(501),
        ] {
            assert!(
                matches!(validate_command(bad), Err(Error::InvalidInput(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_tail_starts_at_a_line_and_a_character() {
        let text = format!("{}\nlast line é\n", "é".repeat(100));
        let (kept, cut) = tail(&text, 20);
        assert!(cut);
        assert_eq!(kept, "last line é\n");
        assert_eq!(tail("short", 20), ("short".to_owned(), false));
    }

    #[test]
    fn the_copy_leaves_git_out_keeps_links_as_links_and_is_bounded() {
        let source = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(source.path().join(".git/objects")).unwrap();
        std::fs::create_dir_all(source.path().join("src")).unwrap();
        std::fs::write(source.path().join("src/a.txt"), "hello").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", source.path().join("link")).unwrap();
        let copy = target.path().join("repo");
        copy_tree(source.path(), &copy, 1024).unwrap();
        assert_eq!(
            std::fs::read_to_string(copy.join("src/a.txt")).unwrap(),
            "hello"
        );
        assert!(!copy.join(".git").exists());
        assert!(
            std::fs::symlink_metadata(copy.join("link"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let bounded = target.path().join("bounded");
        assert!(matches!(
            copy_tree(source.path(), &bounded, 2),
            Err(Error::InvalidInput(_))
        ));
    }
}
