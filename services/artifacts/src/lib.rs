//! Zopu's artifact library: typed manifest in, validated static HTML out.
//!
//! A specialist's [`ArtifactManifest`](zopu_schema::pb::ArtifactManifest) is
//! checked field by field ([`manifest`]), rendered with one of three curated
//! kits ([`render`]: project-setup, repository-exploration,
//! issue-definition), and the page is validated before anything is stored
//! ([`validate`]). [`build`] runs that pipeline with exactly one bounded
//! repair. This crate does no I/O and reads no clock; the service that wires
//! it to NATS and the object store passes the time in.
//!
//! Invariants:
//! - every page is self-contained and inert: one inline `<style>`, a CSP
//!   `<meta>` without `script-src`, no scripts, event handlers, forms, frames,
//!   remote resources or links other than `https:`, `mailto:` and `#anchors`;
//! - all manifest text reaches the page HTML-escaped (templates auto-escape;
//!   diagram labels are escaped where the SVG is built);
//! - a page [`build::build`] returns passed [`validate::validate`], which
//!   includes the `zopu-secrets` scan and the size cap;
//! - the same manifest and options render the same bytes.

pub mod build;
pub mod manifest;
pub mod render;
pub mod validate;

pub use build::{Built, BuildFailure, Options, build};
pub use render::Kit;
pub use validate::{Code, Location, Violation};
