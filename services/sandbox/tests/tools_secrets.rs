//! The read-only tools refuse secret-bearing files: by name (`.env`, keys,
//! credential files; `.env.example` stays readable) and by content (a key
//! body or a credential document under an innocent name), whatever line
//! range is asked for; `search` skips them and `exec_safe` redacts. A
//! project's environment value printed by its own test command in another
//! form — re-spaced, split, reversed, upper-cased, hex, base64 (standard,
//! URL-safe, inside a longer encoding), URL-encoded, JSON- or
//! shell-escaped — leaves `run_check` redacted, run by a real shell and
//! real coreutils under the sandbox's confinement, and so does any other
//! tool's output; a 64-hex-digit value printed under an API key's name is
//! redacted by its context while a commit id and a digest stay readable.

use std::path::Path;
use std::process::Command;

use zopu_sandbox::confine::ConfinementMode;
use zopu_sandbox::policy::{Area, PolicyError, SandboxLimits, WorkspaceRoot};
use zopu_sandbox::tools::{
    Error, ExecSafeInput, ProgramEnvironment, ReadFileInput, RunCheckInput, Sandbox, SearchInput,
};
use zopu_secrets::Secret;

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
    let sandbox = committed_sandbox(dir.path(), &files);
    (dir, sandbox)
}

/// A sandbox over `<dir>/repo` holding `files`, committed.
fn committed_sandbox(dir: &Path, files: &[(&str, String)]) -> Sandbox {
    let repo = dir.join("repo");
    for (path, content) in files {
        let full = repo.join(path);
        std::fs::create_dir_all(full.parent().expect("parent")).expect("dirs");
        std::fs::write(full, content).expect("write");
    }
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "init"]);
    Sandbox::new(
        WorkspaceRoot::open(dir).expect("root"),
        SandboxLimits::default(),
    )
    .expect("sandbox")
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

/// A fake value assembled at run time (never a real credential), holding
/// the characters escaping changes.
fn token() -> String {
    ["tok_live_", "Q8v3/Lm2+Rx9", "Kp4Wz7"].concat()
}

const COMMIT: &str = "3f9a1c0e5b7d2a4f6e8c0b1d3f5a7c9e1b3d5f7a";
const DIGEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// Prints `$API_TOKEN` in every form, then a hex key under an API key's
/// name and a commit and a digest.
const CHECK_SCRIPT: &str = r#"#!/bin/sh
v="$API_TOKEN"
echo "plain $v"
echo "upper $(printf %s "$v" | tr a-z A-Z)"
echo "spaced $(printf %s "$v" | sed 's/./& /g')"
printf 'split %s\n%s\n' "$(printf %s "$v" | cut -c1-9)" "$(printf %s "$v" | cut -c10-)"
echo "reversed $(printf %s "$v" | rev)"
echo "hex $(printf %s "$v" | od -An -tx1 | tr -d ' \n')"
echo "hexdump $(printf %s "$v" | od -An -tx1)"
echo "base64 $(printf %s "$v" | base64)"
echo "base64url $(printf %s "$v" | base64 | tr '+/' '-_' | tr -d '=')"
echo "line $(echo "API_TOKEN=$v" | base64)"
echo "urlencoded $(printf %s "$v" | od -An -tx1 | tr -d '\n' | sed 's/ /%/g')"
echo "json {\"token\": \"$(printf %s "$v" | sed 's|/|\\/|g')\"}"
echo "shell $(printf %s "$v" | sed 's/[^A-Za-z0-9]/\\&/g')"
printf '| API_KEY | %s |\n' "$(printf hello | sha256sum | cut -c1-64)"
echo "commit 3f9a1c0e5b7d2a4f6e8c0b1d3f5a7c9e1b3d5f7a digest sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
"#;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Every form the script prints, computed here.
fn forms(value: &str) -> Vec<String> {
    let encoded = Command::new("base64")
        .arg("-w0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(value.as_bytes())?;
            child.wait_with_output()
        })
        .expect("base64 runs");
    let base64 = String::from_utf8(encoded.stdout).expect("ascii");
    vec![
        value.to_owned(),
        value.to_uppercase(),
        value
            .chars()
            .map(|c| format!("{c} "))
            .collect::<String>()
            .trim_end()
            .to_owned(),
        value[..9].to_owned() + "\n" + &value[9..],
        value.chars().rev().collect(),
        hex(value.as_bytes()),
        base64.trim_end_matches('=').to_owned(),
        base64.replace('+', "-").replace('/', "_"),
        value.replace('/', "\\/"),
        "Q8v3".to_owned(),
        "Kp4Wz7".to_owned(),
    ]
}

#[test]
fn a_value_printed_in_any_form_by_a_check_leaves_it_redacted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let value = token();
    let files = [
        ("check.sh", CHECK_SCRIPT.to_owned()),
        (
            "fixture.txt",
            format!("fixture: {}\n", hex(value.as_bytes()).to_uppercase()),
        ),
    ];
    let sandbox = committed_sandbox(dir.path(), &files).with_program_environment(
        ProgramEnvironment::new(vec![("API_TOKEN".to_owned(), Secret::new(value.clone()))]),
    );
    assert_ne!(
        sandbox.confinement().mode,
        ConfinementMode::Refused,
        "this machine offers no confinement: the check cannot run"
    );

    let output = sandbox
        .run_check(&RunCheckInput {
            command: "sh ./check.sh".to_owned(),
        })
        .expect("the check runs");
    assert_eq!(output.exit_code, Some(0), "{output:?}");
    let text = &output.output_tail;
    for form in forms(&value) {
        assert!(!text.contains(&form), "{form:?} left in:\n{text}");
    }
    for line in [
        "plain",
        "upper",
        "spaced",
        "split",
        "reversed",
        "hex",
        "hexdump",
        "base64",
        "base64url",
        "urlencoded",
        "shell",
    ] {
        assert!(
            text.lines().any(|printed| printed
                .strip_prefix(line)
                .is_some_and(|rest| rest.trim() == "[redacted:env API_TOKEN]")),
            "{line} not redacted:\n{text}"
        );
    }
    assert!(
        text.contains("json {\"token\": \"[redacted:env API_TOKEN]\"}"),
        "{text}"
    );
    assert!(output.values_redacted >= 13, "{output:?}");
    // The hex key under API_KEY goes by its context; ids stay.
    let hello_digest = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
    assert!(!text.contains(hello_digest), "{text}");
    assert!(text.contains("| API_KEY | [redacted:"), "{text}");
    assert!(
        text.contains(&format!("commit {COMMIT} digest sha256:{DIGEST}")),
        "{text}"
    );

    // Any tool's output: a file holding the value in upper-case hex.
    let read = sandbox
        .read_file(&ReadFileInput {
            path: "fixture.txt".to_owned(),
            area: Area::Repo,
            start_line: None,
            end_line: None,
        })
        .expect("read");
    assert!(
        read.content.contains("fixture: [redacted:env API_TOKEN]"),
        "{read:?}"
    );
}
