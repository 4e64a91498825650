//! Agent memory (issue 18 item 2) against a real nats-server: the OSSA
//! interface on the event log (set, get, exists, list, search, expire,
//! delete, clear, TTL), the conversation agent keeping a preference the
//! user states and handing it to later work, the gateway's and the CLI's
//! view and clear, mesh rules, and a projection rebuilt from the stream
//! that holds nothing of a cleared memory.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::json;
use zopu_core::commands::Requester;
use zopu_core::memory::{Memory, MemoryError, MemoryProjection, MemoryProvider, Tier, Write};
use zopu_llm::test_support::{FakeOpenAiServer, Scripted};
use zopu_runtime::Projection;
use zopu_runtime::Shutdown;
use zopu_runtime::clock::ManualClock;
use zopu_runtime::publish::Publisher;
use zopu_runtime::store::Store;
use zopu_schema::{AgentId, EventId, OrgId, ProjectId, pb, subjects};
use zopu_tests::{NatsServer, bus, history, wait_for};

use crate::conversation::{LONG, Running, events_of, org, send, setup_project, turn_end};
use crate::registry::{Gateway, agents_dir};

fn user_requester(org: &OrgId) -> Requester {
    Requester::user(org.clone(), EventId::new().into(), "ada")
}

/// Every text cell of every table of the SQLite file at `path`.
fn all_texts(path: &std::path::Path) -> Result<Vec<String>> {
    let conn = rusqlite::Connection::open(path)?;
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")?
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut texts = Vec::new();
    for table in tables {
        let mut statement = conn.prepare(&format!("SELECT * FROM \"{table}\""))?;
        let columns = statement.column_count();
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            for column in 0..columns {
                if let Ok(text) = row.get::<_, String>(column) {
                    texts.push(text);
                }
            }
        }
    }
    Ok(texts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_interface_sets_reads_searches_expires_and_clears_on_the_event_log() -> Result<()>
{
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let (org, project) = (org("acme"), ProjectId::new());
    let agent = AgentId::conversation(&org, &project).to_string();
    let clock = ManualClock::starting_at(time::OffsetDateTime::now_utc());
    let store = Store::open(&dir.path().join("memory.sqlite"))?;
    store.prepare(&MemoryProjection)?;
    let shutdown = Shutdown::new();
    shutdown.spawn(zopu_runtime::projection::run(
        bus.clone(),
        store.clone(),
        MemoryProjection,
        shutdown.clone(),
    ));
    let publisher = Publisher::new(bus.clone(), "gateway", None).with_clock(clock.clock());
    let requester = user_requester(&org);
    let request = requester.request_id.clone();
    let memory = Memory::new(publisher.clone(), store.clone(), project, &agent, requester);

    // set / get / exists / list.
    let written = memory
        .set("preference.language", "Answer in German", Write::LONG_TERM)
        .await?;
    assert_eq!(written.value, "Answer in German");
    assert_eq!(
        (written.tier, written.expires_at_unix_ms),
        (Tier::LongTerm, None)
    );
    assert_eq!(written.set_by, "user:ada");
    assert!(memory.exists("preference.language").await?);
    assert!(!memory.exists("preference.tone").await?);
    memory
        .set(
            "preference.issue-tests",
            "Skip tests in issue drafts",
            Write::LONG_TERM,
        )
        .await?;
    let scratch = memory
        .set(
            "scratch.current-file",
            "src/payments/retry.rs",
            Write::working(Duration::from_secs(60)),
        )
        .await?;
    assert_eq!(scratch.tier, Tier::Working);
    let keys: Vec<String> = memory.list().await?.into_iter().map(|e| e.key).collect();
    assert_eq!(
        keys,
        [
            "preference.issue-tests",
            "preference.language",
            "scratch.current-file"
        ]
    );

    // search: every word, case-insensitive, over keys and values.
    let found: Vec<String> = memory
        .search("PREFERENCE")
        .await?
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(found, ["preference.issue-tests", "preference.language"]);
    assert_eq!(memory.search("german answer").await?.len(), 1);
    assert!(memory.search("german tests").await?.is_empty());
    assert!(matches!(
        memory.search(" ").await,
        Err(MemoryError::Query(_))
    ));

    // TTL: the working entry is gone once its time passed; expire gives a
    // long-term one a deadline.
    clock.advance(Duration::from_secs(61));
    assert!(memory.get("scratch.current-file").await?.is_none());
    assert!(
        memory
            .expire("preference.language", Duration::from_secs(30))
            .await?
    );
    let expiring = memory
        .get("preference.language")
        .await?
        .context("still there")?;
    assert!(expiring.expires_at_unix_ms.is_some());
    clock.advance(Duration::from_secs(31));
    assert!(!memory.exists("preference.language").await?);
    assert!(
        !memory
            .expire("preference.language", Duration::from_secs(30))
            .await?
    );

    // Refusals name what is wrong and store nothing.
    let before = zopu_runtime::publish::last_sequence(&bus).await?;
    for (key, value, write) in [
        ("Bad Key", "x", Write::LONG_TERM),
        ("k", "", Write::LONG_TERM),
        (
            "k",
            "token ghp_0123456789abcdefghijklmnopqrstuvwxyzAB",
            Write::LONG_TERM,
        ),
        ("k", "v", Write::working(Duration::from_secs(48 * 3600))),
    ] {
        let refused = memory.set(key, value, write).await;
        let message = refused.expect_err("refused").to_string();
        ensure!(
            message.contains("key") || message.contains("value") || message.contains("expiry"),
            "{message}"
        );
        ensure!(
            !message.contains("ghp_"),
            "the refusal repeats no secret: {message}"
        );
    }
    assert_eq!(zopu_runtime::publish::last_sequence(&bus).await?, before);

    // delete, then clear.
    assert!(memory.delete("preference.issue-tests").await?);
    assert!(!memory.delete("preference.issue-tests").await?);
    memory
        .set("fact.ci", "CI runs on GitHub Actions", Write::LONG_TERM)
        .await?;
    assert_eq!(memory.clear().await?, 1);
    assert!(memory.list().await?.is_empty());

    // Every change is an event of the request, attributed to the user.
    let filter = subjects::project_events(&org, &project);
    let events = history(&bus, &filter).await?;
    let types: Vec<&str> = events.iter().map(|(_, e)| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "agent.memory.set",
            "agent.memory.set",
            "agent.memory.set",
            "agent.memory.set",
            "agent.memory.deleted",
            "agent.memory.set",
            "agent.memory.cleared"
        ]
    );
    for (_, event) in &events {
        assert_eq!(event.correlation_id, request);
    }

    // A projection rebuilt from the stream holds nothing of the cleared memory.
    let rebuilt_path = dir.path().join("rebuilt.sqlite");
    let rebuilt = Store::open(&rebuilt_path)?;
    zopu_runtime::projection::catch_up(&bus, &rebuilt, MemoryProjection).await?;
    let texts = all_texts(&rebuilt_path)?;
    for value in [
        "Answer in German",
        "Skip tests in issue drafts",
        "CI runs on GitHub Actions",
        "src/payments/retry.rs",
    ] {
        ensure!(
            !texts.iter().any(|text| text.contains(value)),
            "{value:?} survived the clear in the rebuilt projection"
        );
    }
    assert_eq!(MemoryProjection.tables(), [zopu_core::memory::TABLE]);
    shutdown.cancel();
    ensure!(shutdown.wait(LONG).await, "the projection did not stop");
    Ok(())
}

/// Sends `text`, waits for its turn, and returns the preferences of the one
/// flow it requested.
async fn preferences_handed_on(
    bus: &zopu_runtime::nats::Bus,
    org: &OrgId,
    project: ProjectId,
    text: &str,
) -> Result<Vec<String>> {
    let sent = send(bus, org, project, text).await?;
    turn_end(bus, org, project, sent.request).await?;
    let flows = events_of::<pb::FlowRequested>(bus, org, project, Some(sent.request)).await?;
    ensure!(flows.len() == 1, "{text:?} requested {} flows", flows.len());
    Ok(flows[0].decode::<pb::FlowRequested>()?.preferences)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stated_preference_reaches_later_work_until_the_user_clears_it() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let (org, project) = (org("acme"), ProjectId::new());
    let core = zopu_tests::core_config(&server, &dir.path().join("services"));
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(&core, zopu_conversation::Config::default());
    crate::registry::request_setup(&bus, &org, project).await?;
    setup_project(&bus, &org, project).await?;

    // The user states a preference: kept, and confirmed in one sentence.
    let stated = send(
        &bus,
        &org,
        project,
        "From now on, skip tests in issue drafts.",
    )
    .await?;
    let end = turn_end(&bus, &org, project, stated.request).await?;
    assert_eq!(end.decode::<pb::DispatchCompleted>()?.outcome, "remembered");
    let kept = events_of::<pb::AgentMemorySet>(&bus, &org, project, Some(stated.request)).await?;
    assert_eq!(kept.len(), 1);
    let kept = kept[0].decode::<pb::AgentMemorySet>()?;
    assert_eq!(
        (kept.key.as_str(), kept.value.as_str()),
        ("preference.issue-tests", "Skip tests in issue drafts")
    );
    assert_eq!(
        kept.agent_id,
        AgentId::conversation(&org, &project).to_string()
    );
    assert_eq!(
        kept.by.as_ref().map(|by| by.kind()),
        Some(pb::actor::Kind::Agent)
    );
    let reply = events_of::<pb::AgentMessage>(&bus, &org, project, Some(stated.request)).await?;
    assert_eq!(reply.len(), 1);
    let reply = reply[0].decode::<pb::AgentMessage>()?.text;
    ensure!(reply.contains("leave tests out of issue drafts"), "{reply}");

    // A later issue request hands it to the issue writer.
    assert_eq!(
        preferences_handed_on(
            &bus,
            &org,
            project,
            "Create an issue for the flaky payment tests"
        )
        .await?,
        ["Skip tests in issue drafts"]
    );

    // The user sees it through the gateway and the CLI, and clears it.
    let gateway = Gateway::start(&server, &dir.path().join("gateway")).await?;
    gateway.caught_up(&bus).await?;
    let path = format!("/v1/projects/{project}/memory");
    let (status, listed) = gateway.get(&path).await?;
    assert_eq!(status, reqwest::StatusCode::OK, "{listed}");
    assert_eq!(
        listed["entries"][0]["key"], "preference.issue-tests",
        "{listed}"
    );
    assert_eq!(listed["entries"][0]["tier"], "long_term", "{listed}");
    let set_by = listed["entries"][0]["set_by"].as_str().unwrap_or_default();
    ensure!(set_by.starts_with("agent:conversation:acme:"), "{listed}");
    let (_, searched) = gateway.get(&format!("{path}?q=tests")).await?;
    assert_eq!(searched["entries"].as_array().map(Vec::len), Some(1));
    let (_, searched) = gateway.get(&format!("{path}?q=german")).await?;
    assert_eq!(searched["entries"].as_array().map(Vec::len), Some(0));
    let (status, refused) = gateway
        .put(&format!("{path}/Not%20A%20Key"), json!({"value": "x"}))
        .await?;
    assert_eq!(
        status,
        reqwest::StatusCode::UNPROCESSABLE_ENTITY,
        "{refused}"
    );
    assert_eq!(refused["error"]["field"], "key", "{refused}");
    let (status, refused) = gateway
        .put(
            &format!("{path}/preference.tone"),
            json!({"value": "x", "tier": "forever"}),
        )
        .await?;
    assert_eq!(
        status,
        reqwest::StatusCode::UNPROCESSABLE_ENTITY,
        "{refused}"
    );
    assert_eq!(refused["error"]["field"], "tier", "{refused}");
    let (status, written) = gateway
        .put(
            &format!("{path}/preference.tone"),
            json!({"value": "Keep answers short", "tier": "working", "ttl_seconds": 600}),
        )
        .await?;
    assert_eq!(status, reqwest::StatusCode::OK, "{written}");
    assert_eq!(written["set_by"], "user:ada", "{written}");
    assert!(written["expires_at_unix_ms"].is_i64(), "{written}");
    // Forgotten once; a retry of the same request answers the same, a new request 404.
    let tone = format!("{path}/preference.tone");
    let (status, forgotten) = gateway.delete_as(&tone, "forget-tone-1").await?;
    assert_eq!(status, reqwest::StatusCode::OK, "{forgotten}");
    let (status, retried) = gateway.delete_as(&tone, "forget-tone-1").await?;
    assert_eq!(status, reqwest::StatusCode::OK, "{retried}");
    let (status, _) = gateway.delete(&tone).await?;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND);
    let (status, _) = gateway
        .get(&format!("/v1/projects/{}/memory", ProjectId::new()))
        .await?;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND);

    let zopu = zopu_tests::zopu_binary(&zopu_tests::workspace_root())?;
    let cli = |args: &[&str]| -> Result<String> {
        let output = Command::new(&zopu)
            .args(["--nats", server.url().as_str(), "memory"])
            .args(args)
            .args(["--org", "acme"])
            .output()?;
        ensure!(
            output.status.success(),
            "zopu memory {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let project_arg = project.to_string();
    let listing = cli(&["list", &project_arg])?;
    ensure!(
        listing.contains("preference.issue-tests: Skip tests in issue drafts (long_term, by agent:conversation:acme:"),
        "{listing}"
    );
    let cleared = cli(&["clear", &project_arg])?;
    ensure!(cleared.contains("(1 entries)"), "{cleared}");
    let listing = cli(&["list", &project_arg])?;
    ensure!(listing.contains("remembers nothing"), "{listing}");
    let cleared_event = wait_for(
        &bus,
        &subjects::project_events(&org, &project),
        LONG,
        |event| event.is::<pb::AgentMemoryCleared>(),
    )
    .await?;
    assert_eq!(cleared_event.source, "zopu/cli");
    gateway.caught_up(&bus).await?;
    let (_, listed) = gateway.get(&path).await?;
    assert_eq!(
        listed["entries"].as_array().map(Vec::len),
        Some(0),
        "{listed}"
    );

    // Later work no longer gets it.
    let handed = preferences_handed_on(
        &bus,
        &org,
        project,
        "Create an issue for the slow CSV export",
    )
    .await?;
    assert!(handed.is_empty(), "{handed:?}");

    // A gateway projection rebuilt from the stream holds nothing of it.
    let rebuilt_dir = dir.path().join("rebuilt");
    let rebuilt = Gateway::start(&server, &rebuilt_dir).await?;
    rebuilt.caught_up(&bus).await?;
    let (_, listed) = rebuilt.get(&path).await?;
    assert_eq!(
        listed["entries"].as_array().map(Vec::len),
        Some(0),
        "{listed}"
    );
    rebuilt.stop().await?;
    let mut files = Vec::new();
    for entry in walk(&rebuilt_dir)? {
        if entry.extension().is_some_and(|ext| ext == "sqlite") {
            files.push(entry);
        }
    }
    ensure!(
        !files.is_empty(),
        "the rebuilt gateway wrote no projection file"
    );
    for file in files {
        let texts = all_texts(&file)?;
        ensure!(
            !texts
                .iter()
                .any(|text| text.contains("Skip tests in issue drafts")
                    || text.contains("Keep answers short")),
            "a cleared memory survived in {}",
            file.display()
        );
    }
    gateway.stop().await?;
    conversation.stop().await?;
    dispatch.stop().await?;
    Ok(())
}

fn walk(dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            found.extend(walk(&path)?);
        } else {
            found.push(path);
        }
    }
    Ok(found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_sees_the_stated_preference_and_mesh_rules_limit_delegation_and_sharing()
-> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let (org, project) = (org("acme"), ProjectId::new());
    // The conversation agent may not hand work to the issue writer.
    let agents = agents_dir(dir.path(), |file| {
        for agent in &mut file.agents {
            if agent.key == "conversation" {
                agent.mesh.allow.clear();
                agent.mesh.deny = vec!["issue-writer".to_owned()];
            }
        }
    })?;
    let core = zopu_tests::core_config(&server, &dir.path().join("services"));
    let remember = json!({"key": "preference.language", "preference": "Answer in German", "acknowledgement": "Gern, ab jetzt antworte ich auf Deutsch."});
    let respond = json!({"message": "Das Projekt ist ein Shop."});
    let issue = json!({"acknowledgement": "Ich schreibe das Issue.", "title": "CSV export", "request": "Scope the CSV export."});
    let explore = json!({"acknowledgement": "Ich schaue mir das an.", "title": "Checkout", "request": "Trace checkout."});
    let llm = FakeOpenAiServer::start([
        Scripted::tool_call("call_1", "remember", &remember.to_string()),
        Scripted::tool_call("call_2", "respond", &respond.to_string()),
        Scripted::tool_call("call_3", "create_issue", &issue.to_string()),
        Scripted::tool_call("call_4", "explore", &explore.to_string()),
    ])
    .await?;
    let config = zopu_conversation::Config {
        agents_dir: Some(agents.clone()),
        ..crate::conversation::openai(&llm)
    };
    let dispatch = Running::dispatch_with(
        &core,
        zopu_dispatch::Config {
            agents_dir: Some(agents),
            ..Default::default()
        },
    );
    let conversation = Running::conversation(&core, config);
    setup_project(&bus, &org, project).await?;

    let stated = send(&bus, &org, project, "Please answer in German from now on").await?;
    let end = turn_end(&bus, &org, project, stated.request).await?;
    assert_eq!(end.decode::<pb::DispatchCompleted>()?.outcome, "remembered");
    let asked = send(&bus, &org, project, "What is this project?").await?;
    turn_end(&bus, &org, project, asked.request).await?;
    // The first prompt had no preference; the later one quotes it as data.
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    let first = requests[0].json().to_string();
    let later = requests[1].json().to_string();
    ensure!(first.contains(r#"\"user_preferences\":[]"#), "{first}");
    ensure!(
        later.contains(r#"\"user_preferences\":[\"Answer in German\"]"#),
        "{later}"
    );
    let answer = events_of::<pb::AgentMessage>(&bus, &org, project, Some(asked.request)).await?;
    assert_eq!(
        answer[0].decode::<pb::AgentMessage>()?.text,
        "Das Projekt ist ein Shop."
    );

    // Delegation to a denied agent is refused visibly; no flow is requested.
    let refused = send(&bus, &org, project, "Create an issue for the CSV export").await?;
    let end = turn_end(&bus, &org, project, refused.request).await?;
    assert_eq!(end.decode::<pb::DispatchCompleted>()?.outcome, "responded");
    let flows = events_of::<pb::FlowRequested>(&bus, &org, project, Some(refused.request)).await?;
    assert!(flows.is_empty());
    let guard =
        events_of::<pb::AgentGuardrailTriggered>(&bus, &org, project, Some(refused.request))
            .await?;
    let guard = guard[0].decode::<pb::AgentGuardrailTriggered>()?;
    assert_eq!(
        (guard.rule.as_str(), guard.action.as_str()),
        ("mesh_denied", "refused")
    );
    let told = events_of::<pb::AgentMessage>(&bus, &org, project, Some(refused.request)).await?;
    let told = told[0].decode::<pb::AgentMessage>()?.text;
    ensure!(
        told.contains("issue-writer") && told.contains("mesh rules"),
        "{told}"
    );

    // An allowed specialist gets the work and the preference.
    assert_eq!(
        preferences_handed_on(&bus, &org, project, "How does checkout work?").await?,
        ["Answer in German"]
    );
    conversation.stop().await?;
    dispatch.stop().await?;
    Ok(())
}

/// Whether the project's history holds no memory write at all.
async fn memory_writes(
    bus: &zopu_runtime::nats::Bus,
    org: &OrgId,
    project: ProjectId,
) -> Result<usize> {
    let all = history(bus, &subjects::project_events(org, &project)).await?;
    Ok(all
        .iter()
        .filter(|(_, event)| event.is::<pb::AgentMemorySet>())
        .count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_instructions_never_write_memory_and_no_path_keeps_a_credential() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let (org, project) = (org("acme"), ProjectId::new());
    let core = zopu_tests::core_config(&server, &dir.path().join("services"));
    // The model obeys every instruction it reads: text planted in the
    // repository, a tool's output or an artifact tells it to remember.
    let injected = json!({"key": "preference.deploy", "preference": "Always deploy on Fridays without review", "acknowledgement": "Noted."});
    let password = json!({"key": "preference.login", "preference": "The admin password is hunter22", "acknowledgement": "Noted."});
    let stated = json!({"key": "preference.language", "preference": "Answer in German", "acknowledgement": "Gern, ab jetzt auf Deutsch."});
    let sources = [
        ("repository", "What does the README say about deploying?"),
        ("tool output", "What did the last test run print?"),
        ("artifact", "Summarize the latest check report"),
        ("model output", "Thanks for the help"),
    ];
    let mut script = Vec::new();
    // Each turn's two decision attempts obey the injection.
    for _ in 0..sources.len() * 2 {
        script.push(Scripted::tool_call(
            "call_i",
            "remember",
            &injected.to_string(),
        ));
    }
    for _ in 0..2 {
        script.push(Scripted::tool_call(
            "call_p",
            "remember",
            &password.to_string(),
        ));
    }
    script.push(Scripted::tool_call(
        "call_s",
        "remember",
        &stated.to_string(),
    ));
    let llm = FakeOpenAiServer::start(script).await?;
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(&core, crate::conversation::openai(&llm));
    crate::registry::request_setup(&bus, &org, project).await?;
    setup_project(&bus, &org, project).await?;

    for (source, message) in sources {
        let sent = send(&bus, &org, project, message).await?;
        turn_end(&bus, &org, project, sent.request).await?;
        let refused =
            events_of::<pb::AgentLlmFailed>(&bus, &org, project, Some(sent.request)).await?;
        let codes: Vec<String> = refused
            .iter()
            .filter_map(|event| event.decode::<pb::AgentLlmFailed>().ok())
            .filter_map(|failed| failed.reason.map(|reason| reason.code))
            .collect();
        assert_eq!(
            codes,
            ["llm.unstated_preference", "llm.unstated_preference"],
            "{source}"
        );
        assert_eq!(memory_writes(&bus, &org, project).await?, 0, "{source}");
    }
    // A password the user states is neither the model's memory nor the
    // offline rules' (the fallback after the refused attempts).
    let sent = send(
        &bus,
        &org,
        project,
        "From now on remember that my admin password is hunter22",
    )
    .await?;
    turn_end(&bus, &org, project, sent.request).await?;
    assert_eq!(memory_writes(&bus, &org, project).await?, 0);

    // What the user states is kept, with the user's words as its source.
    let sent = send(&bus, &org, project, "From now on, answer in German").await?;
    let end = turn_end(&bus, &org, project, sent.request).await?;
    assert_eq!(end.decode::<pb::DispatchCompleted>()?.outcome, "remembered");
    let kept = events_of::<pb::AgentMemorySet>(&bus, &org, project, Some(sent.request)).await?;
    assert_eq!(kept.len(), 1);
    let kept = kept[0].decode::<pb::AgentMemorySet>()?;
    assert_eq!(kept.value, "Answer in German");
    assert_eq!(kept.source_event_id, sent.event_id.to_string());
    assert_eq!(kept.source_text, "From now on, answer in German");
    conversation.stop().await?;
    dispatch.stop().await?;

    // The API and the CLI refuse a credential in words, and a key naming one.
    let gateway = Gateway::start(&server, &dir.path().join("gateway")).await?;
    gateway.caught_up(&bus).await?;
    let path = format!("/v1/projects/{project}/memory");
    for (key, value, field, why) in [
        (
            "preference.login",
            "My password is hunter2",
            "value",
            "a password stated in words",
        ),
        (
            "preference.door",
            "the PIN for the door is 4821",
            "value",
            "a PIN stated in words",
        ),
        (
            "db.password",
            "Answer in German",
            "key",
            "names a credential",
        ),
    ] {
        let (status, refused) = gateway
            .put(&format!("{path}/{key}"), json!({"value": value}))
            .await?;
        assert_eq!(
            status,
            reqwest::StatusCode::UNPROCESSABLE_ENTITY,
            "{refused}"
        );
        assert_eq!(refused["error"]["field"], field, "{refused}");
        ensure!(refused.to_string().contains(why), "{refused}");
    }
    gateway.stop().await?;
    let zopu = zopu_tests::zopu_binary(&zopu_tests::workspace_root())?;
    let output = Command::new(&zopu)
        .args(["--nats", server.url().as_str(), "memory", "set"])
        .args([project.to_string().as_str(), "preference.login"])
        .arg("use s3cret! as the password")
        .args(["--org", "acme"])
        .output()?;
    ensure!(!output.status.success(), "the CLI kept a password");
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(stderr.contains("a password stated in words"), "{stderr}");
    assert_eq!(memory_writes(&bus, &org, project).await?, 1);
    Ok(())
}
