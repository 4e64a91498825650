//! OpenTelemetry traces across services (issue 20): every service runs as
//! its own `zopu run` process with the OTLP exporter pointed at an
//! in-test OTLP/HTTP receiver; a `zopu send` turn that the (fake) model
//! answers with an exploration flow must show up as one trace, started by
//! the CLI's append and continued through the `traceparent` of every event
//! by dispatch, conversation, specialists and artifacts, with the GenAI
//! attributes on the model span and nothing of the message in any
//! attribute. The spans still buffered when the services stop are flushed
//! on shutdown: the receiver is read only after every process exited.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::json;
use zopu_llm::test_support::{FAKE_MODEL, FakeOpenAiServer, Scripted};
use zopu_runtime::telemetry::otlp_sink::{AttributeValue, OtlpSink, ReceivedSpan, Retention};
use zopu_schema::{Event, pb, subjects};
use zopu_tests::fleet::{Fleet, FleetConfig, REACTION_SERVICES};
use zopu_tests::{NatsServer, bus, fixtures, history, wait_for, workspace_root, zopu_binary};

const LONG: Duration = Duration::from_secs(240);
const QUESTION: &str = "How does main handle the greeting?";
/// The variable holding the fake model's key (not a `ZOPU_` setting).
const MODEL_KEY_VARIABLE: &str = "TRACES_MODEL_KEY";

fn text(span: &ReceivedSpan, key: &str) -> Option<String> {
    match span.attribute(key) {
        Some(AttributeValue::Text(value)) => Some(value.clone()),
        _ => None,
    }
}

fn describe(spans: &[&ReceivedSpan]) -> String {
    spans
        .iter()
        .map(|span| format!("{} {} {:?}", span.service_name, span.name, span.attributes))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_spans_a_turn_across_every_service_with_the_model_call() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let sink = OtlpSink::start(Retention::Keep).await?;
    let explore = json!({
        "acknowledgement": "On it, tracing the greeting.",
        "title": "Explore the greeting",
        "request": "Trace how main prints the greeting."
    });
    let model = FakeOpenAiServer::start([
        Scripted::tool_call("call_1", "explore", &explore.to_string()),
        Scripted::text("The greeting is printed by main."),
    ])
    .await?;
    let dir = tempfile::tempdir()?;
    let repo = fixtures::demo_repository(dir.path())?;
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint()),
        ("ZOPU_CONVERSATION__PROVIDER", "openai".to_owned()),
        ("ZOPU_CONVERSATION__OPENAI__BASE_URL", model.base_url()),
        ("ZOPU_CONVERSATION__OPENAI__MODEL", FAKE_MODEL.to_owned()),
        (
            "ZOPU_CONVERSATION__OPENAI__API_KEY_ENV",
            MODEL_KEY_VARIABLE.to_owned(),
        ),
        (MODEL_KEY_VARIABLE, "traces-key".to_owned()),
    ];
    let mut fleet = Fleet::new(
        &zopu_binary(&workspace_root())?,
        &dir.path().join("fleet"),
        FleetConfig::single_node(
            server.url(),
            env.into_iter()
                .map(|(name, value)| (name.to_owned(), value))
                .collect(),
        ),
    )?;
    for service in REACTION_SERVICES {
        fleet.start(service, 1)?;
    }

    let project = fleet.create_project("acme", &repo, LONG).await?;
    fleet
        .send("acme", &project, QUESTION, Duration::from_secs(200), &[0])
        .await?;

    // The message's chain, from the stream: its trace is the CLI append's.
    let sent = history(
        &bus,
        &subjects::events_of_type(pb::TimelineMessageSent::TYPE),
    )
    .await?
    .into_iter()
    .map(|(_, event)| event)
    .find(|event| event.project_id.to_string() == project)
    .context("the message is not stored")?;
    let traceparent = sent
        .traceparent
        .clone()
        .context("the message carries no traceparent")?;
    let trace_id = traceparent
        .split('-')
        .nth(1)
        .context("traceparent without a trace id")?
        .to_owned();
    let published = wait_for(
        &bus,
        &subjects::events_of_type(pb::ArtifactPublished::TYPE),
        LONG,
        |event| event.correlation_id == sent.correlation_id,
    )
    .await?;
    ensure!(
        published
            .traceparent
            .as_deref()
            .is_some_and(|value| value.contains(&trace_id)),
        "the artifact of the turn is not in the message's trace: {:?} vs {traceparent}",
        published.traceparent
    );
    // Every flow the conversation agent requested (onboarding, then the
    // exploration) started exactly once: its `flow.started`, which records
    // the run's definition, is not taken for the request.
    let in_project = |event: &zopu_schema::Envelope| event.project_id.to_string() == project;
    let flows_of = |events: Vec<(u64, zopu_schema::Envelope)>| -> Vec<String> {
        let mut flows: Vec<String> = events
            .into_iter()
            .map(|(_, event)| event)
            .filter(in_project)
            .filter_map(|event| event.flow_run_id.map(|flow| flow.to_string()))
            .collect();
        flows.sort();
        flows
    };
    let requested =
        flows_of(history(&bus, &subjects::events_of_type(pb::FlowRequested::TYPE)).await?);
    let started = flows_of(history(&bus, &subjects::events_of_type(pb::FlowStarted::TYPE)).await?);
    ensure!(
        requested.len() == 2 && started == requested,
        "each requested flow starts once: requested {requested:?}, started {started:?}"
    );

    // Stopping every service flushes what its exporter still holds.
    for service in REACTION_SERVICES {
        ensure!(
            fleet.stop(service, 1)?,
            "{service} did not stop cleanly:\n{}",
            fleet.log_tail(&Fleet::instance(service, 1), 40)
        );
    }

    let spans = sink.spans();
    let in_trace: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|span| span.trace_id == trace_id)
        .collect();
    let services: BTreeSet<&str> = in_trace
        .iter()
        .map(|span| span.service_name.as_str())
        .collect();
    for service in [
        "zopu-cli",
        "zopu-dispatch",
        "zopu-conversation",
        "zopu-specialists",
        "zopu-artifacts",
    ] {
        ensure!(
            services.contains(service),
            "no span of {service} in trace {trace_id}; it has:\n{}",
            describe(&in_trace)
        );
    }
    let root = in_trace
        .iter()
        .find(|span| span.parent_span_id.is_empty() || span.parent_span_id == "0".repeat(16))
        .context("the trace has no root")?;
    ensure!(
        root.service_name == "zopu-cli"
            && root.name == "append"
            && text(root, "event_type").as_deref() == Some(pb::TimelineMessageSent::TYPE),
        "the trace does not start at the user's command: {root:?}"
    );
    let dispatch_handle = in_trace
        .iter()
        .find(|span| {
            span.service_name == "zopu-dispatch"
                && span.name == "handle"
                && text(span, "event_type").as_deref() == Some(pb::TimelineMessageSent::TYPE)
        })
        .context("no handling span of dispatch for the message")?;
    ensure!(
        dispatch_handle.parent_span_id == root.span_id,
        "dispatch's handling span does not continue the message's traceparent"
    );
    ensure!(
        text(dispatch_handle, "consumer").is_some_and(|consumer| !consumer.is_empty())
            && dispatch_handle.attribute("stream_sequence").is_some(),
        "the handling span lacks its attributes: {dispatch_handle:?}"
    );
    ensure!(
        in_trace.iter().any(|span| span.name == "append"
            && span.service_name == "zopu-conversation"
            && text(span, "result").as_deref() == Some("stored")
            && text(span, "subject").is_some()),
        "no append span of the conversation with its subject and result"
    );

    let chat = in_trace
        .iter()
        .find(|span| text(span, "gen_ai.operation.name").as_deref() == Some("chat"))
        .with_context(|| format!("no model span in the trace:\n{}", describe(&in_trace)))?;
    ensure!(
        chat.service_name == "zopu-conversation" && chat.name == format!("chat {FAKE_MODEL}"),
        "{chat:?}"
    );
    ensure!(text(chat, "gen_ai.request.model").as_deref() == Some(FAKE_MODEL));
    ensure!(text(chat, "gen_ai.response.model").as_deref() == Some(FAKE_MODEL));
    ensure!(text(chat, "gen_ai.provider.name").is_some());
    ensure!(chat.attribute("gen_ai.usage.input_tokens") == Some(&AttributeValue::Integer(12)));
    ensure!(chat.attribute("gen_ai.usage.output_tokens") == Some(&AttributeValue::Integer(7)));
    ensure!(
        chat.attribute("gen_ai.response.finish_reasons")
            == Some(&AttributeValue::List(vec![AttributeValue::Text(
                "tool_calls".into()
            )])),
        "{chat:?}"
    );

    ensure!(
        in_trace
            .iter()
            .any(|span| span.service_name == "zopu-specialists"
                && text(span, "gen_ai.operation.name").as_deref() == Some("execute_tool")
                && text(span, "gen_ai.tool.name").is_some()
                && text(span, "outcome").is_some()),
        "no tool span of the specialists:\n{}",
        describe(&in_trace)
    );
    ensure!(
        in_trace
            .iter()
            .any(|span| span.service_name == "zopu-artifacts"
                && span.name == "artifact.build"
                && text(span, "outcome").as_deref() == Some("published")),
        "no artifact build span:\n{}",
        describe(&in_trace)
    );

    // Nothing the user wrote becomes an attribute.
    for span in &spans {
        for (key, value) in &span.attributes {
            if let AttributeValue::Text(value) = value {
                ensure!(
                    !value.contains("greeting") && !value.contains("traces-key"),
                    "{} {}: attribute {key} = {value:?}",
                    span.service_name,
                    span.name
                );
            }
        }
    }
    Ok(())
}
