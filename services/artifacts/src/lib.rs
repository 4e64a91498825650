//! Zopu's artifact library: typed manifest in, validated static HTML out.
//!
//! A specialist's [`ArtifactManifest`](zopu_schema::pb::ArtifactManifest) is
//! checked field by field ([`zopu_schema::manifest`], the wire contract's own
//! validation), rendered with one of three curated
//! kits ([`render`]: project-setup, repository-exploration,
//! issue-definition), and the page is validated before anything is stored
//! ([`validate`]). [`build`] runs that pipeline with exactly one bounded
//! repair. Those modules do no I/O and read no clock.
//!
//! The service ([`service`]) wires them to the event log: a reaction on
//! `artifact.build.requested` checks the request's boundary, appends
//! `artifact.build.started`, builds, stores the page in the
//! `zopu-artifacts` object store ([`storage`]) and appends
//! `artifact.published` (or `artifact.failed`) and `artifact.superseded`;
//! a projection ([`catalog`]) keeps builds and revisions. [`fetch`] is the
//! read API for the gateway and the CLI.
//!
//! Invariants:
//! - every page is self-contained and inert: one inline `<style>`, a CSP
//!   `<meta>` without `script-src`, no scripts, event handlers, forms, frames,
//!   remote resources or links other than `https:`, `mailto:` and `#anchors`;
//! - all manifest text reaches the page HTML-escaped (templates auto-escape;
//!   diagram labels are escaped where the SVG is built);
//! - a page [`build::build`] returns passed [`validate::validate`], which
//!   includes the `zopu-secrets` scan and the size cap;
//! - the same manifest and options render the same bytes;
//! - events carry a page's reference and digest, never the page; a build id
//!   publishes at most one revision, and a revision number is published at
//!   most once per artifact (a newer one supersedes, never overwrites);
//! - a page is served only when its bytes match the published SHA-256.

pub mod build;
pub mod catalog;
pub mod fetch;
pub mod render;
pub mod service;
pub mod storage;
pub mod validate;

mod error;

pub use build::{BuildFailure, Built, Options, build};
pub use error::Error;
pub use fetch::{ArtifactMetadata, artifact_metadata, fetch_artifact};
pub use render::Kit;
pub use service::{Config, run};
pub use validate::{Code, Location, Violation};
