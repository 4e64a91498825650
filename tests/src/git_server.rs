//! A private git server on loopback for clone tests: git's own smart-HTTP
//! backend (`git http-backend`, run as a CGI program per request) behind a
//! small HTTPS server that requires `Authorization: Basic` with one user
//! name and token, and answers anything else with 401 and a
//! `WWW-Authenticate` challenge, as a real host does for a private
//! repository. It counts the requests it refused and the ones it served, and
//! keeps every `Authorization` header it saw, so a test can tell the token
//! was presented and never anywhere else.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, pki_types::pem::PemObject as _};

use crate::certificates::Certificates;

/// What the server saw.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Requests answered 401 (no or a wrong `Authorization`).
    pub refused: usize,
    /// Requests handed to `git http-backend`.
    pub served: usize,
    /// Every `Authorization` header value received.
    pub authorizations: Vec<String>,
}

struct Shared {
    root: PathBuf,
    expected: String,
    seen: Mutex<Seen>,
}

/// The running server; stopped when dropped.
pub struct PrivateGitServer {
    address: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl PrivateGitServer {
    /// Serves the bare repositories under `root` over HTTPS with
    /// `certificates`' server certificate (for 127.0.0.1), to clients that
    /// send `username` and `token`.
    pub async fn start(
        root: &Path,
        certificates: &Certificates,
        username: &str,
        token: &str,
    ) -> Result<Self> {
        let chain =
            rustls::pki_types::CertificateDer::pem_file_iter(certificates.path("server.pem"))?
                .collect::<Result<Vec<_>, _>>()?;
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(certificates.path("server.key"))?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
        let tcp = TcpListener::bind("127.0.0.1:0").await?;
        let address = tcp.local_addr()?;
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{token}"))
        );
        let shared = Arc::new(Shared {
            root: root.to_owned(),
            expected,
            seen: Mutex::default(),
        });
        let app = axum::Router::new()
            .fallback(serve_git)
            .with_state(Arc::clone(&shared));
        let listener = TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        };
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            address,
            shared,
            task,
        })
    }

    /// `127.0.0.1:<port>`: the host a credential is stored under.
    pub fn host(&self) -> String {
        self.address.to_string()
    }

    /// The https URL of the repository `name` under the root (`acme/app.git`).
    pub fn url(&self, name: &str) -> String {
        format!("https://{}/{name}", self.address)
    }

    pub fn seen(&self) -> Seen {
        self.shared
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl std::fmt::Debug for PrivateGitServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateGitServer")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Drop for PrivateGitServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts TCP connections and completes their TLS handshake; a client
/// that fails the handshake is dropped and the next one accepted.
struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, address)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, address);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

async fn serve_git(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    {
        let mut seen = shared
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        seen.authorizations.extend(authorization.clone());
        if authorization.as_deref() != Some(shared.expected.as_str()) {
            seen.refused += 1;
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Basic realm=\"private git\"")],
                "authentication required\n",
            )
                .into_response();
        }
        seen.served += 1;
    }
    match http_backend(&shared.root, &method, &uri, &headers, body).await {
        Ok(response) => response,
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error:#}\n")).into_response(),
    }
}

/// Runs `git http-backend` for one request (RFC 3875 variables) and turns
/// its CGI output into the response.
async fn http_backend(
    root: &Path,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let header_text = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let mut child = tokio::process::Command::new("git")
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", root)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", method.as_str())
        .env("PATH_INFO", uri.path())
        .env("QUERY_STRING", uri.query().unwrap_or_default())
        .env("CONTENT_TYPE", header_text(header::CONTENT_TYPE))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env(
            "HTTP_CONTENT_ENCODING",
            header_text(header::CONTENT_ENCODING),
        )
        .env(
            "GIT_PROTOCOL",
            header_text(header::HeaderName::from_static("git-protocol")),
        )
        .env("REMOTE_USER", "private-git-user")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting git http-backend")?;
    let mut stdin = child.stdin.take().context("http-backend stdin")?;
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let output = child.wait_with_output().await?;
    let _ = writer.await;
    let (head, body) = split_cgi(&output.stdout).context("http-backend printed no headers")?;
    let mut response = Response::builder().status(StatusCode::OK);
    for line in head.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().unwrap_or("500");
            response = response.status(code.parse::<u16>().unwrap_or(500));
        } else {
            response = response.header(name.trim(), value);
        }
    }
    Ok(response.body(axum::body::Body::from(body.to_vec()))?)
}

/// The CGI header block (as text) and the body after the blank line.
fn split_cgi(output: &[u8]) -> Option<(String, &[u8])> {
    let (end, gap) = output
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .map(|at| (at, 4))
        .or_else(|| {
            output
                .windows(2)
                .position(|window| window == b"\n\n")
                .map(|at| (at, 2))
        })?;
    Some((
        String::from_utf8_lossy(&output[..end]).into_owned(),
        &output[end + gap..],
    ))
}
