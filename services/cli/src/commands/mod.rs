//! One module per command group. Each exposes clap argument types and a
//! `run_*` function returning the process exit code.

pub mod agent_key;
pub mod agent_runtime;
pub mod agents;
pub mod approvals;
pub mod artifact;
pub mod contract;
pub mod conversation;
pub mod credentials;
pub mod env;
pub mod export;
pub mod flow;
pub mod history;
pub mod log;
pub mod memory;
pub mod project;
pub mod runs;
pub mod services;
pub mod status;
pub mod streams;
pub mod table;
pub mod token;
pub mod why;
