//! The event runtime every Zopu service stands on. It knows events, their
//! subjects and ids, streams, consumers and stores; it knows nothing of
//! projects' work, agents or artifacts (that is `zopu-core`, the domain
//! kernel, which stands on this crate).
//!
//! `config` loads layered settings; `telemetry` sets up tracing; `nats`
//! connects (with the server-version floor) and `streams` applies the
//! definitions in `streams/`; `publish` appends events with causation,
//! idempotency keys and the per-project version/hash chain; `store` is a
//! service's SQLite projection file; `projection` and `reaction` are THE two
//! consumer loops every service uses; `lease` shares a reaction's partitions
//! among a service's instances; `shutdown` is the process-wide
//! cancellation token and task tracker; `clock` is the injected wall clock and
//! fresh-id source; `runtime` bundles them for a service;
//! `text` holds the length limits applied to text put into events;
//! `metrics` is the process's Prometheus registry (the runtime's own
//! families; the domain's enter through `metrics::register`) and its
//! `/metrics` listener;
//! `chain` is the one rule for a project's version/hash chain, and `ledger`
//! the chain each store verified before its projections apply an event;
//! `audit` verifies a stream's chains; `log` reads a project's history;
//! `snapshot` keeps and restores a service's store at a stream sequence;
//! `causality` explains an event from its project's history (causes,
//! consequences, its correlation); `local_server` starts a nats-server of
//! its own (development, tests, benchmarks); `key_file` keeps a generated key;
//! `invariant` checks the invariants below where they must hold.
//!
//! Invariants: no other crate reads a JetStream consumer directly; every
//! append goes through [`publish::Publisher`], so every event carries
//! correlation and causation ids and extends its project's hash chain; a
//! projection's rows and its checkpoint are written in one transaction; no
//! projection applies, and no reaction acts on, an event that does not
//! extend its project's chain; a reaction acks a message only after its
//! appends were acknowledged.

pub mod audit;
pub mod causality;
pub mod chain;
pub mod clock;
pub mod config;
pub mod invariant;
pub mod key_file;
pub mod lease;
pub mod ledger;
pub mod local_server;
pub mod log;
pub mod metrics;
pub mod nats;
pub mod projection;
pub mod publish;
pub mod reaction;
pub mod runtime;
pub mod shutdown;
pub mod snapshot;
pub mod store;
pub mod streams;
pub mod telemetry;
pub mod text;

mod error;

pub use clock::Clock;
pub use error::Error;
pub use publish::{Appended, NewEvent, Publisher};
pub use reaction::{HandlerError, Reaction, ReactionConfig, ReactionContext};
pub use runtime::Runtime;
pub use shutdown::Shutdown;
pub use store::{Projection, Store};
