//! Fuzzing the parsers that take outside input (issue 47, item 5), with
//! proptest (no nightly toolchain here for cargo-fuzz): the event codec,
//! the artifact HTML validator, the secret detector, configuration loading,
//! the gateway's request bodies (over HTTP, against a real gateway and
//! nats-server) and the repository's `.env.example` reader. Each target
//! starts from its seed corpus in `tests/fuzz-corpus/<target>/` (every seed
//! runs first, as it is) and then runs `ZOPU_FUZZ_CASES` cases (default
//! 256) of seeds mutated byte by byte and of arbitrary text. A long run:
//!
//! ```text
//! ZOPU_FUZZ_CASES=10000 cargo test -p zopu-tests --test it fuzz:: -- --test-threads 1
//! ```
//!
//! Every target asserts what must hold for any input — no panic, and the
//! parser's own invariant (a decoded envelope passes its checks and
//! re-encodes to itself; a page the validator accepts has no script; the
//! redacted text has no finding; a loaded configuration validates or is
//! refused with the setting named; a request body gets a 2xx or a 4xx
//! naming what was wrong, never a 5xx).

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use zopu_tests::{NatsServer, workspace_root};

/// Cases per target when `ZOPU_FUZZ_CASES` is not set (CI's brief run).
const CASES_DEFAULT: u32 = 256;

fn cases() -> u32 {
    std::env::var("ZOPU_FUZZ_CASES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(CASES_DEFAULT)
}

/// The seed corpus of `target`, as text.
fn corpus(target: &str) -> Result<Vec<String>> {
    let dir: PathBuf = workspace_root().join("tests/fuzz-corpus").join(target);
    let mut seeds = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        seeds.push(std::fs::read_to_string(&path).with_context(|| path.display().to_string())?);
    }
    seeds.sort();
    ensure!(!seeds.is_empty(), "{} holds no seed", dir.display());
    Ok(seeds)
}

/// Text a parser may meet: a seed with edits (insertions of characters
/// parsers treat specially, deletions, duplicated runs), or arbitrary text.
fn inputs(seeds: Vec<String>) -> impl Strategy<Value = String> {
    let edit = (
        any::<prop::sample::Index>(),
        0usize..4,
        prop_oneof![
            Just("\"".to_owned()),
            Just("<".to_owned()),
            Just(">".to_owned()),
            Just("\\".to_owned()),
            Just("%".to_owned()),
            Just("=".to_owned()),
            Just("\n".to_owned()),
            Just("\u{0}".to_owned()),
            Just("\u{202e}".to_owned()),
            Just("{".to_owned()),
            Just("]".to_owned()),
            Just("é".to_owned()),
            "[ -~]{1,8}",
            Just("9".repeat(40)),
        ],
    );
    let mutated = (
        prop::sample::select(seeds),
        prop::collection::vec(edit, 1..8),
    )
        .prop_map(|(seed, edits)| {
            let mut text = seed;
            for (at, kind, piece) in edits {
                let mut index = at.index(text.len() + 1);
                while !text.is_char_boundary(index) {
                    index -= 1;
                }
                match kind {
                    0 | 1 => text.insert_str(index, &piece),
                    2 => {
                        let end = text[index..]
                            .char_indices()
                            .nth(piece.len())
                            .map_or(text.len(), |(offset, _)| index + offset);
                        text.replace_range(index..end, "");
                    }
                    _ => {
                        let end = text[index..]
                            .char_indices()
                            .nth(16)
                            .map_or(text.len(), |(offset, _)| index + offset);
                        let run = text[index..end].to_owned();
                        text.insert_str(index, &run);
                    }
                }
            }
            text
        });
    prop_oneof![4 => mutated, 1 => "\\PC{0,300}"]
}

/// Runs `check` on every seed, then on `cases()` generated inputs.
fn fuzz(target: &str, check: impl Fn(&str) -> Result<(), TestCaseError>) -> Result<()> {
    let seeds = corpus(target)?;
    for seed in &seeds {
        check(seed).map_err(|error| anyhow::anyhow!("{target} seed: {error}"))?;
    }
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&inputs(seeds), |input| check(&input))
        .map_err(|error| anyhow::anyhow!("{target}: {error}"))
}

#[test]
fn fuzz_the_event_codec() -> Result<()> {
    let decoded = std::cell::Cell::new(0usize);
    let fuzzed = fuzz("event-codec", |text| {
        let headers: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|line| line.split_once(": "))
            .collect();
        let body = Bytes::from(text.as_bytes().to_vec());
        if let Ok(envelope) = zopu_schema::codec::decode(headers.iter().copied(), body) {
            decoded.set(decoded.get() + 1);
            prop_assert!(
                envelope.check().is_ok(),
                "decoded but invalid: {envelope:?}"
            );
            let (encoded, body) = zopu_schema::codec::encode(&envelope);
            let again = zopu_schema::codec::decode(
                encoded.iter().map(|(name, value)| (*name, value.as_str())),
                body,
            );
            prop_assert!(
                again
                    .as_ref()
                    .is_ok_and(|again| again.hash() == envelope.hash()),
                "does not re-encode to itself: {again:?}"
            );
        }
        Ok(())
    });
    println!("event codec: {} inputs decoded", decoded.get());
    fuzzed
}

#[test]
fn fuzz_the_artifact_validator() -> Result<()> {
    let policy = zopu_artifacts::validate::Policy::default();
    fuzz("html", |html| {
        if zopu_artifacts::validate::validate(html, &policy).is_ok() {
            let lower = html.to_ascii_lowercase();
            prop_assert!(
                !lower.contains("<script"),
                "a script was accepted: {html:?}"
            );
            prop_assert!(
                !lower.contains("javascript:"),
                "a javascript: link was accepted: {html:?}"
            );
            prop_assert!(
                zopu_secrets::scan(html).is_empty(),
                "a secret was accepted: {html:?}"
            );
        }
        Ok(())
    })
}

#[test]
fn fuzz_the_secret_detector() -> Result<()> {
    let value = zopu_secrets::Secret::new(["tok_live_", "Q8v3/Lm2+Rx9"].concat());
    let known = zopu_secrets::KnownSecrets::new([("env API_TOKEN".to_owned(), &value)]);
    fuzz("secrets", |text| {
        let findings = zopu_secrets::scan(text);
        let mut previous_end = 0;
        for finding in &findings {
            prop_assert!(finding.start >= previous_end && finding.start < finding.end);
            prop_assert!(
                text.is_char_boundary(finding.start) && text.is_char_boundary(finding.end)
            );
            previous_end = finding.end;
        }
        let redacted = zopu_secrets::redact(text);
        prop_assert!(zopu_secrets::scan(&redacted).is_empty(), "{redacted:?}");
        let (redacted, _) = known.redact(text);
        prop_assert!(!known.is_found_in(&redacted), "{redacted:?}");
        let _ = zopu_secrets::stated_credential(text);
        let _ = zopu_secrets::is_placeholder(text);
        Ok(())
    })
}

#[test]
fn fuzz_configuration_loading() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("zopu.toml");
    fuzz("config", |text| {
        std::fs::write(&file, text).map_err(|error| TestCaseError::fail(error.to_string()))?;
        let sources = zopu_runtime::config::Sources {
            file: Some(file.clone()),
            environment: vec![(
                "ZOPU_SSE_KEEPALIVE".to_owned(),
                text.lines().next().unwrap_or_default().to_owned(),
            )],
            overrides: Vec::new(),
        };
        match zopu_runtime::config::load::<zopu_gateway::Config>(&sources) {
            Ok(config) => {
                // Validation refuses or accepts; either way it names no secret and never panics.
                let _ = config.validate();
            }
            Err(error) => {
                let message = error.to_string();
                prop_assert!(!message.is_empty());
            }
        }
        Ok(())
    })
}

#[test]
fn fuzz_the_env_example_reader() -> Result<()> {
    fuzz("env-example", |text| {
        let manifest = zopu_sandbox::env_scan::parse_env_example(text);
        for variable in &manifest.variables {
            prop_assert!(
                variable
                    .name
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && variable
                        .name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "invalid name kept: {:?}",
                variable.name
            );
            if let Some(example) = &variable.example_value {
                prop_assert!(zopu_secrets::is_placeholder(example), "{example:?} kept");
            }
            if let Some(description) = &variable.description {
                prop_assert!(
                    zopu_secrets::scan(description).is_empty(),
                    "{description:?}"
                );
            }
        }
        Ok(())
    })
}

/// Request bodies sent over HTTP to a real gateway: every one is answered
/// 2xx or 4xx (never 5xx), and a 4xx says what was wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_the_gateways_request_bodies() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = zopu_tests::bus(&server, std::time::Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let (org, project) = (
        crate::conversation::org("acme"),
        zopu_schema::ProjectId::new(),
    );
    crate::registry::request_setup(&bus, &org, project).await?;
    // Quotas high enough that every body reaches its parser.
    let config = zopu_gateway::Config {
        messages_per_minute_per_token: 1_000_000,
        messages_per_minute_per_org: 1_000_000,
        projects_per_hour_per_token: 1_000_000,
        projects_per_hour_per_org: 1_000_000,
        ..zopu_gateway::Config::default()
    };
    let gateway = crate::registry::Gateway::start_configured(
        zopu_tests::core_config(&server, dir.path()),
        config,
    )
    .await?;
    gateway.caught_up(&bus).await?;
    let routes = [
        (reqwest::Method::POST, "/v1/projects".to_owned()),
        (
            reqwest::Method::POST,
            format!("/v1/projects/{project}/messages"),
        ),
        (
            reqwest::Method::PUT,
            format!("/v1/projects/{project}/memory/preference.tone"),
        ),
    ];
    let runtime = tokio::runtime::Handle::current();
    let route = std::cell::Cell::new(0usize);
    let accepted = std::cell::Cell::new(0usize);
    let refused = std::cell::Cell::new(0usize);
    let checked = tokio::task::block_in_place(|| {
        fuzz("gateway-bodies", |body| {
            route.set((route.get() + 1) % routes.len());
            let (method, path) = routes[route.get()].clone();
            let (status, answer) = runtime
                .block_on(gateway.send_bytes(method, &path, body.as_bytes().to_vec()))
                .map_err(|error| TestCaseError::fail(error.to_string()))?;
            prop_assert!(
                !status.is_server_error(),
                "{path} answered {status} to {body:?}: {answer}"
            );
            let tally = if status.is_success() {
                &accepted
            } else {
                &refused
            };
            tally.set(tally.get() + 1);
            if status.is_client_error() && status != reqwest::StatusCode::TOO_MANY_REQUESTS {
                let error: serde_json::Value = serde_json::from_str(&answer).map_err(|_| {
                    TestCaseError::fail(format!("{status} without a JSON error: {answer}"))
                })?;
                prop_assert!(
                    error["error"]["message"]
                        .as_str()
                        .is_some_and(|m| !m.is_empty()),
                    "{answer}"
                );
            }
            Ok(())
        })
    });
    println!(
        "gateway bodies: {} accepted, {} refused with a 4xx",
        accepted.get(),
        refused.get()
    );
    gateway.stop().await?;
    checked
}
