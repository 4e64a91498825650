//! Idempotency keys of the conversation agent's steps not covered by
//! `zopu_schema::keys`, in the same `a:<id>:b:<x>` style. Every key is
//! derived from the dispatch (or the flow run), never from the clock.

use zopu_schema::{DispatchId, FlowRunId};

/// The decision record: `dispatch:<id>:decision`.
pub fn decision(dispatch: &DispatchId) -> String {
    format!("dispatch:{dispatch}:decision")
}

/// One model call of a step: `dispatch:<id>:llm:<step>:<attempt>`. Holds
/// either `agent.llm.completed` or `agent.llm.failed`.
pub fn llm_call(dispatch: &DispatchId, step: &str, attempt: u32) -> String {
    format!("dispatch:{dispatch}:llm:{step}:{attempt}")
}

/// A Work or Thread created for a dispatch: `dispatch:<id>:work` / `dispatch:<id>:thread`.
pub fn entity(dispatch: &DispatchId, entity: &str) -> String {
    format!("dispatch:{dispatch}:{entity}")
}

/// A guardrail record of a dispatch: `dispatch:<id>:guardrail:<rule>:<step>`.
pub fn guardrail(dispatch: &DispatchId, rule: &str, step: &str) -> String {
    format!("dispatch:{dispatch}:guardrail:{rule}:{step}")
}

/// A boundary rejection of a dispatch: `dispatch:<id>:rejected`.
pub fn rejected(dispatch: &DispatchId) -> String {
    format!("dispatch:{dispatch}:rejected")
}

/// The one final hand-off of a flow run: `flow:<id>:agent:final`.
pub fn flow_final(flow_run: &FlowRunId) -> String {
    format!("flow:{flow_run}:agent:final")
}

/// A Work/Thread status change caused by a flow run's outcome:
/// `flow:<id>:agent:<entity>:<status>`.
pub fn flow_update(flow_run: &FlowRunId, entity: &str, status: &str) -> String {
    format!("flow:{flow_run}:agent:{entity}:{status}")
}

/// The approval a click on an artifact's action requests (one per artifact
/// and action, however often it is clicked): `artifact:<id>:approval:<action>`.
pub fn approval_of_artifact(artifact_id: &str, action: &str) -> String {
    format!("artifact:{artifact_id}:approval:{action}")
}
