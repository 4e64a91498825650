//! The agent registry (issue 17 items 1–4) against a real nats-server:
//! an agent the registry does not let run never runs and the user is told;
//! every run records the definition it ran under; a changed knowledge file
//! is recorded once and recompiled once, the unchanged ones never; the run
//! log, its notes and handoffs through the gateway, never on the timeline.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use reqwest::StatusCode;
use serde_json::Value;
use zopu_runtime::Shutdown;
use zopu_runtime::config::CoreConfig;
use zopu_schema::agent_registry::RegistryFile;
use zopu_schema::{Envelope, OrgId, ProjectId, pb, subjects};
use zopu_tests::{NatsServer, bus, wait_for};

use crate::conversation::{LONG, Running, events_of, org, send, setup_project, turn_end};

/// A copy of the built-in agents directory under `root`, its registry
/// changed by `edit`.
pub(crate) fn agents_dir(root: &Path, edit: impl FnOnce(&mut RegistryFile)) -> Result<PathBuf> {
    let source = zopu_tests::workspace_root().join("deploy/agents");
    let dir = root.join("agents");
    std::fs::create_dir_all(dir.join("knowledge"))?;
    for entry in std::fs::read_dir(source.join("knowledge"))? {
        let entry = entry?;
        std::fs::copy(entry.path(), dir.join("knowledge").join(entry.file_name()))?;
    }
    let mut file: RegistryFile =
        toml::from_str(&std::fs::read_to_string(source.join("registry.toml"))?)?;
    edit(&mut file);
    std::fs::write(dir.join("registry.toml"), toml::to_string(&file)?)?;
    Ok(dir)
}

fn failure_code(event: &Envelope) -> Option<String> {
    if let Ok(failed) = event.decode::<pb::FlowFailed>() {
        return failed.reason.map(|reason| reason.code);
    }
    if let Ok(failed) = event.decode::<pb::DispatchFailed>() {
        return failed.reason.map(|reason| reason.code);
    }
    event
        .decode::<pb::AgentFinal>()
        .ok()
        .and_then(|last| last.failure)
        .map(|reason| reason.code)
}

async fn all_of<E: zopu_schema::Event>(
    bus: &zopu_runtime::nats::Bus,
    org: &OrgId,
    project: ProjectId,
) -> Result<Vec<E>> {
    events_of::<E>(bus, org, project, None)
        .await?
        .iter()
        .map(|event| Ok(event.decode::<E>()?))
        .collect()
}

/// The prompt packages cached for `agent` in the data directory, with their modification times.
fn cached(data_dir: &Path, agent: &str) -> Result<Vec<(PathBuf, std::time::SystemTime)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(data_dir.join("knowledge"))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("{agent}-")) && name.ends_with(".md") {
            files.push((entry.path(), entry.metadata()?.modified()?));
        }
    }
    Ok(files)
}

struct Services(Vec<Running>);

impl Services {
    /// Dispatch, conversation and specialists on the registry of `agents`.
    fn start(core: &CoreConfig, agents: &Path) -> Self {
        let agents_dir = Some(agents.to_path_buf());
        Self(vec![
            Running::dispatch_with(
                core,
                zopu_dispatch::Config {
                    agents_dir: agents_dir.clone(),
                    ..Default::default()
                },
            ),
            Running::conversation(
                core,
                zopu_conversation::Config {
                    agents_dir: agents_dir.clone(),
                    ..Default::default()
                },
            ),
            Running::specialists_with(
                core,
                zopu_specialists::Config {
                    agents_dir,
                    ..Default::default()
                },
            ),
        ])
    }

    async fn stop(self) -> Result<()> {
        for service in self.0 {
            service.stop().await?;
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_registered_agents_run_and_a_changed_knowledge_file_is_recorded_and_compiled_once()
-> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    // No onboarding specialist at all, and the explorer disabled.
    let agents = agents_dir(dir.path(), |file| {
        file.agents.retain(|agent| agent.key != "onboarding");
        for agent in &mut file.agents {
            // Mesh rules may name only agents of the registry.
            agent.mesh.allow.retain(|key| key != "onboarding");
            if agent.key == "explorer" {
                agent.enabled = false;
            }
        }
    })?;
    let data_dir = dir.path().join("data");
    let core = zopu_tests::core_config(&server, &data_dir);
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("acme"), ProjectId::new());
    let services = Services::start(&core, &agents);
    setup_project(&bus, &org, project).await?;
    let filter = subjects::project_events(&org, &project);

    // Onboarding is handed to no one: refused before it runs, and said so.
    let onboarding = wait_for(&bus, &filter, LONG, |event| {
        event.is::<pb::FlowFailed>()
            && failure_code(event).as_deref() == Some("agent.not_registered")
    })
    .await?;
    wait_for(&bus, &filter, LONG, |event| {
        event.is::<pb::AgentFinal>()
            && event.flow_run_id == onboarding.flow_run_id
            && failure_code(event).as_deref() == Some("agent.not_registered")
    })
    .await?;

    // A code question goes to the explorer, which is disabled.
    let question = send(
        &bus,
        &org,
        project,
        "How does the checkout flow handle payments?",
    )
    .await?;
    turn_end(&bus, &org, project, question.request).await?;
    let refused = wait_for(&bus, &filter, LONG, |event| {
        event.is::<pb::FlowFailed>()
            && failure_code(event).as_deref() == Some("agent.disabled_in_registry")
    })
    .await?;
    let told = wait_for(&bus, &filter, LONG, |event| {
        event.is::<pb::AgentFinal>() && event.flow_run_id == refused.flow_run_id
    })
    .await?;
    ensure!(
        told.decode::<pb::AgentFinal>()?.text.contains("disabled"),
        "the user is told why: {:?}",
        told.decode::<pb::AgentFinal>()?.text
    );
    ensure!(
        events_of::<pb::FlowStarted>(&bus, &org, project, None)
            .await?
            .is_empty(),
        "no flow the registry refuses ever starts"
    );

    // The definitions in force were recorded once each, before the first dispatch.
    let definitions = all_of::<pb::AgentDefinitionChanged>(&bus, &org, project).await?;
    let mut keys: Vec<&str> = definitions.iter().map(|d| d.agent_key.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["checker", "conversation", "explorer", "issue-writer"]
    );
    assert!(
        definitions
            .iter()
            .all(|d| d.previous_definition_hash.is_empty())
    );
    assert!(
        definitions
            .iter()
            .any(|d| d.agent_key == "explorer" && !d.enabled)
    );
    let conversation_before = definitions
        .iter()
        .find(|d| d.agent_key == "conversation")
        .context("conversation definition")?
        .clone();
    let explorer_hash = definitions
        .iter()
        .find(|d| d.agent_key == "explorer")
        .context("explorer definition")?
        .definition_hash
        .clone();

    // Every turn ran under the conversation definition; each flow was handed off.
    let accepted = all_of::<pb::DispatchAccepted>(&bus, &org, project).await?;
    ensure!(!accepted.is_empty(), "turns were accepted");
    for turn in &accepted {
        let definition = turn.definition.as_ref().context("a turn's definition")?;
        assert_eq!(definition.agent_key, "conversation");
        assert_eq!(
            definition.definition_hash,
            conversation_before.definition_hash
        );
        assert_eq!(
            definition.knowledge_hash,
            conversation_before.knowledge_hash
        );
        assert_eq!(definition.model, "offline");
        assert!(definition.prompt_package_version.starts_with("1.0.0+"));
    }
    let handoffs = all_of::<pb::AgentHandoffCreated>(&bus, &org, project).await?;
    let mut targets: Vec<(&str, &str)> = handoffs
        .iter()
        .map(|h| (h.flow.as_str(), h.target_agent_key.as_str()))
        .collect();
    targets.sort_unstable();
    assert_eq!(targets, [("explore", "explorer"), ("onboarding", "")]);
    assert!(
        handoffs
            .iter()
            .all(|h| h.source_agent_key == "conversation" && !h.source_run_id.is_empty())
    );
    services.stop().await?;

    // The conversation agent's knowledge changes; nothing else does.
    let explorer_cached = cached(&data_dir, "explorer")?;
    assert_eq!(explorer_cached.len(), 1, "{explorer_cached:?}");
    let knowledge = agents.join("knowledge/conversation.md");
    let mut text = std::fs::read_to_string(&knowledge)?;
    text.push_str("- Answer in the language the user writes in.\n");
    std::fs::write(&knowledge, text)?;
    let services = Services::start(&core, &agents);
    let second = send(&bus, &org, project, "What does this project do?").await?;
    turn_end(&bus, &org, project, second.request).await?;
    let definitions = all_of::<pb::AgentDefinitionChanged>(&bus, &org, project).await?;
    assert_eq!(
        definitions.len(),
        5,
        "one new record, for the changed agent"
    );
    let changed = &definitions[4];
    assert_eq!(changed.agent_key, "conversation");
    assert_eq!(
        changed.previous_definition_hash,
        conversation_before.definition_hash
    );
    assert_ne!(changed.knowledge_hash, conversation_before.knowledge_hash);
    let last_turn = all_of::<pb::DispatchAccepted>(&bus, &org, project)
        .await?
        .pop()
        .context("the second turn")?;
    let definition = last_turn.definition.context("its definition")?;
    assert_eq!(definition.knowledge_hash, changed.knowledge_hash);
    assert_eq!(
        definition.prompt_package_version,
        changed.prompt_package_version
    );
    assert_eq!(cached(&data_dir, "conversation")?.len(), 2, "rebuilt once");
    assert_eq!(
        cached(&data_dir, "explorer")?,
        explorer_cached,
        "an unchanged package is never recompiled"
    );
    assert!(
        definitions
            .iter()
            .filter(|d| d.agent_key == "explorer")
            .all(|d| d.definition_hash == explorer_hash)
    );
    services.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_agent_the_registry_disables_takes_no_dispatch_and_the_timeline_says_so()
-> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let agents = agents_dir(dir.path(), |file| {
        for agent in &mut file.agents {
            if agent.key == "conversation" {
                agent.enabled = false;
            }
        }
    })?;
    let core = zopu_tests::core_config(&server, &dir.path().join("data"));
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("acme"), ProjectId::new());
    request_setup(&bus, &org, project).await?;
    let services = Services::start(&core, &agents);
    setup_project(&bus, &org, project).await?;
    let message = send(&bus, &org, project, "Hello?").await?;
    let filter = subjects::project_events(&org, &project);
    let failed = wait_for(&bus, &filter, LONG, |event| {
        event.is::<pb::DispatchFailed>() && event.causation_id == message.event_id
    })
    .await?;
    assert_eq!(
        failure_code(&failed).as_deref(),
        Some("agent.disabled_in_registry")
    );
    ensure!(
        events_of::<pb::DispatchCreated>(&bus, &org, project, None)
            .await?
            .is_empty()
            && events_of::<pb::DispatchAccepted>(&bus, &org, project, None)
                .await?
                .is_empty(),
        "nothing is dispatched to a disabled agent"
    );

    // The user sees the refusal on the timeline.
    let gateway = Gateway::start(&server, &dir.path().join("gateway")).await?;
    gateway.caught_up(&bus).await?;
    let (status, page) = gateway
        .get(&format!("/v1/projects/{project}/timeline?limit=100"))
        .await?;
    assert_eq!(status, StatusCode::OK, "{page}");
    let refusals: Vec<&Value> = page["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter(|item| item["failure"]["code"] == "agent.disabled_in_registry")
        .collect();
    assert_eq!(refusals.len(), 2, "project.ready and the message: {page}");
    gateway.stop().await?;
    services.stop().await
}

/// The project's `project.setup.requested` (the gateway lists a project from it).
pub(crate) async fn request_setup(
    bus: &zopu_runtime::nats::Bus,
    org: &OrgId,
    project: ProjectId,
) -> Result<()> {
    use zopu_core::commands::{ProjectSetup, Requester};
    let requester = Requester::user(org.clone(), zopu_schema::EventId::new().into(), "ada");
    let event = zopu_core::commands::request_setup(
        &requester,
        project,
        &ProjectSetup::new("https://github.com/acme/shop.git"),
        1,
        false,
    )
    .map_err(|problem| anyhow::anyhow!("{problem}"))?;
    zopu_runtime::publish::Publisher::new(bus.clone(), "gateway", None)
        .append(event)
        .await?;
    Ok(())
}

/// A gateway in-process on a free port, with a token of `acme`.
pub(crate) struct Gateway {
    shutdown: Shutdown,
    state: zopu_gateway::AppState,
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Gateway {
    pub(crate) async fn start(server: &NatsServer, data_dir: &Path) -> Result<Self> {
        Self::start_with(zopu_tests::core_config(server, data_dir)).await
    }

    /// [`Gateway::start`] with this core configuration (a secrets key, say).
    pub(crate) async fn start_with(core: CoreConfig) -> Result<Self> {
        Self::start_configured(core, zopu_gateway::Config::default()).await
    }

    /// [`Gateway::start_with`] on the agent registry of `agents`.
    pub(crate) async fn start_on(core: CoreConfig, agents: &Path) -> Result<Self> {
        let config = zopu_gateway::Config {
            agents_dir: Some(agents.to_path_buf()),
            ..Default::default()
        };
        Self::start_configured(core, config).await
    }

    /// [`Gateway::start_with`] with this gateway configuration.
    pub(crate) async fn start_configured(
        core: CoreConfig,
        config: zopu_gateway::Config,
    ) -> Result<Self> {
        let shutdown = Shutdown::new();
        let key = zopu_gateway::LinkKey::new(
            b"registry-tests-link-key-0123456789abcdef".to_vec(),
            "test",
        )?;
        let state = zopu_gateway::start(&core, config, key, shutdown.clone()).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        shutdown.spawn(zopu_gateway::serve(state.clone(), listener));
        let token = state
            .tokens
            .issue(&org("acme"), "ada", zopu_gateway::tokens::DEFAULT_TTL)
            .await?;
        Ok(Self {
            shutdown,
            state,
            base,
            token: token.expose().to_owned(),
            http: reqwest::Client::builder().timeout(LONG).build()?,
        })
    }

    /// Waits until the gateway projected the stream's current end.
    pub(crate) async fn caught_up(&self, bus: &zopu_runtime::nats::Bus) -> Result<()> {
        let last = zopu_runtime::publish::last_sequence(bus).await?;
        tokio::time::timeout(LONG, self.state.runtime.store.wait_for(last))
            .await
            .context("the gateway projection did not catch up")
    }

    pub(crate) async fn get(&self, path: &str) -> Result<(StatusCode, Value)> {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await?;
        let status = response.status();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> Result<(StatusCode, Value)> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(&body))
            .await
    }

    pub(crate) async fn put(&self, path: &str, body: Value) -> Result<(StatusCode, Value)> {
        self.send(self.http.put(format!("{}{path}", self.base)).json(&body))
            .await
    }

    /// A request with `body` sent as it is (`application/json`, however
    /// malformed), its status and body text.
    pub(crate) async fn send_bytes(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(StatusCode, String)> {
        let response = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await?;
        let status = response.status();
        Ok((status, response.text().await?))
    }

    pub(crate) async fn delete(&self, path: &str) -> Result<(StatusCode, Value)> {
        self.send(self.http.delete(format!("{}{path}", self.base)))
            .await
    }

    /// A GET with another bearer credential (an agent key, say); `None`: none at all.
    pub(crate) async fn get_as(
        &self,
        path: &str,
        bearer: Option<&str>,
    ) -> Result<(StatusCode, Value)> {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        let response = request.send().await?;
        let status = response.status();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// A POST with another bearer credential and request id; also returns
    /// the `Retry-After` header.
    pub(crate) async fn post_as(
        &self,
        path: &str,
        bearer: &str,
        request_id: &str,
        body: Value,
    ) -> Result<(StatusCode, Value, Option<String>)> {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(bearer)
            .header("x-request-id", request_id)
            .json(&body)
            .send()
            .await?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        Ok((
            status,
            response.json().await.unwrap_or(Value::Null),
            retry_after,
        ))
    }

    /// The gateway's base URL (`http://127.0.0.1:<port>`).
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// The user token this gateway issued for the tests.
    pub(crate) fn user_token(&self) -> &str {
        &self.token
    }

    /// A DELETE under the caller's request id (`X-Request-Id`), as a retry sends it.
    pub(crate) async fn delete_as(
        &self,
        path: &str,
        request_id: &str,
    ) -> Result<(StatusCode, Value)> {
        self.send(
            self.http
                .delete(format!("{}{path}", self.base))
                .header("x-request-id", request_id),
        )
        .await
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<(StatusCode, Value)> {
        let response = request.bearer_auth(&self.token).send().await?;
        let status = response.status();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    pub(crate) async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        ensure!(self.shutdown.wait(LONG).await, "the gateway did not stop");
        Ok(())
    }
}
