//! The read-only tools refuse secret-bearing files: by name (`.env`, keys,
//! credential files; `.env.example` stays readable) and by content (a key
//! body or a credential document under an innocent name), whatever line
//! range is asked for; `search` skips them and `exec_safe` redacts.

use std::path::Path;
use std::process::Command;

use zopu_sandbox::policy::{Area, PolicyError, SandboxLimits, WorkspaceRoot};
use zopu_sandbox::tools::{Error, ExecSafeInput, ReadFileInput, Sandbox, SearchInput};

/// Fake values assembled at run time (never real credentials).
fn dotenv_value() -> String {
    format!("{}{}", "q7Zx", "Lm2P")
}

fn key_line() -> String {
    format!(
        "{}{}",
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7", "VJTUt9Us8cKjMzEfYyjiWA4R4"
    )
}

fn private_key() -> String {
    format!(
        "-----BEGIN {}-----\n{}\nAbCdEf0123456789abcdefGHIJKLmnopqrstuvwxyz0123\n-----END PRIVATE KEY-----\n",
        "PRIVATE KEY",
        key_line()
    )
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

fn workspace() -> (tempfile::TempDir, Sandbox) {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = dir.path().join("repo");
    let files: Vec<(&str, String)> = vec![
        (
            ".env",
            format!("DB_PASSWORD={}\nPORT=3000\n", dotenv_value()),
        ),
        (".env.example", "DB_PASSWORD=\nPORT=3000\n".to_owned()),
        (
            ".env.production",
            format!("DB_PASSWORD={}\n", dotenv_value()),
        ),
        ("deploy/id_ed25519", private_key()),
        ("certs/server.pem", private_key()),
        (
            "notes/rotation.txt",
            format!("old deploy key below\n{}", private_key()),
        ),
        (
            "ops/gcp.json",
            format!(
                "{{\n  \"type\": \"service_account\",\n  \"private_key_id\": \"{}\"\n}}\n",
                dotenv_value()
            ),
        ),
        ("src/config.py", "DEBUG = True\nPORT = 3000\n".to_owned()),
    ];
    for (path, content) in &files {
        let full = repo.join(path);
        std::fs::create_dir_all(full.parent().expect("parent")).expect("dirs");
        std::fs::write(full, content).expect("write");
    }
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "init"]);
    let sandbox = Sandbox::new(
        WorkspaceRoot::open(dir.path()).expect("root"),
        SandboxLimits::default(),
    )
    .expect("sandbox");
    (dir, sandbox)
}

fn read(sandbox: &Sandbox, path: &str, lines: Option<(u64, u64)>) -> Result<String, Error> {
    sandbox
        .read_file(&ReadFileInput {
            path: path.to_owned(),
            area: Area::Repo,
            start_line: lines.map(|(start, _)| start),
            end_line: lines.map(|(_, end)| end),
        })
        .map(|output| output.content)
}

fn assert_refused(result: Result<String, Error>, path: &str) {
    match result {
        Err(error @ Error::Policy(PolicyError::SecretFile(_))) => {
            assert!(error.is_denial(), "{path}: a refusal is a denial");
            assert_eq!(error.code(), "secret_file");
        }
        other => panic!("{path}: expected a secret-file refusal, got {other:?}"),
    }
}

#[test]
fn read_file_refuses_secret_files_by_name() {
    let (_dir, sandbox) = workspace();
    for path in [
        ".env",
        ".env.production",
        "deploy/id_ed25519",
        "certs/server.pem",
    ] {
        assert_refused(read(&sandbox, path, None), path);
    }
    let example = read(&sandbox, ".env.example", None).expect("the example is readable");
    assert!(example.contains("DB_PASSWORD="));
    assert!(read(&sandbox, "src/config.py", None).is_ok());
}

#[test]
fn read_file_refuses_secret_content_whatever_the_line_range() {
    let (_dir, sandbox) = workspace();
    // Line 1 is harmless, the key starts on line 2: the file is still refused.
    assert_refused(
        read(&sandbox, "notes/rotation.txt", Some((1, 1))),
        "notes/rotation.txt",
    );
    assert_refused(
        read(&sandbox, "notes/rotation.txt", Some((3, 4))),
        "notes/rotation.txt",
    );
    assert_refused(read(&sandbox, "ops/gcp.json", None), "ops/gcp.json");
}

#[test]
fn search_skips_secret_files() {
    let (_dir, sandbox) = workspace();
    for pattern in [dotenv_value(), key_line(), "DB_PASSWORD".to_owned()] {
        let found = sandbox
            .search(&SearchInput {
                pattern: pattern.clone(),
                literal: true,
                ..Default::default()
            })
            .expect("search");
        let hits: Vec<&str> = found.matches.iter().map(|m| m.path.as_str()).collect();
        assert!(
            hits.iter().all(|path| *path == ".env.example"),
            "{pattern}: {hits:?}"
        );
        assert!(found.files_skipped_secret >= 1, "{pattern}: {found:?}");
        let json = serde_json::to_string(&found).expect("json");
        assert!(!json.contains(&dotenv_value()) && !json.contains(&key_line()));
    }
}

#[test]
fn exec_safe_refuses_secret_paths_and_redacts_output() {
    let (_dir, sandbox) = workspace();
    let refused = sandbox.exec_safe(&ExecSafeInput {
        argv: ["git", "log", "-p", "--", ".env"]
            .map(str::to_owned)
            .to_vec(),
    });
    assert!(
        matches!(refused, Err(Error::Policy(PolicyError::SecretFile(_)))),
        "{refused:?}"
    );
    match sandbox.exec_safe(&ExecSafeInput {
        argv: ["git", "show", "HEAD"].map(str::to_owned).to_vec(),
    }) {
        Ok(output) => {
            assert!(
                !output.stdout.contains(&dotenv_value()),
                "{}",
                output.stdout
            );
            assert!(!output.stdout.contains(&key_line()));
        }
        // No confinement on this machine: nothing ran, nothing leaked.
        Err(error) => assert!(error.is_denial(), "{error:?}"),
    }
}
