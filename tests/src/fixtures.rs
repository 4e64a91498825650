//! Fixtures shared by the integration tests: a small git repository, git
//! run hardened, a free loopback port.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};

/// A small Rust project in a fresh git repository on branch `main`.
pub fn demo_repository(dir: &Path) -> Result<PathBuf> {
    let repo = dir.join("demo-repo");
    std::fs::create_dir_all(repo.join("src"))?;
    std::fs::write(
        repo.join("Cargo.toml"),
        "[package]\nname = \"demo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )?;
    std::fs::write(
        repo.join("src/main.rs"),
        "//! A tiny service: reads its greeting from the environment.\n\nfn main() {\n    let greeting = std::env::var(\"GREETING\").unwrap_or_else(|_| \"hello\".into());\n    println!(\"{greeting}\");\n}\n",
    )?;
    std::fs::write(
        repo.join("README.md"),
        "# demo\n\nA tiny service used by Zopu's browser test. Run it with `cargo run`.\n",
    )?;
    std::fs::write(
        repo.join(".env.example"),
        "GREETING=hello\nDATABASE_URL=postgres://localhost/demo\n",
    )?;
    init_and_commit(&repo, "main", "A tiny service")?;
    Ok(repo)
}

/// Makes `repo` a git repository on `branch` with everything in it committed.
pub fn init_and_commit(repo: &Path, branch: &str, message: &str) -> Result<()> {
    git(repo, &["init", "-q", "-b", branch])?;
    git(repo, &["add", "."])?;
    git(
        repo,
        &[
            "-c",
            "user.name=Zopu Test",
            "-c",
            "user.email=test@zopu.invalid",
            "commit",
            "-q",
            "-m",
            message,
        ],
    )
}

/// Runs git in `repo` with no system or user configuration.
pub fn git(repo: &Path, args: &[&str]) -> Result<()> {
    let output = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .context("running git (install it with `apt-get install -y git`)")?;
    ensure!(
        output.status.success(),
        "git {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// Runs `command` with `input` (if any) on its standard input and its
/// output captured: how a test feeds a secret to the CLI.
pub fn output_with_input(
    command: &mut std::process::Command,
    input: Option<&str>,
) -> Result<std::process::Output> {
    use std::io::Write as _;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the command")?;
    if let Some(input) = input {
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(input.as_bytes())?;
    }
    drop(child.stdin.take());
    Ok(child.wait_with_output()?)
}

/// A port nothing listens on now (loopback).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Every regular file under `dir` with its bytes, read raw (for tests that
/// search what services wrote for a value that must not be there).
pub fn files_under(dir: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file() {
                found.push((entry.path(), std::fs::read(entry.path())?));
            }
        }
    }
    Ok(found)
}
