//! The domain kernel: what a project, an agent, a command and a memory are,
//! shared by every service. It stands on `zopu-runtime` (events, streams,
//! consumers, stores) and on `zopu-schema` (the event contract); no service
//! and not the runtime depend on anything below it.
//!
//! `commands` builds every user command (create project, retry setup,
//! message, card action, kill switch) for the gateway and the CLI alike;
//! `delegation` builds the events that hand a request to a specialist, for
//! the conversation agent and for external agents alike; `memory` is the
//! agents' memory on the event log (the OSSA interface); `registry` is the
//! agent registry (`deploy/agents`); `secret_store` keeps the values that
//! never enter an event; `keywords` finds the subject words of a request;
//! `repetition` is the near-duplicate guardrail every agent output passes;
//! `model_usage` is the model-token tally behind the daily budget;
//! `metrics` holds the domain's metric families (model calls, flows,
//! artifacts, live-timeline streams), registered beside the runtime's.
//!
//! Invariants: a user command is built only here, so the gateway and the
//! CLI cannot build it differently; no type here prints a secret value or
//! key.

pub mod commands;
pub mod delegation;
pub mod keywords;
pub mod memory;
pub mod metrics;
pub mod model_usage;
pub mod registry;
pub mod repetition;
pub mod secret_store;
