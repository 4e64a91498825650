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
//! - The agent registry gates every dispatch: when the registry has no
//!   conversation agent, or disables it, the source event ends as a visible
//!   `dispatch.failed` (`agent.not_registered` / `agent.disabled_in_registry`).
//!   Before a project's first dispatch under a definition, that definition is
//!   recorded for the project as `agent.definition.changed` (one per agent of
//!   the registry whose definition the project has not recorded yet, keyed by
//!   the previous and the new hash), so a project's history names every
//!   definition its agents ran under.
//! - Single flight: the conversation service consumes `dispatch.created` with
//!   the core reaction runner, one event per project at a time in stream
//!   order, so two turns of one agent never run at once.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::{OptionalExtension, Transaction, params};
use zopu_core::registry::{NotRunnable, Registry, RegistryError};
use zopu_runtime::config::{ConfigError, CoreConfig};
use zopu_runtime::{
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
    #[serde(with = "zopu_runtime::config::duration")]
    pub handler_timeout: Duration,
    /// The agents directory (the top-level `agents_dir`, given by the
    /// CLI; never read from this section); `None`: the registry built into
    /// the binary.
    #[serde(skip)]
    pub agents_dir: Option<std::path::PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            agents_dir: None,
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
    Core(#[from] zopu_runtime::Error),
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// Runs the dispatch service until `shutdown`.
pub async fn run(core: CoreConfig, config: Config, shutdown: Shutdown) -> Result<(), Error> {
    config.validate()?;
    let registry = Arc::new(zopu_core::registry::Registry::configured(
        config.agents_dir.as_deref(),
        &core,
    )?);
    let runtime =
        zopu_runtime::Runtime::start_with(SERVICE, &core, shutdown.clone(), Bindings).await?;
    runtime.spawn_reaction(config.reaction(), Dispatcher { registry });
    shutdown.cancelled().await;
    Ok(())
}

/// A project's conversation agent binding, as registered by setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub agent_id: String,
    pub global_timeline_id: String,
}

/// The projection of agent bindings (`agent.registered`) and of the
/// registry definitions recorded per project (`agent.definition.changed`).
#[derive(Debug, Default)]
pub struct Bindings;

impl Projection for Bindings {
    fn name(&self) -> &'static str {
        "dispatch_bindings"
    }
    fn schema_version(&self) -> u32 {
        2
    }
    fn tables(&self) -> &'static [&'static str] {
        &["dispatch_bindings", "dispatch_definitions"]
    }
    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(
            "CREATE TABLE dispatch_bindings (
                org TEXT NOT NULL,
                project TEXT NOT NULL,
                agent_id TEXT NOT NULL,
                global_timeline_id TEXT NOT NULL,
                PRIMARY KEY (org, project)
            );
            CREATE TABLE dispatch_definitions (
                org TEXT NOT NULL,
                project TEXT NOT NULL,
                agent_key TEXT NOT NULL,
                definition_hash TEXT NOT NULL,
                PRIMARY KEY (org, project, agent_key)
            );",
        )
    }
    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        _sequence: u64,
    ) -> rusqlite::Result<()> {
        if event.is::<pb::AgentDefinitionChanged>() {
            // Undecodable: the runtime's dead-letter path reports it; this
            // projection keeps the definitions it could read.
            let Ok(changed) = event.decode::<pb::AgentDefinitionChanged>() else {
                return Ok(());
            };
            return tx
                .prepare_cached(
                    "INSERT INTO dispatch_definitions (org, project, agent_key, definition_hash) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT(org, project, agent_key) DO UPDATE SET definition_hash = excluded.definition_hash",
                )?
                .execute(params![
                    event.org_id.as_str(),
                    event.project_id.to_string(),
                    changed.agent_key,
                    changed.definition_hash
                ])
                .map(|_| ());
        }
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

fn binding(store: &Store, event: &Envelope) -> Result<Option<Binding>, zopu_runtime::Error> {
    store.read(|conn| {
        conn.prepare_cached("SELECT agent_id, global_timeline_id FROM dispatch_bindings WHERE org = ?1 AND project = ?2")?.query_row(params![event.org_id.as_str(), event.project_id.to_string()],
            |row| Ok(Binding { agent_id: row.get(0)?, global_timeline_id: row.get(1)? }),
        )
        .optional()
    })
}

/// The definition hash recorded for each agent of the event's project.
fn recorded_definitions(
    store: &Store,
    event: &Envelope,
) -> Result<std::collections::BTreeMap<String, String>, zopu_runtime::Error> {
    store.read(|conn| {
        let mut statement = conn.prepare_cached(
            "SELECT agent_key, definition_hash FROM dispatch_definitions WHERE org = ?1 AND project = ?2",
        )?;
        let rows = statement.query_map(
            params![event.org_id.as_str(), event.project_id.to_string()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?;
        rows.collect()
    })
}

/// The `agent.definition.changed` events that bring the project's recorded
/// definitions up to the registry's (`recorded`: agent key → hash). Pure.
pub fn definition_changes(
    source: &Envelope,
    registry: &Registry,
    recorded: &std::collections::BTreeMap<String, String>,
) -> Vec<NewEvent> {
    registry
        .agents()
        .filter_map(|agent| {
            let previous = recorded
                .get(&agent.definition.key)
                .map_or("", String::as_str);
            (previous != agent.definition_hash).then(|| {
                NewEvent::caused_by(
                    &source.context(),
                    &agent.definition_changed(previous),
                    keys::agent_definition(
                        &source.project_id,
                        &agent.definition.key,
                        previous,
                        &agent.definition_hash,
                    ),
                )
            })
        })
        .collect()
}

/// What to do with one source event.
#[derive(Debug)]
pub enum Plan {
    /// Append this `dispatch.created`.
    Dispatch(NewEvent),
    /// The project has no agent, or the registry lets none run: append this `dispatch.failed`.
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
    registered: Result<(), &NotRunnable>,
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
    let binding = match (binding, registered) {
        (Some(binding), Ok(())) => binding,
        (_, refused) => {
            let reason = match refused {
                Err(not_runnable) => pb::FailureReason {
                    code: not_runnable.code().into(),
                    message: format!(
                        "The agent registry lets no conversation agent run ({not_runnable}); nothing was dispatched."
                    ),
                    retryable: false,
                },
                Ok(()) => pb::FailureReason {
                    code: "dispatch.agent_not_registered".into(),
                    message:
                        "This project has no conversation agent yet; finish project setup first."
                            .into(),
                    retryable: false,
                },
            };
            let failed = pb::DispatchFailed {
                agent_id: expected.to_string(),
                reason: Some(reason),
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
        }
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
#[derive(Debug, Clone)]
pub struct Dispatcher {
    pub registry: Arc<Registry>,
}

impl Reaction for Dispatcher {
    async fn handle(&self, event: &Envelope, ctx: &ReactionContext) -> Result<(), HandlerError> {
        // A registration is never undone, so a binding already known is
        // current; only a miss needs the projection to catch up first.
        let mut bound = binding(&ctx.store, event)?;
        if bound.is_none() {
            ctx.caught_up(ctx.stream_sequence).await?;
            bound = binding(&ctx.store, event)?;
        }
        let registered = self.registry.conversation().map(|_| ());
        match plan(
            event,
            ctx.stream_sequence,
            bound.as_ref(),
            registered.as_ref().map(|_| ()),
        )? {
            Plan::Dispatch(created) => {
                let recorded = recorded_definitions(&ctx.store, event)?;
                for change in definition_changes(event, &self.registry, &recorded) {
                    let appended = ctx.publisher.append(change).await?;
                    tracing::info!(project = %event.project_id, event_id = %appended.event_id, duplicate = appended.duplicate, "agent definition recorded for the project");
                }
                let appended = ctx.publisher.append(created).await?;
                tracing::debug!(source_event = %event.id, dispatch_event = %appended.event_id, duplicate = appended.duplicate, "dispatched");
            }
            Plan::NoAgent(failed) => {
                tracing::warn!(source_event = %event.id, project = %event.project_id, "no conversation agent may run; dispatch failed");
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
                message: zopu_runtime::text::clip_bytes(reason, 500).to_owned(),
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
        let first = plan(&source, 7, Some(&binding), Ok(())).unwrap();
        let second = plan(&source, 7, Some(&binding), Ok(())).unwrap();
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
        let Plan::Dispatch(created) = plan(&source, 1, Some(&bound(&source)), Ok(())).unwrap()
        else {
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
            plan(&source, 1, Some(&bound(&source)), Ok(())).unwrap(),
            Plan::Skip(_)
        ));
        let other = envelope(&pb::AgentMessage::default());
        assert!(matches!(
            plan(&other, 1, Some(&bound(&other)), Ok(())).unwrap(),
            Plan::Skip(_)
        ));
    }

    #[test]
    fn no_agent_is_a_visible_failure() {
        let source = envelope(&pb::TimelineMessageSent {
            text: "hi".into(),
            ..Default::default()
        });
        let Plan::NoAgent(failed) = plan(&source, 1, None, Ok(())).unwrap() else {
            panic!()
        };
        assert_eq!(failed.event_type, pb::DispatchFailed::TYPE);
        assert!(failed.idempotency_key.ends_with(":state:failed"));
    }

    #[test]
    fn a_conversation_agent_the_registry_disables_is_a_visible_failure() {
        let source = envelope(&pb::TimelineMessageSent {
            text: "hi".into(),
            ..Default::default()
        });
        let disabled = NotRunnable::Disabled("conversation".to_owned());
        let Plan::NoAgent(failed) =
            plan(&source, 1, Some(&bound(&source)), Err(&disabled)).unwrap()
        else {
            panic!("refused")
        };
        let reason = pb::DispatchFailed::decode(failed.data.as_ref())
            .unwrap()
            .reason
            .unwrap();
        assert_eq!(reason.code, "agent.disabled_in_registry");
        assert!(!reason.retryable);
    }

    #[test]
    fn a_definition_is_recorded_until_the_project_has_it() {
        let registry = Registry::load(None, None).unwrap();
        let source = envelope(&pb::ProjectReady::default());
        let mut recorded = std::collections::BTreeMap::new();
        let first = definition_changes(&source, &registry, &recorded);
        assert_eq!(first.len(), registry.agents().count());
        assert!(
            first
                .iter()
                .all(|e| e.event_type == pb::AgentDefinitionChanged::TYPE)
        );
        for agent in registry.agents() {
            recorded.insert(agent.definition.key.clone(), agent.definition_hash.clone());
        }
        assert!(definition_changes(&source, &registry, &recorded).is_empty());
        recorded.insert("explorer".to_owned(), "older".to_owned());
        let changed = definition_changes(&source, &registry, &recorded);
        assert_eq!(changed.len(), 1);
        let message = pb::AgentDefinitionChanged::decode(changed[0].data.as_ref()).unwrap();
        assert_eq!(
            (
                message.agent_key.as_str(),
                message.previous_definition_hash.as_str()
            ),
            ("explorer", "older")
        );
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
