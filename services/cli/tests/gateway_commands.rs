//! The operator commands of the gateway through the `zopu` binary: the
//! link key a gateway refuses to start without, `zopu token create | list |
//! revoke` against a real nats-server, and `zopu project create
//! --request-id` as a safe retry. Cargo builds the binary under test.

use std::path::Path;
use std::process::Output;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use zopu_runtime::local_server::{LocalServer, SyncPolicy};

/// Runs `zopu` with a clean environment for the settings under test.
async fn zopu(data_dir: &Path, args: &[&str]) -> Result<Output> {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu"))
        .args(["--data-dir", &data_dir.display().to_string()])
        .args(args)
        .env_remove("ZOPU_CONFIG")
        .env_remove("ZOPU_GATEWAY_LINK_KEY")
        .env_remove("ZOPU_ORG")
        .kill_on_drop(true)
        .output()
        .await
        .context("running zopu")
}

fn json_lines(output: &Output) -> Result<Vec<Value>> {
    ensure!(
        output.status.success(),
        "zopu failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).with_context(|| format!("not JSON: {line}")))
        .collect()
}

/// `zopu project create` of acme's shop repository, not following its
/// setup, with `extra` arguments: its JSON lines.
async fn create_shop(dir: &Path, url: &str, extra: &[&str]) -> Result<Vec<Value>> {
    let args = [
        &[
            "--json",
            "--nats",
            url,
            "project",
            "create",
            "--org",
            "acme",
            "--repo",
            "https://example.com/acme/shop.git",
            "--no-wait",
        ][..],
        extra,
    ]
    .concat();
    json_lines(&zopu(dir, &args).await?)
}

/// A connection to `url` with streams/ applied (the administrator's step:
/// services only check them).
async fn bus_with_streams(url: &str) -> Result<zopu_runtime::nats::Bus> {
    let bus = zopu_runtime::nats::connect(url, "test", std::time::Duration::from_secs(10)).await?;
    zopu_runtime::streams::apply(&bus, &zopu_runtime::streams::StreamSettings::default()).await?;
    Ok(bus)
}

#[tokio::test]
async fn a_gateway_without_its_link_key_refuses_to_start_and_names_the_variable() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Nothing listens on the discard port: the check must come before connecting.
    let output = zopu(
        dir.path(),
        &["--nats", "nats://127.0.0.1:9", "run", "gateway"],
    )
    .await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("ZOPU_GATEWAY_LINK_KEY"), "{stderr}");
    assert!(!stderr.contains("no server answered"), "{stderr}");

    let short = tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu"))
        .args(["--data-dir", &dir.path().display().to_string()])
        .args(["--nats", "nats://127.0.0.1:9", "run", "gateway"])
        .env_remove("ZOPU_CONFIG")
        .env("ZOPU_GATEWAY_LINK_KEY", "too-short-a-secret")
        .kill_on_drop(true)
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&short.stderr);
    assert!(!short.status.success(), "{stderr}");
    assert!(
        stderr.contains("ZOPU_GATEWAY_LINK_KEY") && stderr.contains("too short"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("too-short-a-secret"),
        "the key must never print: {stderr}"
    );
    Ok(())
}

#[tokio::test]
async fn tokens_are_created_listed_and_revoked_in_the_shared_bucket() -> Result<()> {
    let store = tempfile::tempdir()?;
    let server = LocalServer::start(store.path(), None, SyncPolicy::ServerDefault)?;
    let url = server.url();
    let dir = tempfile::tempdir()?;
    let base = ["--json", "--nats", url.as_str(), "token"];
    let run = |args: &'static [&'static str]| {
        let all: Vec<&str> = base.iter().chain(args).copied().collect();
        let dir = dir.path().to_owned();
        async move { zopu(&dir, &all).await }
    };
    // The administrator's step: creates the tokens bucket with the rest.
    json_lines(
        &zopu(
            dir.path(),
            &["--json", "--nats", url.as_str(), "streams", "apply"],
        )
        .await?,
    )?;

    let created =
        json_lines(&run(&["create", "--org", "acme", "--user", "ada", "--ttl", "30d"]).await?)?;
    let created = created.first().context("one line")?;
    let token = created["token"].as_str().context("token")?.to_owned();
    let id = created["id"].as_str().context("id")?.to_owned();
    assert!(
        token.starts_with("zpt_") && token[4..].starts_with(&id),
        "{created}"
    );
    assert_eq!(created["status"], "active");
    let expires =
        zopu_schema::envelope::parse_time(created["expires_at"].as_str().context("expiry")?)
            .context("expiry time")?;
    let days = (expires - time::OffsetDateTime::now_utc()).whole_days();
    assert!((29..=30).contains(&days), "{created}");

    // The gateway's view: the bucket accepts the token.
    let bus = zopu_runtime::nats::connect(&url, "test", std::time::Duration::from_secs(10)).await?;
    let tokens = zopu_gateway::TokenStore::open(&bus.jetstream).await?;
    let principal = tokens
        .verify(&token)
        .await?
        .context("the token is accepted")?;
    // Without --scope a token may read and write, not use the kill switch.
    assert_eq!(created["scopes"], serde_json::json!(["read", "write"]));
    assert_eq!(principal.scopes.to_text(), "read,write");

    let reader = json_lines(
        &run(&[
            "create", "--org", "acme", "--user", "viewer", "--scope", "read",
        ])
        .await?,
    )?;
    let reader_token = reader[0]["token"].as_str().context("token")?;
    let reader = tokens.verify(reader_token).await?.context("accepted")?;
    assert_eq!(reader.scopes.to_text(), "read");
    let bad = run(&[
        "create",
        "--org",
        "acme",
        "--user",
        "ada",
        "--scope",
        "read,owner",
    ])
    .await?;
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("--scope") && stderr.contains("owner"),
        "{stderr}"
    );

    let listed = json_lines(&run(&["list"]).await?)?;
    assert_eq!(listed.len(), 2);
    let by_user = |listed: &[Value], user: &str| {
        listed
            .iter()
            .find(|line| line["user"] == user)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        by_user(&listed, "viewer")["scopes"],
        serde_json::json!(["read"])
    );
    let listed = [by_user(&listed, "ada")];
    assert_eq!(
        (&listed[0]["id"], &listed[0]["user"]),
        (&created["id"], &created["user"])
    );
    assert!(
        !listed[0].to_string().contains(&token[4 + id.len()..]),
        "list must never show a token"
    );

    let bad = run(&[
        "create", "--org", "acme", "--user", "ada", "--ttl", "forever",
    ])
    .await?;
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--ttl"));

    let prefix = id[..6].to_owned();
    let revoke = zopu(
        dir.path(),
        &["--json", "--nats", &url, "token", "revoke", &prefix],
    )
    .await?;
    let revoked = json_lines(&revoke)?;
    assert_eq!(
        (
            &revoked[0]["id"],
            &revoked[0]["status"],
            &revoked[0]["newly_revoked"]
        ),
        (&created["id"], &Value::from("revoked"), &Value::from(true))
    );
    assert!(tokens.verify(&token).await?.is_none());
    let listed = json_lines(&run(&["list"]).await?)?;
    assert_eq!(by_user(&listed, "ada")["status"], "revoked");
    assert_eq!(by_user(&listed, "viewer")["status"], "active");

    let unknown = zopu(dir.path(), &["--nats", &url, "token", "revoke", "ffffffff"]).await?;
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no token id"));
    Ok(())
}

#[tokio::test]
async fn creating_a_project_again_with_its_request_id_is_the_same_project() -> Result<()> {
    let store = tempfile::tempdir()?;
    let server = LocalServer::start(store.path(), None, SyncPolicy::ServerDefault)?;
    let url = server.url();
    let dir = tempfile::tempdir()?;
    let create = |request_id: Option<String>| {
        let (url, dir) = (url.clone(), dir.path().to_owned());
        async move {
            let extra: Vec<&str> = match &request_id {
                Some(request_id) => vec!["--request-id", request_id.as_str()],
                None => Vec::new(),
            };
            create_shop(&dir, &url, &extra).await
        }
    };
    let bus = bus_with_streams(&url).await?;

    let first = create(None).await?;
    let first = first.first().context("one line")?.clone();
    let request_id = first["request_id"]
        .as_str()
        .context("request_id")?
        .to_owned();
    assert_eq!(first["duplicate"], false);
    let again = create(Some(request_id.clone())).await?;
    let again = again.first().context("one line")?;
    assert_eq!(
        (&again["project"], &again["duplicate"]),
        (&first["project"], &Value::from(true))
    );
    let other = create(None).await?;
    assert_ne!(other[0]["project"], first["project"]);

    let project: zopu_schema::ProjectId = first["project"].as_str().context("project")?.parse()?;
    let org: zopu_schema::OrgId = "acme".parse()?;
    let events =
        zopu_runtime::log::events(&bus, zopu_schema::subjects::project_events(&org, &project))
            .await?;
    assert_eq!(events.len(), 1, "one setup request: {events:?}");
    assert_eq!(events[0].1.correlation_id.as_str(), request_id);
    Ok(())
}

#[tokio::test]
async fn projects_are_listed_with_their_name_setup_state_and_repository() -> Result<()> {
    let store = tempfile::tempdir()?;
    let server = LocalServer::start(store.path(), None, SyncPolicy::ServerDefault)?;
    let url = server.url();
    let dir = tempfile::tempdir()?;
    bus_with_streams(&url).await?;
    let nats = ["--nats", url.as_str()];
    let create = |name: Option<&'static str>| {
        let (url, dir) = (url.clone(), dir.path().to_owned());
        async move {
            let extra: Vec<&str> = name.map(|name| vec!["--name", name]).unwrap_or_default();
            let created = create_shop(&dir, &url, &extra).await?;
            created[0]["project"]
                .as_str()
                .map(str::to_owned)
                .context("project")
        }
    };
    let unnamed = create(None).await?;
    let named = create(Some("Shop front")).await?;

    let listed = json_lines(
        &zopu(
            dir.path(),
            &[
                &["--json"][..],
                &nats,
                &["project", "list", "--org", "acme"],
            ]
            .concat(),
        )
        .await?,
    )?;
    let summary: Vec<(&str, &str, &str, &str)> = listed
        .iter()
        .map(|line| {
            (
                line["project"].as_str().unwrap_or_default(),
                line["name"].as_str().unwrap_or_default(),
                line["repository_url"].as_str().unwrap_or_default(),
                line["org"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    let repository = "https://example.com/acme/shop.git";
    assert_eq!(
        summary,
        [
            (unnamed.as_str(), "shop", repository, "acme"),
            (named.as_str(), "Shop front", repository, "acme")
        ]
    );

    // Plain output: a header and one readable row per project.
    let plain = zopu(
        dir.path(),
        &[&nats[..], &["project", "list", "--org", "acme"]].concat(),
    )
    .await?;
    assert!(plain.status.success());
    let text = String::from_utf8_lossy(&plain.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with("PROJECT") && lines[0].contains("NAME"),
        "{text}"
    );
    assert!(
        lines[2].starts_with(&named) && lines[2].contains("Shop front"),
        "{text}"
    );

    // Another organization has none, and says how to create one.
    let empty = zopu(
        dir.path(),
        &[&nats[..], &["project", "list", "--org", "other"]].concat(),
    )
    .await?;
    assert!(empty.status.success());
    assert!(empty.stdout.is_empty());
    assert!(String::from_utf8_lossy(&empty.stderr).contains("zopu project create"));
    Ok(())
}
