//! Events recorded by earlier versions still decode. The fixtures are
//! payloads written by the code of their version (`*.v1.pb`: before
//! `agent.llm.completed` carried `reply` and while it carried `reply_json`);
//! they are never regenerated, only added to.

use prost::Message;
use zopu_schema::model_reply::{self, FINISH_TOOL_CALLS};
use zopu_schema::pb;

fn fixture(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn completed(name: &str) -> pb::AgentLlmCompleted {
    pb::AgentLlmCompleted::decode(fixture(name).as_slice()).expect("the recorded payload decodes")
}

#[test]
fn a_v1_reply_with_tool_calls_upcasts_to_the_model_reply() {
    let event = completed("agent_llm_completed_tool_calls.v1.pb");
    assert!(event.reply.is_none(), "v1 events carry only reply_json");
    let reply = model_reply::recorded(&event).expect("the v1 reply_json upcasts");
    assert_eq!(reply.content, None);
    assert_eq!(reply.finish_reason, FINISH_TOOL_CALLS);
    assert!(!reply.finish_reason_other);
    assert_eq!((reply.prompt_tokens, reply.completion_tokens), (812, 41));
    assert_eq!(reply.attempts, 2);
    assert_eq!(reply.model, "gpt-4o-mini");
    assert_eq!(reply.provider_label, "openai");
    assert_eq!(reply.tool_calls.len(), 1);
    let call = &reply.tool_calls[0];
    assert_eq!(
        (call.id.as_str(), call.name.as_str()),
        ("call_1", "start_exploration")
    );
    let arguments: serde_json::Value =
        serde_json::from_str(&call.arguments_json).expect("arguments stay JSON");
    assert_eq!(
        arguments,
        serde_json::json!({"question": "How does login work?", "paths": ["src/auth"], "depth": 2})
    );
}

#[test]
fn a_v1_text_reply_keeps_the_providers_own_finish_reason() {
    let event = completed("agent_llm_completed_text.v1.pb");
    let reply = model_reply::recorded(&event).expect("the v1 reply_json upcasts");
    assert_eq!(
        reply.content.as_deref(),
        Some("{\"purpose\":\"A CLI\",\"starting_areas\":[\"src/main.rs\"]}")
    );
    assert!(reply.tool_calls.is_empty());
    assert_eq!(reply.finish_reason, "eos");
    assert!(reply.finish_reason_other);
    assert_eq!(event.step, "act:3");
}

#[test]
fn the_model_reply_round_trips_through_protobuf() {
    let event = completed("agent_llm_completed_tool_calls.v1.pb");
    let upgraded = pb::AgentLlmCompleted {
        reply: Some(model_reply::recorded(&event).expect("upcasts")),
        reply_json: String::new(),
        ..event
    };
    let decoded = pb::AgentLlmCompleted::decode(upgraded.encode_to_vec().as_slice())
        .expect("the current payload decodes");
    assert_eq!(decoded, upgraded);
    assert_eq!(
        model_reply::recorded(&decoded).expect("reads the reply field"),
        upgraded.reply.clone().expect("set")
    );
}

#[test]
fn the_v1_flow_results_still_decode() {
    for (name, flow_type) in [
        ("flow_completed_exploration.v1.pb", pb::FlowType::Explore),
        ("flow_completed_issue.v1.pb", pb::FlowType::Issue),
        (
            "flow_completed_onboarding.v1.pb",
            pb::FlowType::OnboardingExplore,
        ),
    ] {
        let event = pb::FlowCompleted::decode(fixture(name).as_slice()).expect("decodes");
        assert_eq!(event.flow_type(), flow_type, "{name}");
        let result: serde_json::Value =
            serde_json::from_str(&event.result_json).expect("result_json is JSON");
        assert!(result.is_object(), "{name}");
    }
}
