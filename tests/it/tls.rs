//! Client TLS to NATS (issue 16, item 5): a real nats-server on loopback
//! with a `tls { ... }` block and certificates made for the test (a CA, a
//! server certificate for 127.0.0.1, a client certificate). A connection
//! through `zopu_runtime::nats` succeeds when it trusts the CA
//! (`ZOPU_NATS_CA_FILE`) and fails with an error naming that variable when
//! it does not; with `verify: true` it also needs the client certificate
//! (`ZOPU_NATS_CERT_FILE`, `ZOPU_NATS_KEY_FILE`). A missing or invalid file
//! is named before any connection is tried.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use zopu_runtime::local_server::LocalServer;
use zopu_runtime::nats::{
    CA_FILE_VARIABLE, CERT_FILE_VARIABLE, KEY_FILE_VARIABLE, connect_with_environment,
};
use zopu_tests::certificates::Certificates;

const CONNECT: Duration = Duration::from_secs(10);
/// How long a connection that must fail is given before it reports why.
const REFUSED: Duration = Duration::from_secs(3);

/// The nats-server side of a test's certificates.
trait TlsServer {
    fn server(&self, store: &Path, verify: bool) -> Result<LocalServer>;
}

impl TlsServer for Certificates {
    /// A server requiring TLS with this CA's server certificate; `verify`
    /// also requires a client certificate the CA signed.
    fn server(&self, store: &Path, verify: bool) -> Result<LocalServer> {
        let block = format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: {verify}\n  timeout: 2\n}}",
            self.path("server.pem").display(),
            self.path("server.key").display(),
            self.path("ca.pem").display(),
        );
        Ok(LocalServer::start_with_config(store, &block)?)
    }
}

/// An environment holding only `pairs`.
fn environment(
    pairs: Vec<(&'static str, PathBuf)>,
) -> impl Fn(&str) -> Result<String, std::env::VarError> {
    move |name| {
        pairs
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.display().to_string())
            .ok_or(std::env::VarError::NotPresent)
    }
}

async fn refusal(url: &str, pairs: Vec<(&'static str, PathBuf)>) -> Result<String> {
    match connect_with_environment(url, "zopu-tls-test", REFUSED, environment(pairs)).await {
        Ok(_) => bail!("connected to {url} although it should have been refused"),
        Err(error) => Ok(error.to_string()),
    }
}

#[tokio::test]
async fn a_client_trusting_the_ca_connects_and_one_without_it_is_told_to_set_it() -> Result<()> {
    let certificates = Certificates::make()?;
    let store = tempfile::tempdir()?;
    let server = certificates.server(store.path(), false)?;

    let bus = connect_with_environment(
        &server.url(),
        "zopu-tls-test",
        CONNECT,
        environment(vec![(CA_FILE_VARIABLE, certificates.path("ca.pem"))]),
    )
    .await
    .context("connecting with the CA configured")?;
    ensure!(
        bus.client.server_info().tls_required,
        "the server did not require TLS"
    );
    bus.jetstream
        .query_account()
        .await
        .context("JetStream over TLS")?;

    // The same over a tls:// URL.
    let tls_url = server.url().replacen("nats://", "tls://", 1);
    connect_with_environment(
        &tls_url,
        "zopu-tls-test",
        CONNECT,
        environment(vec![(CA_FILE_VARIABLE, certificates.path("ca.pem"))]),
    )
    .await
    .context("connecting over tls:// with the CA configured")?;

    let error = refusal(&server.url(), vec![]).await?;
    ensure!(
        error.contains("TLS") && error.contains(CA_FILE_VARIABLE),
        "the refusal does not say to trust the CA: {error}"
    );
    Ok(())
}

#[tokio::test]
async fn a_server_verifying_clients_needs_the_client_certificate() -> Result<()> {
    let certificates = Certificates::make()?;
    let store = tempfile::tempdir()?;
    let server = certificates.server(store.path(), true)?;

    let error = refusal(
        &server.url(),
        vec![(CA_FILE_VARIABLE, certificates.path("ca.pem"))],
    )
    .await?;
    ensure!(
        error.contains(CERT_FILE_VARIABLE),
        "the refusal does not name the client certificate: {error}"
    );

    connect_with_environment(
        &server.url(),
        "zopu-tls-test",
        CONNECT,
        environment(vec![
            (CA_FILE_VARIABLE, certificates.path("ca.pem")),
            (CERT_FILE_VARIABLE, certificates.path("client.pem")),
            (KEY_FILE_VARIABLE, certificates.path("client.key")),
        ]),
    )
    .await
    .context("connecting with the client certificate")?;
    Ok(())
}

#[tokio::test]
async fn a_missing_or_invalid_tls_file_is_named_before_connecting() -> Result<()> {
    let certificates = Certificates::make()?;
    // Nothing listens here: each error must come from the files, at once.
    let url = "nats://127.0.0.1:1";
    let missing = certificates.path("absent.pem");
    let error = refusal(url, vec![(CA_FILE_VARIABLE, missing.clone())]).await?;
    ensure!(
        error.contains(CA_FILE_VARIABLE) && error.contains(&missing.display().to_string()),
        "{error}"
    );
    let error = refusal(
        url,
        vec![(CA_FILE_VARIABLE, certificates.path("server.ext"))],
    )
    .await?;
    ensure!(
        error.contains(CA_FILE_VARIABLE) && error.contains("no PEM certificate"),
        "{error}"
    );
    let error = refusal(
        url,
        vec![
            (CERT_FILE_VARIABLE, certificates.path("client.pem")),
            (KEY_FILE_VARIABLE, certificates.path("client.pem")),
        ],
    )
    .await?;
    ensure!(
        error.contains(KEY_FILE_VARIABLE) && error.contains("private key"),
        "{error}"
    );
    let error = refusal(
        url,
        vec![(CERT_FILE_VARIABLE, certificates.path("client.pem"))],
    )
    .await?;
    ensure!(error.contains("go together"), "{error}");
    Ok(())
}

/// A parallel rebuild's readers connect with the same TLS and credentials
/// as the connection it was given: mutual TLS and a user and password here.
/// Every event arrives and decodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_reads_over_mutual_tls_with_a_password() -> Result<()> {
    use zopu_runtime::nats::{PASSWORD_VARIABLE, USER_VARIABLE};
    use zopu_runtime::publish::{NewEvent, Publisher};
    use zopu_schema::{OrgId, ProjectId, pb};

    let certificates = Certificates::make()?;
    let store = tempfile::tempdir()?;
    let block = format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n  timeout: 2\n}}\nauthorization {{\n  user: replayer\n  password: \"s3cret-replay\"\n}}",
        certificates.path("server.pem").display(),
        certificates.path("server.key").display(),
        certificates.path("ca.pem").display(),
    );
    let server = LocalServer::start_with_config(store.path(), &block)?;
    let files = vec![
        (CA_FILE_VARIABLE, certificates.path("ca.pem")),
        (CERT_FILE_VARIABLE, certificates.path("client.pem")),
        (KEY_FILE_VARIABLE, certificates.path("client.key")),
    ];
    let with_password = {
        let files = environment(files.clone());
        move |name: &str| match name {
            USER_VARIABLE => Ok("replayer".to_owned()),
            PASSWORD_VARIABLE => Ok("s3cret-replay".to_owned()),
            other => files(other),
        }
    };
    let bus = connect_with_environment(&server.url(), "zopu-tls-test", CONNECT, with_password)
        .await
        .context("connecting with TLS and the password")?;
    zopu_tests::apply_streams_on(&bus, 1, zopu_tests::DUPLICATE_WINDOW).await?;

    let org: OrgId = "tls".parse()?;
    let publisher = Publisher::new(bus.clone(), "gateway", None);
    let appended: u64 = 2_500; // three chunks of the parallel replay
    let mut last = 0;
    for index in 0..appended {
        let sent = pb::TimelineMessageSent {
            timeline_id: "global".into(),
            text: format!("message {index}"),
            ..Default::default()
        };
        let project = ProjectId::new();
        let event = NewEvent::root(
            org.clone(),
            project,
            &sent,
            format!("request:{index}"),
            None,
        );
        last = publisher.append(event).await?.sequence;
    }

    let in_memory = zopu_runtime::projection::read_into_memory(&bus, last).await?;
    ensure!(
        in_memory.len() == appended,
        "{} of {appended} events replayed",
        in_memory.len()
    );
    // Every event decoded: the key index holds each one's key, and nothing
    // was recorded as not understood.
    let written = zopu_runtime::Store::open(&store.path().join("keys.sqlite"))?;
    let reached = zopu_runtime::projection::apply_in_memory(
        &written,
        zopu_runtime::store::KeyIndex::all(),
        in_memory,
    )
    .await?;
    ensure!(reached == last, "applied up to {reached} of {last}");
    let (keys, undecodable): (i64, i64) = written.read(|conn| {
        conn.query_row(
            "SELECT (SELECT COUNT(*) FROM zopu_keys), (SELECT COUNT(*) FROM zopu_undecodable)",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
    })?;
    ensure!(
        keys == appended as i64 && undecodable == 0,
        "{keys} keys and {undecodable} undecodable events from {appended} appended"
    );

    Ok(())
}
