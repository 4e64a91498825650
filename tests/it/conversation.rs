//! Timeline dispatch and the conversation agent (issue 5) against a real
//! nats-server, with the offline provider and a scripted OpenAI-compatible
//! server over real HTTP.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use futures::future::join_all;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use zopu_conversation::{FailPoint, OpenAiSettings, ProviderKind};
use zopu_llm::test_support::{FakeOpenAiServer, Gate, Scripted};
use zopu_runtime::clock::ManualClock;
use zopu_runtime::config::CoreConfig;
use zopu_runtime::nats::Bus;
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::{Appended, Clock, Shutdown};
use zopu_schema::{
    AgentId, CorrelationId, DispatchId, Envelope, Event, EventId, OrgId, ProjectId, keys, pb,
    subjects,
};
use zopu_tests::{NatsServer, bus, history, wait_for};

pub(crate) const LONG: Duration = Duration::from_secs(60);

pub(crate) fn org(name: &str) -> OrgId {
    name.parse().expect("valid org")
}

fn user() -> pb::Actor {
    pb::Actor {
        kind: pb::actor::Kind::User as i32,
        id: "ada".into(),
    }
}

/// A service started in-process with its own shutdown.
pub(crate) struct Running {
    shutdown: Shutdown,
    handle: JoinHandle<Result<()>>,
}

impl Running {
    pub(crate) fn dispatch(core: &CoreConfig) -> Self {
        Self::dispatch_with(core, zopu_dispatch::Config::default())
    }

    pub(crate) fn dispatch_with(core: &CoreConfig, config: zopu_dispatch::Config) -> Self {
        let shutdown = Shutdown::new();
        let (core, stop) = (core.clone(), shutdown.clone());
        let handle = tokio::spawn(async move { Ok(zopu_dispatch::run(core, config, stop).await?) });
        Self { shutdown, handle }
    }

    pub(crate) fn conversation(core: &CoreConfig, config: zopu_conversation::Config) -> Self {
        let shutdown = Shutdown::new();
        let (core, stop) = (core.clone(), shutdown.clone());
        let handle =
            tokio::spawn(async move { Ok(zopu_conversation::run(core, config, stop).await?) });
        Self { shutdown, handle }
    }

    pub(crate) fn specialists_with(core: &CoreConfig, config: zopu_specialists::Config) -> Self {
        let shutdown = Shutdown::new();
        let (core, stop) = (core.clone(), shutdown.clone());
        let handle =
            tokio::spawn(async move { Ok(zopu_specialists::run(core, config, stop).await?) });
        Self { shutdown, handle }
    }

    pub(crate) async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        self.handle.await??;
        ensure!(
            self.shutdown.wait(LONG).await,
            "service tasks did not finish"
        );
        Ok(())
    }

    /// Waits until the service stopped by itself (a fail point fired).
    async fn stopped(self) -> Result<()> {
        tokio::time::timeout(LONG, self.shutdown.cancelled())
            .await
            .context("service did not stop")?;
        self.stop().await
    }
}

pub(crate) fn openai(server: &FakeOpenAiServer) -> zopu_conversation::Config {
    zopu_conversation::Config {
        provider: ProviderKind::Openai,
        openai: OpenAiSettings {
            base_url: server.base_url(),
            model: "fake-model".into(),
            api_key_env: String::new(),
            request_timeout: Duration::from_secs(1),
            max_retries: 2,
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_secs(2),
            ..OpenAiSettings::default()
        },
        handler_timeout: Duration::from_secs(60),
        // The holding acknowledgement has its own test; here every
        // acknowledgement is the model's (or the fallback's).
        acknowledgement_deadline: Duration::from_secs(60),
        ..zopu_conversation::Config::default()
    }
}

fn explore_call(ack: &str) -> Scripted {
    let arguments = json!({"acknowledgement": ack, "title": "Explore checkout payments", "request": "Trace how checkout handles payments."});
    Scripted::tool_call("call_1", "explore", &arguments.to_string())
}

/// The setup events (agent.registered and project.ready), appended directly.
pub(crate) async fn setup_project(bus: &Bus, org: &OrgId, project: ProjectId) -> Result<()> {
    setup_project_with(bus, org, project, true).await
}

/// `ready: false` registers the agent only (no onboarding turn).
pub(crate) async fn setup_project_with(
    bus: &Bus,
    org: &OrgId,
    project: ProjectId,
    ready: bool,
) -> Result<()> {
    let publisher = Publisher::new(bus.clone(), "setup", None);
    let agent = AgentId::conversation(org, &project).to_string();
    let registered = pb::AgentRegistered {
        agent_id: agent.clone(),
        agent_type: "conversation".into(),
        runtime_id: "runtime-1".into(),
        global_timeline_id: zopu_core::commands::GLOBAL_TIMELINE_ID.into(),
        setup_revision: 1,
    };
    publisher
        .append(NewEvent::root(
            org.clone(),
            project,
            &registered,
            keys::setup_step(&project, 1, "register"),
            None,
        ))
        .await?;
    if !ready {
        return Ok(());
    }
    let ready = pb::ProjectReady {
        setup_revision: 1,
        agent_id: agent,
        runtime_id: "runtime-1".into(),
        repository_commit: "0123abc".into(),
        environment_variable_names: vec!["DATABASE_URL".into()],
        branch: "main".into(),
        repository_url: "https://github.com/acme/shop.git".into(),
    };
    publisher
        .append(NewEvent::root(
            org.clone(),
            project,
            &ready,
            keys::project_ready(&project, 1),
            None,
        ))
        .await?;
    Ok(())
}

/// A message stored by [`send`].
pub(crate) struct Sent {
    pub(crate) event_id: EventId,
    pub(crate) sequence: u64,
    /// Its request id: the correlation id of everything the turn stores.
    pub(crate) request: EventId,
}

pub(crate) async fn send(bus: &Bus, org: &OrgId, project: ProjectId, text: &str) -> Result<Sent> {
    send_at(bus, &Clock::system(), org, project, text).await
}

/// [`send`] with the message stamped by `clock`.
async fn send_at(
    bus: &Bus,
    clock: &Clock,
    org: &OrgId,
    project: ProjectId,
    text: &str,
) -> Result<Sent> {
    let publisher = Publisher::new(bus.clone(), "gateway", None).with_clock(clock.clone());
    let request = EventId::new();
    let appended = zopu_conversation::send_message(
        &publisher,
        org,
        &project,
        text,
        user(),
        &request.to_string(),
    )
    .await?;
    Ok(Sent {
        event_id: appended.event_id,
        sequence: appended.sequence,
        request,
    })
}

/// Whether `event` belongs to the turn of the message sent under `request`.
pub(crate) fn of_message(event: &Envelope, request: EventId) -> bool {
    event.correlation_id == CorrelationId::from(request)
}

/// Waits for the conversation's terminal dispatch event for a message.
pub(crate) async fn turn_end(
    bus: &Bus,
    org: &OrgId,
    project: ProjectId,
    message: EventId,
) -> Result<Envelope> {
    wait_for(
        bus,
        &subjects::project_events(org, &project),
        LONG,
        |event| {
            of_message(event, message)
                && event.source == "zopu/conversation"
                && (event.is::<pb::DispatchCompleted>() || event.is::<pb::DispatchFailed>())
        },
    )
    .await
}

pub(crate) async fn events_of<E: Event>(
    bus: &Bus,
    org: &OrgId,
    project: ProjectId,
    message: Option<EventId>,
) -> Result<Vec<Envelope>> {
    Ok(history(bus, &subjects::event(org, &project, E::TYPE))
        .await?
        .into_iter()
        .map(|(_, event)| event)
        .filter(|event| message.is_none_or(|message| of_message(event, message)))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_81_offline_exploration_request_up_to_the_flow_and_its_final() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("acme"), ProjectId::new());
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(&core, zopu_conversation::Config::default());
    setup_project(&bus, &org, project).await?;

    // project.ready → onboarding: ack, Work, Thread, flow.requested(onboarding_explore).
    let onboarding = wait_for(
        &bus,
        &subjects::event(&org, &project, pb::FlowRequested::TYPE),
        LONG,
        |_| true,
    )
    .await?;
    let requested = onboarding.decode::<pb::FlowRequested>()?;
    assert_eq!(requested.flow_type(), pb::FlowType::OnboardingExplore);
    assert_eq!(requested.repository_commit, "0123abc");

    let message = send(
        &bus,
        &org,
        project,
        "How does the checkout flow handle payments?",
    )
    .await?;
    let end = turn_end(&bus, &org, project, message.request).await?;
    assert_eq!(
        end.decode::<pb::DispatchCompleted>()?.outcome,
        "flow_requested"
    );
    let acks =
        events_of::<pb::AgentAcknowledged>(&bus, &org, project, Some(message.request)).await?;
    assert_eq!(acks.len(), 1);
    let ack = acks[0].decode::<pb::AgentAcknowledged>()?;
    assert!(ack.text.split_whitespace().count() < 50, "{}", ack.text);
    assert_eq!(ack.provider, "offline");
    assert_eq!(ack.reply_to_event_id, message.event_id.to_string());
    let decided = events_of::<pb::AgentDecided>(&bus, &org, project, Some(message.request)).await?;
    assert_eq!(
        decided[0].decode::<pb::AgentDecided>()?.decision(),
        pb::agent_decided::Decision::Explore
    );
    let work = &events_of::<pb::WorkCreated>(&bus, &org, project, Some(message.request)).await?[0];
    let thread =
        &events_of::<pb::ThreadCreated>(&bus, &org, project, Some(message.request)).await?[0];
    let flows = events_of::<pb::FlowRequested>(&bus, &org, project, Some(message.request)).await?;
    assert_eq!(flows.len(), 1);
    let flow = &flows[0];
    let request = flow.decode::<pb::FlowRequested>()?;
    assert_eq!(request.flow_type(), pb::FlowType::Explore);
    assert_eq!(request.source_event_id, message.event_id.to_string());
    assert_eq!(
        request.request_text,
        "How does the checkout flow handle payments?"
    );
    // Causally linked: the thread under the work, the flow under both, all
    // under the dispatch of the message.
    assert_eq!(thread.work_id, work.work_id);
    assert_eq!(
        (flow.work_id, flow.thread_id),
        (work.work_id, thread.thread_id)
    );
    assert!(flow.flow_run_id.is_some() && flow.dispatch_id.is_some());
    assert_eq!(flow.dispatch_id, end.dispatch_id);

    // The specialist finishes; the artifact is published; one final with its id.
    let specialist = Publisher::new(bus.clone(), "specialists", None);
    let run = flow.flow_run_id.context("flow run id")?;
    let completed = pb::FlowCompleted {
        flow_type: pb::FlowType::Explore as i32,
        summary: "The payment path starts in src/checkout/pay.rs and retries twice. Refunds are separate.".into(),
        artifact_build_id: "build-1".into(),
        ..Default::default()
    };
    specialist
        .append(NewEvent::caused_by(
            &flow.context(),
            &completed,
            keys::flow_step(&run, "completed"),
        ))
        .await?;
    let artifacts = Publisher::new(bus.clone(), "artifacts", None);
    let artifact_id = zopu_schema::ArtifactId::new().to_string();
    let published = pb::ArtifactPublished {
        build_id: "build-1".into(),
        artifact_id: artifact_id.clone(),
        revision: 1,
        kind: pb::ArtifactKind::Exploration as i32,
        title: "Checkout payments".into(),
        ..Default::default()
    };
    artifacts
        .append(NewEvent::caused_by(
            &flow.context(),
            &published,
            format!("artifact:{artifact_id}:1"),
        ))
        .await?;
    let last = wait_for(
        &bus,
        &subjects::event(&org, &project, pb::AgentFinal::TYPE),
        LONG,
        |event| of_message(event, message.request),
    )
    .await?;
    let last_payload = last.decode::<pb::AgentFinal>()?;
    assert_eq!(last_payload.artifact_ids, vec![artifact_id]);
    assert!(last_payload.failure.is_none());
    assert!(
        last_payload.text.starts_with("The exploration is ready."),
        "{}",
        last_payload.text
    );
    assert_eq!(last.flow_run_id, Some(run));
    let updates =
        events_of::<pb::ThreadUpdated>(&bus, &org, project, Some(message.request)).await?;
    assert_eq!(updates.len(), 1);
    assert_eq!(
        events_of::<pb::AgentFinal>(&bus, &org, project, Some(message.request))
            .await?
            .len(),
        1
    );

    conversation.stop().await?;
    dispatch.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_81_with_an_openai_compatible_tool_call() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("acme"), ProjectId::new());
    let llm =
        FakeOpenAiServer::start([explore_call("On it — tracing checkout payments now.")]).await?;
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(&core, openai(&llm));
    setup_project(&bus, &org, project).await?;
    let message = send(&bus, &org, project, "How does checkout handle payments?").await?;
    let end = turn_end(&bus, &org, project, message.request).await?;
    assert_eq!(
        end.decode::<pb::DispatchCompleted>()?.outcome,
        "flow_requested"
    );
    let ack =
        events_of::<pb::AgentAcknowledged>(&bus, &org, project, Some(message.request)).await?;
    assert_eq!(ack.len(), 1);
    let ack = ack[0].decode::<pb::AgentAcknowledged>()?;
    assert_eq!(ack.text, "On it — tracing checkout payments now.");
    assert_eq!(ack.provider, "openai:fake-model");
    let recorded =
        events_of::<pb::AgentLlmCompleted>(&bus, &org, project, Some(message.request)).await?;
    assert_eq!(recorded.len(), 1);
    let flows = events_of::<pb::FlowRequested>(&bus, &org, project, Some(message.request)).await?;
    assert_eq!(flows.len(), 1);
    assert!(
        flows[0]
            .decode::<pb::FlowRequested>()?
            .request_text
            .contains("How does checkout handle payments?")
    );
    // One call, offering the decision tools (as the structured output's
    // actions), with the message as data.
    assert_eq!(llm.request_count(), 1);
    let body = llm.requests()[0].json();
    assert_eq!(decision_actions(&body)?, DECISION_ACTIONS);
    assert!(body.to_string().contains("<user_message>"));
    conversation.stop().await?;
    dispatch.stop().await?;
    Ok(())
}

const DECISION_ACTIONS: [&str; 6] = [
    "respond",
    "clarify",
    "remember",
    "explore",
    "create_issue",
    "check",
];

/// The actions a structured decision request's schema allows, in order.
fn decision_actions(body: &Value) -> Result<Vec<String>> {
    let format = &body["response_format"];
    ensure!(
        format["type"] == "json_schema" && format["json_schema"]["strict"] == true,
        "not a strict JSON schema: {format}"
    );
    Ok(
        format["json_schema"]["schema"]["properties"]["reply"]["anyOf"]
            .as_array()
            .context("one alternative per action")?
            .iter()
            .filter_map(|alternative| alternative["properties"]["action"]["enum"][0].as_str())
            .map(str::to_owned)
            .collect(),
    )
}

/// A model behind a server that enforces the decision's schema (the fake
/// checks the request carries it and answers only JSON it accepts) decides
/// the turn: its acknowledgement, its flow, no fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_behind_a_schema_enforcing_server_decides_the_turn() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("acme"), ProjectId::new());
    let decision = json!({"reply": {"action": "explore", "arguments": {
        "acknowledgement": "Looking into how checkout takes payments now.",
        "title": "Explore checkout payments",
        "request": "Trace how checkout handles payments."
    }}});
    let llm = FakeOpenAiServer::start([Scripted::Conforming(decision)]).await?;
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(&core, openai(&llm));
    setup_project(&bus, &org, project).await?;
    let message = send(&bus, &org, project, "How does checkout handle payments?").await?;
    let end = turn_end(&bus, &org, project, message.request).await?;
    assert_eq!(
        end.decode::<pb::DispatchCompleted>()?.outcome,
        "flow_requested"
    );
    let ack =
        events_of::<pb::AgentAcknowledged>(&bus, &org, project, Some(message.request)).await?;
    assert_eq!(ack.len(), 1);
    let ack = ack[0].decode::<pb::AgentAcknowledged>()?;
    assert_eq!(ack.text, "Looking into how checkout takes payments now.");
    assert_eq!(ack.provider, "openai:fake-model");
    let fallbacks =
        events_of::<pb::AgentGuardrailTriggered>(&bus, &org, project, Some(message.request))
            .await?;
    assert!(fallbacks.is_empty(), "{fallbacks:?}");
    let flows = events_of::<pb::FlowRequested>(&bus, &org, project, Some(message.request)).await?;
    assert_eq!(flows.len(), 1);
    assert_eq!(llm.request_count(), 1);
    let body = llm.requests()[0].json();
    assert_eq!(decision_actions(&body)?, DECISION_ACTIONS);
    assert!(body.get("tools").is_none());
    conversation.stop().await?;
    dispatch.stop().await?;
    Ok(())
}

/// A server that refuses `response_format` (a 400 naming it) gets the
/// decision as plain tool calling: the turn is still the model's, and only
/// the first request of the service ever carries the schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_refusing_structured_output_gets_tool_calls_from_then_on() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("acme"), ProjectId::new());
    let respond = json!({"message": "Hello! Ask me anything about the project."});
    let llm = FakeOpenAiServer::start([
        explore_call("On it — tracing checkout payments now."),
        Scripted::tool_call("call_2", "respond", &respond.to_string()),
    ])
    .await?
    .refusing_structured();
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(&core, openai(&llm));
    setup_project(&bus, &org, project).await?;
    let first = send(&bus, &org, project, "How does checkout handle payments?").await?;
    let end = turn_end(&bus, &org, project, first.request).await?;
    assert_eq!(
        end.decode::<pb::DispatchCompleted>()?.outcome,
        "flow_requested"
    );
    let second = send(&bus, &org, project, "hello there").await?;
    let end = turn_end(&bus, &org, project, second.request).await?;
    assert_eq!(end.decode::<pb::DispatchCompleted>()?.outcome, "responded");
    let answer = events_of::<pb::AgentMessage>(&bus, &org, project, Some(second.request)).await?;
    let answer = answer[0].decode::<pb::AgentMessage>()?;
    assert_eq!(answer.provider, "openai:fake-model");
    assert_eq!(answer.text, "Hello! Ask me anything about the project.");
    let fallbacks = events_of::<pb::AgentGuardrailTriggered>(&bus, &org, project, None).await?;
    assert!(fallbacks.is_empty(), "{fallbacks:?}");
    let requests = llm.requests();
    assert_eq!(requests.len(), 3, "one refusal, then two plain requests");
    assert!(requests[0].json().get("response_format").is_some());
    for plain in &requests[1..] {
        let body = plain.json();
        assert!(body.get("response_format").is_none(), "{body}");
        let tools = body["tools"].as_array().context("tools offered")?;
        assert_eq!(tools.len(), DECISION_ACTIONS.len());
    }
    conversation.stop().await?;
    dispatch.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_model_never_holds_up_the_acknowledgement() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("slow-model"), ProjectId::new());
    // The model answers only when the test says so.
    let answer = Gate::new();
    let llm = FakeOpenAiServer::start([Scripted::Gated(
        answer.clone(),
        Box::new(explore_call("On it — tracing checkout payments now.")),
    )])
    .await?;
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(
        &core,
        zopu_conversation::Config {
            acknowledgement_deadline: Duration::from_millis(300),
            openai: OpenAiSettings {
                request_timeout: Duration::from_secs(5),
                ..openai(&llm).openai
            },
            ..openai(&llm)
        },
    );
    setup_project(&bus, &org, project).await?;
    let text = "How does checkout handle payments?";
    let message = send(&bus, &org, project, text).await?;
    let holding = wait_for(
        &bus,
        &subjects::project_events(&org, &project),
        LONG,
        |event| event.is::<pb::AgentAcknowledged>() && of_message(event, message.request),
    )
    .await?
    .decode::<pb::AgentAcknowledged>()?;
    // Posted while the model still holds its answer.
    assert_eq!(llm.request_count(), 1);
    assert!(
        events_of::<pb::AgentLlmCompleted>(&bus, &org, project, Some(message.request))
            .await?
            .is_empty()
    );
    assert_eq!(
        holding.text,
        zopu_conversation::offline::holding_acknowledgement(text)
    );
    assert_eq!(holding.provider, "offline");
    assert_eq!(holding.reply_to_event_id, message.event_id.to_string());
    answer.open();
    let end = turn_end(&bus, &org, project, message.request).await?;
    assert_eq!(
        end.decode::<pb::DispatchCompleted>()?.outcome,
        "flow_requested"
    );
    let m = Some(message.request);
    assert_eq!(
        events_of::<pb::AgentAcknowledged>(&bus, &org, project, m)
            .await?
            .len(),
        1,
        "one acknowledgement"
    );
    // The model's own acknowledgement follows as an update.
    let updates: Vec<pb::AgentMessage> = events_of::<pb::AgentMessage>(&bus, &org, project, m)
        .await?
        .iter()
        .filter_map(|event| event.decode::<pb::AgentMessage>().ok())
        .collect();
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].status, "update");
    assert_eq!(updates[0].text, "On it — tracing checkout payments now.");
    assert_eq!(updates[0].provider, "openai:fake-model");
    assert_eq!(
        events_of::<pb::FlowRequested>(&bus, &org, project, m)
            .await?
            .len(),
        1
    );
    conversation.stop().await?;
    dispatch.stop().await?;
    Ok(())
}

/// Polls the conversation's durable consumer until it has settled the work
/// stream's copy of the event stored at `sequence` on `event_subject` (one
/// partition). (A restarted instance that takes over unsettled messages
/// recreates the consumer at its ack floor: briefly, it is missing.)
async fn wait_consumer_settled(bus: &Bus, event_subject: &str, sequence: u64) -> Result<()> {
    let stream = bus.jetstream.get_stream(subjects::WORK_STREAM).await?;
    let durable = subjects::durable(zopu_conversation::SERVICE, "dispatches");
    let work_subject = subjects::work_filter(event_subject, 1, 0).context("an event subject")?;
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let copy = stream
            .get_last_raw_message_by_subject(&work_subject)
            .await
            .ok()
            .filter(|copy| {
                copy.headers
                    .get(zopu_runtime::streams::STREAM_SOURCE_HEADER)
                    .and_then(|value| zopu_runtime::streams::copied_from(value.as_str()))
                    .is_some_and(|(copied, _)| copied >= sequence)
            });
        if let Some(copy) = copy
            && let Ok(info) = stream.consumer_info(&durable).await
            && info.ack_floor.stream_sequence >= copy.sequence
            && info.num_ack_pending == 0
        {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "consumer never settled sequence {sequence}"
        );
        tokio::task::yield_now().await;
    }
}

async fn wait_window_passed(bus: &Bus, probe_key: &str, event: &NewEvent) -> Result<Appended> {
    // Re-append until JetStream stores it again: the window has passed.
    let publisher = Publisher::new(bus.clone(), "dispatch", None);
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let appended = publisher.append(event.clone()).await?;
        if !appended.duplicate {
            return Ok(appended);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "duplicate window for {probe_key} never passed"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_83_one_dispatch_delivered_many_times_acts_once() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let window = Duration::from_secs(1);
    let mut core = zopu_tests::core_config(&server, dir.path());
    core.duplicate_window = window;
    let bus = bus(&server, window).await?;
    let (org, project) = (org("dup"), ProjectId::new());
    setup_project(&bus, &org, project).await?;
    let message = send(&bus, &org, project, "How does checkout handle payments?").await?;
    let source = zopu_runtime::publish::get_event(&bus, message.sequence).await?;
    // The dispatch the dispatch service would create (it is not running here).
    let agent = AgentId::conversation(&org, &project);
    let id = zopu_dispatch::dispatch_id(&source, &agent);
    let created = pb::DispatchCreated {
        source_event_id: source.id.to_string(),
        source_event_type: source.event_type.clone(),
        source_stream_sequence: message.sequence,
        agent_id: agent.to_string(),
        handler_version: zopu_dispatch::HANDLER_VERSION,
        global_timeline_id: zopu_core::commands::GLOBAL_TIMELINE_ID.into(),
    };
    let key = keys::dispatch(&source.id, &agent, zopu_dispatch::HANDLER_VERSION);
    let event = NewEvent::caused_by(&source.context(), &created, key.clone()).with_dispatch(id);
    // The dispatch service's publisher keeps a key index, which is what
    // deduplicates beyond the (1 s) JetStream window.
    let dispatch_store = zopu_runtime::Store::open(&dir.path().join("dispatch-writer.sqlite"))?;
    let publisher = Publisher::new(bus.clone(), "dispatch", Some(dispatch_store));
    let first = publisher.append(event.clone()).await?;
    for _ in 0..499 {
        assert!(publisher.append(event.clone()).await?.duplicate);
    }
    let racing = join_all((0..500).map(|_| {
        let (publisher, event) = (publisher.clone(), event.clone());
        async move { publisher.append(event).await }
    }))
    .await;
    for outcome in racing {
        assert!(outcome?.duplicate);
    }

    // First run: does the whole turn, then "crashes" before its ack, so the
    // dispatch is redelivered to the restarted service.
    let llm =
        FakeOpenAiServer::start([explore_call("On it — tracing checkout payments now.")]).await?;
    let crashing = Running::conversation(
        &core,
        zopu_conversation::Config {
            fail_point: Some(FailPoint::BeforeAck),
            ..openai(&llm)
        },
    );
    crashing.stopped().await?;
    let again = Running::conversation(&core, openai(&llm));
    let dispatch_subject = subjects::event(&org, &project, pb::DispatchCreated::TYPE);
    wait_consumer_settled(&bus, &dispatch_subject, first.sequence).await?;
    // After the duplicate window the same dispatch is stored (and delivered) again.
    let late = wait_window_passed(&bus, &key, &event).await?;
    wait_consumer_settled(&bus, &dispatch_subject, late.sequence).await?;
    again.stop().await?;

    let dispatches = events_of::<pb::DispatchCreated>(&bus, &org, project, None).await?;
    assert_eq!(
        dispatches.len(),
        2,
        "stored once, and once more after the window"
    );
    let count = |events: Vec<Envelope>| events.len();
    let m = Some(message.request);
    assert_eq!(
        count(events_of::<pb::AgentAcknowledged>(&bus, &org, project, m).await?),
        1
    );
    assert_eq!(
        count(events_of::<pb::AgentDecided>(&bus, &org, project, m).await?),
        1
    );
    assert_eq!(
        count(events_of::<pb::WorkCreated>(&bus, &org, project, m).await?),
        1
    );
    assert_eq!(
        count(events_of::<pb::ThreadCreated>(&bus, &org, project, m).await?),
        1
    );
    assert_eq!(
        count(events_of::<pb::FlowRequested>(&bus, &org, project, m).await?),
        1
    );
    assert_eq!(
        count(events_of::<pb::AgentLlmCompleted>(&bus, &org, project, m).await?),
        1
    );
    assert_eq!(
        count(events_of::<pb::DispatchCompleted>(&bus, &org, project, m).await?),
        1
    );
    assert_eq!(
        llm.request_count(),
        1,
        "the model was called more than once"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_any_point_leaves_exactly_one_acknowledgement() -> Result<()> {
    for point in [
        FailPoint::BeforeLlmCall,
        FailPoint::AfterLlmRecorded,
        FailPoint::BeforeAck,
    ] {
        let server = NatsServer::start()?;
        let dir = tempfile::tempdir()?;
        let core = zopu_tests::core_config(&server, dir.path());
        let bus = bus(&server, Duration::from_secs(120)).await?;
        let (org, project) = (org("crash"), ProjectId::new());
        let llm = FakeOpenAiServer::start([explore_call("On it — tracing checkout payments now.")])
            .await?;
        let dispatch = Running::dispatch(&core);
        setup_project_with(&bus, &org, project, false).await?;
        let crashing = Running::conversation(
            &core,
            zopu_conversation::Config {
                fail_point: Some(point),
                ..openai(&llm)
            },
        );
        let message = send(&bus, &org, project, "How does checkout handle payments?").await?;
        crashing.stopped().await?;
        let restarted = Running::conversation(&core, openai(&llm));
        turn_end(&bus, &org, project, message.request).await?;
        restarted.stop().await?;
        dispatch.stop().await?;
        let acks =
            events_of::<pb::AgentAcknowledged>(&bus, &org, project, Some(message.request)).await?;
        assert_eq!(acks.len(), 1, "{point:?}");
        assert_eq!(
            events_of::<pb::FlowRequested>(&bus, &org, project, Some(message.request))
                .await?
                .len(),
            1,
            "{point:?}"
        );
        assert_eq!(llm.request_count(), 1, "{point:?}: model calls");
    }
    Ok(())
}

fn tool_calls(calls: usize) -> Scripted {
    let calls: Vec<_> = (0..calls)
        .map(|i| json!({"id": format!("c{i}"), "type": "function", "function": {"name": "respond", "arguments": "{\"message\":\"hi\"}"}}))
        .collect();
    Scripted::Reply(json!({
        "id": "x", "object": "chat.completion", "model": "fake-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": calls}, "finish_reason": "tool_calls"}],
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_faults_end_in_exactly_one_outcome_per_dispatch_or_the_offline_fallback() -> Result<()>
{
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("faults"), ProjectId::new());
    let llm = FakeOpenAiServer::start([]).await?;
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(&core, openai(&llm));
    setup_project(&bus, &org, project).await?;
    let cut_off = Scripted::tool_call("c1", "explore", "{\"acknowledgement\": \"On it");
    let unknown = Scripted::tool_call("c1", "delete_repository", "{}");
    // (script, expected requests, expected failure code or None for success)
    let cases: Vec<(Vec<Scripted>, usize, Option<&str>)> = vec![
        (
            vec![
                Scripted::Status(
                    429,
                    vec![("Retry-After".into(), "1".into())],
                    "slow down".into(),
                ),
                explore_call("Tracing retries now."),
            ],
            2,
            None,
        ),
        (
            vec![
                Scripted::Status(500, vec![], "oops".into()),
                explore_call("Tracing the cart now."),
            ],
            2,
            None,
        ),
        (
            vec![
                // Never answered: the call can only end by the client's timeout, then a retry.
                Scripted::Hang,
                explore_call("Tracing the login now."),
            ],
            2,
            None,
        ),
        (
            vec![
                Scripted::Malformed("{\"choices\": [".into()),
                explore_call("Tracing the search now."),
            ],
            2,
            None,
        ),
        (
            vec![cut_off.clone(), cut_off],
            2,
            Some("llm.truncated_tool_call"),
        ),
        (vec![unknown.clone(), unknown], 2, Some("llm.unknown_tool")),
        (
            vec![tool_calls(6), tool_calls(6)],
            2,
            Some("llm.tool_call_cap"),
        ),
        (
            vec![Scripted::Status(503, vec![], "down".into()); 6],
            6,
            Some("llm.server_error"),
        ),
    ];
    let topics = [
        "retries", "cart", "login", "search", "orders", "refunds", "invoices", "emails",
    ];
    for ((script, requests, failure), topic) in cases.into_iter().zip(topics) {
        let before = llm.request_count();
        for entry in script {
            llm.push(entry);
        }
        let message = send(
            &bus,
            &org,
            project,
            &format!("How does the {topic} module work?"),
        )
        .await?;
        let end = turn_end(&bus, &org, project, message.request).await?;
        assert_eq!(
            llm.request_count() - before,
            requests,
            "{topic}: model requests"
        );
        match failure {
            None => {
                assert!(end.is::<pb::DispatchCompleted>(), "{topic}");
                assert_eq!(
                    events_of::<pb::AgentAcknowledged>(&bus, &org, project, Some(message.request))
                        .await?
                        .len(),
                    1
                );
            }
            Some(code) => {
                // No usable decision after every attempt: the offline rules
                // decide instead, and the acknowledgement says so.
                assert!(end.is::<pb::DispatchCompleted>(), "{topic}: fell back");
                let m = Some(message.request);
                let acks = events_of::<pb::AgentAcknowledged>(&bus, &org, project, m).await?;
                assert_eq!(acks.len(), 1, "{topic}");
                let ack = acks[0].decode::<pb::AgentAcknowledged>()?;
                assert_eq!(ack.provider, "offline", "{topic}");
                assert!(
                    ack.text
                        .ends_with(&zopu_conversation::offline::fallback_note(code)),
                    "{topic}: {}",
                    ack.text
                );
                let fallbacks: Vec<_> =
                    events_of::<pb::AgentGuardrailTriggered>(&bus, &org, project, m)
                        .await?
                        .iter()
                        .filter_map(|event| event.decode::<pb::AgentGuardrailTriggered>().ok())
                        .filter(|g| g.rule == "model_fallback")
                        .collect();
                assert_eq!(fallbacks.len(), 1, "{topic}");
                assert!(fallbacks[0].detail.starts_with(code), "{topic}");
                assert!(
                    !events_of::<pb::AgentLlmFailed>(&bus, &org, project, m)
                        .await?
                        .is_empty(),
                    "{topic}: the model's failures are recorded"
                );
                assert_eq!(
                    events_of::<pb::FlowRequested>(&bus, &org, project, m)
                        .await?
                        .len(),
                    1,
                    "{topic}: the offline decision's exploration"
                );
                assert!(
                    events_of::<pb::AgentFinal>(&bus, &org, project, m)
                        .await?
                        .is_empty(),
                    "{topic}: no visible failure"
                );
            }
        }
    }
    // Exactly one terminal outcome per dispatch.
    let completed = events_of::<pb::DispatchCompleted>(&bus, &org, project, None).await?;
    let failed = events_of::<pb::DispatchFailed>(&bus, &org, project, None).await?;
    let mut ended: Vec<DispatchId> = completed
        .iter()
        .chain(&failed)
        .filter_map(|event| event.dispatch_id)
        .collect();
    let total = ended.len();
    ended.sort();
    ended.dedup();
    assert_eq!(ended.len(), total, "a dispatch ended twice");
    assert_eq!(total, 9, "onboarding plus eight messages");
    let guardrails = events_of::<pb::AgentGuardrailTriggered>(&bus, &org, project, None).await?;
    assert!(guardrails.iter().any(|event| {
        event
            .decode::<pb::AgentGuardrailTriggered>()
            .is_ok_and(|g| g.rule == "tool_call_cap")
    }));
    conversation.stop().await?;
    dispatch.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_sent_while_busy_are_handled_in_order_one_turn_at_a_time() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("busy"), ProjectId::new());
    // The model holds its answer to the first message until the second one
    // is stored: the second arrives while the first turn is running.
    let first_answer = Gate::new();
    let llm = FakeOpenAiServer::start([
        Scripted::Gated(
            first_answer.clone(),
            Box::new(explore_call("Tracing the cart now.")),
        ),
        explore_call("Tracing the login now."),
    ])
    .await?;
    setup_project(&bus, &org, project).await?;
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(&core, openai(&llm));
    let first = send(&bus, &org, project, "How does the cart work?").await?;
    tokio::time::timeout(LONG, llm.wait_for_requests(1))
        .await
        .context("the first turn never called the model")?;
    let second = send(&bus, &org, project, "How does the login work?").await?;
    first_answer.open();
    turn_end(&bus, &org, project, second.request).await?;
    conversation.stop().await?;
    dispatch.stop().await?;
    let all = history(&bus, &subjects::project_events(&org, &project)).await?;
    let turn = |message: EventId| -> Vec<u64> {
        all.iter()
            .filter(|(_, event)| event.source == "zopu/conversation" && of_message(event, message))
            .map(|(sequence, _)| *sequence)
            .collect()
    };
    let (a, b) = (turn(first.request), turn(second.request));
    ensure!(!a.is_empty() && !b.is_empty(), "both turns ran");
    assert!(
        a.iter().max() < b.iter().min(),
        "turns interleaved: {a:?} / {b:?}"
    );
    let acks: Vec<String> = events_of::<pb::AgentAcknowledged>(&bus, &org, project, None)
        .await?
        .iter()
        .filter_map(|event| {
            event
                .decode::<pb::AgentAcknowledged>()
                .ok()
                .map(|ack| ack.text)
        })
        .collect();
    assert_eq!(
        acks[1..],
        ["Tracing the cart now.", "Tracing the login now."]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_switch_silences_the_agent_until_it_is_enabled() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("kill"), ProjectId::new());
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(&core, zopu_conversation::Config::default());
    setup_project(&bus, &org, project).await?;
    let onboarding = wait_for(
        &bus,
        &subjects::event(&org, &project, pb::FlowRequested::TYPE),
        LONG,
        |_| true,
    )
    .await?;
    let operator = Publisher::new(bus.clone(), "gateway", None);
    let actor = pb::Actor {
        kind: pb::actor::Kind::Operator as i32,
        id: "ops".into(),
    };
    let disabled =
        zopu_conversation::disable_agent(&operator, &org, &project, "maintenance", actor.clone())
            .await?;

    // The running flow is halted by the specialists; the agent says nothing about it.
    let run = onboarding.flow_run_id.context("flow run")?;
    let cancelled = pb::FlowCancelled {
        flow_type: pb::FlowType::OnboardingExplore as i32,
        reason: "agent disabled".into(),
        ..Default::default()
    };
    let halted = Publisher::new(bus.clone(), "specialists", None)
        .append(NewEvent::caused_by(
            &onboarding.context(),
            &cancelled,
            keys::flow_step(&run, "cancelled"),
        ))
        .await?;
    let first = send(&bus, &org, project, "How does the cart work?").await?;
    let second = send(&bus, &org, project, "How does the login work?").await?;
    for message in [first.request, second.request] {
        let end = turn_end(&bus, &org, project, message).await?;
        assert_eq!(
            end.decode::<pb::DispatchCompleted>()?.outcome,
            "skipped_disabled"
        );
    }
    let enabled = zopu_conversation::enable_agent(&operator, &org, &project, actor).await?;
    let third = send(&bus, &org, project, "How does the search work?").await?;
    turn_end(&bus, &org, project, third.request).await?;
    conversation.stop().await?;
    dispatch.stop().await?;

    let all = history(&bus, &subjects::project_events(&org, &project)).await?;
    let visible: Vec<(u64, String)> = all
        .iter()
        .filter(|(sequence, event)| {
            *sequence > disabled.sequence
                && *sequence < enabled.sequence
                && [
                    pb::AgentAcknowledged::TYPE,
                    pb::AgentMessage::TYPE,
                    pb::AgentBlocked::TYPE,
                    pb::AgentFinal::TYPE,
                ]
                .contains(&event.event_type.as_str())
        })
        .map(|(sequence, event)| (*sequence, event.event_type.clone()))
        .collect();
    assert_eq!(
        visible.len(),
        1,
        "only the one 'paused' notice while disabled: {visible:?}"
    );
    let notice = all
        .iter()
        .find(|(sequence, _)| *sequence == visible[0].0)
        .context("notice")?;
    assert_eq!(notice.1.decode::<pb::AgentMessage>()?.status, "paused");
    assert!(
        all.iter()
            .all(|(sequence, event)| *sequence <= halted.sequence || !event.is::<pb::AgentFinal>())
    );
    assert_eq!(
        events_of::<pb::AgentAcknowledged>(&bus, &org, project, Some(third.request))
            .await?
            .len(),
        1
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_for_another_projects_agent_is_rejected_not_acted_on() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("route"), ProjectId::new());
    setup_project(&bus, &org, project).await?;
    let message = send(&bus, &org, project, "How does the cart work?").await?;
    let source = zopu_runtime::publish::get_event(&bus, message.sequence).await?;
    let stranger = AgentId::conversation(&org, &ProjectId::new());
    let created = pb::DispatchCreated {
        source_event_id: source.id.to_string(),
        source_event_type: source.event_type.clone(),
        source_stream_sequence: message.sequence,
        agent_id: stranger.to_string(),
        handler_version: 1,
        global_timeline_id: zopu_core::commands::GLOBAL_TIMELINE_ID.into(),
    };
    let id = zopu_dispatch::dispatch_id(&source, &stranger);
    Publisher::new(bus.clone(), "dispatch", None)
        .append(
            NewEvent::caused_by(
                &source.context(),
                &created,
                keys::dispatch(&source.id, &stranger, 1),
            )
            .with_dispatch(id),
        )
        .await?;
    let conversation = Running::conversation(&core, zopu_conversation::Config::default());
    let end = turn_end(&bus, &org, project, message.request).await?;
    conversation.stop().await?;
    assert_eq!(
        end.decode::<pb::DispatchFailed>()?
            .reason
            .context("reason")?
            .code,
        "agent.wrong_project"
    );
    let rejected =
        events_of::<pb::AgentRejected>(&bus, &org, project, Some(message.request)).await?;
    assert_eq!(rejected.len(), 1);
    assert!(
        events_of::<pb::AgentAcknowledged>(&bus, &org, project, Some(message.request))
            .await?
            .is_empty()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_used_up_daily_model_budget_ends_the_turn_visibly_without_a_model_call() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    // Every service and the user read one manual clock, an hour before a UTC midnight.
    let clock = ManualClock::starting_at(time::macros::datetime!(2030-03-01 23:00 UTC));
    let core = CoreConfig {
        clock: clock.clock(),
        ..zopu_tests::core_config(&server, dir.path())
    };
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (acme, other) = (org("acme"), org("other"));
    let (project, theirs) = (ProjectId::new(), ProjectId::new());
    let respond = |message: &str| {
        Scripted::tool_call(
            "call_1",
            "respond",
            &json!({ "message": message }).to_string(),
        )
    };
    let llm = FakeOpenAiServer::start([
        respond("Hello there."),
        respond("Good morning: a new day, a new budget."),
        respond("Hello there."),
    ])
    .await?;
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(
        &core,
        zopu_conversation::Config {
            daily_model_tokens_per_org: 10,
            ..openai(&llm)
        },
    );
    setup_project(&bus, &acme, project).await?;
    // The first turn calls the model, which reports more tokens than the budget.
    let first = send_at(&bus, &core.clock, &acme, project, "Hi").await?;
    let end = turn_end(&bus, &acme, project, first.request).await?;
    ensure!(end.is::<pb::DispatchCompleted>(), "first turn: {end:?}");
    let used = events_of::<pb::AgentLlmCompleted>(&bus, &acme, project, Some(first.request))
        .await?
        .iter()
        .map(|event| {
            let completed = event.decode::<pb::AgentLlmCompleted>()?;
            anyhow::Ok(completed.prompt_tokens + completed.completion_tokens)
        })
        .sum::<Result<u32>>()?;
    assert!(used > 10, "the scripted reply reports {used} tokens");
    // The next message of the organization ends with a visible failure, and no call.
    let second = send_at(&bus, &core.clock, &acme, project, "Hi again").await?;
    let end = turn_end(&bus, &acme, project, second.request).await?;
    ensure!(end.is::<pb::DispatchFailed>(), "second turn: {end:?}");
    let finals = events_of::<pb::AgentFinal>(&bus, &acme, project, Some(second.request)).await?;
    assert_eq!(finals.len(), 1);
    let last = finals[0].decode::<pb::AgentFinal>()?;
    let failure = last.failure.context("the final carries the failure")?;
    assert_eq!(failure.code, "budget.exceeded");
    assert!(
        failure
            .message
            .contains("conversation.daily_model_tokens_per_org")
            && last.text.contains("budget"),
        "{failure:?} / {}",
        last.text
    );
    assert_eq!(llm.request_count(), 1);
    // The budget is per UTC day: after midnight the organization may call the model again.
    clock.advance(Duration::from_secs(2 * 3_600));
    let next_day = send_at(&bus, &core.clock, &acme, project, "Good morning").await?;
    let end = turn_end(&bus, &acme, project, next_day.request).await?;
    ensure!(end.is::<pb::DispatchCompleted>(), "next day: {end:?}");
    assert_eq!(llm.request_count(), 2);
    // Another organization has its own budget.
    setup_project(&bus, &other, theirs).await?;
    let third = send_at(&bus, &core.clock, &other, theirs, "Hi").await?;
    let end = turn_end(&bus, &other, theirs, third.request).await?;
    ensure!(end.is::<pb::DispatchCompleted>(), "other org: {end:?}");
    assert_eq!(llm.request_count(), 3);
    conversation.stop().await?;
    dispatch.stop().await?;
    Ok(())
}

/// Issue 48 item 16 with a model configured: a question about running,
/// building or testing the project is answered from the commands
/// onboarding recorded in summary.md, verified ones first, without a model
/// call; a question about the tests' code still goes to the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_build_and_test_questions_are_answered_from_onboarding_before_the_model() -> Result<()>
{
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let acme = org("acme");
    let project = ProjectId::new();
    let llm = FakeOpenAiServer::start([Scripted::tool_call(
        "call_1",
        "respond",
        &json!({ "message": "The tests live in tests/ and share a fixture module." }).to_string(),
    )])
    .await?;
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(&core, openai(&llm));
    setup_project(&bus, &acme, project).await?;
    let summary = pb::ContextPublished {
        document_id: "summary".into(),
        kind: "repository_summary".into(),
        title: "summary.md".into(),
        content_type: "text/markdown".into(),
        body: "# shop — repository summary\n\n## Project purpose\n\nA shop.\n\n\
               ## Likely run/build/test commands\n\n\
               - `cargo test` — run the tests — *inferred* — Cargo convention; not run\n\
               - `make test` — test — **verified** — declared in Makefile line 21\n"
            .into(),
        revision: 1,
        ..Default::default()
    };
    Publisher::new(bus.clone(), "specialists", None)
        .append(NewEvent::root(
            acme.clone(),
            project,
            &summary,
            format!("project:{project}:summary:1"),
            None,
        ))
        .await?;

    let asked = send(&bus, &acme, project, "How do I run the tests?").await?;
    let end = turn_end(&bus, &acme, project, asked.request).await?;
    ensure!(end.is::<pb::DispatchCompleted>(), "{end:?}");
    let replies = events_of::<pb::AgentMessage>(&bus, &acme, project, Some(asked.request)).await?;
    ensure!(replies.len() == 1, "one reply: {replies:?}");
    let answer = replies[0].decode::<pb::AgentMessage>()?;
    ensure!(
        answer
            .text
            .starts_with("From what onboarding found: `make test` (test; verified"),
        "the verified command first: {}",
        answer.text
    );
    assert_eq!(answer.provider, "offline", "decided by the rules");
    assert_eq!(llm.request_count(), 0, "no model call for it");

    let asked = send(&bus, &acme, project, "How are the tests organized?").await?;
    let end = turn_end(&bus, &acme, project, asked.request).await?;
    ensure!(end.is::<pb::DispatchCompleted>(), "{end:?}");
    assert_eq!(
        llm.request_count(),
        1,
        "a question about the tests' code asks the model"
    );
    conversation.stop().await?;
    dispatch.stop().await?;
    Ok(())
}

/// Clicks `action_id` on `artifact` as a user would (through the command
/// the gateway and CLI share); returns the click's request id.
async fn click(
    bus: &Bus,
    org: &OrgId,
    project: ProjectId,
    artifact: &zopu_schema::ArtifactId,
    action_id: &str,
) -> Result<EventId> {
    let request = EventId::new();
    let requester = zopu_core::commands::Requester::new(org.clone(), request.into(), user());
    let event =
        zopu_core::commands::send_action(&requester, project, &artifact.to_string(), action_id)?;
    Publisher::new(bus.clone(), "gateway", None)
        .append(event)
        .await?;
    Ok(request)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_on_an_issue_draft_requests_one_approval_which_expires_undecided() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("acme"), ProjectId::new());
    setup_project_with(&bus, &org, project, false).await?;
    // An issue flow the agent requested and its published draft, an
    // exploration's report (whose card has no publish), and a second draft.
    let agent = Publisher::new(bus.clone(), "conversation", None);
    let artifacts = Publisher::new(bus.clone(), "artifacts", None);
    let mut drafts = Vec::new();
    for flow_type in [
        pb::FlowType::Issue,
        pb::FlowType::Explore,
        pb::FlowType::Issue,
    ] {
        let flow_run = zopu_schema::FlowRunId::new();
        let requested = pb::FlowRequested {
            flow_type: flow_type as i32,
            source_event_id: EventId::new().to_string(),
            ..Default::default()
        };
        agent
            .append(
                NewEvent::root(
                    org.clone(),
                    project,
                    &requested,
                    format!("test:flow:{flow_run}"),
                    None,
                )
                .with_flow_run(flow_run),
            )
            .await?;
        let artifact = zopu_schema::ArtifactId::new();
        let published = pb::ArtifactPublished {
            artifact_id: artifact.to_string(),
            revision: 1,
            kind: if flow_type == pb::FlowType::Issue {
                pb::ArtifactKind::Issue
            } else {
                pb::ArtifactKind::Exploration
            } as i32,
            title: "Retry failed payments".into(),
            ..Default::default()
        };
        artifacts
            .append(
                NewEvent::root(
                    org.clone(),
                    project,
                    &published,
                    format!("test:artifact:{artifact}"),
                    None,
                )
                .with_flow_run(flow_run),
            )
            .await?;
        drafts.push(artifact);
    }
    let ttl = Duration::from_secs(2);
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(
        &core,
        zopu_conversation::Config {
            approval_ttl: ttl,
            approval_sweep_interval: Duration::from_millis(200),
            ..zopu_conversation::Config::default()
        },
    );

    // Two clicks on the draft's publish, one on the report's: one approval.
    let clicks = [
        (
            click(&bus, &org, project, &drafts[0], "publish").await?,
            "approval_requested",
        ),
        (
            click(&bus, &org, project, &drafts[0], "publish").await?,
            "approval_requested",
        ),
        (
            click(&bus, &org, project, &drafts[1], "publish").await?,
            "noted",
        ),
    ];
    let mut turns = Vec::new();
    for (request, outcome) in clicks {
        let end = turn_end(&bus, &org, project, request).await?;
        assert_eq!(end.decode::<pb::DispatchCompleted>()?.outcome, outcome);
        turns.push(end.dispatch_id);
    }
    let expired = wait_for(
        &bus,
        &subjects::event(&org, &project, pb::ApprovalExpired::TYPE),
        LONG,
        |_| true,
    )
    .await?;
    let requests = events_of::<pb::ApprovalRequested>(&bus, &org, project, None).await?;
    assert_eq!(requests.len(), 1, "one approval per draft: {requests:?}");
    let requested = requests[0].decode::<pb::ApprovalRequested>()?;
    assert_eq!(requested.action, "issue.publish");
    assert_eq!(
        requested.approval_id,
        format!("approval:{}:issue.publish", drafts[0])
    );
    let click_event = history(
        &bus,
        &subjects::event(&org, &project, pb::TimelineActionSent::TYPE),
    )
    .await?
    .into_iter()
    .map(|(_, event)| event)
    .next()
    .context("the first click")?;
    assert_eq!(
        requested.expires_at,
        zopu_schema::envelope::format_time(click_event.time + ttl),
        "the expiry is the click's time plus approval_ttl"
    );
    assert!(requested.evidence.contains(&drafts[0].to_string()));
    let parameters: serde_json::Value = serde_json::from_str(&requested.parameters_json)?;
    assert_eq!(parameters["artifact_id"], drafts[0].to_string());
    assert_eq!(requests[0].causation_id, click_event.id);
    // The run log joins approvals to the turn that asked by dispatch id.
    assert!(turns[0].is_some());
    assert_eq!(requests[0].dispatch_id, turns[0], "the first click's turn");
    // It closed as expired once, under the one decision key, caused by the request.
    assert_eq!(
        expired.decode::<pb::ApprovalExpired>()?.approval_id,
        requested.approval_id
    );
    assert_eq!(expired.causation_id, requests[0].id);
    assert_eq!(
        expired.idempotency_key,
        keys::approval_decision(&project, &requested.approval_id)
    );
    // Sweeps go on after the expiry: a later approval (the second draft's)
    // expires through them, and the first still expired once.
    let later = click(&bus, &org, project, &drafts[2], "publish").await?;
    let end = turn_end(&bus, &org, project, later).await?;
    assert_eq!(
        end.decode::<pb::DispatchCompleted>()?.outcome,
        "approval_requested"
    );
    let later_approval = format!("approval:{}:issue.publish", drafts[2]);
    wait_for(
        &bus,
        &subjects::event(&org, &project, pb::ApprovalExpired::TYPE),
        LONG,
        |event| {
            event
                .decode::<pb::ApprovalExpired>()
                .is_ok_and(|expired| expired.approval_id == later_approval)
        },
    )
    .await?;
    let first_expiries = events_of::<pb::ApprovalExpired>(&bus, &org, project, None)
        .await?
        .iter()
        .filter(|event| {
            event
                .decode::<pb::ApprovalExpired>()
                .is_ok_and(|expired| expired.approval_id == requested.approval_id)
        })
        .count();
    assert_eq!(first_expiries, 1);
    conversation.stop().await?;
    dispatch.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_approvals_and_decides_a_pending_one_only_once() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("acme"), ProjectId::new());
    let agent = Publisher::new(bus.clone(), "conversation", None);
    for id in ["approval:a", "approval:b", "approval:lapsed"] {
        let requested = pb::ApprovalRequested {
            approval_id: id.into(),
            action: "issue.publish".into(),
            detail: format!("Publish {id}."),
            dry_run: true,
            expires_at: if id == "approval:lapsed" {
                "2001-01-01T00:00:00Z"
            } else {
                "2999-01-01T00:00:00Z"
            }
            .into(),
            ..Default::default()
        };
        agent
            .append(NewEvent::root(
                org.clone(),
                project,
                &requested,
                format!("test:{id}"),
                None,
            ))
            .await?;
    }
    let zopu = zopu_tests::zopu_binary(&zopu_tests::workspace_root())?;
    let url = server.url();
    let project_arg = project.to_string();
    let cli = |args: &[&str]| {
        let mut command = std::process::Command::new(&zopu);
        command
            .args(["--nats", url.as_str(), "--json", "approvals"])
            .args(args)
            .args(["--org", "acme"])
            .env("USER", "lead");
        command.output()
    };
    // No $USER: the reviewer is the account running zopu, never a made-up
    // `cli` (with no account name at all it is refused; see the CLI's
    // unit test `the_operator_is_the_one_named_else_the_user_else_refused`).
    let approved = std::process::Command::new(&zopu)
        .args(["--nats", url.as_str(), "approvals", "approve"])
        .args([project_arg.as_str(), "approval:a", "--org", "acme"])
        .env_remove("USER")
        .env_remove("LOGNAME")
        .env_remove("ZOPU_OPERATOR")
        .output()?;
    ensure!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    let again = cli(&[
        "reject",
        &project_arg,
        "approval:a",
        "--reason",
        "changed my mind",
    ])?;
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already approved"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let lapsed = cli(&["approve", &project_arg, "approval:lapsed"])?;
    assert!(!lapsed.status.success());
    assert!(String::from_utf8_lossy(&lapsed.stderr).contains("expired"));
    let unknown = cli(&["approve", &project_arg, "approval:none"])?;
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("has no approval"));
    // `--as` names the reviewer over $USER.
    let rejected = cli(&[
        "reject",
        &project_arg,
        "approval:b",
        "--reason",
        "Not this sprint.",
        "--as",
        "ops",
    ])?;
    ensure!(
        rejected.status.success(),
        "{}",
        String::from_utf8_lossy(&rejected.stderr)
    );

    let listed = cli(&["list", &project_arg])?;
    ensure!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let account = account_name()?;
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let seen: Vec<(&str, &str, &str, &str)> = rows
        .iter()
        .map(|row| {
            (
                row["approval_id"].as_str().unwrap_or(""),
                row["status"].as_str().unwrap_or(""),
                row["decided_by"].as_str().unwrap_or(""),
                row["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("approval:a", "approved", account.as_str(), ""),
            ("approval:b", "rejected", "ops", "Not this sprint."),
            ("approval:lapsed", "pending", "", ""),
        ]
    );
    let pending = cli(&["list", &project_arg, "--status", "approved"])?;
    assert_eq!(String::from_utf8_lossy(&pending.stdout).lines().count(), 1);
    // One decision each, stored with the reviewer.
    assert_eq!(
        events_of::<pb::ApprovalGranted>(&bus, &org, project, None)
            .await?
            .len(),
        1
    );
    assert_eq!(
        events_of::<pb::ApprovalDenied>(&bus, &org, project, None)
            .await?
            .len(),
        1
    );
    Ok(())
}

/// The account `zopu` runs as without `$USER`: what `id -un` says.
fn account_name() -> Result<String> {
    let id = std::process::Command::new("id").arg("-un").output()?;
    ensure!(id.status.success(), "id -un failed");
    let account = String::from_utf8(id.stdout)?.trim().to_owned();
    ensure!(!account.is_empty() && account != "cli");
    Ok(account)
}

/// A published issue draft of an issue flow the agent requested and
/// completed with `issue` as its result.
async fn issue_draft(
    bus: &Bus,
    org: &OrgId,
    project: ProjectId,
    issue: &zopu_schema::flow_result::IssueResult,
) -> Result<zopu_schema::ArtifactId> {
    let flow_run = zopu_schema::FlowRunId::new();
    let artifact = zopu_schema::ArtifactId::new();
    let requested = pb::FlowRequested {
        flow_type: pb::FlowType::Issue as i32,
        source_event_id: EventId::new().to_string(),
        ..Default::default()
    };
    let completed = pb::FlowCompleted {
        flow_type: pb::FlowType::Issue as i32,
        summary: issue.summary.clone(),
        result_json: serde_json::to_string(issue)?,
        ..Default::default()
    };
    let published = pb::ArtifactPublished {
        artifact_id: artifact.to_string(),
        revision: 1,
        kind: pb::ArtifactKind::Issue as i32,
        title: issue.title.clone(),
        ..Default::default()
    };
    let agent = Publisher::new(bus.clone(), "conversation", None);
    let specialists = Publisher::new(bus.clone(), "specialists", None);
    let artifacts = Publisher::new(bus.clone(), "artifacts", None);
    let root = |payload: &dyn Fn() -> NewEvent| payload().with_flow_run(flow_run);
    agent
        .append(root(&|| {
            NewEvent::root(
                org.clone(),
                project,
                &requested,
                format!("test:flow:{flow_run}"),
                None,
            )
        }))
        .await?;
    specialists
        .append(root(&|| {
            NewEvent::root(
                org.clone(),
                project,
                &completed,
                format!("test:flow:{flow_run}:completed"),
                None,
            )
        }))
        .await?;
    artifacts
        .append(root(&|| {
            NewEvent::root(
                org.clone(),
                project,
                &published,
                format!("test:artifact:{artifact}"),
                None,
            )
        }))
        .await?;
    Ok(artifact)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_issue_draft_is_published_to_the_tracker_once_and_the_kill_switch_holds()
-> Result<()> {
    use zopu_core::commands::{Decision, Requester, decide_approval, disable_agent};
    use zopu_schema::approval::{self, PublishIssue};
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path().join("data").as_path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("acme"), ProjectId::new());
    setup_project_with(&bus, &org, project, true).await?;
    let tracker = zopu_tests::tracker::FakeTracker::start().await?;
    tracker.fail_next_creates(1);
    let token_file = dir.path().join("tracker-token");
    std::fs::write(&token_file, "ghp_conversationTestToken0123456789abcd")?;
    let issue = zopu_schema::flow_result::IssueResult {
        title: "Retry failed payments".into(),
        summary: "Payments that fail are lost.".into(),
        acceptance_criteria: vec!["A failed payment is retried three times".into()],
        ..Default::default()
    };
    let published = issue_draft(&bus, &org, project, &issue).await?;
    let paused = issue_draft(
        &bus,
        &org,
        project,
        &zopu_schema::flow_result::IssueResult {
            title: "Add a refund endpoint".into(),
            ..Default::default()
        },
    )
    .await?;
    let dispatch = Running::dispatch(&core);
    let conversation = Running::conversation(
        &core,
        zopu_conversation::Config {
            dry_run: false,
            ..zopu_conversation::Config::default()
        },
    );
    let executor_config = zopu_executor::Config {
        dry_run: false,
        retry_backoff: Duration::from_millis(50),
        tracker: zopu_executor::TrackerConfig {
            base_url: tracker.base_url(),
            token_file: token_file.display().to_string(),
            ..Default::default()
        },
        ..Default::default()
    };
    let shutdown = Shutdown::new();
    let executor = {
        let (core, stop) = (core.clone(), shutdown.clone());
        tokio::spawn(async move {
            Ok::<_, anyhow::Error>(zopu_executor::run(core, executor_config, stop).await?)
        })
    };
    let reviewer = Requester::new(org.clone(), EventId::new().into(), user());
    let gateway = Publisher::new(bus.clone(), "gateway", None);
    let outcome = |approval_id: String| {
        let bus = bus.clone();
        let org = org.clone();
        async move {
            let key = keys::approval_execution(&project, &approval_id);
            wait_for(
                &bus,
                &subjects::project_events(&org, &project),
                LONG,
                |event| event.idempotency_key == key,
            )
            .await
        }
    };

    // Publish clicked: the approval carries the issue exactly as it will be sent.
    for _ in 0..2 {
        let request = click(&bus, &org, project, &published, "publish").await?;
        let end = turn_end(&bus, &org, project, request).await?;
        assert_eq!(
            end.decode::<pb::DispatchCompleted>()?.outcome,
            "approval_requested"
        );
    }
    let approval_id = format!("approval:{published}:issue.publish");
    let requests = events_of::<pb::ApprovalRequested>(&bus, &org, project, None).await?;
    assert_eq!(requests.len(), 1, "two clicks, one approval");
    let requested = requests[0].decode::<pb::ApprovalRequested>()?;
    let parameters = PublishIssue::parse(&requested.parameters_json)?;
    assert_eq!(
        parameters.repository, "acme/shop",
        "from the project's repository URL"
    );
    assert_eq!(parameters.title, "Retry failed payments");
    assert_eq!(parameters.body, issue.markdown());
    assert!(!requested.dry_run);

    // Approved by a reviewer: one issue, after one transient failure.
    gateway
        .append(decide_approval(
            &reviewer,
            project,
            &approval_id,
            &Decision::Approve,
        )?)
        .await?;
    let created = outcome(approval_id.clone())
        .await?
        .decode::<pb::TrackerIssueCreated>()?;
    let issues = tracker.issues();
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert_eq!(
        (issues[0].repository.as_str(), issues[0].title.as_str()),
        ("acme/shop", "Retry failed payments")
    );
    assert!(issues[0].body.starts_with(&issue.markdown()));
    assert!(
        issues[0]
            .body
            .ends_with(&approval::issue_marker(&approval_id))
    );
    assert_eq!(
        created.url,
        format!("{}/acme/shop/issues/1", tracker.base_url())
    );
    assert_eq!((created.number, created.found_existing), (1, false));
    assert_eq!(created.artifact_id, published.to_string());
    let posts = tracker
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .count();
    assert_eq!(posts, 2, "the first create answered 502 and was retried");

    // The kill switch: a draft approved while the agent is disabled is not published.
    let request = click(&bus, &org, project, &paused, "publish").await?;
    turn_end(&bus, &org, project, request).await?;
    gateway
        .append(disable_agent(&reviewer, project, "maintenance")?)
        .await?;
    let paused_id = format!("approval:{paused}:issue.publish");
    gateway
        .append(decide_approval(
            &reviewer,
            project,
            &paused_id,
            &Decision::Approve,
        )?)
        .await?;
    let refused = outcome(paused_id).await?.decode::<pb::ExecutionFailed>()?;
    assert_eq!(
        refused.reason.unwrap_or_default().code,
        "executor.kill_switch"
    );
    assert_eq!(
        tracker.issues().len(),
        1,
        "nothing published while disabled"
    );
    assert_eq!(
        tracker
            .requests()
            .iter()
            .filter(|r| r.method == "POST")
            .count(),
        2
    );

    shutdown.cancel();
    executor.await??;
    conversation.stop().await?;
    dispatch.stop().await
}
