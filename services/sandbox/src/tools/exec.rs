//! `exec_safe`: an allowlist of read-only git commands with validated
//! arguments, run through the confined runner.
//!
//! Only `git log|show|diff|ls-files|grep|blame` are accepted. Options are
//! matched against a per-subcommand allowlist (anything else, such as
//! `--output`, `--ext-diff`, `--textconv`, `--no-index`, `-O`, `-c`,
//! `--exec-path`, `--git-dir`, `--work-tree`, is denied); combined short
//! flags are not accepted. Revisions must look like revisions (no leading
//! `-`) and are placed after `--end-of-options`; paths go after `--` and
//! pass the path policy (no `..`, absolute paths or pathspec magic).
//!
//! git runs with a cleared environment, `GIT_CONFIG_NOSYSTEM=1`,
//! `GIT_CONFIG_GLOBAL=/dev/null`, `GIT_DIR`/`GIT_WORK_TREE` pinned (a
//! planted `core.worktree` is ignored), optional locks off, lazy fetch off,
//! and `-c` overrides that disable hooks, fsmonitor, pagers, external diff,
//! signature checking and every transport; `--no-ext-diff --no-textconv`
//! are added where they apply.

use std::ffi::OsString;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Error, ToolOutput};
use crate::confine::{ConfinedCommand, Confinement, find_program};
use crate::policy::{PolicyError, RelPath, SandboxLimits, WorkspaceRoot};

/// Most arguments accepted.
const MAX_ARGS: usize = 64;
/// Longest single argument.
const MAX_ARG_BYTES: usize = 512;
/// Most stderr bytes returned.
const MAX_STDERR_BYTES: usize = 16 * 1024;

/// Configuration forced on every git invocation.
const GIT_CONFIG: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=cat",
    "core.attributesFile=/dev/null",
    "core.untrackedCache=false",
    "core.sshCommand=false",
    "diff.external=",
    "log.showSignature=false",
    "gpg.program=false",
    "protocol.allow=never",
    "color.ui=never",
];

/// The allowed git subcommands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GitSubcommand {
    Log,
    Show,
    Diff,
    LsFiles,
    Grep,
    Blame,
}

impl GitSubcommand {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "log" => Self::Log,
            "show" => Self::Show,
            "diff" => Self::Diff,
            "ls-files" => Self::LsFiles,
            "grep" => Self::Grep,
            "blame" => Self::Blame,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Log => "log",
            Self::Show => "show",
            Self::Diff => "diff",
            Self::LsFiles => "ls-files",
            Self::Grep => "grep",
            Self::Blame => "blame",
        }
    }

    /// Flags git gets before the caller's options.
    fn hardening(self) -> &'static [&'static str] {
        match self {
            Self::Log | Self::Show | Self::Diff => {
                &["--no-ext-diff", "--no-textconv", "--no-color"]
            }
            Self::Grep => &["--no-textconv", "--no-color"],
            Self::Blame => &["--no-textconv"],
            Self::LsFiles => &[],
        }
    }

    /// `(option, takes a value)`.
    fn options(self) -> Vec<(&'static str, bool)> {
        const DIFF: &[(&str, bool)] = &[
            ("--stat", false),
            ("--shortstat", false),
            ("--numstat", false),
            ("--name-only", false),
            ("--name-status", false),
            ("--summary", false),
            ("-p", false),
            ("--patch", false),
            ("-s", false),
            ("--no-patch", false),
            ("-U", true),
            ("--unified", true),
            ("-w", false),
            ("--ignore-all-space", false),
            ("-b", false),
            ("--ignore-space-change", false),
            ("--word-diff", false),
            ("-M", false),
            ("--find-renames", false),
            ("--diff-filter", true),
            ("-R", false),
            ("--raw", false),
            ("--full-index", false),
        ];
        const LOG: &[(&str, bool)] = &[
            ("--oneline", false),
            ("--format", true),
            ("--pretty", true),
            ("-n", true),
            ("--max-count", true),
            ("--skip", true),
            ("--since", true),
            ("--until", true),
            ("--after", true),
            ("--before", true),
            ("--author", true),
            ("--committer", true),
            ("--grep", true),
            ("-i", false),
            ("--regexp-ignore-case", false),
            ("--all-match", false),
            ("--invert-grep", false),
            ("-S", true),
            ("-G", true),
            ("--no-merges", false),
            ("--merges", false),
            ("--first-parent", false),
            ("--reverse", false),
            ("--graph", false),
            ("--decorate", false),
            ("--no-decorate", false),
            ("--date", true),
            ("--follow", false),
            ("--abbrev-commit", false),
            ("--no-abbrev-commit", false),
            ("--topo-order", false),
            ("--date-order", false),
            ("--all", false),
            ("--branches", false),
            ("--tags", false),
        ];
        let mut options: Vec<(&'static str, bool)> = Vec::new();
        match self {
            Self::Log | Self::Show => {
                options.extend_from_slice(DIFF);
                options.extend_from_slice(LOG);
            }
            Self::Diff => {
                options.extend_from_slice(DIFF);
                options.extend_from_slice(&[
                    ("--cached", false),
                    ("--staged", false),
                    ("--merge-base", false),
                ]);
            }
            Self::LsFiles => options.extend_from_slice(&[
                ("--cached", false),
                ("-c", false),
                ("--deleted", false),
                ("-d", false),
                ("--modified", false),
                ("-m", false),
                ("--others", false),
                ("-o", false),
                ("--stage", false),
                ("-s", false),
                ("--exclude-standard", false),
                ("--directory", false),
                ("--full-name", false),
                ("--eol", false),
                ("--deduplicate", false),
                ("--error-unmatch", false),
                ("-t", false),
                ("-z", false),
            ]),
            Self::Grep => options.extend_from_slice(&[
                ("-n", false),
                ("--line-number", false),
                ("-i", false),
                ("--ignore-case", false),
                ("-w", false),
                ("--word-regexp", false),
                ("-v", false),
                ("--invert-match", false),
                ("-l", false),
                ("--files-with-matches", false),
                ("-L", false),
                ("--files-without-match", false),
                ("-c", false),
                ("--count", false),
                ("-E", false),
                ("--extended-regexp", false),
                ("-F", false),
                ("--fixed-strings", false),
                ("-G", false),
                ("--basic-regexp", false),
                ("-P", false),
                ("--perl-regexp", false),
                ("-e", true),
                ("--and", false),
                ("--or", false),
                ("--not", false),
                ("-A", true),
                ("-B", true),
                ("-C", true),
                ("-m", true),
                ("--max-count", true),
                ("--cached", false),
                ("-h", false),
                ("-H", false),
                ("--full-name", false),
                ("--heading", false),
                ("--break", false),
                ("-I", false),
                ("--max-depth", true),
                ("--column", false),
                ("-o", false),
                ("--only-matching", false),
                ("-q", false),
                ("--quiet", false),
            ]),
            Self::Blame => options.extend_from_slice(&[
                ("-L", true),
                ("-w", false),
                ("-M", false),
                ("-C", false),
                ("--porcelain", false),
                ("--line-porcelain", false),
                ("-s", false),
                ("-e", false),
                ("--show-email", false),
                ("-l", false),
                ("-t", false),
                ("--root", false),
                ("--date", true),
                ("-p", false),
            ]),
        }
        options
    }
}

/// Input of `exec_safe`: a full argv, e.g. `["git", "log", "-n", "5"]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecSafeInput {
    pub argv: Vec<String>,
}

/// Output of `exec_safe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSafeOutput {
    pub subcommand: GitSubcommand,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub timed_out: bool,
    pub duration_ms: u64,
    /// Confinement layers the command ran under.
    pub layers: Vec<String>,
}

impl ToolOutput for ExecSafeOutput {
    fn truncated(&self) -> bool {
        self.stdout_truncated || self.stderr_truncated || self.timed_out
    }
}

/// The validated arguments of one git command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GitArgs {
    pub subcommand: GitSubcommand,
    pub options: Vec<String>,
    pub revisions: Vec<String>,
    pub paths: Vec<String>,
}

fn denied(msg: impl Into<String>) -> Error {
    Error::NotAllowed(msg.into())
}

fn check_text(arg: &str) -> Result<(), Error> {
    if arg.len() > MAX_ARG_BYTES {
        return Err(denied(format!(
            "argument longer than {MAX_ARG_BYTES} bytes"
        )));
    }
    if arg.chars().any(char::is_control) {
        return Err(denied("argument contains control characters"));
    }
    Ok(())
}

fn is_revision(arg: &str) -> bool {
    let mut chars = arg.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || "_./~^@{}:+-".contains(c))
        && !arg.contains("@{-")
}

/// Validates argv against the allowlist.
pub(crate) fn validate(argv: &[String], limits: &SandboxLimits) -> Result<GitArgs, Error> {
    let (program, rest) = argv.split_first().ok_or_else(|| denied("empty command"))?;
    if program != "git" {
        return Err(denied(format!(
            "program {program:?} is not allowed (only git)"
        )));
    }
    let (sub, args) = rest
        .split_first()
        .ok_or_else(|| denied("git needs a subcommand"))?;
    let subcommand = GitSubcommand::parse(sub).ok_or_else(|| {
        denied(format!(
            "git {sub:?} is not allowed (log, show, diff, ls-files, grep, blame)"
        ))
    })?;
    if args.len() > MAX_ARGS {
        return Err(denied(format!("more than {MAX_ARGS} arguments")));
    }
    let table = subcommand.options();
    let mut out = GitArgs {
        subcommand,
        options: Vec::new(),
        revisions: Vec::new(),
        paths: Vec::new(),
    };
    let mut positionals = Vec::new();
    let mut iter = args.iter();
    let mut after_separator = false;
    let mut have_pattern = false;
    while let Some(arg) = iter.next() {
        check_text(arg)?;
        if after_separator {
            out.paths.push(check_path(arg, limits)?);
        } else if arg == "--" {
            after_separator = true;
        } else if let Some(long) = arg.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((name, value)) => (format!("--{name}"), Some(value)),
                None => (arg.clone(), None),
            };
            let Some(&(_, takes_value)) = table.iter().find(|(o, _)| *o == name) else {
                return Err(denied(format!(
                    "option {name} is not allowed for git {}",
                    subcommand.name()
                )));
            };
            match (takes_value, value) {
                (false, None) => out.options.push(name),
                (false, Some(_)) => return Err(denied(format!("option {name} takes no value"))),
                (true, Some(value)) => out.options.push(format!("{name}={value}")),
                (true, None) => {
                    let value = iter
                        .next()
                        .ok_or_else(|| denied(format!("option {name} needs a value")))?;
                    check_text(value)?;
                    out.options.push(format!("{name}={value}"));
                }
            }
        } else if arg.starts_with('-') && arg.len() > 1 {
            if !arg.is_char_boundary(2) {
                return Err(denied(format!("option {arg:?} is not allowed")));
            }
            let name = &arg[..2];
            let Some(&(_, takes_value)) = table.iter().find(|(o, _)| *o == name) else {
                return Err(denied(format!(
                    "option {name} is not allowed for git {}",
                    subcommand.name()
                )));
            };
            if takes_value {
                let value = if arg.len() > 2 {
                    arg[2..].to_owned()
                } else {
                    let value = iter
                        .next()
                        .ok_or_else(|| denied(format!("option {name} needs a value")))?;
                    check_text(value)?;
                    value.clone()
                };
                have_pattern |= subcommand == GitSubcommand::Grep && name == "-e";
                out.options.push(name.to_owned());
                out.options.push(value);
            } else if arg.len() > 2 {
                return Err(denied(format!(
                    "combined short options {arg:?} are not allowed; pass them separately"
                )));
            } else {
                out.options.push(name.to_owned());
            }
        } else {
            positionals.push(arg.clone());
        }
    }
    let mut positionals = positionals.into_iter();
    if subcommand == GitSubcommand::Grep && !have_pattern {
        let pattern = positionals
            .next()
            .ok_or_else(|| denied("git grep needs a pattern"))?;
        out.options.push("-e".to_owned());
        out.options.push(pattern);
    }
    let mut positionals: Vec<String> = positionals.collect();
    let as_paths = match subcommand {
        GitSubcommand::LsFiles => positionals.len(),
        GitSubcommand::Blame if !after_separator => usize::from(!positionals.is_empty()),
        _ => 0,
    };
    let path_args = positionals.split_off(positionals.len() - as_paths);
    for path in path_args {
        out.paths.insert(0, check_path(&path, limits)?);
    }
    for rev in positionals {
        if !is_revision(&rev) {
            return Err(denied(format!(
                "{rev:?} is not a revision; put paths after `--`"
            )));
        }
        out.revisions.push(rev);
    }
    Ok(out)
}

fn check_path(arg: &str, limits: &SandboxLimits) -> Result<String, Error> {
    if arg.starts_with(':') {
        return Err(denied("pathspec magic (`:`) is not allowed"));
    }
    let path = RelPath::parse(arg, limits)?.as_string();
    if zopu_secrets::is_secret_file_name(&path) {
        return Err(PolicyError::SecretFile(path).into());
    }
    Ok(path)
}

/// The full git argv (without the program).
pub(crate) fn git_argv(args: &GitArgs) -> Vec<OsString> {
    let mut argv: Vec<OsString> = Vec::new();
    for setting in GIT_CONFIG {
        argv.push("-c".into());
        argv.push((*setting).into());
    }
    argv.push("--no-pager".into());
    argv.push(args.subcommand.name().into());
    argv.extend(args.subcommand.hardening().iter().map(OsString::from));
    argv.extend(args.options.iter().map(OsString::from));
    // git 2.47 blame rejects `--end-of-options` before a revision; revisions
    // are validated to start with an alphanumeric character anyway.
    if args.subcommand != GitSubcommand::Blame {
        argv.push("--end-of-options".into());
    }
    argv.extend(args.revisions.iter().map(OsString::from));
    argv.push("--".into());
    argv.extend(args.paths.iter().map(OsString::from));
    argv
}

fn git_env(root: &WorkspaceRoot) -> Vec<(String, String)> {
    let repo = root.repo().to_string_lossy().into_owned();
    [
        ("PATH", "/usr/local/bin:/usr/bin:/bin".to_owned()),
        ("HOME", "/nonexistent".to_owned()),
        ("LC_ALL", "C".to_owned()),
        ("GIT_CONFIG_NOSYSTEM", "1".to_owned()),
        ("GIT_CONFIG_GLOBAL", "/dev/null".to_owned()),
        ("GIT_ATTR_NOSYSTEM", "1".to_owned()),
        ("GIT_TERMINAL_PROMPT", "0".to_owned()),
        ("GIT_OPTIONAL_LOCKS", "0".to_owned()),
        ("GIT_NO_LAZY_FETCH", "1".to_owned()),
        ("GIT_NO_REPLACE_OBJECTS", "1".to_owned()),
        ("GIT_PAGER", "cat".to_owned()),
        ("PAGER", "cat".to_owned()),
        (
            "GIT_CEILING_DIRECTORIES",
            root.root().to_string_lossy().into_owned(),
        ),
        ("GIT_DIR", format!("{repo}/.git")),
        ("GIT_WORK_TREE", repo),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

pub(crate) fn exec_safe(
    root: &WorkspaceRoot,
    limits: &SandboxLimits,
    confinement: &Confinement,
    input: &ExecSafeInput,
) -> Result<ExecSafeOutput, Error> {
    let args = validate(&input.argv, limits)?;
    let git_dir = root.repo().join(".git");
    if !std::fs::symlink_metadata(&git_dir).is_ok_and(|m| m.file_type().is_dir()) {
        return Err(denied(
            "repo/.git is not a real directory (a gitfile or symlink is refused)",
        ));
    }
    let git = find_program("git")
        .ok_or_else(|| Error::InvalidInput("git is not installed".to_owned()))?;
    let command = ConfinedCommand {
        program: git,
        args: git_argv(&args),
        cwd: root.repo().to_path_buf(),
        env: git_env(root),
        read_paths: vec![root.root().to_path_buf()],
        write_paths: Vec::new(),
        exec_paths: Vec::new(),
        timeout: Duration::from_millis(limits.exec_timeout_ms),
        output_cap: limits.exec_output_bytes,
    };
    let output = confinement.run(&command)?;
    let mut stderr = output.stderr;
    let stderr_truncated = output.stderr_truncated || stderr.len() > MAX_STDERR_BYTES;
    stderr.truncate(MAX_STDERR_BYTES);
    Ok(ExecSafeOutput {
        subcommand: args.subcommand,
        exit_code: output.exit_code,
        signal: output.signal,
        // git prints file contents (show, grep, log -p): secrets in them
        // never leave the sandbox.
        stdout: zopu_secrets::redact(&String::from_utf8_lossy(&output.stdout)),
        stderr: zopu_secrets::redact(&String::from_utf8_lossy(&stderr)),
        stdout_truncated: output.stdout_truncated,
        stderr_truncated,
        timed_out: output.timed_out,
        duration_ms: u64::try_from(output.duration.as_millis()).unwrap_or(u64::MAX),
        layers: confinement
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

    fn v(args: &[&str]) -> Result<GitArgs, Error> {
        validate(
            &args.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
            &SandboxLimits::default(),
        )
    }

    #[test]
    fn allowlist() {
        assert!(v(&["git", "log", "-n", "5", "--oneline"]).is_ok());
        assert!(v(&["git", "log", "-n5", "HEAD~1..HEAD", "--", "src/a.rs"]).is_ok());
        assert!(v(&["git", "grep", "-n", "fn main"]).is_ok());
        assert!(v(&["git", "blame", "-L", "1,5", "README"]).is_ok_and(|a| a.paths == ["README"]));
        for bad in [
            &["git", "log", "--output=/tmp/x"][..],
            &["git", "diff", "--ext-diff"],
            &["git", "show", "--textconv"],
            &["git", "-c", "core.pager=sh", "log"],
            &["git", "--exec-path=/tmp", "log"],
            &["git", "--git-dir=/etc", "log"],
            &["git", "--work-tree=/", "log"],
            &["git", "diff", "--no-index", "/etc/passwd", "x"],
            &["git", "grep", "-O", "x"],
            &["git", "grep", "--open-files-in-pager=sh", "x"],
            &["git", "log", "--", "../x"],
            &["git", "log", "--", "/etc/passwd"],
            &["git", "log", "--", ":(top)x"],
            &["git", "log", "-pw"],
            &["git", "log", "--upload-pack=x"],
            &["git", "push"],
            &["sh", "-c", "id"],
            &["git", "log", "/etc/passwd"],
            &["git", "ls-files", "../../etc"],
            &["git", "log", "-é"],
            &["git", "log", "-"],
        ] {
            assert!(
                matches!(v(bad), Err(Error::NotAllowed(_) | Error::Policy(_))),
                "{bad:?} was accepted"
            );
        }
    }
}
