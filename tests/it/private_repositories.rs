//! Private repositories (issue 18, item 5): a repository on a git server
//! that demands a token — git's own smart-HTTP backend behind HTTPS on
//! loopback (`zopu_tests::git_server`) with a CA of the test's own, which
//! setup trusts through `sandbox.repository_ca_file` — fails setup with an
//! actionable `clone.authentication_required` while the organization has no
//! token for the host, clones once a token is stored through the gateway
//! (`PUT /v1/repository-credentials/{host}`), and fails
//! `clone.credential_refused` with a wrong one stored through the CLI. The
//! token appears nowhere: not on the stream, not in the secret store's
//! messages, not in a response or CLI output, not in setup's log (at debug),
//! not in a file setup wrote (the clone's `.git/config` included).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use base64::Engine as _;
use serde_json::json;
use zopu_core::secret_store::SecretKey;
use zopu_runtime::nats::Bus;
use zopu_schema::{Envelope, OrgId, ProjectId, pb, subjects};
use zopu_tests::certificates::Certificates;
use zopu_tests::fleet::{Fleet, FleetConfig};
use zopu_tests::git_server::PrivateGitServer;
use zopu_tests::{NatsServer, bus, fixtures, wait_for, workspace_root, zopu_binary};

use crate::secrets::{contains, secret_bucket_payloads, stream_texts};

const LONG: Duration = Duration::from_secs(120);
const SECRETS_KEY: &str = "private-repositories-test-key-0123456789abcdef";

/// The setup revision's outcome: `project.ready` or `project.setup.failed`.
async fn outcome(bus: &Bus, org: &OrgId, project: ProjectId, revision: u32) -> Result<Envelope> {
    wait_for(
        bus,
        &subjects::project_events(org, &project),
        LONG,
        |event| {
            (event.is::<pb::ProjectReady>() || event.is::<pb::ProjectSetupFailed>())
                && zopu_setup::state::setup_revision_of(event) == Some(revision)
        },
    )
    .await
}

async fn failure_code(
    bus: &Bus,
    org: &OrgId,
    project: ProjectId,
    revision: u32,
) -> Result<(String, String)> {
    let event = outcome(bus, org, project, revision).await?;
    let failed = event
        .decode::<pb::ProjectSetupFailed>()
        .with_context(|| format!("revision {revision} did not fail: {}", event.event_type))?;
    let reason = failed.reason.context("a failure reason")?;
    Ok((reason.code, reason.message))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_repository_clones_with_the_stored_token_and_fails_clearly_without_it()
-> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let org: OrgId = "acme".parse()?;

    // The private host: a bare copy of the demo repository behind HTTPS.
    let source = fixtures::demo_repository(dir.path())?;
    let root = dir.path().join("git-root");
    std::fs::create_dir_all(root.join("acme"))?;
    fixtures::git(
        dir.path(),
        &[
            "clone",
            "--quiet",
            "--bare",
            &source.display().to_string(),
            &root.join("acme/app.git").display().to_string(),
        ],
    )?;
    let certificates = Certificates::make()?;
    let token = ["zpk_private_", "9fQ2mX7vL4tR8wK1"].concat();
    let wrong = ["zpk_stale_", "3hN6pB0cV5jD2sY8"].concat();
    let git_server =
        PrivateGitServer::start(&root, &certificates, "x-access-token", &token).await?;
    let host = git_server.host();
    let secrets = [
        token.clone(),
        wrong.clone(),
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{token}")),
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{wrong}")),
    ];

    // Setup as its own process (its log is scanned), trusting the test CA
    // and allowed to reach the loopback host.
    let zopu = zopu_binary(&workspace_root())?;
    let fleet_root = dir.path().join("fleet");
    let mut fleet = Fleet::new(
        &zopu,
        &fleet_root,
        FleetConfig::single_node(
            server.url(),
            vec![
                ("ZOPU_SECRETS_KEY".into(), SECRETS_KEY.into()),
                (
                    "ZOPU_SANDBOX__ALLOWED_REPOSITORY_HOSTS".into(),
                    format!("[{host:?}]"),
                ),
                (
                    "ZOPU_SANDBOX__REPOSITORY_CA_FILE".into(),
                    certificates.path("ca.pem").display().to_string(),
                ),
            ],
        ),
    )?;
    fleet.set_instance_env("setup", 1, vec![("ZOPU_LOG".into(), "debug".into())]);
    fleet.start("setup", 1)?;
    let gateway = crate::registry::Gateway::start_configured(
        zopu_tests::core_config(&server, &dir.path().join("gateway")),
        zopu_gateway::Config {
            secrets_key: Some(SecretKey::new(SECRETS_KEY.as_bytes(), "test")?),
            ..Default::default()
        },
    )
    .await?;
    let mut responses: Vec<String> = Vec::new();

    // No token yet: the host answers 401, setup says what to do.
    let (status, created) = gateway
        .post(
            "/v1/projects",
            json!({"repository": git_server.url("acme/app.git"), "branch": "main"}),
        )
        .await?;
    ensure!(status == reqwest::StatusCode::CREATED, "{created}");
    let project: ProjectId = created["project_id"]
        .as_str()
        .context("project id")?
        .parse()?;
    let (code, message) = failure_code(&bus, &org, project, 1)
        .await
        .with_context(|| fleet.log_tail("setup-1", 40))?;
    assert_eq!(code, "clone.authentication_required", "{message}");
    ensure!(
        message.contains(&format!("zopu credentials set {host}"))
            && message.contains(&format!("/v1/repository-credentials/{host}")),
        "the message says how to store a token for the host: {message}"
    );
    let seen = git_server.seen();
    ensure!(seen.refused >= 1 && seen.served == 0, "{seen:?}");

    // The token through the API (admin scope): stored sealed, listed without it.
    let (status, refused) = gateway
        .put(
            "/v1/repository-credentials/not a host",
            json!({"token": token}),
        )
        .await?;
    assert_eq!(
        status,
        reqwest::StatusCode::UNPROCESSABLE_ENTITY,
        "{refused}"
    );
    assert_eq!(refused["error"]["field"], "host", "{refused}");
    let (status, set) = gateway
        .put(
            &format!("/v1/repository-credentials/{host}"),
            json!({"token": token}),
        )
        .await?;
    assert_eq!(status, reqwest::StatusCode::OK, "{set}");
    let version = set["credential"]["version"].as_u64().context("a version")?;
    let (status, listed) = gateway.get("/v1/repository-credentials").await?;
    assert_eq!(status, reqwest::StatusCode::OK, "{listed}");
    assert_eq!(listed["credentials"][0]["host"], host.as_str(), "{listed}");
    assert_eq!(listed["credentials"][0]["username"], "x-access-token");
    responses.extend([
        created.to_string(),
        refused.to_string(),
        set.to_string(),
        listed.to_string(),
    ]);

    // A retry clones with it; the clone records which credential it used.
    let (status, retried) = gateway
        .post(&format!("/v1/projects/{project}/setup/retry"), json!({}))
        .await?;
    ensure!(status == reqwest::StatusCode::ACCEPTED, "{retried}");
    let ready = outcome(&bus, &org, project, 2).await?;
    ensure!(
        ready.is::<pb::ProjectReady>(),
        "revision 2 ended {}: {}",
        ready.event_type,
        fleet.log_tail("setup-1", 40)
    );
    let cloned = wait_for(
        &bus,
        &subjects::event(
            &org,
            &project,
            <pb::ProjectRepositoryCloned as zopu_schema::Event>::TYPE,
        ),
        LONG,
        |event| zopu_setup::state::setup_revision_of(event) == Some(2),
    )
    .await?
    .decode::<pb::ProjectRepositoryCloned>()?;
    assert_eq!(
        (cloned.credential_host.as_str(), cloned.credential_version),
        (host.as_str(), version)
    );
    ensure!(cloned.tracked_files > 0, "{cloned:?}");
    let seen = git_server.seen();
    ensure!(seen.served >= 1, "{seen:?}");
    let expected = format!("Basic {}", secrets[2]);
    ensure!(
        seen.authorizations.iter().all(|header| *header == expected),
        "only the stored token was ever presented"
    );

    // A wrong token stored through the CLI: the host refuses it, and setup says so.
    let cli = |args: &[&str], input: Option<&str>| -> Result<std::process::Output> {
        fixtures::output_with_input(
            fleet
                .command()
                .args(["credentials"])
                .args(args)
                .args(["--org", "acme"])
                .env("ZOPU_SECRETS_KEY", SECRETS_KEY)
                .env("ZOPU_LOG", "debug"),
            input,
        )
    };
    let replaced = cli(&["set", &host], Some(&format!("{wrong}\n")))?;
    ensure!(
        replaced.status.success(),
        "{}",
        String::from_utf8_lossy(&replaced.stderr)
    );
    let (status, retried) = gateway
        .post(&format!("/v1/projects/{project}/setup/retry"), json!({}))
        .await?;
    // Revision 2 is ready: a retry is refused, so ask for a fresh setup of
    // another project on the same host.
    assert_eq!(status, reqwest::StatusCode::CONFLICT, "{retried}");
    let (status, second) = gateway
        .post(
            "/v1/projects",
            json!({"repository": git_server.url("acme/app.git"), "branch": "main", "name": "second"}),
        )
        .await?;
    ensure!(status == reqwest::StatusCode::CREATED, "{second}");
    let second: ProjectId = second["project_id"]
        .as_str()
        .context("project id")?
        .parse()?;
    let (code, message) = failure_code(&bus, &org, second, 1).await?;
    assert_eq!(code, "clone.credential_refused", "{message}");
    ensure!(message.contains("Replace it"), "{message}");

    let cli_listed = cli(&["list"], None)?;
    let listing = String::from_utf8_lossy(&cli_listed.stdout).into_owned();
    ensure!(
        listing.contains(&format!("{host}  user x-access-token")),
        "{listing}"
    );
    let removed = cli(&["unset", &host], None)?;
    ensure!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    let again = cli(&["unset", &host], None)?;
    ensure!(!again.status.success(), "a second unset finds nothing");
    let (_, listed) = gateway.get("/v1/repository-credentials").await?;
    assert_eq!(listed["credentials"], json!([]), "{listed}");
    for output in [&replaced, &cli_listed, &removed, &again] {
        responses.push(String::from_utf8_lossy(&output.stdout).into_owned());
        responses.push(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    responses.push(listing);
    gateway.stop().await?;
    fleet.stop("setup", 1)?;

    // The token is nowhere.
    for (sequence, text) in stream_texts(&bus).await? {
        for secret in &secrets {
            ensure!(
                !text.contains(secret.as_str()),
                "event {sequence} holds the token"
            );
        }
    }
    for payload in secret_bucket_payloads(&bus).await? {
        for secret in &secrets {
            ensure!(
                !contains(&payload, secret),
                "the secret store holds a token in the clear"
            );
        }
    }
    for text in &responses {
        for secret in &secrets {
            ensure!(
                !text.contains(secret.as_str()),
                "a response or CLI output holds the token: {text}"
            );
        }
    }
    let mut files = fixtures::files_under(&fleet_root)?;
    files.extend(fixtures::files_under(&dir.path().join("gateway"))?);
    ensure!(
        files.iter().any(|(path, _)| path.ends_with(".git/config")),
        "setup's clone is among the files searched"
    );
    ensure!(
        files
            .iter()
            .any(|(path, _)| path.extension().is_some_and(|e| e == "log")),
        "setup's log is among the files searched"
    );
    for (path, bytes) in &files {
        for secret in &secrets {
            ensure!(
                !contains(bytes, secret),
                "{} holds the token",
                path.display()
            );
        }
    }
    Ok(())
}
