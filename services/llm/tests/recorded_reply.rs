//! A reply recorded by an earlier version (`reply_json` of
//! `agent.llm.completed`, fixtures in `services/schema/tests/fixtures`) reads
//! back as the same reply, and a reply recorded now reads back unchanged.

use prost::Message;
use zopu_llm::{ChatReply, FinishReason, ToolCall, Usage};
use zopu_schema::pb;

fn recorded(name: &str) -> pb::AgentLlmCompleted {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../schema/tests/fixtures")
        .join(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    pb::AgentLlmCompleted::decode(bytes.as_slice()).expect("decodes")
}

fn tool_call_reply() -> ChatReply {
    ChatReply {
        content: None,
        tool_calls: vec![ToolCall {
            id: "call_1".into(),
            name: "start_exploration".into(),
            arguments: serde_json::json!({"question": "How does login work?", "paths": ["src/auth"], "depth": 2}),
        }],
        finish_reason: FinishReason::ToolCalls,
        usage: Usage {
            prompt_tokens: 812,
            completion_tokens: 41,
        },
        attempts: 2,
        model: "gpt-4o-mini".into(),
        provider_label: "openai".into(),
    }
}

#[test]
fn replies_recorded_by_the_previous_version_read_back_the_same() {
    assert_eq!(
        ChatReply::recorded_in(&recorded("agent_llm_completed_tool_calls.v1.pb")).expect("reads"),
        tool_call_reply()
    );
    let text = ChatReply::recorded_in(&recorded("agent_llm_completed_text.v1.pb")).expect("reads");
    assert_eq!(text.finish_reason, FinishReason::Other("eos".into()));
    assert_eq!(
        text.content.as_deref(),
        Some("{\"purpose\":\"A CLI\",\"starting_areas\":[\"src/main.rs\"]}")
    );
    assert_eq!((text.model.as_str(), text.attempts), ("local-model", 1));
}

#[test]
fn replies_recorded_now_read_back_the_same() {
    let reply = tool_call_reply();
    let event = pb::AgentLlmCompleted {
        reply: Some(reply.to_record()),
        ..Default::default()
    };
    let stored = pb::AgentLlmCompleted::decode(event.encode_to_vec().as_slice()).expect("decodes");
    assert!(stored.reply_json.is_empty());
    assert_eq!(ChatReply::recorded_in(&stored).expect("reads"), reply);
}
