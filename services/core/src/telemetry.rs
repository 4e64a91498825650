//! Tracing setup: key-value logs to stderr, filtered by `ZOPU_LOG`
//! (or `RUST_LOG`), `info` by default; JSON lines when `json` is set.
//! Short-lived commands pass a quieter default with [`init_with_default`].

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls are no-ops.
pub fn init(json: bool) {
    init_with_default(json, "info,async_nats=warn");
}

/// [`init`] with another default filter (used when `ZOPU_LOG` is unset).
pub fn init_with_default(json: bool, default_filter: &str) {
    let filter = std::env::var("ZOPU_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.compact().try_init()
    };
}
