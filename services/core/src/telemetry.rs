//! Tracing setup: key-value logs to stderr, filtered by `ZOPU_LOG`
//! (or `RUST_LOG`), `info` by default; JSON lines when `json` is set.
//! Short-lived commands pass a quieter default with [`init_with_default`];
//! `zopu dev` sends the full log to a file with [`init_to_file`], so its
//! banner is not buried.

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

/// Installs the global subscriber with the full log (filtered as in
/// [`init_with_default`]) appended to `file`, and errors also on stderr,
/// so a failure is never only in the file.
pub fn init_to_file(file: std::fs::File, default_filter: &str) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = std::env::var("ZOPU_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new(default_filter));
    let to_file = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .with_filter(filter);
    let errors = tracing_subscriber::fmt::layer()
        .compact()
        .with_writer(std::io::stderr)
        .with_filter(tracing_subscriber::filter::LevelFilter::ERROR);
    let _ = tracing_subscriber::registry()
        .with(to_file)
        .with(errors)
        .try_init();
}
