//! A real OpenAI-compatible model server as a peer (issue 19 item 4):
//! llama.cpp's `llama-server` (built by `make llama-server` into
//! `./tools/bin`) serving SmolLM2-135M-Instruct, as the provider of both the
//! conversation agent and the specialists, every service a `zopu run`
//! process. A model this small rarely produces a usable decision; what must
//! hold is the protocol against a real server's answers and limits, and the
//! product's promises around it: the acknowledgement never waits on the
//! model, every model call is recorded as an event with its duration, an
//! unusable decision falls back to the offline rules and says so, and the
//! exploration ends (completed, or failed with a reason) — never a crash or
//! a hang.
//!
//! Runs when the binary and the model are installed; `.ci/run` builds them
//! and sets `ZOPU_REQUIRE_LLAMA_SERVER=1`, which turns a missing binary into
//! a failure instead of a skip.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use zopu_schema::{Envelope, pb};
use zopu_tests::fleet::{Fleet, FleetConfig, REACTION_SERVICES, variables};
use zopu_tests::{NatsServer, bus, fixtures, history, wait_for, workspace_root, zopu_binary};

const LONG: Duration = Duration::from_secs(420);
const QUESTION: &str = "Where does main print the greeting?";
/// The variable holding the model's key (not a `ZOPU_` setting).
const MODEL_KEY_VARIABLE: &str = "LLAMA_TEST_KEY";

/// The installed server and model, or why the test cannot run.
fn installed() -> Result<Option<(PathBuf, PathBuf)>> {
    let tools = workspace_root().join("tools");
    let binary = tools.join("bin/llama-server");
    let model = tools.join("models/smollm2-135m.gguf");
    if binary.is_file() && model.is_file() {
        return Ok(Some((binary, model)));
    }
    let why = format!(
        "{} or {} is missing: run `make llama-server`",
        binary.display(),
        model.display()
    );
    if std::env::var_os("ZOPU_REQUIRE_LLAMA_SERVER").is_some_and(|v| !v.is_empty()) {
        bail!("{why} (ZOPU_REQUIRE_LLAMA_SERVER is set)");
    }
    eprintln!("skipped: {why}");
    Ok(None)
}

/// `llama-server` on a free loopback port, killed when dropped.
struct LlamaServer {
    child: tokio::process::Child,
    base_url: String,
}

impl LlamaServer {
    async fn start(binary: &PathBuf, model: &PathBuf, log: &std::path::Path) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = std::fs::File::create(log)?;
        let child = tokio::process::Command::new(binary)
            .args(["-m"])
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            // One slot with the whole context, one thread: the rest of the
            // test suite keeps a core.
            .args(["-c", "8192", "-np", "1", "-t", "1", "--jinja"])
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting llama-server")?;
        let server = Self {
            child,
            base_url: format!("http://127.0.0.1:{port}/v1"),
        };
        let health = format!("http://127.0.0.1:{port}/health");
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(response) = client.get(&health).send().await
                && response.status().is_success()
            {
                return Ok(server);
            }
            ensure!(
                Instant::now() < deadline,
                "llama-server did not become healthy"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A flow's progress about its model: a call, or the fallback.
fn is_model_step(event: &Envelope) -> bool {
    event
        .decode::<pb::FlowProgress>()
        .is_ok_and(|p| p.step.contains("llm") || p.step.contains("model"))
}

/// One line per event for the test's output: type, and what a reader of
/// the note needs (model, duration, reason, text).
fn describe(event: &Envelope) -> String {
    let detail = if let Ok(done) = event.decode::<pb::AgentLlmCompleted>()
        && event.is::<pb::AgentLlmCompleted>()
    {
        format!(
            "{} step {} {} ms, {} prompt + {} completion tokens",
            done.model, done.step, done.duration_ms, done.prompt_tokens, done.completion_tokens
        )
    } else if let Ok(failed) = event.decode::<pb::AgentLlmFailed>()
        && event.is::<pb::AgentLlmFailed>()
    {
        let reason = failed.reason.unwrap_or_default();
        format!("step {} {}: {}", failed.step, reason.code, reason.message)
    } else if let Ok(message) = event.decode::<pb::AgentAcknowledged>()
        && event.is::<pb::AgentAcknowledged>()
    {
        format!("[{}] {}", message.provider, message.text)
    } else if let Ok(message) = event.decode::<pb::AgentMessage>()
        && event.is::<pb::AgentMessage>()
    {
        format!("[{} {}] {}", message.provider, message.status, message.text)
    } else if let Ok(rule) = event.decode::<pb::AgentGuardrailTriggered>()
        && event.is::<pb::AgentGuardrailTriggered>()
    {
        format!("{}: {}", rule.rule, rule.detail)
    } else if let Ok(progress) = event.decode::<pb::FlowProgress>()
        && event.is::<pb::FlowProgress>()
    {
        format!("{} {}", progress.step, progress.note)
    } else if let Ok(failed) = event.decode::<pb::FlowFailed>()
        && event.is::<pb::FlowFailed>()
    {
        format!("{:?}", failed.reason.unwrap_or_default())
    } else if let Ok(done) = event.decode::<pb::FlowCompleted>()
        && event.is::<pb::FlowCompleted>()
    {
        format!("[{}] {}", done.provider, done.summary)
    } else {
        String::new()
    };
    format!("{} {} {detail}", event.time, event.event_type)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_llama_server_answers_a_turn_and_an_exploration_or_the_product_falls_back()
-> Result<()> {
    let Some((binary, model)) = installed()? else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let llama = LlamaServer::start(&binary, &model, &dir.path().join("llama-server.log")).await?;
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let repo = fixtures::demo_repository(dir.path())?;
    let env = [
        ("ZOPU_CONVERSATION__PROVIDER", "openai"),
        ("ZOPU_CONVERSATION__OPENAI__BASE_URL", &llama.base_url),
        ("ZOPU_CONVERSATION__OPENAI__MODEL", "smollm2"),
        ("ZOPU_CONVERSATION__OPENAI__API_KEY_ENV", MODEL_KEY_VARIABLE),
        ("ZOPU_CONVERSATION__OPENAI__REQUEST_TIMEOUT", "60s"),
        ("ZOPU_CONVERSATION__OPENAI__MAX_RETRIES", "1"),
        ("ZOPU_SPECIALISTS__PROVIDER__KIND", "openai"),
        ("ZOPU_SPECIALISTS__PROVIDER__BASE_URL", &llama.base_url),
        ("ZOPU_SPECIALISTS__PROVIDER__MODEL", "smollm2"),
        (
            "ZOPU_SPECIALISTS__PROVIDER__API_KEY_ENV",
            MODEL_KEY_VARIABLE,
        ),
        // llama-server started without --api-key ignores it.
        (MODEL_KEY_VARIABLE, "llama-key"),
        ("ZOPU_SPECIALISTS__PROVIDER__MAX_TOKENS", "256"),
        ("ZOPU_SPECIALISTS__PROVIDER__MAX_RETRIES", "1"),
        ("ZOPU_SPECIALISTS__FLOW__MAX_ITERATIONS", "3"),
    ];
    let mut fleet = Fleet::new(
        &zopu_binary(&workspace_root())?,
        &dir.path().join("fleet"),
        FleetConfig::single_node(server.url(), variables(&env)),
    )?;
    for service in REACTION_SERVICES {
        fleet.start(service, 1)?;
    }
    let project = fleet.create_project("acme", &repo, LONG).await?;
    let events = format!("zopu.evt.acme.{project}.>");
    // Onboarding ends, with the model's summary or the offline one.
    let onboarding = wait_for(&bus, &events, LONG, |event| event.is::<pb::AgentFinal>())
        .await
        .context("onboarding never ended")?;
    ensure!(
        onboarding
            .decode::<pb::AgentFinal>()?
            .failure
            .is_none_or(|f| f.code.is_empty()),
        "onboarding failed: {onboarding:?}"
    );
    // Its model phase: each model call, and the summary's author or the
    // visible fallback.
    let onboarding_flow: Vec<Envelope> = history(&bus, &events)
        .await?
        .into_iter()
        .map(|(_, event)| event)
        .filter(|event| {
            event.correlation_id == onboarding.correlation_id
                && event.flow_run_id.is_some()
                && (!event.is::<pb::FlowProgress>() || is_model_step(event))
        })
        .collect();
    if let (Some(first), Some(last)) = (onboarding_flow.first(), onboarding_flow.last()) {
        eprintln!(
            "onboarding ({:.1}s):",
            (last.time - first.time).as_seconds_f64()
        );
    }
    for event in &onboarding_flow {
        eprintln!("  {}", describe(event));
    }

    // One turn: `zopu send` prints the acknowledgement and the final.
    let sent_at = Instant::now();
    let sent = fleet
        .send(
            "acme",
            &project,
            QUESTION,
            Duration::from_secs(400),
            &[0, 1],
        )
        .await?;
    let turn_took = sent_at.elapsed();
    let all = history(&bus, &events).await?;
    let message = all
        .iter()
        .map(|(_, event)| event)
        .find(|event| {
            event
                .decode::<pb::TimelineMessageSent>()
                .is_ok_and(|m| event.is::<pb::TimelineMessageSent>() && m.text == QUESTION)
        })
        .context("the message is not on the stream")?;
    let of_turn: Vec<&Envelope> = all
        .iter()
        .map(|(_, event)| event)
        .filter(|event| event.correlation_id == message.correlation_id)
        .collect();
    eprintln!("the turn ({:.1}s in all):", turn_took.as_secs_f64());
    for event in &of_turn {
        eprintln!("  {}", describe(event));
    }
    eprintln!("zopu send printed:\n{sent}");

    // The acknowledgement came first and quickly, whatever the model did.
    let acks: Vec<&&Envelope> = of_turn
        .iter()
        .filter(|event| event.is::<pb::AgentAcknowledged>())
        .collect();
    ensure!(acks.len() == 1, "{} acknowledgements", acks.len());
    let ack_after = acks[0].time - message.time;
    ensure!(
        ack_after < time::Duration::seconds(10),
        "acknowledged {ack_after} after the message"
    );
    let model_calls: Vec<&&Envelope> = of_turn
        .iter()
        .filter(|event| event.is::<pb::AgentLlmCompleted>() || event.is::<pb::AgentLlmFailed>())
        .collect();
    ensure!(!model_calls.is_empty(), "no model call was recorded");
    let decided = of_turn
        .iter()
        .find(|event| event.is::<pb::AgentDecided>())
        .context("the turn was never decided")?
        .decode::<pb::AgentDecided>()?;
    let fell_back = of_turn.iter().any(|event| {
        event
            .decode::<pb::AgentGuardrailTriggered>()
            .is_ok_and(|g| event.is::<pb::AgentGuardrailTriggered>() && g.rule == "model_fallback")
    });
    if fell_back {
        // The model's failures are on record, the offline rules decided,
        // and the visible text says so.
        ensure!(decided.provider == "offline", "{decided:?}");
        ensure!(
            of_turn.iter().any(|event| event.is::<pb::AgentLlmFailed>()),
            "a fallback without a recorded model failure"
        );
        ensure!(sent.contains("the built-in rules answered"), "{sent}");
    } else {
        ensure!(decided.provider.starts_with("openai:"), "{decided:?}");
    }
    ensure!(
        of_turn
            .iter()
            .any(|event| event.is::<pb::DispatchCompleted>()),
        "the turn did not complete"
    );
    ensure!(
        !of_turn.iter().any(|event| event.is::<pb::DispatchFailed>()),
        "the turn failed"
    );

    // If the turn asked for an exploration, it ends: completed, or failed
    // with a reason the user sees.
    if of_turn.iter().any(|event| event.is::<pb::FlowRequested>()) {
        let ended = wait_for(&bus, &events, LONG, |event| {
            event.correlation_id == message.correlation_id && event.is::<pb::AgentFinal>()
        })
        .await
        .context("the exploration never ended")?;
        let flow: Vec<Envelope> = history(&bus, &events)
            .await?
            .into_iter()
            .map(|(_, event)| event)
            .filter(|event| {
                event.correlation_id == message.correlation_id
                    && event.flow_run_id.is_some()
                    && (!event.is::<pb::FlowProgress>() || is_model_step(event))
            })
            .collect();
        eprintln!("the exploration:");
        for event in &flow {
            eprintln!("  {}", describe(event));
        }
        let terminal = flow
            .iter()
            .find(|event| event.is::<pb::FlowCompleted>() || event.is::<pb::FlowFailed>())
            .context("no flow.completed or flow.failed")?;
        // An offline result after a model run says why it fell back.
        if let Ok(done) = terminal.decode::<pb::FlowCompleted>()
            && terminal.is::<pb::FlowCompleted>()
            && done.provider == "offline"
        {
            ensure!(
                flow.iter()
                    .any(|event| event
                        .decode::<pb::FlowProgress>()
                        .is_ok_and(|p| event.is::<pb::FlowProgress>()
                            && p.step.ends_with("model:fallback"))),
                "an offline exploration without its fallback note"
            );
        }
        if let Ok(failed) = terminal.decode::<pb::FlowFailed>()
            && terminal.is::<pb::FlowFailed>()
        {
            let reason = failed.reason.context("a failure without a reason")?;
            ensure!(!reason.code.is_empty() && !reason.message.is_empty());
            ensure!(
                ended.decode::<pb::AgentFinal>()?.failure.is_some(),
                "the failure was not shown"
            );
        }
    }
    // Nothing crashed.
    let exited = fleet.reap_exited();
    ensure!(exited.is_empty(), "services exited: {exited:?}");
    for service in REACTION_SERVICES {
        fleet.stop(service, 1)?;
    }
    drop(llama);
    Ok(())
}

/// Questions a user asks about the demo repository: about its code,
/// greetings and thanks, requests to change it, its tests.
const QUESTIONS: [&str; 20] = [
    "Where does main print the greeting?",
    "Hi there!",
    "Which environment variable sets the greeting?",
    "How do I run this service?",
    "What does the README say about the project?",
    "Thanks, that helps.",
    "What happens when GREETING is not set?",
    "Please add a --name flag to the binary.",
    "Which file is the entry point?",
    "What is DATABASE_URL used for?",
    "Can you explain the main function?",
    "Fix the greeting so it ends with an exclamation mark.",
    "What language is this project written in?",
    "Good morning!",
    "Where is the Cargo manifest?",
    "Does the project have any tests?",
    "How is the greeting read from the environment?",
    "Add a test for the default greeting.",
    "What does unwrap_or_else do in main?",
    "Which crate edition does the project use?",
];

/// The share of turns the model decides needs this many of the 20.
const DECIDED_BY_THE_MODEL_MIN: usize = 16;

/// Twenty turns against SmolLM2-135M behind llama-server (the specialists
/// offline, so the flows do not queue in front of the decisions): each is
/// acknowledged first, and at least 16 are decided by the model rather than
/// the offline fallback. `--nocapture` prints each turn's decision, its
/// time and the totals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_local_model_decides_most_turns() -> Result<()> {
    let Some((binary, model)) = installed()? else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let llama = LlamaServer::start(&binary, &model, &dir.path().join("llama-server.log")).await?;
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let repo = fixtures::demo_repository(dir.path())?;
    let env = [
        ("ZOPU_CONVERSATION__PROVIDER", "openai"),
        ("ZOPU_CONVERSATION__OPENAI__BASE_URL", &llama.base_url),
        ("ZOPU_CONVERSATION__OPENAI__MODEL", "smollm2"),
        ("ZOPU_CONVERSATION__OPENAI__API_KEY_ENV", MODEL_KEY_VARIABLE),
        (MODEL_KEY_VARIABLE, "llama-key"),
        ("ZOPU_CONVERSATION__OPENAI__REQUEST_TIMEOUT", "60s"),
        ("ZOPU_CONVERSATION__OPENAI__MAX_RETRIES", "1"),
    ];
    let mut fleet = Fleet::new(
        &zopu_binary(&workspace_root())?,
        &dir.path().join("fleet"),
        FleetConfig::single_node(server.url(), variables(&env)),
    )?;
    for service in REACTION_SERVICES {
        fleet.start(service, 1)?;
    }
    let project = fleet.create_project("acme", &repo, LONG).await?;
    let events = format!("zopu.evt.acme.{project}.>");
    wait_for(&bus, &events, LONG, |event| event.is::<pb::AgentFinal>())
        .await
        .context("onboarding never ended")?;

    let mut by_model = 0;
    let mut decision_times = Vec::new();
    for question in QUESTIONS {
        fleet
            .send(
                "acme",
                &project,
                question,
                Duration::from_secs(300),
                &[0, 1],
            )
            .await?;
        let all = history(&bus, &events).await?;
        let message = all
            .iter()
            .map(|(_, event)| event)
            .filter(|event| {
                event
                    .decode::<pb::TimelineMessageSent>()
                    .is_ok_and(|m| event.is::<pb::TimelineMessageSent>() && m.text == question)
            })
            .last()
            .context("the message is not on the stream")?;
        let of_turn: Vec<&Envelope> = all
            .iter()
            .map(|(_, event)| event)
            .filter(|event| event.correlation_id == message.correlation_id)
            .collect();
        let first_post = of_turn
            .iter()
            .find(|event| {
                event.is::<pb::AgentAcknowledged>()
                    || event.is::<pb::AgentMessage>()
                    || event.is::<pb::AgentBlocked>()
                    || event.is::<pb::AgentFinal>()
            })
            .context("the turn posted nothing")?;
        ensure!(
            first_post.is::<pb::AgentAcknowledged>()
                || !of_turn.iter().any(|e| e.is::<pb::FlowRequested>()),
            "a flow-starting turn whose first post is not its acknowledgement"
        );
        let decided_event = of_turn
            .iter()
            .find(|event| event.is::<pb::AgentDecided>())
            .context("the turn was never decided")?;
        let decided = decided_event.decode::<pb::AgentDecided>()?;
        let took = decided_event.time - message.time;
        decision_times.push(took.as_seconds_f64());
        let model = decided.provider.starts_with("openai:");
        by_model += usize::from(model);
        let failures: Vec<String> = of_turn
            .iter()
            .filter(|event| event.is::<pb::AgentLlmFailed>())
            .map(|event| describe(event))
            .collect();
        eprintln!(
            "{:>5.1}s {:<8} {:?} {question:?} {}",
            took.as_seconds_f64(),
            if model { "model" } else { "fallback" },
            decided.decision(),
            failures.join("; ")
        );
    }
    decision_times.sort_by(f64::total_cmp);
    let mean = decision_times.iter().sum::<f64>() / decision_times.len() as f64;
    eprintln!(
        "decided by the model: {by_model} of {}; time to decision: mean {mean:.1}s, median {:.1}s, max {:.1}s",
        QUESTIONS.len(),
        decision_times[decision_times.len() / 2],
        decision_times[decision_times.len() - 1]
    );
    ensure!(
        by_model >= DECIDED_BY_THE_MODEL_MIN,
        "only {by_model} of {} turns were decided by the model",
        QUESTIONS.len()
    );
    let exited = fleet.reap_exited();
    ensure!(exited.is_empty(), "services exited: {exited:?}");
    for service in REACTION_SERVICES {
        fleet.stop(service, 1)?;
    }
    drop(llama);
    Ok(())
}
