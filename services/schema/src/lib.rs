//! Zopu's wire contract, shared by every service and by integrators' tools.
//!
//! This crate holds the prost types generated from `proto/` ([`pb`]), the
//! event catalogue ([`catalogue`]: one event type, one message), the
//! CloudEvents envelope and its NATS binary-mode header codec ([`envelope`],
//! [`codec`], on the cloudevents-sdk's binding traits), typed ids ([`ids`]),
//! subject and durable-name builders ([`subjects`]), deterministic
//! idempotency keys ([`keys`]), the artifact manifest's limits and
//! validation ([`manifest`]), the recorded model reply with its upcaster
//! from earlier versions' JSON ([`model_reply`]), the repository location
//! and branch a project is set up from, with their one validation
//! ([`repository`]), an approval's lifecycle as every reader folds it
//! ([`approval`]), the flows' results as versioned JSON with a generated
//! JSON Schema ([`flow_result`]), the contract as an AsyncAPI 3
//! document ([`asyncapi`]), and which NATS identity may append which event
//! types ([`ownership`], the source of deploy/'s permissions).
//!
//! Invariants: this crate does no I/O (the one exception: checking a local
//! repository path reads that path's metadata, and only when the operator
//! allows local repositories; see [`repository`]). It is the only place where a NATS
//! subject, stream name or durable name is spelled. Every envelope that
//! [`codec::decode`] accepts satisfies [`envelope::Envelope::check`], and
//! [`codec::encode`] followed by [`codec::decode`] returns the same envelope.

pub mod agent_registry;
pub mod approval;
pub mod asyncapi;
pub mod catalogue;
pub mod codec;
pub mod envelope;
pub mod flow_result;
pub mod ids;
pub mod keys;
pub mod manifest;
pub mod model_reply;
pub mod ownership;
pub mod repository;
pub mod subjects;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;

/// Types generated from `proto/zopu/v1/*.proto`.
#[allow(missing_debug_implementations, clippy::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/zopu.v1.rs"));
}

/// A Work's status as a person reads it (the web timeline and `zopu
/// timeline` alike): `waiting` is a Work whose thread finished and that now
/// waits on its owner (a follow-up, an issue, a check); the others read as
/// they are.
pub fn work_status_text(status: &str) -> &str {
    match status {
        "waiting" => "waiting for you: ask a follow-up or act on the result",
        other => other,
    }
}

/// An actor as `<kind>:<id>` (`user:ada`, `agent:conversation:acme:p`), or
/// the kind alone when it has no id; `system` when there is none.
pub fn actor_label(actor: Option<&pb::Actor>) -> String {
    let Some(actor) = actor else {
        return "system".to_owned();
    };
    let kind = match actor.kind() {
        pb::actor::Kind::User => "user",
        pb::actor::Kind::Agent => "agent",
        pb::actor::Kind::Operator => "operator",
        pb::actor::Kind::System | pb::actor::Kind::Unspecified => "system",
    };
    if actor.id.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}:{}", actor.id)
    }
}

/// The compiled descriptor set of `proto/`, for dynamic decoding (JSON views).
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/zopu_descriptor.bin"));

pub use catalogue::Event;
pub use envelope::{Envelope, EventContext, EventHash};
pub use ids::{
    AgentId, ArtifactId, BuildId, CorrelationId, DispatchId, EventId, FlowRunId, OrgId, ProjectId,
    ThreadId, WorkId,
};
