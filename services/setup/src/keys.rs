//! Idempotency keys of the setup steps. The spec's keys come from
//! `zopu_schema::keys`; only the agent registration, which belongs to the
//! project rather than to a revision, is built here in the same style.

use zopu_schema::keys::{project_ready, setup_step};
use zopu_schema::{AgentId, ProjectId};

/// `project.setup.started` of one revision.
pub fn started(project: &ProjectId, revision: u32) -> String {
    setup_step(project, revision, "started")
}

/// `project.runtime.created` of one revision.
pub fn runtime_created(project: &ProjectId, revision: u32) -> String {
    setup_step(project, revision, "runtime")
}

/// `project.repository.cloned` of one revision.
pub fn cloned(project: &ProjectId, revision: u32) -> String {
    setup_step(project, revision, "cloned")
}

/// `project.environment.scanned` of one revision.
pub fn environment_scanned(project: &ProjectId, revision: u32) -> String {
    setup_step(project, revision, "environment")
}

/// `project.setup.failed` of one revision (at most one per revision).
pub fn failed(project: &ProjectId, revision: u32) -> String {
    setup_step(project, revision, "failed")
}

/// `project.ready` of one revision: `project:<id>:ready:<revision>`.
pub fn ready(project: &ProjectId, revision: u32) -> String {
    project_ready(project, revision)
}

/// `agent.registered`, once per org + project + agent type (the agent id
/// spells all three): `agent:<agentId>:registered:v1`.
pub fn agent_registered(agent: &AgentId) -> String {
    format!("agent:{agent}:registered:v1")
}
