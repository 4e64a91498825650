//! The tools against a hostile repository: path escapes, planted links,
//! a symlinked `.zopu`, hostile git config, and the call records.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use tempfile::TempDir;
use zopu_sandbox::confine::ConfinementMode;
use zopu_sandbox::policy::{Area, SandboxLimits, WorkspaceRoot};
use zopu_sandbox::tools::{
    Error, ExecSafeInput, ListFilesInput, ReadFileInput, Sandbox, SearchInput, ToolOutcome,
    WriteGeneratedFileInput,
};

const SECRET: &str = "TOPSECRET-outside-the-workspace";

struct Hostile {
    _dir: TempDir,
    root: PathBuf,
    outside: PathBuf,
}

fn git(repo: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(repo)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .status()
        .expect("git runs");
    assert!(status.success(), "git {args:?}");
}

/// `<tmp>/ws/{repo,.zopu}` plus `<tmp>/outside/` holding targets the attacker wants.
fn hostile() -> Hostile {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).expect("outside");
    std::fs::write(outside.join("secret.txt"), SECRET).expect("secret");
    std::fs::write(outside.join("secret2.txt"), SECRET).expect("secret2");
    let root = dir.path().join("ws");
    let repo = root.join("repo");
    std::fs::create_dir_all(repo.join("src")).expect("repo");
    std::fs::write(repo.join("README.md"), "# hostile\nhello world\n").expect("readme");
    std::fs::write(
        repo.join("src/main.rs"),
        "fn main() {\n    println!(\"hello\");\n}\n",
    )
    .expect("main");
    std::fs::write(repo.join(".gitignore"), "ignored/\n").expect("gitignore");
    std::fs::create_dir(repo.join("ignored")).expect("ignored");
    std::fs::write(repo.join("ignored/x.txt"), "hello ignored").expect("ignored file");
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "init"]);
    symlink("/etc/passwd", repo.join("link_passwd")).expect("link");
    symlink("/proc/self", repo.join("link_proc")).expect("link");
    symlink("/etc", repo.join("dir_link")).expect("link");
    symlink(outside.join("secret.txt"), repo.join("link_secret")).expect("link");
    symlink("loop_b", repo.join("loop_a")).expect("link");
    symlink("loop_a", repo.join("loop_b")).expect("link");
    symlink(".", repo.join("self_loop")).expect("link");
    std::fs::hard_link(outside.join("secret.txt"), repo.join("hard_secret")).expect("hardlink");
    let zopu = root.join(".zopu");
    std::fs::create_dir(&zopu).expect("zopu");
    symlink(outside.join("secret.txt"), zopu.join("link")).expect("link");
    std::fs::hard_link(outside.join("secret2.txt"), zopu.join("hard")).expect("hardlink");
    symlink(&outside, zopu.join("outdir")).expect("link");
    Hostile {
        _dir: dir,
        root,
        outside,
    }
}

fn hash_tree(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).unwrap_or_default();
        out.push((path, hex::encode(Sha256::digest(bytes))));
    }
    out.sort();
    out
}

fn sandbox(root: &Path) -> Sandbox {
    Sandbox::new(
        WorkspaceRoot::open(root).expect("root"),
        SandboxLimits::default(),
    )
    .expect("sandbox")
}

fn read(sb: &Sandbox, path: &str, area: Area) -> Result<String, Error> {
    sb.read_file(&ReadFileInput {
        path: path.to_owned(),
        area,
        ..Default::default()
    })
    .map(|o| o.content)
}

#[test]
fn reads_never_leave_the_workspace() {
    let h = hostile();
    let before = hash_tree(&h.outside);
    let sb = sandbox(&h.root);
    assert!(
        read(&sb, "README.md", Area::Repo)
            .expect("readme")
            .contains("hello world")
    );
    for path in [
        "../outside/secret.txt",
        "../../outside/secret.txt",
        "src/../../outside/secret.txt",
        "/etc/passwd",
        "link_passwd",
        "link_secret",
        "link_proc/status",
        "link_proc/environ",
        "dir_link/passwd",
        "loop_a",
        "self_loop/README.md",
        "hard_secret",
        ".git/config",
        "a\0b",
        "src/\u{202E}rs.niam",
        "src",
    ] {
        let result = read(&sb, path, Area::Repo);
        let err = result.expect_err(path);
        assert!(err.is_denial(), "{path:?}: {err}");
    }
    for path in ["link", "hard", "outdir/secret.txt", "../outside/secret.txt"] {
        let err = read(&sb, path, Area::Generated).expect_err(path);
        assert!(err.is_denial(), "{path:?}: {err}");
    }
    let records = sb.recorder().snapshot();
    assert!(
        records
            .iter()
            .skip(1)
            .all(|r| r.outcome == ToolOutcome::Denied && r.detail.is_some())
    );
    assert_eq!(sb.recorder().denials(), 20);
    assert_eq!(records[0].outcome, ToolOutcome::Allowed);
    assert!(
        records[0]
            .output_sha256
            .as_ref()
            .is_some_and(|h| h.len() == 64)
    );
    assert_eq!(hash_tree(&h.outside), before);
}

#[test]
fn symlink_denial_names_the_reason() {
    let h = hostile();
    let sb = sandbox(&h.root);
    let err = read(&sb, "link_passwd", Area::Repo).expect_err("symlink");
    assert!(
        matches!(
            err,
            Error::Policy(zopu_sandbox::policy::PolicyError::Symlink(_))
        ),
        "{err}"
    );
    let err = read(&sb, "hard_secret", Area::Repo).expect_err("hardlink");
    assert!(
        matches!(
            err,
            Error::Policy(zopu_sandbox::policy::PolicyError::HardLinked { links: 2, .. })
        ),
        "{err}"
    );
    let record = sb.recorder().drain().remove(0);
    assert!(
        record
            .detail
            .as_deref()
            .is_some_and(|d| d.starts_with("symlink:")),
        "{record:?}"
    );
}

#[test]
fn listing_and_search_terminate_and_stay_inside() {
    let h = hostile();
    let sb = sandbox(&h.root);
    let listing = sb.list_files(&ListFilesInput::default()).expect("list");
    let paths: Vec<&str> = listing.entries.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.contains(&"src/main.rs"));
    assert!(paths.contains(&"loop_a"));
    assert!(!paths.iter().any(|p| p.starts_with("dir_link/")
        || p.starts_with("self_loop/")
        || *p == ".git"
        || p.starts_with(".git/")));
    assert!(
        !paths.iter().any(|p| p.starts_with("ignored")),
        "gitignore honoured: {paths:?}"
    );
    assert!(
        listing
            .entries
            .iter()
            .any(|e| e.path == "hard_secret" && e.hard_linked)
    );
    for e in &listing.entries {
        assert!(!Path::new(&e.path).is_absolute() && !e.path.contains(".."));
    }
    let found = sb
        .search(&SearchInput {
            pattern: "TOPSECRET".into(),
            literal: true,
            ..Default::default()
        })
        .expect("search");
    assert!(found.matches.is_empty(), "{found:?}");
    assert!(
        found.files_skipped_policy >= 1,
        "hard link skipped: {found:?}"
    );
    let found = sb
        .search(&SearchInput {
            pattern: "^root:".into(),
            ..Default::default()
        })
        .expect("search");
    assert!(found.matches.is_empty());
    let found = sb
        .search(&SearchInput {
            pattern: "hello".into(),
            ..Default::default()
        })
        .expect("search");
    let files: Vec<&str> = found.matches.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(files, ["README.md", "src/main.rs"]);
    for path in ["../outside", "/etc", "dir_link", "self_loop", ".git"] {
        let err = sb
            .list_files(&ListFilesInput {
                path: path.into(),
                ..Default::default()
            })
            .expect_err(path);
        assert!(err.is_denial(), "{path}: {err}");
        let err = sb
            .search(&SearchInput {
                pattern: "x".into(),
                path: path.into(),
                ..Default::default()
            })
            .expect_err(path);
        assert!(err.is_denial(), "{path}: {err}");
    }
    let described = sb.describe(&Default::default()).expect("describe");
    assert!(
        described.files >= 3 && described.symlinks >= 6,
        "{described:?}"
    );
    assert!(described.languages.iter().any(|l| l.language == "Rust"));
}

#[test]
fn writes_only_create_new_files_under_zopu() {
    let h = hostile();
    let before = hash_tree(&h.outside);
    let sb = sandbox(&h.root);
    let write = |path: &str| {
        sb.write_generated_file(&WriteGeneratedFileInput {
            path: path.to_owned(),
            content: "generated".into(),
        })
    };
    let ok = write("reports/summary.md").expect("write");
    assert_eq!(ok.path, ".zopu/reports/summary.md");
    assert_eq!(
        std::fs::read_to_string(h.root.join(".zopu/reports/summary.md")).expect("written"),
        "generated"
    );
    assert!(read(&sb, "reports/summary.md", Area::Generated).is_ok());
    for path in [
        "reports/summary.md",
        "link",
        "hard",
        "outdir/new.txt",
        "../repo/README.md",
        "../outside/new.txt",
        "/tmp/new.txt",
        "",
        "a\0b",
    ] {
        let err = write(path).expect_err(path);
        assert!(
            err.is_denial() || matches!(err, Error::InvalidInput(_)),
            "{path:?}: {err}"
        );
    }
    assert_eq!(hash_tree(&h.outside), before, "nothing outside changed");
    assert!(!h.outside.join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(h.root.join("repo/README.md")).expect("readme"),
        "# hostile\nhello world\n"
    );
}

#[test]
fn symlinked_zopu_is_refused() {
    let h = hostile();
    std::fs::remove_dir_all(h.root.join(".zopu")).expect("rm");
    symlink(&h.outside, h.root.join(".zopu")).expect("link");
    let before = hash_tree(&h.outside);
    let sb = sandbox(&h.root);
    let err = sb
        .write_generated_file(&WriteGeneratedFileInput {
            path: "x.txt".into(),
            content: "x".into(),
        })
        .expect_err("symlinked .zopu");
    assert!(
        matches!(
            err,
            Error::Policy(zopu_sandbox::policy::PolicyError::GeneratedDirNotDirectory)
        ),
        "{err}"
    );
    assert!(
        read(&sb, "secret.txt", Area::Generated)
            .expect_err("read")
            .is_denial()
    );
    assert_eq!(hash_tree(&h.outside), before);
}

fn exec(sb: &Sandbox, argv: &[&str]) -> Result<zopu_sandbox::tools::ExecSafeOutput, Error> {
    sb.exec_safe(&ExecSafeInput {
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
    })
}

#[test]
fn exec_denies_outside_the_allowlist() {
    let h = hostile();
    let sb = sandbox(&h.root);
    for argv in [
        &["rm", "-rf", "/"][..],
        &["git", "push"],
        &["git", "config", "core.pager", "sh"],
        &["git", "log", "--output=/tmp/x"],
        &["git", "diff", "--ext-diff"],
        &["git", "-c", "core.pager=sh", "log"],
        &["git", "--git-dir=/", "log"],
        &["git", "grep", "-O", "hello"],
        &["git", "log", "--", "../outside"],
    ] {
        let err = exec(&sb, argv).expect_err("denied");
        assert!(err.is_denial(), "{argv:?}: {err}");
    }
    assert_eq!(sb.recorder().denials(), 9);
}

/// A repository whose own config tries hooks, fsmonitor, pager, external
/// diff and textconv: none of them runs.
#[test]
fn hostile_git_config_runs_nothing() {
    let h = hostile();
    let repo = h.root.join("repo");
    let markers = h.outside.join("markers");
    std::fs::create_dir(&markers).expect("markers");
    let script = h.outside.join("evil.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\ntouch {}/$1\ncat\n", markers.display()),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let s = script.display();
    let config = format!(
        "[core]\n\tpager = {s} pager\n\tfsmonitor = {s} fsmonitor\n\thooksPath = {hooks}\n\tworktree = /\n\
         [diff]\n\texternal = {s} external\n[diff \"evil\"]\n\ttextconv = {s} textconv\n\
         [filter \"evil\"]\n\tclean = {s} clean\n[pager]\n\tlog = {s} pagerlog\n",
        hooks = h.outside.display()
    );
    let mut existing = std::fs::read_to_string(repo.join(".git/config")).expect("config");
    existing.push_str(&config);
    std::fs::write(repo.join(".git/config"), existing).expect("write config");
    for hook in [
        "post-checkout",
        "pre-commit",
        "post-index-change",
        "reference-transaction",
    ] {
        std::fs::write(
            h.outside.join(hook),
            format!("#!/bin/sh\ntouch {}/{hook}\n", markers.display()),
        )
        .expect("hook");
        std::fs::set_permissions(
            h.outside.join(hook),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
    }
    std::fs::write(repo.join(".gitattributes"), "* diff=evil filter=evil\n").expect("attributes");
    std::fs::write(repo.join("README.md"), "changed\n").expect("modify");
    let sb = sandbox(&h.root);
    if sb.confinement().mode == ConfinementMode::Refused {
        let err = exec(&sb, &["git", "log"]).expect_err("refused");
        assert!(err.to_string().contains("sandbox.allow_unconfined_exec"));
        return;
    }
    let log = exec(&sb, &["git", "log", "-p", "-n", "1"]).expect("log");
    assert_eq!(log.exit_code, Some(0), "{log:?}");
    assert!(log.stdout.contains("init"));
    for argv in [
        &["git", "diff"][..],
        &["git", "diff", "--stat"],
        &["git", "show", "HEAD"],
        &["git", "grep", "-n", "hello"],
        &["git", "blame", "README.md"],
        &["git", "ls-files"],
    ] {
        let out = exec(&sb, argv).expect("runs");
        assert!(out.exit_code.is_some(), "{argv:?}: {out:?}");
    }
    let fired: Vec<_> = std::fs::read_dir(&markers)
        .expect("markers")
        .map(|e| e.expect("e").file_name())
        .collect();
    assert!(fired.is_empty(), "markers created: {fired:?}");
    let records = sb.recorder().snapshot();
    assert_eq!(records.len(), 7);
    assert!(records.iter().all(|r| r.outcome != ToolOutcome::Denied));
}

#[test]
fn exec_output_is_capped() {
    let h = hostile();
    let repo = h.root.join("repo");
    std::fs::write(repo.join("big.txt"), "line of text\n".repeat(50_000)).expect("big");
    git(&repo, &["add", "big.txt"]);
    git(&repo, &["commit", "-qm", "big"]);
    let limits = SandboxLimits {
        exec_output_bytes: 4096,
        ..SandboxLimits::default()
    };
    let sb = Sandbox::new(WorkspaceRoot::open(&h.root).expect("root"), limits).expect("sandbox");
    if sb.confinement().mode == ConfinementMode::Refused {
        return;
    }
    let out = exec(&sb, &["git", "show", "HEAD"]).expect("show");
    assert!(
        out.stdout_truncated && out.stdout.len() <= 4096,
        "{}",
        out.stdout.len()
    );
    assert_eq!(sb.recorder().snapshot()[0].outcome, ToolOutcome::Truncated);
}
