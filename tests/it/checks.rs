//! The check flow (issue 18 item 4, "an environment value set through the
//! API is used where needed"): a user asks the agent to run the tests; the
//! checker runs the test command onboarding verified (`make test`) in a
//! confined scratch copy of the repository with the project's environment
//! value in the program's environment; the program reads it (it prints the
//! value and its digest); the report is a validated artifact. The raw value
//! appears nowhere: not on the stream, not in the object store, not in the
//! secret store's messages, not in a model prompt, not in any service's log
//! (at debug) or file, not in a response or CLI output — while its digest,
//! computed by the program, shows it was used.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::json;
use sha2::{Digest, Sha256};
use zopu_llm::test_support::{FakeOpenAiServer, Scripted};
use zopu_schema::flow_result::{CheckResult, CheckStatus};
use zopu_schema::pb;
use zopu_tests::fleet::{Fleet, FleetConfig, REACTION_SERVICES, variables};
use zopu_tests::{
    NatsServer, bus, fixtures, history, wait_for, wait_for_count, workspace_root, zopu_binary,
};

use crate::secrets::{artifact_texts, contains, secret_bucket_payloads, stream_texts};

const LONG: Duration = Duration::from_secs(180);
const SECRETS_KEY: &str = "checks-test-secrets-key-0123456789abcdef";
const MODEL_KEY_VARIABLE: &str = "CHECKS_TEST_MODEL_KEY";

/// A project whose tests need `API_TOKEN`: `make test` runs `check.sh`,
/// which fails without it and prints it (and its digest) with it.
fn repository_needing_a_token(dir: &Path) -> Result<PathBuf> {
    let repo = dir.join("token-app");
    std::fs::create_dir_all(&repo)?;
    std::fs::write(
        repo.join("README.md"),
        "# token-app\n\nA small service that calls an API with `API_TOKEN`.\n",
    )?;
    std::fs::write(repo.join(".env.example"), "API_TOKEN=\nGREETING=hello\n")?;
    std::fs::write(repo.join("Makefile"), "test:\n\t@sh ./check.sh\n")?;
    std::fs::write(
        repo.join("check.sh"),
        "#!/bin/sh\n\
         if [ -z \"$API_TOKEN\" ]; then echo 'API_TOKEN is not set' >&2; exit 3; fi\n\
         echo \"calling the API with $API_TOKEN\"\n\
         printf 'token digest %s\\n' \"$(printf %s \"$API_TOKEN\" | sha256sum | cut -c1-16)\"\n\
         echo '1 check ok'\n",
    )?;
    fixtures::init_and_commit(&repo, "main", "A service that needs a token")?;
    Ok(repo)
}

/// A check flow's `flow.completed`.
fn check_completed(event: &zopu_schema::Envelope) -> bool {
    event.is::<pb::FlowCompleted>()
        && event
            .decode::<pb::FlowCompleted>()
            .is_ok_and(|completed| completed.flow_type == pb::FlowType::Check as i32)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_runs_the_verified_test_command_with_the_stored_value_which_appears_nowhere_else()
-> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let repo = repository_needing_a_token(dir.path())?;
    let value = ["tok_live_", "Q8v3Lm2Rx9Kp4Wz7Jd5N"].concat();
    let digest: String = hex::encode(Sha256::digest(value.as_bytes()))
        .chars()
        .take(16)
        .collect();

    // The conversation asks a scripted model: check, then answer.
    let check = json!({"acknowledgement": "Running the project's tests now.", "title": "Check: tests", "request": "Run the project's tests."});
    let respond = json!({"message": "The check ran; its report is on the card."});
    let llm = FakeOpenAiServer::start([
        Scripted::tool_call("call_1", "check", &check.to_string()),
        Scripted::tool_call("call_2", "respond", &respond.to_string()),
    ])
    .await?;
    let base_url = llm.base_url();
    let env = [
        ("ZOPU_SECRETS_KEY", SECRETS_KEY),
        ("ZOPU_CONVERSATION__PROVIDER", "openai"),
        ("ZOPU_CONVERSATION__OPENAI__BASE_URL", base_url.as_str()),
        ("ZOPU_CONVERSATION__OPENAI__MODEL", "scripted"),
        ("ZOPU_CONVERSATION__OPENAI__API_KEY_ENV", MODEL_KEY_VARIABLE),
        (MODEL_KEY_VARIABLE, "model-key"),
        ("ZOPU_LOG", "debug"),
    ];
    let fleet_root = dir.path().join("fleet");
    let mut fleet = Fleet::new(
        &zopu_binary(&workspace_root())?,
        &fleet_root,
        FleetConfig::single_node(server.url(), variables(&env)),
    )?;
    for service in REACTION_SERVICES {
        fleet.start(service, 1)?;
    }
    let project = fleet.create_project("acme", &repo, LONG).await?;
    let events = format!("zopu.evt.acme.{project}.>");
    // Onboarding found `make test`, declared in the Makefile.
    let onboarded = wait_for(&bus, &events, LONG, |event| {
        event.is::<pb::FlowCompleted>()
            && event.decode::<pb::FlowCompleted>().is_ok_and(|completed| {
                completed.flow_type == pb::FlowType::OnboardingExplore as i32
            })
    })
    .await
    .context("onboarding never completed")?;
    let onboarding = onboarded.decode::<pb::FlowCompleted>()?.result_json;
    ensure!(
        onboarding.contains("make test"),
        "onboarding found no `make test`: {onboarding}"
    );

    // The value, set through the API.
    let gateway = crate::registry::Gateway::start_configured(
        zopu_tests::core_config(&server, &dir.path().join("gateway")),
        zopu_gateway::Config {
            secrets_key: Some(zopu_core::secret_store::SecretKey::new(
                SECRETS_KEY.as_bytes(),
                "test",
            )?),
            ..Default::default()
        },
    )
    .await?;
    gateway.caught_up(&bus).await?;
    let mut responses = Vec::new();
    let (status, set) = gateway
        .put(
            &format!("/v1/projects/{project}/environment/API_TOKEN"),
            json!({"value": value}),
        )
        .await?;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{set}");
    responses.push(set.to_string());

    // "Run the tests": the check runs, passes, and is reported.
    let sent = fleet
        .send(
            "acme",
            &project,
            "Please run the tests",
            Duration::from_secs(150),
            &[0],
        )
        .await?;
    responses.push(sent.clone());
    let completed = wait_for(&bus, &events, LONG, check_completed)
        .await
        .context("the check never completed")?;
    let result: CheckResult =
        zopu_schema::flow_result::decode(&completed.decode::<pb::FlowCompleted>()?.result_json)?;
    assert_eq!(result.status, CheckStatus::Passed, "{result:?}");
    assert_eq!(
        (result.command.as_str(), result.command_source.as_str()),
        ("make test", "declared in Makefile line 1"),
        "{result:?}"
    );
    assert_eq!(result.exit_code, Some(0));
    assert_eq!(result.environment, ["API_TOKEN"]);
    ensure!(
        result
            .output_tail
            .contains(&format!("token digest {digest}")),
        "the program did not see the value: {}",
        result.output_tail
    );
    ensure!(
        result
            .output_tail
            .contains("calling the API with [redacted:env API_TOKEN]")
            && result.values_redacted == 1,
        "the printed value was not redacted: {result:?}"
    );
    ensure!(
        result.summary.contains("Not set: GREETING"),
        "the summary names the unset value: {}",
        result.summary
    );
    ensure!(
        !result.confinement.is_empty(),
        "it ran confined: {result:?}"
    );
    // The report is published, and the agent says how it ended.
    let published = wait_for(&bus, &events, LONG, |event| {
        event
            .decode::<pb::ArtifactPublished>()
            .is_ok_and(|published| {
                event.is::<pb::ArtifactPublished>()
                    && published.kind == pb::ArtifactKind::CheckReport as i32
            })
    })
    .await
    .context("no check report was published")?;
    let published: pb::ArtifactPublished = published.decode()?;
    ensure!(published.title == "Check: make test", "{published:?}");
    ensure!(
        published.card.as_ref().is_some_and(|card| card
            .facts
            .iter()
            .any(|fact| fact.label == "Status" && fact.value == "passed")),
        "{published:?}"
    );
    let all = history(&bus, &events).await?;
    let finals: Vec<String> = all
        .iter()
        .filter_map(|(_, event)| {
            event
                .decode::<pb::AgentFinal>()
                .ok()
                .filter(|_| event.is::<pb::AgentFinal>())
        })
        .map(|final_message| final_message.text)
        .collect();
    ensure!(
        finals
            .iter()
            .any(|text| text.starts_with("The check passed: `make test` exited 0")),
        "{finals:?}"
    );
    // A later turn's prompt quotes the report's sentence, never the value.
    let asked = fleet
        .send(
            "acme",
            &project,
            "What happened?",
            Duration::from_secs(60),
            &[0],
        )
        .await?;
    responses.push(asked);
    let prompts: Vec<String> = llm
        .requests()
        .iter()
        .map(|request| request.body.clone())
        .collect();
    ensure!(prompts.len() == 2, "{} model calls", prompts.len());
    ensure!(
        prompts[1].contains("The check passed"),
        "the later prompt quotes the check: {}",
        prompts[1]
    );
    // "Run again" on the report's card: a second check, and no model call.
    gateway.caught_up(&bus).await?;
    let (status, clicked) = gateway
        .post(
            &format!("/v1/projects/{project}/actions"),
            json!({"artifact_id": published.artifact_id, "action_id": "run_check"}),
        )
        .await?;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{clicked}");
    responses.push(clicked.to_string());
    let checks = wait_for_count(&bus, &events, LONG, 2, check_completed)
        .await
        .context("the click started no second check")?;
    let again: CheckResult =
        zopu_schema::flow_result::decode(&checks[1].decode::<pb::FlowCompleted>()?.result_json)?;
    assert_eq!(again.status, CheckStatus::Passed, "{again:?}");
    ensure!(llm.requests().len() == 2, "a click asks no model");
    gateway.stop().await?;
    for service in REACTION_SERVICES {
        fleet.stop(service, 1)?;
    }

    // The raw value is nowhere.
    let mut found = Vec::new();
    for (sequence, text) in stream_texts(&bus).await? {
        if text.contains(&value) {
            found.push(format!("event {sequence}"));
        }
    }
    let objects = artifact_texts(&bus).await?;
    ensure!(
        objects.iter().any(|(_, html)| html.contains(&digest)),
        "the report shows the program's output"
    );
    for (name, html) in &objects {
        if html.contains(&value) {
            found.push(format!("object {name}"));
        }
    }
    for payload in secret_bucket_payloads(&bus).await? {
        if contains(&payload, &value) {
            found.push("a secret-store message".to_owned());
        }
    }
    for (index, prompt) in prompts.iter().enumerate() {
        if prompt.contains(&value) {
            found.push(format!("prompt {index}"));
        }
    }
    for text in &responses {
        if text.contains(&value) {
            found.push(format!("a response or CLI output: {text}"));
        }
    }
    let mut files = fixtures::files_under(&fleet_root)?;
    files.extend(fixtures::files_under(&dir.path().join("gateway"))?);
    ensure!(
        files
            .iter()
            .any(|(path, _)| path.ends_with("specialists-1.log")),
        "the specialists' log is among the files searched"
    );
    for (path, bytes) in &files {
        if contains(bytes, &value) {
            found.push(path.display().to_string());
        }
    }
    ensure!(found.is_empty(), "the value survived in: {found:?}");
    Ok(())
}

/// The processes whose command line is exactly `argv`, from `/proc`.
fn processes_running(argv: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = argv
        .iter()
        .flat_map(|arg| [arg.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|cmdline| cmdline == wanted)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (up to `timeout`) until `condition` holds.
async fn until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) -> Result<()> {
    zopu_tests::eventually(what, timeout, || {
        let holds = condition();
        async move { Ok(holds.then_some(())) }
    })
    .await
}

/// Issue 18 item 3 with a real program: a check whose test command runs
/// long is cancelled through the API; its program (and the shell and make
/// above it) is killed, the flow ends `flow.cancelled` well before the
/// program would have, nothing completes after it, and the agent says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_check_kills_its_program_and_ends_at_once() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let repo = dir.path().join("slow-app");
    std::fs::create_dir_all(&repo)?;
    std::fs::write(
        repo.join("README.md"),
        "# slow-app\n\nIts tests take a while.\n",
    )?;
    // 347 s: a duration no other test's program has.
    std::fs::write(repo.join("Makefile"), "test:\n\t@sleep 347\n")?;
    fixtures::init_and_commit(&repo, "main", "Slow tests")?;
    let mut fleet = Fleet::new(
        &zopu_binary(&workspace_root())?,
        &dir.path().join("fleet"),
        FleetConfig::single_node(server.url(), Vec::new()),
    )?;
    for service in REACTION_SERVICES {
        fleet.start(service, 1)?;
    }
    let project = fleet.create_project("acme", &repo, LONG).await?;
    let events = format!("zopu.evt.acme.{project}.>");
    wait_for(&bus, &events, LONG, |event| {
        event.is::<pb::FlowCompleted>()
            && event.decode::<pb::FlowCompleted>().is_ok_and(|completed| {
                completed.flow_type == pb::FlowType::OnboardingExplore as i32
            })
    })
    .await
    .context("onboarding never completed")?;
    let gateway = crate::registry::Gateway::start(&server, &dir.path().join("gateway")).await?;
    // A fresh gateway knows the project once its projection has read it.
    gateway.caught_up(&bus).await?;
    let (status, sent) = gateway
        .post(
            &format!("/v1/projects/{project}/messages"),
            json!({"text": "Please run the tests"}),
        )
        .await?;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{sent}");
    let started = wait_for(&bus, &events, LONG, |event| {
        event.is::<pb::FlowStarted>()
            && event
                .decode::<pb::FlowStarted>()
                .is_ok_and(|started| started.flow_type == pb::FlowType::Check as i32)
    })
    .await?;
    let flow = started.flow_run_id.context("the run's id")?;
    until(LONG, "the check's program runs", || {
        !processes_running(&["sleep", "347"]).is_empty()
    })
    .await?;

    gateway.caught_up(&bus).await?;
    let (status, accepted) = gateway
        .post(
            &format!("/v1/projects/{project}/flows/{flow}/cancel"),
            json!({"reason": "Too slow."}),
        )
        .await?;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{accepted}");
    let ended = wait_for(&bus, &events, LONG, |event| {
        event.flow_run_id == Some(flow)
            && (event.is::<pb::FlowCancelled>()
                || event.is::<pb::FlowCompleted>()
                || event.is::<pb::FlowFailed>())
    })
    .await?;
    ensure!(
        ended.is::<pb::FlowCancelled>(),
        "the check ended {}",
        ended.event_type
    );
    let requested_at = history(&bus, &events)
        .await?
        .iter()
        .find(|(_, event)| event.is::<pb::FlowCancelRequested>())
        .map(|(_, event)| event.time)
        .context("the cancel request")?;
    eprintln!(
        "cancel request to flow.cancelled: {}",
        ended.time - requested_at
    );
    let took = ended.time - started.time;
    ensure!(
        took < time::Duration::seconds(60),
        "the flow ended {took} after it started: it waited for its program"
    );
    until(Duration::from_secs(10), "the program is killed", || {
        processes_running(&["sleep", "347"]).is_empty()
    })
    .await?;
    wait_for(&bus, &events, LONG, |event| {
        event.is::<pb::AgentFinal>()
            && event
                .decode::<pb::AgentFinal>()
                .is_ok_and(|told| told.text.starts_with("I stopped the check."))
    })
    .await
    .context("the agent never said it stopped the check")?;
    let after: Vec<String> = history(&bus, &events)
        .await?
        .iter()
        .filter(|(_, event)| event.flow_run_id == Some(flow) && event.is::<pb::FlowCompleted>())
        .map(|(_, event)| event.event_type.clone())
        .collect();
    ensure!(
        after.is_empty(),
        "nothing completes after the cancel: {after:?}"
    );
    gateway.stop().await?;
    Ok(())
}
