//! One module per command group. Each exposes clap argument types and a
//! `run_*` function returning the process exit code.

pub mod bench;
pub mod log;
pub mod streams;
