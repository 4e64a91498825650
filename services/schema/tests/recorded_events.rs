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

/// `result_json` of `flow.completed` events recorded before results carried a
/// version: each validates against the checked-in schema of its flow type's
/// result, reads into today's type as version 1, and writes back unchanged
/// but for the version it now carries. A renamed or retyped field fails here
/// (the schema forbids fields the types do not have) instead of breaking
/// replay.
#[test]
fn the_v1_flow_results_validate_against_the_schema_and_round_trip() {
    use zopu_schema::flow_result::{
        self, CommandStatus, ExplorationResult, FlowResult, IssueResult, OnboardingResult,
        ResultVersion,
    };

    fn recorded<T: FlowResult>(name: &str) -> T {
        let event = pb::FlowCompleted::decode(fixture(name).as_slice()).expect("decodes");
        assert_eq!(event.flow_type(), T::FLOW_TYPE, "{name}");
        let recorded: serde_json::Value =
            serde_json::from_str(&event.result_json).expect("result_json is JSON");
        assert!(
            recorded.get("version").is_none(),
            "{name} predates versions"
        );

        let checked_in: serde_json::Value =
            serde_json::from_str(flow_result::CHECKED_IN).expect("the checked-in schema is JSON");
        assert_eq!(
            checked_in,
            flow_result::schema_document(),
            "run `zopu contract flow-result`"
        );
        let schema = flow_result::schema_of(T::FLOW_TYPE).expect("the flow type has a result");
        let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
        let errors: Vec<String> = validator
            .iter_errors(&recorded)
            .map(|error| format!("{} at {}", error, error.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{name}: {errors:?}");

        let result: T = flow_result::decode(&event.result_json).expect("reads into today's type");
        assert_eq!(result.version(), ResultVersion(1), "{name}");
        let mut expected = recorded;
        expected["version"] = serde_json::json!(1);
        let written = serde_json::to_value(&result).expect("writes");
        assert_eq!(written, expected, "{name}");
        assert!(
            validator.is_valid(&written),
            "{name}: the written result validates"
        );
        result
    }

    let exploration: ExplorationResult = recorded("flow_completed_exploration.v1.pb");
    assert_eq!(
        exploration.findings[0].evidence[0].path,
        "src/auth/login.rs"
    );
    let issue: IssueResult = recorded("flow_completed_issue.v1.pb");
    assert_eq!(issue.acceptance_criteria, ["the 6th attempt is refused"]);
    let onboarding: OnboardingResult = recorded("flow_completed_onboarding.v1.pb");
    assert_eq!(onboarding.languages[0], ("Rust".to_owned(), 30));
    assert_eq!(onboarding.commands[1].status, CommandStatus::Verified);
}

#[test]
fn a_recorded_result_with_a_renamed_field_fails_the_schema() {
    let event = pb::FlowCompleted::decode(fixture("flow_completed_issue.v1.pb").as_slice())
        .expect("decodes");
    let mut renamed: serde_json::Value =
        serde_json::from_str(&event.result_json).expect("result_json is JSON");
    let criteria = renamed
        .as_object_mut()
        .and_then(|object| object.remove("acceptance_criteria"))
        .expect("the fixture has acceptance criteria");
    renamed["acceptance"] = criteria;
    let schema = zopu_schema::flow_result::schema_of(pb::FlowType::Issue).expect("issue result");
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    assert!(!validator.is_valid(&renamed));
}
