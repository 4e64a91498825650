//! Deterministic idempotency keys (main spec section 65).
//!
//! A key is derived only from what caused the operation, so re-running a
//! handler on the same input produces the same key, which JetStream
//! (`Nats-Msg-Id`, inside its duplicate window) and the services' projections
//! (beyond it) use to store the effect once.

use crate::ids::{AgentId, CorrelationId, DispatchId, EventId, FlowRunId, ProjectId};
use crate::pb::FlowType;

/// Workspace (the seed's VM) creation: `project:<id>:vm:v1`.
pub fn workspace(project: &ProjectId) -> String {
    format!("project:{project}:vm:v1")
}

/// Repository clone: `project:<id>:clone:<commit-or-branch>:v1`.
pub fn clone(project: &ProjectId, commit_or_branch: &str) -> String {
    format!("project:{project}:clone:{commit_or_branch}:v1")
}

/// Project ready, once per setup revision: `project:<id>:ready:<revision>`.
pub fn project_ready(project: &ProjectId, setup_revision: u32) -> String {
    format!("project:{project}:ready:{setup_revision}")
}

/// Any other setup step of one revision: `project:<id>:setup:<revision>:<step>`.
pub fn setup_step(project: &ProjectId, setup_revision: u32, step: &str) -> String {
    format!("project:{project}:setup:{setup_revision}:{step}")
}

/// A setup request: `project:<id>:setup-request:<revision>`.
pub fn setup_request(project: &ProjectId, setup_revision: u32) -> String {
    format!("project:{project}:setup-request:{setup_revision}")
}

/// Agent dispatch: `event:<eventId>:agent:<agentId>:handler:<version>`.
pub fn dispatch(source_event: &EventId, agent: &AgentId, handler_version: u32) -> String {
    format!("event:{source_event}:agent:{agent}:handler:{handler_version}")
}

/// A state change of a dispatch: `dispatch:<dispatchId>:state:<state>`.
pub fn dispatch_state(dispatch: &DispatchId, state: &str) -> String {
    format!("dispatch:{dispatch}:state:{state}")
}

/// An agent post: `dispatch:<dispatchId>:message:<logicalStep>`.
pub fn agent_post(dispatch: &DispatchId, logical_step: &str) -> String {
    format!("dispatch:{dispatch}:message:{logical_step}")
}

/// Flow run: `event:<eventId>:flow:<flowType>:version:<version>`.
pub fn flow_run(source_event: &EventId, flow_type: &str, version: u32) -> String {
    format!("event:{source_event}:flow:{flow_type}:version:{version}")
}

/// The prefix of the agent id an external agent's events carry (`external:<registry key>`).
pub const EXTERNAL_AGENT_PREFIX: &str = "external:";

/// The run key of a requested flow. A request of the project's own agents
/// runs under the seed's [`flow_run`] key, one run per message, flow and
/// version. An external agent's request (its `agent_id` is
/// `external:<key>`) is a run of its own,
/// `event:<eventId>:flow:<flowType>:version:<version>:agent:<key>`, so it
/// neither takes the place of the conversation agent's flow about the same
/// message nor is taken for it.
pub fn requested_flow_run(
    source_event: &EventId,
    flow_type: FlowType,
    version: u32,
    requester_agent_id: &str,
) -> String {
    let run = flow_run(source_event, flow_type_name(flow_type), version);
    match requester_agent_id.strip_prefix(EXTERNAL_AGENT_PREFIX) {
        Some(agent) => format!("{run}:agent:{agent}"),
        None => run,
    }
}

/// The name of a flow type in keys, Threads and results.
pub fn flow_type_name(flow_type: FlowType) -> &'static str {
    match flow_type {
        FlowType::OnboardingExplore => "onboarding_explore",
        FlowType::Explore => "explore",
        FlowType::Issue => "issue",
        FlowType::Check => "check",
        FlowType::Unspecified => "unspecified",
    }
}

/// A step of a flow run: `flow:<flowRunId>:step:<step>`.
pub fn flow_step(flow_run: &FlowRunId, step: &str) -> String {
    format!("flow:{flow_run}:step:{step}")
}

/// One write of an environment value: `project:<p>:environment:<NAME>:version:<v>`
/// (the secret store's revision), so each stored value is recorded once.
pub fn environment_value(project: &ProjectId, name: &str, version: u64) -> String {
    format!("project:{project}:environment:{name}:version:{version}")
}

/// The one cancel request of a flow run: `flow:<flowRunId>:cancel`, so a
/// retried or repeated cancel stores nothing new.
pub fn flow_cancel(flow_run: &FlowRunId) -> String {
    format!("flow:{flow_run}:cancel")
}

/// Artifact build: `flow:<flowRunId>:artifact:<kind>:revision:<revision>`.
pub fn artifact_build(flow_run: &FlowRunId, kind: &str, revision: u32) -> String {
    format!("flow:{flow_run}:artifact:{kind}:revision:{revision}")
}

/// A step of an artifact build: `build:<buildId>:<step>`.
pub fn artifact_step(build: &crate::ids::BuildId, step: &str) -> String {
    format!("build:{build}:{step}")
}

/// A dead letter for one stream message and consumer: `deadletter:<consumer>:<sequence>`.
pub fn dead_letter(consumer: &str, stream_sequence: u64) -> String {
    format!("deadletter:{consumer}:{stream_sequence}")
}

/// The one decision on an approval (granted or denied, whoever sends it):
/// `project:<id>:approval:<approvalId>:decision`. One key for both
/// outcomes, so a second decision is a duplicate of the first.
pub fn approval_decision(project: &ProjectId, approval_id: &str) -> String {
    format!("project:{project}:approval:{approval_id}:decision")
}

/// The one outcome of executing an approved action (`execution.dry_run`,
/// `execution.failed` or the action's own result event, such as
/// `tracker.issue.created`): an approval is executed at most once.
pub fn approval_execution(project: &ProjectId, approval_id: &str) -> String {
    format!("project:{project}:approval:{approval_id}:execution")
}

/// A registry definition coming into force for a project:
/// `project:<id>:agent:<key>:definition:<previous>:<new>`. A definition
/// changed back to an earlier one is a new fact (its previous differs).
pub fn agent_definition(
    project: &ProjectId,
    agent_key: &str,
    previous_hash: &str,
    definition_hash: &str,
) -> String {
    format!("project:{project}:agent:{agent_key}:definition:{previous_hash}:{definition_hash}")
}

/// A handoff from one run to another agent:
/// `run:<runId>:handoff:<targetAgent>:<revision>` (revision 0 the first,
/// each correction the next).
pub fn agent_handoff(run_id: &str, target_agent_key: &str, revision: u32) -> String {
    format!("run:{run_id}:handoff:{target_agent_key}:{revision}")
}

/// An internal note of a run: `run:<runId>:note:<step>`.
pub fn agent_note(run_id: &str, step: &str) -> String {
    format!("run:{run_id}:note:{step}")
}

/// A user command other than a setup request (a message, a card action,
/// the kill switch): `project:<id>:request:<requestId>:<what>`. Scoped to the
/// project, so one tenant's request ids never collide with another's.
pub fn user_request(project: &ProjectId, request: &CorrelationId, what: &str) -> String {
    format!("project:{project}:request:{request}:{what}")
}
