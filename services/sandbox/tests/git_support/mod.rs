//! Shared fixtures for the git, workspace and env-scan integration tests:
//! source repositories built with the real `git` binary.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use zopu_sandbox::git::GitOptions;

/// Runs the host git for fixture setup (never the code under test), isolated
/// from the user's and system's configuration.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args([
            "-c",
            "user.name=Zopu Test",
            "-c",
            "user.email=test@example.com",
        ])
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .output()
        .expect("git is installed");
    assert!(
        output.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

pub fn write(path: &Path, content: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, content).unwrap();
}

/// A source repository with two commits on `main` and one more on `feature`
/// (plus a tag), checked out on `main`.
pub fn source_repository(parent: &Path, name: &str) -> PathBuf {
    let path = parent.join(name);
    std::fs::create_dir_all(&path).unwrap();
    git(&path, &["init", "--quiet", "--initial-branch=main"]);
    write(&path.join("README.md"), "# Demo\n");
    write(&path.join("src/lib.rs"), "pub fn demo() {}\n");
    write(&path.join(".env.example"), "# Port\nPORT=3000\n");
    git(&path, &["add", "."]);
    git(&path, &["commit", "--quiet", "-m", "first"]);
    write(&path.join("README.md"), "# Demo\n\nSecond.\n");
    git(&path, &["commit", "--quiet", "-am", "second"]);
    git(&path, &["tag", "v1"]);
    git(&path, &["checkout", "--quiet", "-b", "feature"]);
    write(&path.join("FEATURE.md"), "feature\n");
    git(&path, &["add", "FEATURE.md"]);
    git(&path, &["commit", "--quiet", "-m", "feature"]);
    git(&path, &["checkout", "--quiet", "main"]);
    path
}

/// Git options for tests: local repositories allowed under the temporary
/// directory (where every fixture lives), generous timeouts.
pub fn options() -> GitOptions {
    GitOptions {
        allow_local_repositories: true,
        local_repository_roots: vec![std::env::temp_dir()],
        clone_timeout: Duration::from_secs(60),
        command_timeout: Duration::from_secs(30),
        ..GitOptions::default()
    }
}

/// An executable shell script that creates `marker` when run.
pub fn marker_script(path: &Path, marker: &Path) {
    use std::os::unix::fs::PermissionsExt;
    write(
        path,
        &format!("#!/bin/sh\ntouch '{}'\nexit 0\n", marker.display()),
    );
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Entries of a directory (names), sorted.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
