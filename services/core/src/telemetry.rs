//! Tracing setup: key-value logs to stderr, filtered by `ZOPU_LOG`
//! (or `RUST_LOG`), `info` by default; JSON lines when `json` is set.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls are no-ops.
pub fn init(json: bool) {
    let filter = std::env::var("ZOPU_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new("info,async_nats=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.compact().try_init()
    };
}
