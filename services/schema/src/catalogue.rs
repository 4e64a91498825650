//! The event catalogue: every event type, its protobuf message and its
//! `dataschema`. One type, one message; an incompatible change adds a new
//! message (and a new type version), never edits history.

use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DynamicMessage};

use crate::pb;

/// A payload that can travel as an event.
pub trait Event: prost::Message + Default + Clone + Send + Sync + 'static {
    /// The dotted CloudEvents `type`, e.g. `project.ready`.
    const TYPE: &'static str;
    /// The full protobuf message name used as `dataschema`, e.g. `zopu.v1.ProjectReady`.
    const SCHEMA: &'static str;
}

/// One row of the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventKind {
    pub event_type: &'static str,
    pub schema: &'static str,
}

macro_rules! catalogue {
    ($($message:ident => $event_type:literal),+ $(,)?) => {
        $(
            impl Event for pb::$message {
                const TYPE: &'static str = $event_type;
                const SCHEMA: &'static str = concat!("zopu.v1.", stringify!($message));
            }
        )+

        /// Every event type the runtime writes, in catalogue order.
        pub const ALL: &[EventKind] = &[
            $(EventKind { event_type: $event_type, schema: concat!("zopu.v1.", stringify!($message)) },)+
        ];
    };
}

catalogue! {
    ProjectSetupRequested => "project.setup.requested",
    ProjectSetupStarted => "project.setup.started",
    ProjectRuntimeCreated => "project.runtime.created",
    ProjectRepositoryCloned => "project.repository.cloned",
    ProjectEnvironmentScanned => "project.environment.scanned",
    ProjectEnvironmentValueSet => "project.environment.value.set",
    ProjectEnvironmentValueDeleted => "project.environment.value.deleted",
    ProjectReady => "project.ready",
    ProjectSetupFailed => "project.setup.failed",
    AgentRegistered => "agent.registered",
    AgentAcknowledged => "agent.acknowledged",
    AgentMessage => "agent.message",
    AgentBlocked => "agent.blocked",
    AgentFinal => "agent.final",
    AgentDecided => "agent.decided",
    AgentDisabled => "agent.disabled",
    AgentEnabled => "agent.enabled",
    AgentRejected => "agent.rejected",
    AgentGuardrailTriggered => "agent.guardrail.triggered",
    AgentLlmCompleted => "agent.llm.completed",
    AgentLlmFailed => "agent.llm.failed",
    AgentDefinitionChanged => "agent.definition.changed",
    AgentHandoffCreated => "agent.handoff.created",
    AgentNoteRecorded => "agent.note.recorded",
    AgentMemorySet => "agent.memory.set",
    AgentMemoryDeleted => "agent.memory.deleted",
    AgentMemoryCleared => "agent.memory.cleared",
    TimelineMessageSent => "timeline.message.sent",
    TimelineActionSent => "timeline.action.sent",
    WorkCreated => "work.created",
    WorkUpdated => "work.updated",
    ThreadCreated => "thread.created",
    ThreadUpdated => "thread.updated",
    DispatchCreated => "dispatch.created",
    DispatchAccepted => "dispatch.accepted",
    DispatchCompleted => "dispatch.completed",
    DispatchFailed => "dispatch.failed",
    FlowRequested => "flow.requested",
    FlowStarted => "flow.started",
    FlowProgress => "flow.progress",
    FlowCompleted => "flow.completed",
    FlowFailed => "flow.failed",
    FlowCancelRequested => "flow.cancel.requested",
    FlowCancelled => "flow.cancelled",
    ContextPublished => "context.published",
    ArtifactBuildRequested => "artifact.build.requested",
    ArtifactBuildStarted => "artifact.build.started",
    ArtifactPublished => "artifact.published",
    ArtifactFailed => "artifact.failed",
    ArtifactSuperseded => "artifact.superseded",
    ApprovalRequested => "approval.requested",
    ApprovalGranted => "approval.granted",
    ApprovalDenied => "approval.denied",
    ApprovalExpired => "approval.expired",
    ExecutionDryRun => "execution.dry_run",
    ExecutionFailed => "execution.failed",
    TrackerIssueCreated => "tracker.issue.created",
    DeadLetterRecorded => "runtime.deadletter.recorded",
}

/// The catalogue row for an event type.
pub fn lookup(event_type: &str) -> Option<&'static EventKind> {
    ALL.iter().find(|kind| kind.event_type == event_type)
}

/// Why a body could not be turned into a JSON view.
#[derive(Debug, thiserror::Error)]
pub enum JsonViewError {
    #[error("unknown dataschema {0:?}")]
    UnknownSchema(String),
    #[error("body does not decode as {schema}: {source}")]
    Decode {
        schema: String,
        source: prost::DecodeError,
    },
    #[error("cannot render {schema} as JSON: {source}")]
    Render {
        schema: String,
        source: serde_json::Error,
    },
}

pub(crate) fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        // The descriptor set is produced by this crate's build from the same
        // files the types come from; failing to read it is a build defect.
        DescriptorPool::decode(crate::DESCRIPTOR_SET).expect("embedded descriptor set is valid")
    })
}

/// Why an event is not understood by this version of the runtime: its type
/// or dataschema is not in the catalogue (a newer version wrote it), or its
/// body does not decode as its dataschema. `None` for an event this version
/// reads.
pub fn not_understood(event_type: &str, schema: &str, body: &[u8]) -> Option<String> {
    match lookup(event_type) {
        None => Some(format!(
            "unknown event type {event_type} (dataschema {schema}); written by a newer version?"
        )),
        Some(kind) if kind.schema != schema => Some(format!(
            "event type {event_type} with dataschema {schema}, this version reads {}; written by a newer version?",
            kind.schema
        )),
        Some(kind) => {
            let descriptor = pool().get_message_by_name(kind.schema)?;
            DynamicMessage::decode(descriptor, body)
                .err()
                .map(|error| format!("body does not decode as {}: {error}", kind.schema))
        }
    }
}

/// The type half of [`not_understood`]: cheap (no body decoding), for the
/// projection loop's every event.
pub fn not_understood_type(event_type: &str, schema: &str) -> Option<String> {
    match lookup(event_type) {
        Some(kind) if kind.schema == schema => None,
        _ => not_understood(event_type, schema, &[]),
    }
}

/// Decodes a body by its `dataschema` into the proto3 JSON mapping, the way
/// an integrator with nothing but `proto/` would.
pub fn to_json(schema: &str, body: &[u8]) -> Result<serde_json::Value, JsonViewError> {
    let descriptor = pool()
        .get_message_by_name(schema)
        .ok_or_else(|| JsonViewError::UnknownSchema(schema.to_owned()))?;
    let message =
        DynamicMessage::decode(descriptor, body).map_err(|source| JsonViewError::Decode {
            schema: schema.to_owned(),
            source,
        })?;
    serde_json::to_value(&message).map_err(|source| JsonViewError::Render {
        schema: schema.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn every_catalogue_schema_is_in_the_descriptor_set() {
        for kind in ALL {
            assert!(
                pool().get_message_by_name(kind.schema).is_some(),
                "{} missing",
                kind.schema
            );
            assert!(
                crate::subjects::is_valid_event_type(kind.event_type),
                "{}",
                kind.event_type
            );
        }
    }

    #[test]
    fn types_are_unique() {
        let mut types: Vec<_> = ALL.iter().map(|kind| kind.event_type).collect();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), ALL.len());
    }

    #[test]
    fn json_view_uses_proto3_names() {
        let ready = pb::ProjectReady {
            setup_revision: 2,
            repository_commit: "abc".into(),
            ..Default::default()
        };
        let json = to_json(pb::ProjectReady::SCHEMA, &ready.encode_to_vec()).unwrap();
        assert_eq!(json["setupRevision"], 2);
        assert_eq!(json["repositoryCommit"], "abc");
    }
}
