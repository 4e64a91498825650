//! The dispatch service: turns every event the project's conversation agent
//! must see into exactly one `dispatch.created` (an AgentDispatch, main spec
//! section 9 and Part V).
//!
//! Sources: `project.ready`, `timeline.message.sent`, `timeline.action.sent`,
//! `flow.completed` / `flow.failed` / `flow.cancelled`, `artifact.published`
//! and `artifact.failed`. The target agent is the project's conversation agent
//! as registered by setup (`agent.registered`, kept in this service's
//! projection).
//!
//! Invariants:
//! - One dispatch per source event, agent and handler version: the key is
//!   `keys::dispatch(source, agent, HANDLER_VERSION)` and the dispatch id is
//!   derived from the source event's time and that key, so a redelivered or
//!   replayed source event yields the same dispatch (stored once).
//! - The dispatch event carries the source's work/thread/flow ids and its own
//!   dispatch id, and is caused by the source event.
//! - Nothing the agent itself wrote is dispatched back to it (agent-authored
//!   timeline messages are skipped), so the agent cannot loop on its output.
//! - A source event of a project with no registered agent is not dropped: it
//!   ends as a visible `dispatch.failed` (`dispatch.agent_not_registered`).
//! - The kill switch is enforced by the agent, not here: a disabled agent
//!   still receives its dispatches and completes them as `skipped_disabled`
//!   (telling the user once that it is paused), so the decision is taken in
//!   stream order on the agent's own state and every source event keeps a
//!   visible, terminal dispatch record.
//! - Single flight: the conversation service consumes `dispatch.created` with
//!   the core reaction runner, one event per project at a time in stream
//!   order, so two turns of one agent never run at once.

use std::time::Duration;

use rusqlite::{OptionalExtension, Transaction, params};
use zopu_core::config::{ConfigError, CoreConfig};
use zopu_core::{
    HandlerError, NewEvent, Projection, Reaction, ReactionConfig, ReactionContext, Shutdown, Store,
};
use zopu_schema::{AgentId, DispatchId, Envelope, Event, keys, pb, subjects};

/// Service name (`zopu/dispatch`, `dispatch.sqlite`).
pub const SERVICE: &str = "dispatch";
/// Version of the conversation agent's handler; part of every dispatch key.
pub const HANDLER_VERSION: u32 = 1;

/// The event types this service dispatches.
pub const SOURCE_TYPES: &[&str] = &[
    pb::ProjectReady::TYPE,
    pb::TimelineMessageSent::TYPE,
    pb::TimelineActionSent::TYPE,
    pb::FlowCompleted::TYPE,
    pb::FlowFailed::TYPE,
    pb::FlowCancelled::TYPE,
    pb::ArtifactPublished::TYPE,
    pb::ArtifactFailed::TYPE,
];

/// Settings of the dispatch service (`[dispatch]`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Source events in flight across projects.
    pub max_ack_pending: i64,
    /// Deliveries of one source event before it is dead-lettered.
    pub max_deliver: i64,
    /// Upper bound of handling one source event.
    #[serde(with = "zopu_core::config::duration")]
    pub handler_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_ack_pending: 1024,
            max_deliver: 10,
            handler_timeout: Duration::from_secs(30),
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.reaction().validate(SERVICE)?;
        if self.handler_timeout < Duration::from_secs(1)
            || self.handler_timeout > Duration::from_secs(600)
        {
            return Err(ConfigError::setting(
                "dispatch.handler_timeout",
                "must be between 1s and 10m",
            ));
        }
        Ok(())
    }

    /// The consumer of the source events.
    pub fn reaction(&self) -> ReactionConfig {
        ReactionConfig {
            max_ack_pending: self.max_ack_pending,
            max_deliver: self.max_deliver,
            handler_timeout: self.handler_timeout,
            ..ReactionConfig::new(
                subjects::durable(SERVICE, "sources"),
                SOURCE_TYPES
                    .iter()
                    .map(|event_type| subjects::events_of_type(event_type))
                    .collect(),
            )
        }
    }
}

/// What can stop the dispatch service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Core(#[from] zopu_core::Error),
}

/// Runs the dispatch service until `shutdown`.
pub async fn run(core: CoreConfig, config: Config, shutdown: Shutdown) -> Result<(), Error> {
    config.validate()?;
    let runtime =
        zopu_core::Runtime::start_with(SERVICE, &core, shutdown.clone(), Bindings).await?;
    runtime.spawn_reaction(config.reaction(), Dispatcher);
    shutdown.cancelled().await;
    Ok(())
}

/// A project's conversation agent binding, as registered by setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub agent_id: String,
    pub global_timeline_id: String,
}

/// The projection of agent bindings (`agent.registered`).
#[derive(Debug, Default)]
pub struct Bindings;

impl Projection for Bindings {
    fn name(&self) -> &'static str {
        "dispatch_bindings"
    }
    fn schema_version(&self) -> u32 {
        1
    }
    fn tables(&self) -> &'static [&'static str] {
        &["dispatch_bindings"]
    }
    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(
            "CREATE TABLE dispatch_bindings (
                org TEXT NOT NULL,
                project TEXT NOT NULL,
                agent_id TEXT NOT NULL,
                global_timeline_id TEXT NOT NULL,
                PRIMARY KEY (org, project)
            );",
        )
    }
    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        _sequence: u64,
    ) -> rusqlite::Result<()> {
        if !event.is::<pb::AgentRegistered>() {
            return Ok(());
        }
        let Ok(registered) = event.decode::<pb::AgentRegistered>() else {
            return Ok(());
        };
        tx.prepare_cached("INSERT INTO dispatch_bindings (org, project, agent_id, global_timeline_id) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(org, project) DO UPDATE SET agent_id = excluded.agent_id, global_timeline_id = excluded.global_timeline_id")?.execute(params![event.org_id.as_str(), event.project_id.to_string(), registered.agent_id, registered.global_timeline_id],
        )
        .map(|_| ())
    }
}

fn binding(store: &Store, event: &Envelope) -> Result<Option<Binding>, zopu_core::Error> {
    store.read(|conn| {
        conn.prepare_cached("SELECT agent_id, global_timeline_id FROM dispatch_bindings WHERE org = ?1 AND project = ?2")?.query_row(params![event.org_id.as_str(), event.project_id.to_string()],
            |row| Ok(Binding { agent_id: row.get(0)?, global_timeline_id: row.get(1)? }),
        )
        .optional()
    })
}

/// What to do with one source event.
#[derive(Debug)]
pub enum Plan {
    /// Append this `dispatch.created`.
    Dispatch(NewEvent),
    /// The project has no agent: append this `dispatch.failed`.
    NoAgent(NewEvent),
    /// Not for the agent (with the reason, for the log).
    Skip(&'static str),
}

/// The dispatch id of `source` for `agent`: derived from the source event's
/// time and the dispatch key, the same on every run.
pub fn dispatch_id(source: &Envelope, agent: &AgentId) -> DispatchId {
    let key = keys::dispatch(&source.id, agent, HANDLER_VERSION);
    DispatchId::derived(zopu_schema::envelope::unix_ms(source.time), &key)
}

/// Decides what one source event becomes. Pure: the same event and binding
/// give the same plan (and the same ids and keys).
pub fn plan(
    source: &Envelope,
    sequence: u64,
    binding: Option<&Binding>,
) -> Result<Plan, HandlerError> {
    if !SOURCE_TYPES.contains(&source.event_type.as_str()) {
        return Ok(Plan::Skip("not a dispatched event type"));
    }
    if source.is::<pb::TimelineMessageSent>() {
        let message = source.decode::<pb::TimelineMessageSent>()?;
        if message
            .author
            .as_ref()
            .is_some_and(|author| author.kind() == pb::actor::Kind::Agent)
        {
            return Ok(Plan::Skip("written by an agent"));
        }
    }
    // The agent the project must have; a binding that names another agent is
    // dispatched anyway and refused by the agent's own boundary check.
    let expected = AgentId::conversation(&source.org_id, &source.project_id);
    let id = dispatch_id(source, &expected);
    let key = keys::dispatch(&source.id, &expected, HANDLER_VERSION);
    let Some(binding) = binding else {
        let failed = pb::DispatchFailed {
            agent_id: expected.to_string(),
            reason: Some(pb::FailureReason {
                code: "dispatch.agent_not_registered".into(),
                message: "This project has no conversation agent yet; finish project setup first."
                    .into(),
                retryable: false,
            }),
            attempts: 0,
        };
        return Ok(Plan::NoAgent(
            NewEvent::caused_by(
                &source.context(),
                &failed,
                keys::dispatch_state(&id, "failed"),
            )
            .with_dispatch(id),
        ));
    };
    let created = pb::DispatchCreated {
        source_event_id: source.id.to_string(),
        source_event_type: source.event_type.clone(),
        source_stream_sequence: sequence,
        agent_id: binding.agent_id.clone(),
        handler_version: HANDLER_VERSION,
        global_timeline_id: binding.global_timeline_id.clone(),
    };
    Ok(Plan::Dispatch(
        NewEvent::caused_by(&source.context(), &created, key).with_dispatch(id),
    ))
}

/// The reaction: one `dispatch.created` per source event.
#[derive(Debug, Default, Clone, Copy)]
pub struct Dispatcher;

impl Reaction for Dispatcher {
    async fn handle(&self, event: &Envelope, ctx: &ReactionContext) -> Result<(), HandlerError> {
        // A registration is never undone, so a binding already known is
        // current; only a miss needs the projection to catch up first.
        let mut bound = binding(&ctx.store, event)?;
        if bound.is_none() {
            ctx.caught_up(ctx.stream_sequence).await?;
            bound = binding(&ctx.store, event)?;
        }
        match plan(event, ctx.stream_sequence, bound.as_ref())? {
            Plan::Dispatch(created) => {
                let appended = ctx.publisher.append(created).await?;
                tracing::debug!(source_event = %event.id, dispatch_event = %appended.event_id, duplicate = appended.duplicate, "dispatched");
            }
            Plan::NoAgent(failed) => {
                tracing::warn!(source_event = %event.id, project = %event.project_id, "no conversation agent registered; dispatch failed");
                ctx.publisher.append(failed).await?;
            }
            Plan::Skip(reason) => {
                tracing::debug!(source_event = %event.id, reason, "not dispatched");
            }
        }
        Ok(())
    }

    /// Handled once the dispatch (or its failure) is stored.
    async fn already_handled(
        &self,
        event: &Envelope,
        ctx: &ReactionContext,
    ) -> Result<bool, HandlerError> {
        let agent = AgentId::conversation(&event.org_id, &event.project_id);
        let created = keys::dispatch(&event.id, &agent, HANDLER_VERSION);
        let failed = keys::dispatch_state(&dispatch_id(event, &agent), "failed");
        Ok(ctx.store.key_sequence(&created)?.is_some()
            || ctx.store.key_sequence(&failed)?.is_some())
    }

    fn failure_event(&self, event: &Envelope, reason: &str) -> Option<NewEvent> {
        let agent = AgentId::conversation(&event.org_id, &event.project_id);
        let id = dispatch_id(event, &agent);
        let failed = pb::DispatchFailed {
            agent_id: agent.to_string(),
            reason: Some(pb::FailureReason {
                code: "dispatch.gave_up".into(),
                message: zopu_core::text::clip_bytes(reason, 500).to_owned(),
                retryable: true,
            }),
            attempts: 0,
        };
        Some(
            NewEvent::caused_by(
                &event.context(),
                &failed,
                keys::dispatch_state(&id, "failed"),
            )
            .with_dispatch(id),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use prost::Message;
    use zopu_schema::{CorrelationId, EventId, OrgId, ProjectId};

    fn fixed_event_id(n: u64) -> EventId {
        EventId::derived(1_700_000_000_000 + n, "fixture")
    }

    fn envelope<E: Event>(payload: &E) -> Envelope {
        let id = fixed_event_id(1);
        let org: OrgId = "acme".parse().unwrap();
        Envelope {
            id,
            source: "zopu/gateway".into(),
            event_type: E::TYPE.into(),
            time: time::OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap(),
            data_schema: E::SCHEMA.into(),
            org_id: org,
            project_id: ProjectId::derived(1_700_000_000_000, "p"),
            correlation_id: CorrelationId::from(id),
            causation_id: id,
            work_id: None,
            thread_id: None,
            flow_run_id: None,
            dispatch_id: None,
            traceparent: None,
            idempotency_key: "request:1".into(),
            project_version: 3,
            previous_hash: Some(zopu_schema::EventHash([0; 32])),
            data: Bytes::from(payload.encode_to_vec()),
        }
    }

    fn bound(source: &Envelope) -> Binding {
        Binding {
            agent_id: AgentId::conversation(&source.org_id, &source.project_id).to_string(),
            global_timeline_id: "timeline-1".into(),
        }
    }

    #[test]
    fn a_user_message_becomes_one_stable_dispatch() {
        let source = envelope(&pb::TimelineMessageSent {
            text: "how does auth work?".into(),
            ..Default::default()
        });
        let binding = bound(&source);
        let first = plan(&source, 7, Some(&binding)).unwrap();
        let second = plan(&source, 7, Some(&binding)).unwrap();
        let (Plan::Dispatch(first), Plan::Dispatch(second)) = (first, second) else {
            panic!("not dispatched")
        };
        assert_eq!(first.idempotency_key, second.idempotency_key);
        assert_eq!(first.event_id(), second.event_id());
        assert_eq!(first.context.dispatch_id, second.context.dispatch_id);
        assert_eq!(first.context.causation_id, source.id);
        assert_eq!(
            first.idempotency_key,
            format!("event:{}:agent:{}:handler:1", source.id, binding.agent_id)
        );
        let created = pb::DispatchCreated::decode(first.data).unwrap();
        assert_eq!(created.source_stream_sequence, 7);
        assert_eq!(created.global_timeline_id, "timeline-1");
    }

    #[test]
    fn work_and_thread_ids_of_the_source_are_kept() {
        let mut source = envelope(&pb::FlowCompleted::default());
        let work = zopu_schema::WorkId::new();
        let thread = zopu_schema::ThreadId::new();
        source.work_id = Some(work);
        source.thread_id = Some(thread);
        let Plan::Dispatch(created) = plan(&source, 1, Some(&bound(&source))).unwrap() else {
            panic!()
        };
        assert_eq!(created.context.work_id, Some(work));
        assert_eq!(created.context.thread_id, Some(thread));
    }

    #[test]
    fn agent_messages_are_not_dispatched_back() {
        let source = envelope(&pb::TimelineMessageSent {
            text: "echo".into(),
            author: Some(pb::Actor {
                kind: pb::actor::Kind::Agent as i32,
                id: "conversation:acme:x".into(),
            }),
            ..Default::default()
        });
        assert!(matches!(
            plan(&source, 1, Some(&bound(&source))).unwrap(),
            Plan::Skip(_)
        ));
        let other = envelope(&pb::AgentMessage::default());
        assert!(matches!(
            plan(&other, 1, Some(&bound(&other))).unwrap(),
            Plan::Skip(_)
        ));
    }

    #[test]
    fn no_agent_is_a_visible_failure() {
        let source = envelope(&pb::TimelineMessageSent {
            text: "hi".into(),
            ..Default::default()
        });
        let Plan::NoAgent(failed) = plan(&source, 1, None).unwrap() else {
            panic!()
        };
        assert_eq!(failed.event_type, pb::DispatchFailed::TYPE);
        assert!(failed.idempotency_key.ends_with(":state:failed"));
    }

    #[test]
    fn config_names_the_bad_key() {
        assert!(Config::default().validate().is_ok());
        let error = Config {
            max_deliver: 0,
            ..Config::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(error.contains("dispatch.max_deliver"), "{error}");
    }
}
