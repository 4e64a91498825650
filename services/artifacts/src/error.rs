use std::path::PathBuf;

/// What the artifact service and its read API report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Core(#[from] zopu_runtime::Error),
    #[error("configuration: {0}")]
    Config(#[from] zopu_runtime::config::ConfigError),
    #[error("artifact object store {operation}: {reason}")]
    ObjectStore {
        operation: &'static str,
        reason: String,
    },
    #[error("no published artifact {artifact_id}{}", revision.map(|r| format!(" revision {r}")).unwrap_or_default())]
    NotFound {
        artifact_id: String,
        revision: Option<u32>,
    },
    #[error(
        "artifact object {name} is named by a published event but is missing from the object store"
    )]
    ObjectMissing { name: String },
    #[error(
        "artifact object {name} does not match its published digest (expected sha256 {expected}, {expected_size} bytes; found {actual}, {actual_size} bytes): refusing to serve it"
    )]
    DigestMismatch {
        name: String,
        expected: String,
        actual: String,
        expected_size: u64,
        actual_size: u64,
    },
    #[error("artifact object {name} is {size} bytes, more than the {max} allowed")]
    TooLarge { name: String, size: u64, max: u64 },
    #[error("{operation} did not finish in time")]
    Timeout { operation: &'static str },
    #[error("I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}
