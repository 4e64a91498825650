//! Project workspaces and the agent's repository tools.
//!
//! Two halves share this crate. The workspace runtime (`workspace`, `git`,
//! `env_scan`, `checkout`) creates one sandboxed directory per project,
//! shallow-clones the repository with a hardened git (or checks out exactly a
//! recorded commit, for an instance that never saw the first clone), verifies
//! it and scans its root `.env.example`. The tools (`policy`, `confine`, `tools`) let an agent read
//! that repository without ever reading outside it or writing anywhere but
//! `<workspace>/.zopu/`. `egress` decides which hosts a clone may connect
//! to (no internal addresses unless allowlisted).
//!
//! Invariants: repository content is untrusted; no path leaves the workspace
//! root; no secret value (credential, `.env` value) is returned by any
//! function of this crate in a form that could reach an event, a log, a
//! prompt or an artifact.

pub mod checkout;
pub mod clone_settings;
pub mod confine;
pub mod egress;
pub mod env_scan;
pub mod git;
pub mod policy;
pub mod repo_paths;
pub mod tools;
pub mod workspace;
