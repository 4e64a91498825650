//! The Agent API's keys, config and candidates (issue 18 item 1, first part)
//! against a real nats-server and the gateway over HTTP: a scoped key
//! issued by the CLI and the store, the user-token / agent-key separation,
//! candidates paged by cursor within the key's projects and capabilities,
//! rotation with an overlap in which both keys work, revocation, and an
//! agent the registry disables.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use reqwest::StatusCode;
use zopu_gateway::agent_keys::{AgentGrant, AgentKeyStore};
use zopu_runtime::clock::ManualClock;
use zopu_schema::agent_registry::{AgentDefinition, AgentKind, Routing};
use zopu_schema::{ProjectId, pb};
use zopu_tests::{NatsServer, bus};

use crate::conversation::{org, send, setup_project};
use crate::registry::{Gateway, agents_dir, request_setup};

const DAY: Duration = Duration::from_secs(24 * 3600);

fn external(key: &str, enabled: bool) -> AgentDefinition {
    AgentDefinition {
        key: key.to_owned(),
        kind: AgentKind::External,
        version: "1.0.0".to_owned(),
        description: "A partner's triage bot that answers on the timeline.".to_owned(),
        enabled,
        tools: Vec::new(),
        model: Default::default(),
        routing: Routing::default(),
        recommends: Vec::new(),
        knowledge: Vec::new(),
        mesh: Default::default(),
        capabilities: vec!["read_candidates".to_owned(), "post_message".to_owned()],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_agent_reads_its_config_and_candidates_with_a_scoped_rotatable_key()
-> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let agents = agents_dir(dir.path(), |file| {
        file.agents.push(external("partner-bot", true));
        file.agents.push(external("sleeper", false));
        let mut triage = external("triage-bot", true);
        triage.capabilities.push("open_work".to_owned());
        file.agents.push(triage);
    })?;
    let clock = ManualClock::starting_at(time::OffsetDateTime::now_utc());
    let core = zopu_runtime::config::CoreConfig {
        clock: clock.clock(),
        ..zopu_tests::core_config(&server, &dir.path().join("gateway"))
    };
    let gateway = Gateway::start_on(core, &agents).await?;
    let acme = org("acme");
    let (project, other) = (ProjectId::new(), ProjectId::new());
    for id in [project, other] {
        request_setup(&bus, &acme, id).await?;
        setup_project(&bus, &acme, id).await?;
    }
    let first = send(&bus, &acme, project, "Why does the nightly build fail?").await?;
    send(
        &bus,
        &acme,
        project,
        "Can someone look at the flaky login test?",
    )
    .await?;
    send(
        &bus,
        &acme,
        other,
        "A message in a project the key does not cover",
    )
    .await?;
    gateway.caught_up(&bus).await?;

    // The operator issues a key through the CLI: printed once, then listed without it.
    let zopu = zopu_tests::zopu_binary(&zopu_tests::workspace_root())?;
    let cli = |args: &[&str]| -> Result<std::process::Output> {
        Ok(Command::new(&zopu)
            .args(["--nats", server.url().as_str(), "agent", "key"])
            .args(args)
            .env("ZOPU_AGENTS_DIR", &agents)
            .output()?)
    };
    let project_arg = project.to_string();
    let created = cli(&[
        "create",
        "partner-bot",
        "--org",
        "acme",
        "--project",
        &project_arg,
    ])?;
    ensure!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let key = String::from_utf8(created.stdout)?.trim().to_owned();
    ensure!(key.starts_with("zak_") && key.len() == 84, "{key}");
    let refused = cli(&[
        "create",
        "explorer",
        "--org",
        "acme",
        "--project",
        &project_arg,
    ])?;
    ensure!(!refused.status.success());
    let reason = String::from_utf8_lossy(&refused.stderr);
    ensure!(reason.contains("kind external"), "{reason}");
    let refused = cli(&[
        "create",
        "partner-bot",
        "--org",
        "acme",
        "--project",
        &project_arg,
        "--capability",
        "open_work",
    ])?;
    ensure!(!refused.status.success());
    ensure!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("registered with read_candidates, post_message")
    );
    let listed = cli(&["list"])?;
    let listing = String::from_utf8(listed.stdout)?;
    ensure!(
        listing.contains("partner-bot") && listing.contains("active"),
        "{listing}"
    );
    ensure!(!listing.contains(&key[4..]), "the list shows no key");

    // Config: what the key's agent may do.
    let (status, config) = gateway.get_as("/v1/agent/config", Some(&key)).await?;
    assert_eq!(status, StatusCode::OK, "{config}");
    assert_eq!(config["agent"], "partner-bot");
    assert_eq!(config["enabled"], true);
    assert_eq!(
        config["capabilities"],
        serde_json::json!(["read_candidates", "post_message"])
    );
    assert_eq!(config["projects"], serde_json::json!([project_arg]));
    assert!(
        config["rate_limits"]["actions_per_minute"]
            .as_u64()
            .unwrap_or(0)
            > 0
    );

    // Keys and user tokens each open only their own routes.
    let (status, body) = gateway
        .get_as("/v1/agent/config", Some(gateway.user_token()))
        .await?;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("user_token"))
    );
    let (status, body) = gateway.get_as("/v1/projects", Some(&key)).await?;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("agent_key"))
    );
    let (status, _) = gateway.get_as("/v1/agent/config", None).await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let forged = format!("zak_{}", "0".repeat(80));
    let (status, _) = gateway.get_as("/v1/agent/config", Some(&forged)).await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Candidates: the covered project's user messages, by cursor.
    let (status, page) = gateway
        .get_as("/v1/agent/candidates?limit=1", Some(&key))
        .await?;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(
        page["candidates"][0]["text"],
        "Why does the nightly build fail?"
    );
    assert_eq!(
        page["candidates"][0]["event_id"],
        first.event_id.to_string()
    );
    assert_eq!(page["more"], true);
    let after = page["next_after"].as_u64().context("next_after")?;
    let (_, page) = gateway
        .get_as(&format!("/v1/agent/candidates?after={after}"), Some(&key))
        .await?;
    let texts: Vec<&str> = page["candidates"]
        .as_array()
        .context("candidates")?
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect();
    assert_eq!(texts, ["Can someone look at the flaky login test?"]);
    assert_eq!(page["more"], false);
    let (status, body) = gateway
        .get_as(&format!("/v1/agent/candidates?project={other}"), Some(&key))
        .await?;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("project_outside_scope"))
    );
    let (status, body) = gateway
        .get_as("/v1/agent/candidates?limit=0", Some(&key))
        .await?;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("limit"))
    );

    // A reply: an agent.message of the external agent, caused by the candidate.
    let reply = |candidate: &str, text: &str| serde_json::json!({"type": "reply", "project": project_arg, "candidate": candidate, "text": text});
    let first_id = first.event_id.to_string();
    let answer = "The nightly build fails because the cache key changed; see ci.yml.";
    let (status, accepted, _) = gateway
        .post_as(
            "/v1/agent/actions",
            &key,
            "reply-1",
            reply(&first_id, answer),
        )
        .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let stored =
        zopu_runtime::publish::get_event(&bus, accepted["sequence"].as_u64().context("sequence")?)
            .await?;
    let message = stored.decode::<pb::AgentMessage>()?;
    assert_eq!(message.agent_id, "external:partner-bot");
    assert_eq!(message.reply_to_event_id, first_id);
    assert_eq!(stored.causation_id, first.event_id);
    let (status, again, _) = gateway
        .post_as(
            "/v1/agent/actions",
            &key,
            "reply-1",
            reply(&first_id, answer),
        )
        .await?;
    assert_eq!(
        (status, again["duplicate"].as_bool()),
        (StatusCode::ACCEPTED, Some(true))
    );
    gateway.caught_up(&bus).await?;

    // An answered message is no longer a candidate.
    let (_, page_after_reply) = gateway.get_as("/v1/agent/candidates", Some(&key)).await?;
    let left: Vec<&str> = page_after_reply["candidates"]
        .as_array()
        .context("candidates")?
        .iter()
        .filter_map(|c| c["event_id"].as_str())
        .collect();
    ensure!(
        !left.contains(&first_id.as_str()) && left.len() == 1,
        "{page_after_reply}"
    );

    // Typed refusals: a near-duplicate, another project, an unknown candidate,
    // a credential, an action it has no capability for.
    let second_id = page["candidates"][0]["event_id"]
        .as_str()
        .context("second")?
        .to_owned();
    let refusals = [
        (
            reply(&second_id, answer),
            StatusCode::CONFLICT,
            "near_duplicate",
        ),
        (
            serde_json::json!({"type": "reply", "project": other.to_string(), "candidate": second_id, "text": "Hi"}),
            StatusCode::FORBIDDEN,
            "project_outside_scope",
        ),
    ];
    for (n, (body, status, code)) in refusals.into_iter().enumerate() {
        let (got, refused, _) = gateway
            .post_as("/v1/agent/actions", &key, &format!("refused-{n}"), body)
            .await?;
        assert_eq!(
            (got, refused["error"]["code"].as_str()),
            (status, Some(code)),
            "{refused}"
        );
        // Says what was repeated and what to do, never "100% like".
        if code == "near_duplicate" {
            let message = refused["error"]["message"].as_str().unwrap_or_default();
            ensure!(
                message.contains("word for word")
                    && message.contains(answer)
                    && message.contains("Reply with what the user has not been told yet")
                    && !message.contains('%'),
                "{refused}"
            );
        }
    }
    // An accepted action ends the streak of rejections.
    let (status, _, _) = gateway
        .post_as(
            "/v1/agent/actions",
            &key,
            "reply-2",
            reply(
                &second_id,
                "The login test waits on a fixed sleep; it needs a retry.",
            ),
        )
        .await?;
    assert_eq!(status, StatusCode::ACCEPTED);
    let unknown = zopu_schema::EventId::new().to_string();
    let (status, _, _) = gateway
        .post_as(
            "/v1/agent/actions",
            &key,
            "refused-3",
            reply(&unknown, "Something new"),
        )
        .await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let leaked = ["my token is ghp_0123456789", "abcdefghijklmnopqrstuvwxyzAB"].concat();
    let (status, refused, _) = gateway
        .post_as(
            "/v1/agent/actions",
            &key,
            "refused-4",
            reply(&second_id, &leaked),
        )
        .await?;
    assert_eq!(
        (status, refused["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("text"))
    );
    ensure!(!refused.to_string().contains("ghp_"), "{refused}");
    let (status, _, _) = gateway
        .post_as(
            "/v1/agent/actions",
            &key,
            "refused-5",
            serde_json::json!({"type": "deploy", "project": project_arg, "candidate": second_id, "text": "x"}),
        )
        .await?;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "an action the API does not perform"
    );
    // Three rejections in a row: backed off, with Retry-After, even for a good action.
    let (status, refused, retry_after) = gateway
        .post_as(
            "/v1/agent/actions",
            &key,
            "refused-6",
            reply(&second_id, "A fresh thought"),
        )
        .await?;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("backed_off")),
        "{refused}"
    );
    let wait: u64 = retry_after.context("Retry-After")?.parse()?;
    ensure!(
        (1..=30).contains(&wait),
        "the first back-off is 30 s, not {wait}"
    );
    // The run of rejections is the bucket's: another gateway instance backs
    // the key off as well.
    let other_instance = Gateway::start_on(
        zopu_runtime::config::CoreConfig {
            clock: clock.clock(),
            ..zopu_tests::core_config(&server, &dir.path().join("gateway-2"))
        },
        &agents,
    )
    .await?;
    let (status, refused, retry_after) = other_instance
        .post_as(
            "/v1/agent/actions",
            &key,
            "refused-7",
            reply(&second_id, "Another fresh thought"),
        )
        .await?;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("backed_off")),
        "{refused}"
    );
    ensure!(retry_after.is_some(), "Retry-After on the other instance");
    other_instance.stop().await?;

    // open_work: a Work of the agent, started from the candidate; retried, the same Work.
    let keys_for_work = AgentKeyStore::open(&bus.jetstream).await?;
    let triage = key_for(&keys_for_work, "triage-bot", project, &["open_work"]).await?;
    let open = serde_json::json!({"type": "open_work", "project": project_arg, "candidate": second_id,
        "title": "Flaky login test", "summary": "Waits on a fixed sleep."});
    let (status, opened, _) = gateway
        .post_as("/v1/agent/actions", triage.expose(), "work-1", open.clone())
        .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{opened}");
    let work_id = opened["work_id"].as_str().context("work_id")?.to_owned();
    let stored =
        zopu_runtime::publish::get_event(&bus, opened["sequence"].as_u64().context("sequence")?)
            .await?;
    let created = stored.decode::<pb::WorkCreated>()?;
    assert_eq!(
        (
            created.agent_id.as_str(),
            created.kind.as_str(),
            created.title.as_str()
        ),
        ("external:triage-bot", "external", "Flaky login test")
    );
    assert_eq!(stored.work_id.map(|w| w.to_string()), Some(work_id.clone()));
    gateway.caught_up(&bus).await?;
    let (status, again, _) = gateway
        .post_as("/v1/agent/actions", triage.expose(), "work-1", open.clone())
        .await?;
    assert_eq!(
        (status, again["work_id"].as_str()),
        (StatusCode::ACCEPTED, Some(work_id.as_str()))
    );
    let (status, work) = gateway
        .get(&format!("/v1/projects/{project}/works/{work_id}"))
        .await?;
    assert_eq!(
        (status, work["title"].as_str()),
        (StatusCode::OK, Some("Flaky login test")),
        "{work}"
    );
    let (status, body, _) = gateway
        .post_as("/v1/agent/actions", triage.expose(), "work-2",
            serde_json::json!({"type": "open_work", "project": project_arg, "candidate": second_id}))
        .await?;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("title"))
    );
    let (status, body, _) = gateway
        .post_as("/v1/agent/actions", triage.expose(), "work-3",
            serde_json::json!({"type": "reply", "project": project_arg, "candidate": second_id, "text": "Hi there"}))
        .await?;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("capability_missing"))
    );

    // A key narrower than the definition: no candidates for it.
    let keys = AgentKeyStore::open(&bus.jetstream)
        .await?
        .with_clock(clock.clock());
    let poster = key_for(&keys, "partner-bot", project, &["post_message"]).await?;
    let (status, body) = gateway
        .get_as("/v1/agent/candidates", Some(poster.expose()))
        .await?;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("capability_missing"))
    );

    // Rotation: both keys work during the overlap, only the new one after it.
    let id = created_id(&keys, &key).await?;
    let (rotated, old) = keys.rotate(&id, Duration::from_secs(60)).await?;
    assert_eq!(old.rotated_to.as_deref(), Some(rotated.info.id.as_str()));
    for credential in [key.as_str(), rotated.expose()] {
        let (status, _) = gateway
            .get_as("/v1/agent/candidates", Some(credential))
            .await?;
        assert_eq!(status, StatusCode::OK);
    }
    clock.advance(Duration::from_secs(61));
    let (status, _) = gateway.get_as("/v1/agent/candidates", Some(&key)).await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = gateway
        .get_as("/v1/agent/candidates", Some(rotated.expose()))
        .await?;
    assert_eq!(status, StatusCode::OK);

    // Revoked: refused at once.
    let revoked = cli(&["revoke", &rotated.info.id])?;
    ensure!(
        revoked.status.success(),
        "{}",
        String::from_utf8_lossy(&revoked.stderr)
    );
    let (status, _) = gateway
        .get_as("/v1/agent/config", Some(rotated.expose()))
        .await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // An agent the registry disables sees so in its config and may not read.
    let sleeper = key_for(&keys, "sleeper", project, &["read_candidates"]).await?;
    let (status, config) = gateway
        .get_as("/v1/agent/config", Some(sleeper.expose()))
        .await?;
    assert_eq!(
        (status, config["enabled"].as_bool()),
        (StatusCode::OK, Some(false))
    );
    let (status, body) = gateway
        .get_as("/v1/agent/candidates", Some(sleeper.expose()))
        .await?;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("agent_disabled"))
    );

    let (status, body, _) = gateway
        .post_as(
            "/v1/agent/actions",
            sleeper.expose(),
            "sleeper-1",
            reply(&second_id, "Hello"),
        )
        .await?;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("agent_disabled"))
    );

    // The project's kill switch stops external agents too.
    let (status, _) = gateway
        .post(
            &format!("/v1/projects/{project}/agent/disable"),
            serde_json::json!({"reason": "maintenance"}),
        )
        .await?;
    assert!(status.is_success(), "{status}");
    gateway.caught_up(&bus).await?;
    let (status, body, _) = gateway
        .post_as(
            "/v1/agent/actions",
            poster.expose(),
            "paused-1",
            reply(&second_id, "Anything at all"),
        )
        .await?;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("agent_paused")),
        "{body}"
    );

    // User tokens are listed as before (one per gateway this test started),
    // without the agent keys and their back-offs in the same bucket.
    let tokens = zopu_gateway::tokens::TokenStore::open(&bus.jetstream).await?;
    assert_eq!(tokens.list().await?.len(), 2);
    gateway.stop().await
}

/// A key of `agent` for `project` with `capabilities`, valid a day.
async fn key_for(
    keys: &AgentKeyStore,
    agent: &str,
    project: ProjectId,
    capabilities: &[&str],
) -> Result<zopu_gateway::agent_keys::IssuedAgentKey> {
    let grant = AgentGrant {
        agent: agent.into(),
        projects: vec![project],
        capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
    };
    Ok(keys.issue(&org("acme"), grant, DAY).await?)
}

/// The id of the stored key `key` (its first 16 hex digits after the prefix).
async fn created_id(keys: &AgentKeyStore, key: &str) -> Result<String> {
    let id = key.get(4..20).context("a key id")?.to_owned();
    keys.info(&id).await?.context("the created key is stored")?;
    Ok(id)
}

/// Runs `zopu agent <args>` with the runtime's key in its environment.
fn runtime_cli(args: &[&str], key: &str) -> Result<std::process::Output> {
    let zopu = zopu_tests::zopu_binary(&zopu_tests::workspace_root())?;
    Ok(Command::new(zopu)
        .arg("agent")
        .args(args)
        .env("ZOPU_AGENT_KEY", key)
        .output()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_runtime_dry_runs_smokes_and_posts_once_per_candidate() -> Result<()> {
    use zopu_llm::test_support::{FakeOpenAiServer, Scripted};
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let agents = agents_dir(dir.path(), |file| {
        file.agents.push(external("partner-bot", true))
    })?;
    let core = zopu_tests::core_config(&server, &dir.path().join("gateway"));
    let gateway = Gateway::start_on(core, &agents).await?;
    let acme = org("acme");
    let project = ProjectId::new();
    request_setup(&bus, &acme, project).await?;
    setup_project(&bus, &acme, project).await?;
    let asked = send(&bus, &acme, project, "Where are the API routes defined?").await?;
    gateway.caught_up(&bus).await?;
    let keys = AgentKeyStore::open(&bus.jetstream).await?;
    let key = key_for(
        &keys,
        "partner-bot",
        project,
        &["read_candidates", "post_message"],
    )
    .await?;
    let model = FakeOpenAiServer::start([
        Scripted::text("They are in src/routes.rs, one module per resource."),
        Scripted::text("Smoke draft: src/routes.rs holds them."),
        Scripted::text("The routes live in src/routes.rs."),
    ])
    .await?;
    let config = |dry_run: bool, key_env: &str| {
        format!(
            "gateway_url = \"{}\"\nkey_env = \"{key_env}\"\ninterval = \"1s\"\nmax_work_per_run = 5\ndry_run = {dry_run}\n[model]\nbase_url = \"{}\"\nmodel = \"fake-model\"\n",
            gateway.base(),
            model.base_url()
        )
    };
    let dry = dir.path().join("dry.toml");
    std::fs::write(&dry, config(true, "ZOPU_AGENT_KEY"))?;
    let live = dir.path().join("live.toml");
    std::fs::write(&live, config(false, "ZOPU_AGENT_KEY"))?;
    let broken = dir.path().join("broken.toml");
    std::fs::write(
        &broken,
        config(true, "ZOPU_AGENT_KEY").replace("interval = \"1s\"", "interval = \"2d\""),
    )?;
    let text = |output: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    };
    let replies = || async {
        let sequences = zopu_tests::history(
            &bus,
            &zopu_schema::subjects::event(&acme, &project, "agent.message"),
        )
        .await?;
        anyhow::Ok(sequences.len())
    };

    // The configuration is validated before anything runs.
    let refused = runtime_cli(
        &["run-external", broken.to_str().context("path")?, "--once"],
        key.expose(),
    )?;
    ensure!(
        !refused.status.success() && text(&refused).contains("interval = \"2d\""),
        "{}",
        text(&refused)
    );
    let refused = runtime_cli(&["smoke", dry.to_str().context("path")?], "not-a-key")?;
    ensure!(
        !refused.status.success() && text(&refused).contains("does not hold an agent key"),
        "{}",
        text(&refused)
    );

    // Dry-run (the default): prints what it would post, posts nothing.
    let ran = runtime_cli(
        &["run-external", dry.to_str().context("path")?, "--once"],
        key.expose(),
    )?;
    ensure!(ran.status.success(), "{}", text(&ran));
    let printed = String::from_utf8_lossy(&ran.stdout).into_owned();
    ensure!(
        printed.contains(&format!(
            "would reply to \"{}\": They are in src/routes.rs",
            asked.event_id
        )),
        "{printed}"
    );
    assert_eq!(replies().await?, 0, "a dry run posts nothing");

    // Smoke: auth, one candidate, one draft, nothing written.
    let smoked = runtime_cli(&["smoke", dry.to_str().context("path")?], key.expose())?;
    ensure!(smoked.status.success(), "{}", text(&smoked));
    ensure!(
        text(&smoked).contains("Smoke draft: src/routes.rs holds them. (not posted)"),
        "{}",
        text(&smoked)
    );
    assert_eq!(replies().await?, 0, "smoke posts nothing");

    // Posting: one reply per candidate, and a restarted runtime posts none again.
    let posted = runtime_cli(
        &["run-external", live.to_str().context("path")?, "--once"],
        key.expose(),
    )?;
    ensure!(posted.status.success(), "{}", text(&posted));
    ensure!(
        String::from_utf8_lossy(&posted.stdout).contains("replied to"),
        "{}",
        text(&posted)
    );
    assert_eq!(replies().await?, 1);
    model.push(Scripted::text("The routes live in src/routes.rs."));
    let again = runtime_cli(
        &["run-external", live.to_str().context("path")?, "--once"],
        key.expose(),
    )?;
    ensure!(again.status.success(), "{}", text(&again));
    assert_eq!(
        replies().await?,
        1,
        "the restarted runtime's retry stored nothing new"
    );
    let stored = zopu_tests::history(
        &bus,
        &zopu_schema::subjects::event(&acme, &project, "agent.message"),
    )
    .await?;
    let message = stored[0].1.decode::<pb::AgentMessage>()?;
    assert_eq!(
        (message.agent_id.as_str(), message.text.as_str()),
        ("external:partner-bot", "The routes live in src/routes.rs.")
    );

    // A revoked key stops the runtime with the reason.
    keys.revoke(&key.info.id).await?;
    let stopped = runtime_cli(
        &["run-external", live.to_str().context("path")?, "--once"],
        key.expose(),
    )?;
    ensure!(
        !stopped.status.success() && text(&stopped).contains("401"),
        "{}",
        text(&stopped)
    );
    gateway.stop().await
}

/// `POST /v1/agent/actions` with `key` under request id `request_id`.
async fn act(
    gateway: &Gateway,
    key: &str,
    request_id: &str,
    body: serde_json::Value,
) -> Result<(StatusCode, serde_json::Value)> {
    let (status, answer, _) = gateway
        .post_as("/v1/agent/actions", key, request_id, body)
        .await?;
    Ok((status, answer))
}

/// Polls `GET path` with `key` until `done` holds of the answer.
async fn poll_until(
    gateway: &Gateway,
    path: &str,
    key: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value> {
    zopu_tests::eventually(what, Duration::from_secs(120), || async {
        let (status, body) = gateway.get_as(path, Some(key)).await?;
        Ok((status == StatusCode::OK && done(&body)).then_some(body))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_agent_requests_a_flow_answers_its_ending_and_proposes_an_artifact()
-> Result<()> {
    use zopu_schema::Event;
    use zopu_schema::agent_registry::{Mesh, RoutedFlow};
    use zopu_tests::fleet::{Fleet, FleetConfig};
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let agents = agents_dir(dir.path(), |file| {
        let mut scout = external("scout", true);
        scout.capabilities = [
            "read_timeline",
            "read_candidates",
            "post_message",
            "request_flow",
            "propose_artifact",
        ]
        .map(str::to_owned)
        .to_vec();
        scout.routing = Routing {
            flows: vec![RoutedFlow::Explore],
        };
        scout.mesh = Mesh {
            allow: vec!["explorer".to_owned()],
            deny: Vec::new(),
        };
        file.agents.push(scout);
        let mut fenced = external("fenced", true);
        fenced.capabilities = vec!["read_candidates".to_owned(), "request_flow".to_owned()];
        fenced.routing = Routing {
            flows: vec![RoutedFlow::Explore, RoutedFlow::Issue],
        };
        fenced.mesh = Mesh {
            allow: Vec::new(),
            deny: vec!["issue-writer".to_owned()],
        };
        file.agents.push(fenced);
    })?;
    // The product runs as processes, all reading the same registry.
    let zopu = zopu_tests::zopu_binary(&zopu_tests::workspace_root())?;
    let mut fleet = Fleet::new(
        &zopu,
        &dir.path().join("fleet"),
        FleetConfig::single_node(
            server.url(),
            [(
                "ZOPU_AGENTS_DIR".to_owned(),
                agents.to_string_lossy().into_owned(),
            )]
            .into_iter()
            .collect(),
        ),
    )?;
    for service in [
        "setup",
        "dispatch",
        "conversation",
        "specialists",
        "artifacts",
    ] {
        fleet.start(service, 1)?;
    }
    let core = zopu_tests::core_config(&server, &dir.path().join("gateway"));
    let gateway = Gateway::start_on(core, &agents).await?;
    let repo = zopu_tests::fixtures::demo_repository(dir.path())?;
    let created = fleet
        .command()
        .args(["--json", "project", "create", "--org", "acme", "--repo"])
        .arg(&repo)
        .output()?;
    ensure!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let first: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&created.stdout)
            .lines()
            .next()
            .unwrap_or("{}"),
    )?;
    let project: ProjectId = first["project"]
        .as_str()
        .context("no project id")?
        .parse()?;
    let acme = org("acme");
    zopu_tests::wait_for(
        &bus,
        &zopu_schema::subjects::event(&acme, &project, pb::ProjectReady::TYPE),
        Duration::from_secs(120),
        |_| true,
    )
    .await?;
    let question = send(&bus, &acme, project, "How does main print the greeting?").await?;
    let keys = AgentKeyStore::open(&bus.jetstream).await?;
    let scout = key_for(
        &keys,
        "scout",
        project,
        &[
            "read_timeline",
            "read_candidates",
            "post_message",
            "request_flow",
            "propose_artifact",
        ],
    )
    .await?
    .expose()
    .to_owned();
    let project_arg = project.to_string();
    let candidates = format!("/v1/agent/candidates?project={project_arg}");
    let page = poll_until(&gateway, &candidates, &scout, "the question", |page| {
        page["candidates"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["event_id"] == question.event_id.to_string())
        })
    })
    .await?;
    let asked = page["candidates"]
        .as_array()
        .and_then(|c| {
            c.iter()
                .find(|c| c["event_id"] == question.event_id.to_string())
        })
        .context("the question")?;
    assert_eq!(asked["kind"], "message");

    // Refusals first: a flow outside its routing, and a malformed request.
    let request = |flow: &str, text: &str| {
        serde_json::json!({"type": "request_flow", "project": project_arg,
            "candidate": question.event_id.to_string(), "flow": flow, "text": text})
    };
    let (status, refused) = act(
        &gateway,
        &scout,
        "flow-0",
        request("issue", "Draft an issue about the greeting."),
    )
    .await?;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("flow_outside_routing")),
        "{refused}"
    );
    let (status, refused) = act(&gateway, &scout, "flow-1", request("explore", "")).await?;
    assert_eq!(
        (status, refused["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("text")),
        "{refused}"
    );
    // A flow its mesh rules do not let it hand over.
    let fenced = key_for(
        &keys,
        "fenced",
        project,
        &["read_candidates", "request_flow"],
    )
    .await?
    .expose()
    .to_owned();
    let (status, refused) = act(
        &gateway,
        &fenced,
        "fenced-1",
        request("issue", "Draft an issue about the greeting."),
    )
    .await?;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("mesh_denied")),
        "{refused}"
    );

    // The request: the events the conversation agent writes, attributed to the agent.
    let (status, accepted) = act(
        &gateway,
        &scout,
        "flow-2",
        request("explore", "Trace how main prints the greeting."),
    )
    .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let flow_run = accepted["flow_run_id"]
        .as_str()
        .context("a flow run id")?
        .to_owned();
    ensure!(accepted["work_id"].is_string() && accepted["thread_id"].is_string());
    // Another request for the same flow of the same candidate is that run.
    let (status, again) = act(
        &gateway,
        &scout,
        "flow-3",
        request("explore", "Trace it again, please."),
    )
    .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert_eq!(
        (again["duplicate"].as_bool(), again["flow_run_id"].as_str()),
        (Some(true), Some(flow_run.as_str()))
    );

    // The flow runs as its own run (the conversation agent may explore the
    // same message too) and ends; its ending awaits the agent.
    let ended = poll_until(&gateway, &candidates, &scout, "the flow's ending", |page| {
        page["candidates"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["flow_run_id"] == flow_run.as_str()))
    })
    .await?;
    let ending = ended["candidates"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["flow_run_id"] == flow_run.as_str()))
        .context("the ending")?
        .clone();
    assert_eq!(
        (ending["kind"].as_str(), ending["flow_state"].as_str()),
        (Some("flow_ended"), Some("completed")),
        "{ending}"
    );
    let all = |event_type: &'static str| {
        let bus = bus.clone();
        let acme = acme.clone();
        async move {
            zopu_tests::history(
                &bus,
                &zopu_schema::subjects::event(&acme, &project, event_type),
            )
            .await
        }
    };
    let requests = all(pb::FlowRequested::TYPE).await?;
    let ours: Vec<_> = requests
        .iter()
        .filter(|(_, event)| event.flow_run_id.map(|f| f.to_string()) == Some(flow_run.clone()))
        .collect();
    assert_eq!(ours.len(), 1, "one request stored");
    let (_, stored) = ours[0];
    let requested = stored.decode::<pb::FlowRequested>()?;
    assert_eq!(
        (requested.agent_id.as_str(), stored.causation_id),
        ("external:scout", question.event_id)
    );
    let started = all(pb::FlowStarted::TYPE).await?;
    ensure!(
        started
            .iter()
            .filter(|(_, event)| event.flow_run_id == stored.flow_run_id)
            .count()
            == 1,
        "the agent's flow started once"
    );
    let handoffs = all(pb::AgentHandoffCreated::TYPE).await?;
    ensure!(
        handoffs.iter().any(|(_, event)| {
            event.flow_run_id == stored.flow_run_id
                && event.decode::<pb::AgentHandoffCreated>().is_ok_and(|h| {
                    h.source_agent_key == "scout" && h.target_agent_key == "explorer"
                })
        }),
        "the handoff names the agent and the explorer"
    );
    // The conversation agent does not report the agent's flow.
    let finals = all(pb::AgentFinal::TYPE).await?;
    ensure!(
        finals
            .iter()
            .all(|(_, event)| event.flow_run_id != stored.flow_run_id),
        "the conversation agent posted a final for the external agent's flow"
    );

    // A comment on the ending answers nothing: it still awaits the agent.
    let (status, commented) = act(
        &gateway,
        &scout,
        "comment-ending",
        serde_json::json!({"type": "comment", "project": project_arg,
                "candidate": ending["event_id"], "text": "Reading the explorer's findings now."}),
    )
    .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{commented}");
    gateway.caught_up(&bus).await?;
    let (_, page) = gateway.get_as(&candidates, Some(&scout)).await?;
    ensure!(
        page["candidates"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["event_id"] == ending["event_id"])),
        "a comment leaves the candidate awaiting: {page}"
    );
    let messages = all(pb::AgentMessage::TYPE).await?;
    let comment = messages
        .iter()
        .find(|(_, event)| event.id.to_string() == commented["event_id"].as_str().unwrap_or(""))
        .context("the comment is stored")?;
    let stored_comment = comment.1.decode::<pb::AgentMessage>()?;
    assert_eq!(
        (
            stored_comment.status.as_str(),
            stored_comment.reply_to_event_id.as_str(),
            comment.1.flow_run_id
        ),
        ("comment", "", stored.flow_run_id)
    );

    // It answers the ending, which then no longer awaits it.
    let (status, replied) = act(&gateway, &scout, "reply-ending", serde_json::json!({"type": "reply", "project": project_arg,
                "candidate": ending["event_id"], "text": "The explorer traced it: main calls println!."})).await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{replied}");
    gateway.caught_up(&bus).await?;
    let (_, page) = gateway.get_as(&candidates, Some(&scout)).await?;
    ensure!(
        page["candidates"]
            .as_array()
            .is_some_and(|c| c.iter().all(|c| c["event_id"] != ending["event_id"])),
        "{page}"
    );

    // A proposed artifact: refused when invalid, built and carded when valid.
    let propose = |artifact: serde_json::Value| {
        serde_json::json!({"type": "propose_artifact", "project": project_arg,
            "candidate": question.event_id.to_string(), "artifact": artifact})
    };
    let (status, refused) = act(
        &gateway,
        &scout,
        "artifact-0",
        propose(
            serde_json::json!({"kind": "issue", "title": "Greeting", "summary": "s",
                "sections": [{"kind": "prose", "body": "No current and desired world."}]}),
        ),
    )
    .await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    ensure!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("current_desired")),
        "{refused}"
    );
    let leaked = ["token ghp_0123456789", "abcdefghijklmnopqrstuvwxyzAB"].concat();
    let (status, refused) = act(
        &gateway,
        &scout,
        "artifact-1",
        propose(
            serde_json::json!({"kind": "exploration", "title": "Greeting",
                "summary": "How main prints it", "sections": [{"kind": "prose", "body": leaked}]}),
        ),
    )
    .await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    ensure!(!refused.to_string().contains("ghp_"), "{refused}");
    let (status, proposed) = act(
        &gateway,
        &scout,
        "artifact-2",
        propose(
            serde_json::json!({"kind": "exploration", "title": "How the greeting is printed",
            "summary": "main prints the greeting with println!.",
            "sections": [
                {"kind": "prose", "title": "Answer", "body": "src/main.rs calls println! once."},
                {"kind": "files", "title": "Files", "items": ["src/main.rs"]}
            ]}),
        ),
    )
    .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{proposed}");
    let artifact = proposed["artifact_id"]
        .as_str()
        .context("an artifact id")?
        .to_owned();
    let timeline = format!("/v1/agent/timeline?project={project_arg}");
    let shown = poll_until(
        &gateway,
        &timeline,
        &scout,
        "the proposed artifact's card",
        |page| {
            page["items"].as_array().is_some_and(|items| {
                items.iter().any(|item| {
                    item["kind"] == "artifact" && item.to_string().contains(artifact.as_str())
                })
            })
        },
    )
    .await?;
    ensure!(shown.to_string().contains("Proposed by scout"), "{shown}");
    let published = all(pb::ArtifactPublished::TYPE).await?;
    let card = published
        .iter()
        .filter_map(|(_, event)| event.decode::<pb::ArtifactPublished>().ok())
        .find(|p| p.artifact_id == artifact)
        .context("the artifact is published")?;
    assert_eq!(card.provider, "external:scout");
    // A retried proposal is the same artifact.
    let (status, again) = act(&gateway, &scout, "artifact-2", propose(serde_json::json!({"kind": "exploration", "title": "How the greeting is printed",
                "summary": "main prints the greeting with println!.",
                "sections": [{"kind": "prose", "title": "Answer", "body": "src/main.rs calls println! once."}]}))).await?;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(
        (again["duplicate"].as_bool(), again["artifact_id"].as_str()),
        (Some(true), Some(artifact.as_str()))
    );
    // The timeline needs its capability.
    let (status, refused) = gateway.get_as(&timeline, Some(&fenced)).await?;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("capability_missing"))
    );
    gateway.stop().await
}
