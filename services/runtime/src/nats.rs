//! Connecting to NATS: retry on first connect, unlimited reconnects, every
//! connection event logged, and a refusal to run against a nats-server
//! older than 2.12 or without JetStream.
//!
//! A URL may list several servers, comma-separated
//! (`nats://a:4222,nats://b:4222`, the seed list NATS tools accept for a
//! cluster): the client connects to any of them and, when its server dies,
//! reconnects to another (also to those the cluster announces).
//!
//! TLS is optional and off by default: a `tls://` URL or a CA file
//! (`ZOPU_NATS_CA_FILE`) requires it, and a client certificate and key
//! (`ZOPU_NATS_CERT_FILE`, `ZOPU_NATS_KEY_FILE`) add mutual TLS. Every file
//! is read and parsed before connecting, so a missing or invalid one is an
//! error naming the variable and the path, not a connect timeout.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;

use crate::Error;

/// The oldest nats-server Zopu runs against.
pub const MINIMUM_SERVER: (u64, u64) = (2, 12);

/// A connection and its JetStream context.
#[derive(Clone, Debug)]
pub struct Bus {
    pub client: async_nats::Client,
    pub jetstream: jetstream::Context,
    pub url: String,
    /// The credentials and TLS the connection was made with, for the
    /// connections a parallel rebuild opens beside it.
    pub security: Arc<Security>,
}

/// How long a connected client waits for JetStream to answer (a cluster
/// electing its leaders) before giving up, whatever the connect timeout.
const JETSTREAM_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest pause between two reconnect attempts (the client's default
/// backs off exponentially to 4s; a cluster node elects and answers sooner).
const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(1);

/// The servers of a comma-separated URL list, each `nats://host:port` or
/// `tls://host:port`. An error names the entry that is wrong.
pub fn server_list(url: &str) -> Result<Vec<async_nats::ServerAddr>, String> {
    let entries: Vec<&str> = url.split(',').map(str::trim).collect();
    // Before anything echoes the URL: credentials in it would be logged.
    if let Some(index) = entries.iter().position(|entry| carries_credentials(entry)) {
        return Err(format!(
            "entry {} carries credentials (user:password@ or token@): the URL is logged, so Zopu never takes them from it; set {USER_VARIABLE} with {PASSWORD_VARIABLE} or {PASSWORD_FILE_VARIABLE}, or {CREDENTIALS_FILE_VARIABLE}",
            index + 1
        ));
    }
    let mut servers = Vec::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        let position = index + 1;
        if entry.is_empty() {
            return Err(format!(
                "entry {position} of {url:?} is empty (write servers as nats://a:4222,nats://b:4222)"
            ));
        }
        if !(entry.starts_with("nats://") || entry.starts_with("tls://")) {
            return Err(format!(
                "entry {position} ({entry:?}) must start with nats:// or tls://"
            ));
        }
        let server: async_nats::ServerAddr = entry
            .parse()
            .map_err(|error| format!("entry {position} ({entry:?}): {error}"))?;
        if server.host().is_empty() {
            return Err(format!("entry {position} ({entry:?}) names no host"));
        }
        servers.push(server);
    }
    Ok(servers)
}

/// Whether a server URL has a user-info part (`nats://user:pass@host`).
fn carries_credentials(entry: &str) -> bool {
    let rest = entry.split_once("://").map_or(entry, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority.contains('@')
}

/// `url` with any user-info part replaced by `***`, for messages and logs.
pub fn redacted(url: &str) -> String {
    url.split(',')
        .map(|entry| {
            let trimmed = entry.trim();
            if !carries_credentials(trimmed) {
                return trimmed.to_owned();
            }
            let (scheme, rest) = trimmed.split_once("://").unwrap_or(("", trimmed));
            let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
            if scheme.is_empty() {
                format!("***@{host}")
            } else {
                format!("{scheme}://***@{host}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The environment variables that carry NATS credentials. They are secrets:
/// never configuration keys, never logged.
pub const USER_VARIABLE: &str = "ZOPU_NATS_USER";
pub const PASSWORD_VARIABLE: &str = "ZOPU_NATS_PASSWORD";
/// A file holding the password (a mounted Kubernetes Secret, a Docker secret).
pub const PASSWORD_FILE_VARIABLE: &str = "ZOPU_NATS_PASSWORD_FILE";
pub const CREDENTIALS_FILE_VARIABLE: &str = "ZOPU_NATS_CREDS";

/// The password from `ZOPU_NATS_PASSWORD` or the file `ZOPU_NATS_PASSWORD_FILE`
/// names (one trailing newline dropped), not both. Errors name the variable
/// and the path, never the password.
fn password(
    env: &impl Fn(&str) -> Result<String, std::env::VarError>,
) -> Result<Option<String>, String> {
    let inline = env(PASSWORD_VARIABLE).ok().filter(|v| !v.is_empty());
    let file = env(PASSWORD_FILE_VARIABLE).ok().filter(|v| !v.is_empty());
    match (inline, file) {
        (Some(_), Some(_)) => Err(format!(
            "set {PASSWORD_VARIABLE} or {PASSWORD_FILE_VARIABLE}, not both"
        )),
        (Some(password), None) => Ok(Some(password)),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|error| format!("{PASSWORD_FILE_VARIABLE} ({path}): {error}"))?;
            let password = text
                .strip_suffix('\n')
                .map(|t| t.strip_suffix('\r').unwrap_or(t))
                .unwrap_or(&text);
            if password.is_empty() {
                return Err(format!("{PASSWORD_FILE_VARIABLE} ({path}) is empty"));
            }
            Ok(Some(password.to_owned()))
        }
        (None, None) => Ok(None),
    }
}

/// How this process authenticates to NATS and whether it speaks TLS, read
/// once from the environment and used by every connection it opens (the
/// bus, [`connect`], and a parallel rebuild's readers beside it). Its
/// `Debug` names which kind of credential is set,
/// never the secret.
#[derive(Clone, Default)]
pub struct Security {
    pub(crate) credentials: Credentials,
    pub(crate) tls: TlsFiles,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let credentials = match &self.credentials {
            Credentials::Anonymous => "anonymous",
            Credentials::UserPassword { .. } => "user and password",
            Credentials::CredsFile(_) => "creds file",
        };
        formatter
            .debug_struct("Security")
            .field("credentials", &credentials)
            .field("tls", &self.tls)
            .finish()
    }
}

/// The credentials the environment names: a user and password
/// (`ZOPU_NATS_USER` and `ZOPU_NATS_PASSWORD` or `ZOPU_NATS_PASSWORD_FILE`,
/// both or neither) or a `.creds` file (`ZOPU_NATS_CREDS`, JWT and nkey).
/// None: an anonymous connection, as against a dev server.
#[derive(Clone, Default)]
pub(crate) enum Credentials {
    #[default]
    Anonymous,
    UserPassword {
        user: String,
        password: String,
    },
    /// The path of a `.creds` file.
    CredsFile(String),
}

impl Credentials {
    fn from_environment(
        env: &impl Fn(&str) -> Result<String, std::env::VarError>,
    ) -> Result<Self, String> {
        let user = env(USER_VARIABLE).ok().filter(|v| !v.is_empty());
        let password = password(env)?;
        let creds = env(CREDENTIALS_FILE_VARIABLE)
            .ok()
            .filter(|v| !v.is_empty());
        match (user, password, creds) {
            (Some(_), Some(_), Some(_)) => Err(format!(
                "set either {USER_VARIABLE}/{PASSWORD_VARIABLE} ({PASSWORD_FILE_VARIABLE}) or {CREDENTIALS_FILE_VARIABLE}, not both"
            )),
            (Some(user), Some(password), None) => Ok(Self::UserPassword { user, password }),
            (Some(_), None, _) | (None, Some(_), _) => Err(format!(
                "{USER_VARIABLE} and {PASSWORD_VARIABLE} (or {PASSWORD_FILE_VARIABLE}) go together: one of them is not set"
            )),
            (None, None, Some(path)) => {
                // Read (and so checked) before any connection, as the
                // client library reads it.
                creds_file(&path)?;
                Ok(Self::CredsFile(path))
            }
            (None, None, None) => Ok(Self::Anonymous),
        }
    }

    async fn apply(
        &self,
        options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, String> {
        match self {
            Self::Anonymous => Ok(options),
            Self::UserPassword { user, password } => {
                Ok(options.user_and_password(user.clone(), password.clone()))
            }
            Self::CredsFile(path) => options
                .credentials_file(path)
                .await
                .map_err(|error| format!("{CREDENTIALS_FILE_VARIABLE} ({path}): {error}")),
        }
    }
}

/// The user JWT and nkey seed of a `.creds` file (the blocks `nsc` writes:
/// `-----BEGIN NATS USER JWT-----` and `-----BEGIN USER NKEY SEED-----`,
/// each followed by its value on one line). An error names the variable
/// and the path, never the seed.
pub(crate) fn creds_file(path: &str) -> Result<(String, String), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("{CREDENTIALS_FILE_VARIABLE} ({path}): {error}"))?;
    let block_after = |marker: &str| {
        let mut lines = text.lines().map(str::trim);
        lines.find(|line| line.starts_with("-----BEGIN") && line.contains(marker))?;
        lines.find(|line| !line.is_empty()).map(str::to_owned)
    };
    match (block_after("JWT"), block_after("SEED")) {
        (Some(jwt), Some(seed)) if !jwt.starts_with("---") && !seed.starts_with("---") => {
            Ok((jwt, seed))
        }
        _ => Err(format!(
            "{CREDENTIALS_FILE_VARIABLE} ({path}) is not a .creds file: it needs a NATS USER JWT block and a USER NKEY SEED block"
        )),
    }
}

/// The environment variables that configure client TLS. File paths, not
/// secrets, but read beside the credentials so every `connect` (services,
/// CLI, benchmarks) honours them.
/// The CA certificates (PEM) that sign the servers' certificates: set, it
/// requires TLS and trusts only these.
pub const CA_FILE_VARIABLE: &str = "ZOPU_NATS_CA_FILE";
/// A client certificate (PEM) for mutual TLS, with [`KEY_FILE_VARIABLE`].
pub const CERT_FILE_VARIABLE: &str = "ZOPU_NATS_CERT_FILE";
/// The client certificate's private key (PEM), with [`CERT_FILE_VARIABLE`].
pub const KEY_FILE_VARIABLE: &str = "ZOPU_NATS_KEY_FILE";

/// The PEM certificates in the file `variable` names; an error names the
/// variable and the path when it is unreadable, not PEM or holds none.
pub(crate) fn read_certificates(
    variable: &str,
    path: &str,
) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let bytes = std::fs::read(path).map_err(|error| format!("{variable} ({path}): {error}"))?;
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("{variable} ({path}) is not a valid PEM file: {error}"))?;
    if certificates.is_empty() {
        return Err(format!(
            "{variable} ({path}) holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ));
    }
    Ok(certificates)
}

/// The TLS files the environment names (see [`CA_FILE_VARIABLE`]), each
/// read and parsed once so a missing or invalid one is named before any
/// connection. Nothing set: the connection is plain unless the URL says
/// `tls://` or the server requires TLS.
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsFiles {
    /// The CA file: set, TLS is required and only these roots are trusted.
    pub(crate) ca: Option<String>,
    /// A client certificate and its key (mutual TLS); also requires TLS.
    pub(crate) client: Option<(String, String)>,
}

impl TlsFiles {
    fn from_environment(
        env: &impl Fn(&str) -> Result<String, std::env::VarError>,
    ) -> Result<Self, String> {
        let read = |name: &str| env(name).ok().filter(|v| !v.is_empty());
        let ca = read(CA_FILE_VARIABLE);
        if let Some(path) = &ca {
            read_certificates(CA_FILE_VARIABLE, path)?;
        }
        let client = match (read(CERT_FILE_VARIABLE), read(KEY_FILE_VARIABLE)) {
            (Some(certificate), Some(key)) => {
                read_certificates(CERT_FILE_VARIABLE, &certificate)?;
                read_private_key(&key)?;
                Some((certificate, key))
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(format!(
                    "{CERT_FILE_VARIABLE} and {KEY_FILE_VARIABLE} go together (mutual TLS): one of them is not set"
                ));
            }
            (None, None) => None,
        };
        Ok(Self { ca, client })
    }

    fn apply(&self, options: async_nats::ConnectOptions) -> async_nats::ConnectOptions {
        let mut options = options;
        if let Some(path) = &self.ca {
            options = options.add_root_certificates(path.into()).require_tls(true);
        }
        if let Some((certificate, key)) = &self.client {
            options = options
                .add_client_certificate(certificate.into(), key.into())
                .require_tls(true);
        }
        options
    }
}

/// The PEM private key in the file [`KEY_FILE_VARIABLE`] names. An error
/// names the variable and the path; the key itself never reaches a message.
pub(crate) fn read_private_key(
    path: &str,
) -> Result<rustls_pki_types::PrivateKeyDer<'static>, String> {
    use rustls_pki_types::PrivateKeyDer;
    use rustls_pki_types::pem::PemObject;
    let bytes =
        std::fs::read(path).map_err(|error| format!("{KEY_FILE_VARIABLE} ({path}): {error}"))?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|error| {
        format!("{KEY_FILE_VARIABLE} ({path}) holds no valid PEM private key: {error}")
    })
}

impl Security {
    /// The credentials and TLS files `env` names, each checked.
    pub fn from_environment(
        env: &impl Fn(&str) -> Result<String, std::env::VarError>,
    ) -> Result<Self, String> {
        Ok(Self {
            credentials: Credentials::from_environment(env)?,
            tls: TlsFiles::from_environment(env)?,
        })
    }

    async fn apply(
        &self,
        options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, String> {
        Ok(self.tls.apply(self.credentials.apply(options).await?))
    }
}

/// What a server announces before any TLS handshake: the `tls_required`
/// and `tls_verify` flags of its plain-text `INFO` line, if it answers
/// within a second.
async fn announced_tls(server: &async_nats::ServerAddr) -> Option<(bool, bool)> {
    use tokio::io::AsyncBufReadExt;
    let probe = async {
        let stream = tokio::net::TcpStream::connect((server.host(), server.port()))
            .await
            .ok()?;
        let mut line = String::new();
        // The INFO line is a few hundred bytes; cap what a stranger can send.
        tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(stream, 16 * 1024))
            .read_line(&mut line)
            .await
            .ok()?;
        let info: serde_json::Value =
            serde_json::from_str(line.trim().strip_prefix("INFO ")?).ok()?;
        let flag = |name: &str| info.get(name).and_then(serde_json::Value::as_bool);
        Some((
            flag("tls_required").unwrap_or(false),
            flag("tls_verify").unwrap_or(false),
        ))
    };
    tokio::time::timeout(Duration::from_secs(1), probe)
        .await
        .ok()
        .flatten()
}

/// Why the first connection has not come up, for the timeout's message:
/// the last error the client reported and, when the first server
/// announces TLS, which TLS setting is missing.
async fn not_connected_reason(
    timeout: Duration,
    last_error: &Mutex<Option<String>>,
    server: &async_nats::ServerAddr,
    configured: &TlsFiles,
) -> String {
    let last = last_error
        .lock()
        .map(|slot| slot.clone())
        .unwrap_or_default();
    let Some(error) = last else {
        return format!(
            "no server answered within {}s (is nats-server running? `make run` starts one)",
            timeout.as_secs()
        );
    };
    let mut reason = format!(
        "no connection within {}s; the last attempt failed: {error}",
        timeout.as_secs()
    );
    let Some((tls_required, tls_verify)) = announced_tls(server).await else {
        reason.push_str(" (is nats-server running? `make run` starts one)");
        return reason;
    };
    let mut hints = Vec::new();
    if tls_required && configured.ca.is_none() {
        hints.push(format!(
            "{}:{} requires TLS and this client trusts only the system's CAs: set {CA_FILE_VARIABLE} to the CA that signed the server's certificate",
            server.host(),
            server.port()
        ));
    }
    if tls_verify && configured.client.is_none() {
        hints.push(format!(
            "{}:{} verifies client certificates (mutual TLS): set {CERT_FILE_VARIABLE} and {KEY_FILE_VARIABLE}",
            server.host(),
            server.port()
        ));
    }
    if tls_required && hints.is_empty() {
        hints.push(format!(
            "the TLS handshake failed: check that {CA_FILE_VARIABLE} holds the CA that signed the server's certificate (issued for the host in the URL) and that the server trusts the client certificate"
        ));
    }
    for hint in hints {
        reason.push_str("; ");
        reason.push_str(&hint);
    }
    reason
}

/// Connects to `url` (one server or a comma-separated list) as `name`. The
/// first connection is retried for up to `first_connect_timeout`; after
/// that the client reconnects forever, to any server it knows.
pub async fn connect(url: &str, name: &str, first_connect_timeout: Duration) -> Result<Bus, Error> {
    connect_with_environment(url, name, first_connect_timeout, |variable| {
        std::env::var(variable)
    })
    .await
}

/// [`connect`] with the credential and TLS variables read from `env`
/// instead of the process environment (a test runs several identities in
/// one process).
pub async fn connect_with_environment(
    url: &str,
    name: &str,
    first_connect_timeout: Duration,
    environment: impl Fn(&str) -> Result<String, std::env::VarError>,
) -> Result<Bus, Error> {
    // The URL first: credentials in it are refused before anything else.
    server_list(url).map_err(|reason| Error::Connect {
        url: redacted(url),
        reason,
    })?;
    let security = Security::from_environment(&environment).map_err(|reason| Error::Connect {
        url: redacted(url),
        reason,
    })?;
    connect_with_security(url, name, first_connect_timeout, Arc::new(security)).await
}

/// [`connect`] with credentials and TLS already read: how a replay opens
/// its extra connections with exactly the settings of the bus it was given.
pub async fn connect_with_security(
    url: &str,
    name: &str,
    first_connect_timeout: Duration,
    security: Arc<Security>,
) -> Result<Bus, Error> {
    let servers = server_list(url).map_err(|reason| Error::Connect {
        url: redacted(url),
        reason,
    })?;
    // `server_list` refused credentials in the URL; the redaction stays as
    // a second guard for everything below that prints it.
    let url = &redacted(url);
    // `server_list` returns at least one server or an error.
    let first_server = servers[0].clone();
    let events_url = url.to_owned();
    let last_error: Arc<Mutex<Option<String>>> = Arc::default();
    let events_last_error = Arc::clone(&last_error);
    let options = async_nats::ConnectOptions::new()
        .name(name)
        .retry_on_initial_connect()
        .max_reconnects(None)
        .reconnect_delay_callback(reconnect_delay)
        .connection_timeout(Duration::from_secs(5))
        .event_callback(move |event| {
            let url = events_url.clone();
            if let async_nats::Event::ClientError(error) = &event
                && let Ok(mut slot) = events_last_error.lock()
            {
                *slot = Some(error.to_string());
            }
            async move {
                match event {
                    async_nats::Event::Connected => tracing::info!(%url, "nats connected"),
                    async_nats::Event::Closed => tracing::info!(%url, "nats connection closed"),
                    // Asked for (a clean stop), not a fault.
                    async_nats::Event::Draining => tracing::info!(%url, "nats connection draining"),
                    async_nats::Event::Disconnected => {
                        tracing::warn!(%url, "nats disconnected; reconnecting")
                    }
                    other => tracing::warn!(%url, event = %other, "nats connection event"),
                }
            }
        });
    let options = security
        .apply(options)
        .await
        .map_err(|reason| Error::Connect {
            url: url.to_owned(),
            reason,
        })?;
    let connecting = async_nats::connect_with_options(servers, options);
    let Ok(connected) = tokio::time::timeout(first_connect_timeout, connecting).await else {
        return Err(Error::Connect {
            url: url.to_owned(),
            reason: not_connected_reason(
                first_connect_timeout,
                &last_error,
                &first_server,
                &security.tls,
            )
            .await,
        });
    };
    let client = connected.map_err(|error| Error::Connect {
        url: url.to_owned(),
        reason: error.to_string(),
    })?;
    // `retry_on_initial_connect` returns before the handshake; wait for it,
    // and for the server's INFO, which the client publishes a moment after
    // its state turns connected (an empty version read too early looked
    // like a server too old).
    let deadline = tokio::time::Instant::now() + first_connect_timeout;
    while client.connection_state() != async_nats::connection::State::Connected
        || client.server_info().version.is_empty()
    {
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Connect {
                url: url.to_owned(),
                reason: not_connected_reason(
                    first_connect_timeout,
                    &last_error,
                    &first_server,
                    &security.tls,
                )
                .await,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check_server(url, &client.server_info())?;
    let jetstream = jetstream::new(client.clone());
    // A cluster electing its meta leader, or a connection dropped under the
    // request, does not answer for a while (an R3 election takes 4-9 s):
    // only the server's own "not enabled" answer means JetStream is off.
    let deadline = tokio::time::Instant::now() + first_connect_timeout.max(JETSTREAM_READY_TIMEOUT);
    loop {
        let error = match jetstream.query_account().await {
            Ok(_) => break,
            Err(error) => error,
        };
        let disabled = match error.kind() {
            jetstream::context::AccountErrorKind::JetStream(inner) => matches!(
                inner.error_code(),
                jetstream::ErrorCode::JETSTREAM_NOT_ENABLED
                    | jetstream::ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
            ),
            _ => false,
        };
        if disabled {
            return Err(Error::JetStreamDisabled {
                url: url.to_owned(),
            });
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Connect {
                url: url.to_owned(),
                reason: format!(
                    "JetStream did not answer within {}s: {error}",
                    first_connect_timeout.max(JETSTREAM_READY_TIMEOUT).as_secs()
                ),
            });
        }
        tracing::warn!(%url, %error, "JetStream not answering yet; retrying");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(Bus {
        client,
        jetstream,
        url: url.to_owned(),
        security,
    })
}

/// How long a starting service tries a JetStream request again while the
/// cluster does not answer (a node restarting, a leader election).
pub const STARTING_RETRY: Duration = Duration::from_secs(60);

/// The pause after `failures` failed tries of a request the cluster did
/// not answer: 250 ms more each time, up to 2 s.
pub fn unanswered_pause(failures: u64) -> Duration {
    Duration::from_millis(250 * failures.min(8))
}

/// `operation`'s value, tried again after each failure `transient` names,
/// waiting longer each time (up to 2 s), until [`STARTING_RETRY`] has
/// passed: what a service opens while it starts (its streams' check, its
/// buckets) must not stop it because a node is restarting. Any other
/// failure, or the last one, is returned as it is.
pub async fn while_unanswered<T, E, F, Fut>(
    what: &str,
    transient: impl Fn(&E) -> bool,
    mut operation: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + STARTING_RETRY;
    let mut failures = 0u64;
    loop {
        match operation().await {
            Err(error) if transient(&error) && tokio::time::Instant::now() < deadline => {
                failures += 1;
                tracing::warn!(%error, failures, "cannot {what} yet; trying again");
                tokio::time::sleep(unanswered_pause(failures)).await;
            }
            result => return result,
        }
    }
}

/// Opens the key-value bucket `bucket` ([`while_unanswered`]: a bucket
/// `zopu streams apply` made is opened even while a node restarts).
pub async fn key_value(
    jetstream: &jetstream::Context,
    bucket: &str,
) -> Result<jetstream::kv::Store, jetstream::context::KeyValueError> {
    let what = format!("open the {bucket} bucket");
    while_unanswered(
        &what,
        |error: &jetstream::context::KeyValueError| {
            error.kind() != jetstream::context::KeyValueErrorKind::InvalidStoreName
        },
        || jetstream.get_key_value(bucket),
    )
    .await
}

/// Opens the object store `bucket` ([`while_unanswered`]).
pub async fn object_store(
    jetstream: &jetstream::Context,
    bucket: &str,
) -> Result<jetstream::object_store::ObjectStore, jetstream::context::ObjectStoreError> {
    let what = format!("open the {bucket} object store");
    while_unanswered(
        &what,
        |error: &jetstream::context::ObjectStoreError| {
            error.kind() != jetstream::context::ObjectStoreErrorKind::InvalidBucketName
        },
        || jetstream.get_object_store(bucket),
    )
    .await
}

/// The pause before reconnect attempt `attempts` (1-based): none for the
/// first, then doubling from 2ms up to [`RECONNECT_DELAY_MAX`].
fn reconnect_delay(attempts: usize) -> Duration {
    if attempts <= 1 {
        return Duration::ZERO;
    }
    let exponent = u32::try_from(attempts - 1).unwrap_or(u32::MAX).min(20);
    Duration::from_millis(2u64.saturating_pow(exponent)).min(RECONNECT_DELAY_MAX)
}

fn check_server(url: &str, info: &async_nats::ServerInfo) -> Result<(), Error> {
    let found = info.version.clone();
    let mut parts = found
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|part| part.parse::<u64>().ok());
    let major = parts.next().flatten();
    let minor = parts.next().flatten();
    match (major, minor) {
        (Some(major), Some(minor)) if (major, minor) >= MINIMUM_SERVER => {}
        _ => {
            return Err(Error::ServerTooOld {
                url: url.to_owned(),
                found,
            });
        }
    }
    if !info.jetstream {
        return Err(Error::JetStreamDisabled {
            url: url.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{PASSWORD_VARIABLE, Security, USER_VARIABLE};

    #[tokio::test]
    async fn a_starting_request_is_tried_again_while_unanswered_and_a_refusal_returns_at_once() {
        let mut calls = 0;
        let answered = super::while_unanswered(
            "answer",
            |error: &String| error.contains("timed out"),
            || {
                calls += 1;
                let attempt = calls;
                async move {
                    if attempt < 3 {
                        Err("request timed out".to_owned())
                    } else {
                        Ok(attempt)
                    }
                }
            },
        )
        .await;
        assert_eq!(answered, Ok(3), "two timeouts are tried again");
        let mut calls = 0;
        let refused: Result<(), String> = super::while_unanswered(
            "answer",
            |error: &String| error.contains("timed out"),
            || {
                calls += 1;
                async { Err("stream not found".to_owned()) }
            },
        )
        .await;
        assert_eq!(refused, Err("stream not found".to_owned()));
        assert_eq!(calls, 1, "a refusal is not tried again");
    }

    fn env_of(
        pairs: &'static [(&'static str, &'static str)],
    ) -> impl Fn(&str) -> Result<String, std::env::VarError> {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
                .ok_or(std::env::VarError::NotPresent)
        }
    }

    #[test]
    fn credentials_come_in_pairs_and_never_print() {
        assert!(Security::from_environment(&env_of(&[])).is_ok());
        let half = Security::from_environment(&env_of(&[(USER_VARIABLE, "dispatch")]))
            .err()
            .unwrap_or_default();
        assert!(half.contains(PASSWORD_VARIABLE), "{half}");
        let both = Security::from_environment(&env_of(&[
            (USER_VARIABLE, "dispatch"),
            (PASSWORD_VARIABLE, "s3cret-value"),
        ]));
        let both = both
            .map(|security| format!("{security:?}"))
            .unwrap_or_default();
        assert!(
            both.contains("user and password") && !both.contains("s3cret"),
            "{both}"
        );
        let missing_file =
            Security::from_environment(&env_of(&[("ZOPU_NATS_CREDS", "/nonexistent/zopu.creds")]))
                .err()
                .unwrap_or_default();
        assert!(
            missing_file.contains("/nonexistent/zopu.creds"),
            "{missing_file}"
        );
        assert!(!missing_file.contains("s3cret"));
    }

    #[tokio::test]
    async fn the_password_may_come_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("password");
        std::fs::write(&path, "s3cret-value\n").unwrap();
        let path: &'static str = Box::leak(path.display().to_string().into_boxed_str());
        let pairs: &'static [(&'static str, &'static str)] = Box::leak(Box::new([
            (USER_VARIABLE, "dispatch"),
            (super::PASSWORD_FILE_VARIABLE, path),
        ]));
        assert_eq!(
            super::password(&env_of(pairs)).unwrap().as_deref(),
            Some("s3cret-value")
        );
        assert!(Security::from_environment(&env_of(pairs)).is_ok());
        let both = super::password(&env_of(&[
            (PASSWORD_VARIABLE, "s3cret-value"),
            (super::PASSWORD_FILE_VARIABLE, "/nonexistent/password"),
        ]))
        .unwrap_err();
        assert!(
            both.contains("not both") && !both.contains("s3cret"),
            "{both}"
        );
        let missing = super::password(&env_of(&[(
            super::PASSWORD_FILE_VARIABLE,
            "/nonexistent/password",
        )]))
        .unwrap_err();
        assert!(missing.contains("/nonexistent/password"), "{missing}");
    }

    #[test]
    fn a_creds_file_gives_its_jwt_and_seed_and_a_broken_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("user.creds");
        std::fs::write(
            &path,
            "-----BEGIN NATS USER JWT-----\neyJ0eXAi.payload.sig\n------END NATS USER JWT------\n\n\
             ***** IMPORTANT *****\nNKEY Seed printed below.\n\n\
             -----BEGIN USER NKEY SEED-----\nSUAKEXAMPLESEED\n------END USER NKEY SEED------\n",
        )
        .unwrap();
        let path = path.display().to_string();
        assert_eq!(
            super::creds_file(&path).unwrap(),
            (
                "eyJ0eXAi.payload.sig".to_owned(),
                "SUAKEXAMPLESEED".to_owned()
            )
        );
        let broken = dir.path().join("broken.creds");
        std::fs::write(
            &broken,
            "-----BEGIN NATS USER JWT-----\n------END NATS USER JWT------\n",
        )
        .unwrap();
        let error = super::creds_file(&broken.display().to_string()).unwrap_err();
        assert!(
            error.contains("broken.creds") && error.contains("SEED"),
            "{error}"
        );
    }

    #[test]
    fn credentials_in_the_url_are_refused_without_echoing_them() {
        for url in [
            "nats://setup:s3cret-value@127.0.0.1:4222",
            "nats://127.0.0.1:4222,tls://s3cret-value@nats.example:4222",
            "nats://s3cret-value@127.0.0.1:4222/",
        ] {
            let error = server_list(url).unwrap_err();
            assert!(error.contains("carries credentials"), "{error}");
            assert!(!error.contains("s3cret"), "{error}");
            assert!(!redacted(url).contains("s3cret"), "{}", redacted(url));
        }
        assert_eq!(
            redacted("nats://setup:s3cret-value@127.0.0.1:4222"),
            "nats://***@127.0.0.1:4222"
        );
        assert_eq!(redacted("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        let config = crate::config::CoreConfig {
            nats_url: "nats://setup:s3cret-value@127.0.0.1:4222".into(),
            ..Default::default()
        };
        let error = config.validate().unwrap_err().to_string();
        assert!(
            error.contains("nats_url") && !error.contains("s3cret"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_connect_error_never_prints_the_credentials() {
        let error = connect(
            "nats://setup:s3cret-value@127.0.0.1:1",
            "zopu-test",
            Duration::from_millis(100),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(!error.contains("s3cret"), "{error}");
        assert!(error.contains("***@127.0.0.1:1"), "{error}");
    }

    use super::*;

    fn info(version: &str) -> async_nats::ServerInfo {
        async_nats::ServerInfo {
            version: version.into(),
            jetstream: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_url_may_list_several_servers() {
        let servers = server_list("nats://127.0.0.1:4222").unwrap();
        assert_eq!(servers.len(), 1);
        assert_eq!(servers[0].port(), 4222);
        let servers =
            server_list("nats://10.0.0.1:4222, nats://10.0.0.2:4223,tls://nats.example:4224")
                .unwrap();
        let hosts: Vec<(&str, u16)> = servers.iter().map(|s| (s.host(), s.port())).collect();
        assert_eq!(
            hosts,
            [
                ("10.0.0.1", 4222),
                ("10.0.0.2", 4223),
                ("nats.example", 4224)
            ]
        );
        assert!(servers[2].tls_required());
    }

    #[test]
    fn a_bad_entry_in_a_server_list_is_named() {
        let error = server_list("nats://a:4222,http://b:4222").unwrap_err();
        assert!(
            error.contains("entry 2") && error.contains("http://b:4222"),
            "{error}"
        );
        let error = server_list("nats://a:4222,").unwrap_err();
        assert!(
            error.contains("entry 2") && error.contains("empty"),
            "{error}"
        );
        let error = server_list("nats://a:4222,nats://b:port").unwrap_err();
        assert!(
            error.contains("entry 2") && error.contains("nats://b:port"),
            "{error}"
        );
        let error = server_list("a:4222").unwrap_err();
        assert!(error.contains("entry 1"), "{error}");
    }

    #[test]
    fn reconnects_back_off_to_a_bound() {
        assert_eq!(reconnect_delay(1), Duration::ZERO);
        assert_eq!(reconnect_delay(2), Duration::from_millis(2));
        assert_eq!(reconnect_delay(5), Duration::from_millis(16));
        assert_eq!(reconnect_delay(12), RECONNECT_DELAY_MAX);
        assert_eq!(reconnect_delay(usize::MAX), RECONNECT_DELAY_MAX);
    }

    #[test]
    fn version_floor_is_enforced() {
        assert!(check_server("u", &info("2.12.0")).is_ok());
        assert!(check_server("u", &info("2.15.1")).is_ok());
        assert!(check_server("u", &info("3.0.0-beta")).is_ok());
        let error = check_server("u", &info("2.9.25")).unwrap_err().to_string();
        assert!(
            error.contains("2.9.25") && error.contains("make setup"),
            "{error}"
        );
        assert!(check_server("u", &info("garbage")).is_err());
    }
}
