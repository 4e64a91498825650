//! A rebuild's own reader of the NATS wire protocol, for bulk replay only.
//!
//! async-nats turns every message's headers into a `HeaderMap`: for each of
//! an event's fifteen-odd CloudEvents headers an owned name, an owned value
//! and a SipHash insert. On a replay of millions of events that is most of
//! the reading's CPU (`zopu bench scale` measured raw reading through the
//! client library at 0.4× of the same number of header-less messages, and
//! a rebuild bounded by it). This reader hands each message to the caller
//! as slices of its read buffer (subject, `$JS.ACK` reply, header lines,
//! body), so a rebuild decodes an envelope straight from the bytes that
//! arrived, with nothing allocated on the way.
//!
//! It speaks only what a replay needs: `INFO`/`CONNECT` with the same
//! credentials and TLS as every other connection of the process
//! ([`crate::nats::Security`]: user and password, a `.creds` file's JWT
//! and nkey signature, a CA file, mutual TLS), one inbox subscription per
//! pull request, `PUB` of the request, `HMSG`/`MSG` frames, `PING`/`PONG`
//! and `-ERR`. Consumers are still created and deleted through async-nats;
//! a pull whose frames stop arriving for [`SILENCE`] is an error, and the
//! replay that used it fails and starts again as any failed read does.
//! When it cannot connect, the caller reads through the client library
//! instead (slower, same events).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::Error;
use crate::nats::{Bus, CA_FILE_VARIABLE, CERT_FILE_VARIABLE, Credentials, Security};

/// Bytes read from the socket at a time (a chunk of 1,000 events is about
/// 600 KB): the buffer grows to hold one frame when a frame is larger.
const READ_CAPACITY: usize = 256 * 1024;
/// The longest `INFO` or control line accepted from a server.
const MAX_LINE: usize = 64 * 1024;
/// How long a pull may go with nothing arriving before it is an error.
const SILENCE: Duration = Duration::from_secs(30);
/// How long one server may take to accept a connection (TCP, INFO, TLS,
/// CONNECT and PONG), as the client library allows, before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server keeps a pull request open (it answers 408 after).
const PULL_EXPIRES: Duration = Duration::from_secs(25);

trait Socket: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Socket for T {}

/// One connection speaking the replay's part of the NATS protocol.
pub(crate) struct WireReader {
    socket: Box<dyn Socket>,
    buffer: BytesMut,
    /// This connection's inbox prefix; each pull gets `<inbox>.<sid>`.
    inbox: String,
    next_sid: u64,
}

impl std::fmt::Debug for WireReader {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("WireReader")
            .field("inbox", &self.inbox)
            .finish_non_exhaustive()
    }
}

/// One message of a pull, borrowed from the read buffer.
#[derive(Debug)]
pub(crate) struct Delivered<'a> {
    pub subject: &'a str,
    pub sequence: u64,
    /// Messages left for the consumer after this one.
    pub pending: u64,
    header_block: &'a str,
    pub body: &'a [u8],
}

impl<'a> Delivered<'a> {
    /// The `(name, value)` pairs of the message's headers, as async-nats
    /// reads them: split at the first `:`, both sides trimmed.
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, &'a str)> + use<'a> {
        header_lines(self.header_block)
    }
}

/// What the caller wants after a message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    More,
    Done,
}

/// The server's `INFO`, what the handshake needs of it.
#[derive(Debug, Deserialize)]
struct ServerInfo {
    #[serde(default)]
    tls_required: bool,
    #[serde(default)]
    nonce: Option<String>,
}

fn wire_error(reason: impl std::fmt::Display) -> Error {
    Error::jetstream("replay wire", reason)
}

/// Opens a wire reader to the first server of `bus` that accepts it, with
/// the bus's credentials and TLS. An error names each server's refusal.
pub(crate) async fn connect(bus: &Bus, name: &str) -> Result<WireReader, Error> {
    let servers = crate::nats::server_list(&bus.url).map_err(wire_error)?;
    let mut refusals = Vec::new();
    for server in servers {
        let attempt = tokio::time::timeout(
            CONNECT_TIMEOUT,
            WireReader::connect(&server, &bus.security, name),
        )
        .await
        .unwrap_or_else(|_| {
            Err(wire_error(format!(
                "no handshake within {}s",
                CONNECT_TIMEOUT.as_secs()
            )))
        });
        match attempt {
            Ok(reader) => return Ok(reader),
            Err(error) => refusals.push(format!("{}:{}: {error}", server.host(), server.port())),
        }
    }
    Err(wire_error(refusals.join("; ")))
}

impl WireReader {
    async fn connect(
        server: &async_nats::ServerAddr,
        security: &Security,
        name: &str,
    ) -> Result<Self, Error> {
        let tcp = TcpStream::connect((server.host(), server.port()))
            .await
            .map_err(wire_error)?;
        tcp.set_nodelay(true).map_err(wire_error)?;
        let mut reader = Self {
            socket: Box::new(tcp),
            buffer: BytesMut::with_capacity(READ_CAPACITY),
            inbox: format!("_INBOX.{}", uuid::Uuid::new_v4().simple()),
            next_sid: 1,
        };
        let line = reader.line().await?;
        let info: ServerInfo = line
            .strip_prefix("INFO ")
            .ok_or_else(|| wire_error(format!("the server did not start with INFO: {line:.80}")))
            .and_then(|json| serde_json::from_str(json).map_err(wire_error))?;
        let tls = info.tls_required || server.tls_required() || security.tls.required();
        if tls {
            reader.socket = Box::new(handshake(reader.socket, server.host(), security).await?);
        }
        let mut connect = serde_json::json!({
            "verbose": false,
            "pedantic": false,
            "tls_required": tls,
            "name": name,
            "lang": "rust",
            "version": env!("CARGO_PKG_VERSION"),
            "protocol": 1,
            "headers": true,
            "no_responders": true,
            "echo": false,
        });
        match &security.credentials {
            Credentials::Anonymous => {}
            Credentials::UserPassword { user, password } => {
                connect["user"] = user.clone().into();
                connect["pass"] = password.clone().into();
            }
            Credentials::CredsFile(path) => {
                let (jwt, seed) = crate::nats::creds_file(path).map_err(wire_error)?;
                let key = nkeys::KeyPair::from_seed(&seed).map_err(|_| {
                    wire_error(format!("the nkey seed in {path} is not a valid seed"))
                })?;
                let nonce = info.nonce.as_deref().unwrap_or_default();
                let signature = key
                    .sign(nonce.as_bytes())
                    .map_err(|error| wire_error(format!("signing the server's nonce: {error}")))?;
                use base64::Engine;
                connect["jwt"] = jwt.into();
                connect["sig"] = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .encode(signature)
                    .into();
            }
        }
        let hello = format!("CONNECT {connect}\r\nPING\r\n");
        reader.write(hello.as_bytes()).await?;
        loop {
            let line = reader.line().await?;
            if line.starts_with("PONG") {
                return Ok(reader);
            }
            if let Some(refusal) = line.strip_prefix("-ERR") {
                return Err(wire_error(format!("refused: {}", refusal.trim())));
            }
            // +OK, INFO (cluster updates), PING before the handshake ends.
            if line.starts_with("PING") {
                reader.write(b"PONG\r\n").await?;
            }
        }
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.socket.write_all(bytes).await.map_err(wire_error)?;
        self.socket.flush().await.map_err(wire_error)
    }

    /// Reads more from the socket; silence for [`SILENCE`] or a closed
    /// connection is an error.
    async fn fill(&mut self) -> Result<(), Error> {
        if self.buffer.capacity() - self.buffer.len() < READ_CAPACITY / 4 {
            self.buffer.reserve(READ_CAPACITY);
        }
        let read = tokio::time::timeout(SILENCE, self.socket.read_buf(&mut self.buffer))
            .await
            .map_err(|_| wire_error(format!("nothing arrived for {}s", SILENCE.as_secs())))?
            .map_err(wire_error)?;
        if read == 0 {
            return Err(wire_error("the server closed the connection"));
        }
        Ok(())
    }

    /// The next control line (`INFO`, `PONG`, `-ERR`, ...), without its CRLF.
    async fn line(&mut self) -> Result<String, Error> {
        loop {
            if let Some(end) = line_end(&self.buffer) {
                let line = String::from_utf8_lossy(&self.buffer[..end]).into_owned();
                self.buffer.advance(end + 2);
                return Ok(line);
            }
            if self.buffer.len() > MAX_LINE {
                return Err(wire_error("a control line longer than 64 KiB"));
            }
            self.fill().await?;
        }
    }

    /// Pulls up to `batch` messages of `consumer` on `stream` and hands each
    /// to `each` in the order they arrive, until `each` says
    /// [`Flow::Done`] or the server says there are no more (404 or 408).
    /// The pull's own inbox is unsubscribed after, so messages of a batch
    /// left unread never reach the next pull.
    pub(crate) async fn pull(
        &mut self,
        stream: &str,
        consumer: &str,
        batch: usize,
        mut each: impl FnMut(Delivered<'_>) -> Result<Flow, Error>,
    ) -> Result<(), Error> {
        let sid = self.next_sid;
        self.next_sid += 1;
        let inbox = format!("{}.{sid}", self.inbox);
        let request = serde_json::json!({
            "batch": batch,
            "expires": PULL_EXPIRES.as_nanos() as u64,
        })
        .to_string();
        let commands = format!(
            "SUB {inbox} {sid}\r\nPUB $JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer} {inbox} {}\r\n{request}\r\n",
            request.len()
        );
        self.write(commands.as_bytes()).await?;
        let outcome = self.read_frames(sid, &mut each).await;
        self.write(format!("UNSUB {sid}\r\n").as_bytes()).await?;
        outcome
    }

    async fn read_frames(
        &mut self,
        sid: u64,
        each: &mut impl FnMut(Delivered<'_>) -> Result<Flow, Error>,
    ) -> Result<(), Error> {
        loop {
            while let Some(end) = line_end(&self.buffer) {
                let line = &self.buffer[..end];
                if line.starts_with(b"HMSG ") || line.starts_with(b"MSG ") {
                    let frame = Frame::parse(line)?;
                    let whole = end + 2 + frame.total + 2;
                    if self.buffer.len() < whole {
                        if self.buffer.capacity() < whole {
                            self.buffer.reserve(whole - self.buffer.len());
                        }
                        break;
                    }
                    let flow = if frame.sid == sid {
                        let body = &self.buffer[end + 2..end + 2 + frame.total];
                        let subject = std::str::from_utf8(&line[frame.subject.clone()])
                            .map_err(wire_error)?;
                        let reply =
                            std::str::from_utf8(&line[frame.reply.clone()]).map_err(wire_error)?;
                        deliver(subject, reply, body, frame.header_length, each)?
                    } else {
                        // A frame of an earlier pull that ended early.
                        Flow::More
                    };
                    self.buffer.advance(whole);
                    if flow == Flow::Done {
                        return Ok(());
                    }
                } else if line.starts_with(b"PING") {
                    self.buffer.advance(end + 2);
                    self.write(b"PONG\r\n").await?;
                } else if let Some(refusal) = line.strip_prefix(b"-ERR") {
                    return Err(wire_error(format!(
                        "the server answered {}",
                        String::from_utf8_lossy(refusal).trim()
                    )));
                } else {
                    // +OK, PONG, INFO: nothing for a pull.
                    self.buffer.advance(end + 2);
                }
            }
            if self.buffer.len() > MAX_LINE && line_end(&self.buffer).is_none() {
                return Err(wire_error("a protocol line longer than 64 KiB"));
            }
            self.fill().await?;
        }
    }
}

/// Where the first line of `buffer` ends: the position of its `\r\n`.
/// (A `\n` search: the protocol ends every line with `\r\n`, and the
/// `memchr` crate's single-byte search needs no searcher built per call.)
fn line_end(buffer: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = memchr::memchr(b'\n', &buffer[from..]) {
        let newline = from + found;
        if newline > 0 && buffer[newline - 1] == b'\r' {
            return Some(newline - 1);
        }
        from = newline + 1;
    }
    None
}

/// A message or status frame of one pull: a stored message goes to `each`;
/// 404 (nothing left) and 408 (the request expired) end the pull, 100 (a
/// heartbeat) is skipped, any other status is an error naming it.
fn deliver(
    subject: &str,
    reply: &str,
    body: &[u8],
    header_length: usize,
    each: &mut impl FnMut(Delivered<'_>) -> Result<Flow, Error>,
) -> Result<Flow, Error> {
    let header_block = std::str::from_utf8(&body[..header_length]).map_err(wire_error)?;
    if let Some(status) = status_of(header_block) {
        return match status {
            "100" => Ok(Flow::More),
            "404" | "408" => Ok(Flow::Done),
            _ => Err(wire_error(format!(
                "the pull ended with status {}",
                header_block.lines().next().unwrap_or_default().trim()
            ))),
        };
    }
    let (sequence, pending) = sequence_and_pending(reply).ok_or_else(|| {
        wire_error(format!(
            "{reply:?} is not a JetStream delivery's reply subject"
        ))
    })?;
    each(Delivered {
        subject,
        sequence,
        pending,
        header_block,
        body: &body[header_length..],
    })
}

/// The positions of a `MSG`/`HMSG` line's fields.
#[derive(Debug)]
struct Frame {
    subject: std::ops::Range<usize>,
    reply: std::ops::Range<usize>,
    sid: u64,
    header_length: usize,
    total: usize,
}

impl Frame {
    /// `HMSG <subject> <sid> [reply] <header bytes> <total bytes>` or
    /// `MSG <subject> <sid> [reply] <bytes>`.
    fn parse(line: &[u8]) -> Result<Self, Error> {
        let bad = || {
            wire_error(format!(
                "malformed frame {:?}",
                String::from_utf8_lossy(line)
            ))
        };
        let with_headers = line.starts_with(b"H");
        // At most six fields; a seventh makes the frame malformed.
        let mut fields: [std::ops::Range<usize>; 7] = Default::default();
        let mut count = 0;
        let mut start = 0;
        for end in memchr::memchr_iter(b' ', line).chain([line.len()]) {
            if end > start {
                if count == fields.len() {
                    return Err(bad());
                }
                fields[count] = start..end;
                count += 1;
            }
            start = end + 1;
        }
        let fields = &fields[..count];
        let number = |range: &std::ops::Range<usize>| {
            std::str::from_utf8(&line[range.clone()])
                .ok()
                .and_then(|text| text.parse::<usize>().ok())
                .ok_or_else(bad)
        };
        let (reply, lengths) = match (with_headers, fields.len()) {
            (true, 6) | (false, 5) => (fields[3].clone(), &fields[4..]),
            (true, 5) | (false, 4) => (0..0, &fields[3..]),
            _ => return Err(bad()),
        };
        let (header_length, total) = match lengths {
            [header, total] => (number(header)?, number(total)?),
            [total] => (0, number(total)?),
            _ => return Err(bad()),
        };
        if header_length > total {
            return Err(bad());
        }
        Ok(Self {
            subject: fields[1].clone(),
            reply,
            sid: number(&fields[2])? as u64,
            header_length,
            total,
        })
    }
}

/// The status code of a header block whose first line carries one
/// (`NATS/1.0 404 No Messages`).
fn status_of(block: &str) -> Option<&str> {
    let first = block.lines().next()?;
    let rest = first.strip_prefix("NATS/1.0")?.trim_start();
    rest.get(..3)
        .filter(|code| code.bytes().all(|b| b.is_ascii_digit()))
}

/// The header lines after the version line, as `(name, value)` pairs.
/// Lines are found with the `memchr` crate's vector search (a rebuild runs
/// this for every header of every event).
fn header_lines(block: &str) -> impl Iterator<Item = (&str, &str)> {
    let mut rest = match memchr::memchr(b'\n', block.as_bytes()) {
        Some(end) => &block[end + 1..],
        None => "",
    };
    std::iter::from_fn(move || {
        loop {
            if rest.is_empty() {
                return None;
            }
            let (line, after) = match memchr::memchr(b'\n', rest.as_bytes()) {
                Some(end) => (&rest[..end], &rest[end + 1..]),
                None => (rest, ""),
            };
            rest = after;
            // `:` and `\n` are ASCII, so both splits fall on char boundaries.
            if let Some(colon) = memchr::memchr(b':', line.as_bytes()) {
                return Some((line[..colon].trim(), line[colon + 1..].trim()));
            }
        }
    })
}

/// Stream sequence and pending count of a `$JS.ACK` reply subject: the
/// original form `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.
/// <consumer seq>.<time>.<pending>` or the one with a domain and account
/// hash (`$JS.ACK.<domain>.<account>.<stream>...`, 12 tokens).
fn sequence_and_pending(reply: &str) -> Option<(u64, u64)> {
    let tokens: Vec<&str> = reply.split('.').collect();
    if tokens.get(..2) != Some(&["$JS", "ACK"][..]) {
        return None;
    }
    let (sequence, pending) = match tokens.len() {
        9 => (tokens[5], tokens[8]),
        length if length >= 11 => (tokens[7], tokens[10]),
        _ => return None,
    };
    Some((sequence.parse().ok()?, pending.parse().ok()?))
}

/// The TLS handshake over `socket` as async-nats makes it: the CA file's
/// roots (else the system's), the client certificate when one is set.
async fn handshake(
    socket: Box<dyn Socket>,
    host: &str,
    security: &Security,
) -> Result<tokio_rustls::client::TlsStream<Box<dyn Socket>>, Error> {
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};
    let mut roots = RootCertStore::empty();
    match &security.tls.ca {
        Some(path) => {
            let certificates =
                crate::nats::read_certificates(CA_FILE_VARIABLE, path).map_err(wire_error)?;
            roots.add_parsable_certificates(certificates);
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let config = match &security.tls.client {
        Some((certificate, key)) => {
            let chain = crate::nats::read_certificates(CERT_FILE_VARIABLE, certificate)
                .map_err(wire_error)?;
            let key = crate::nats::read_private_key(key).map_err(wire_error)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| wire_error(format!("{CERT_FILE_VARIABLE}: {error}")))?
        }
        None => builder.with_no_client_auth(),
    };
    let name = rustls_pki_types::ServerName::try_from(host.to_owned())
        .map_err(|error| wire_error(format!("{host} is not a valid TLS server name: {error}")))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, socket)
        .await
        .map_err(|error| wire_error(format!("TLS handshake: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_with_and_without_reply_and_headers_are_read() {
        let frame = Frame::parse(b"HMSG zopu.e 7 $JS.ACK.EV.c.1.5.5.1.0 30 42").unwrap();
        assert_eq!((frame.sid, frame.header_length, frame.total), (7, 30, 42));
        assert_eq!(frame.reply, 14..36);
        let frame = Frame::parse(b"HMSG _INBOX.a.3 3 16 16").unwrap();
        assert_eq!(
            (frame.reply, frame.header_length, frame.total),
            (0..0, 16, 16)
        );
        let frame = Frame::parse(b"MSG s 2 r 5").unwrap();
        assert_eq!((frame.header_length, frame.total), (0, 5));
        for bad in [
            &b"HMSG s 1 10 5"[..],
            b"HMSG s x 1 2",
            b"MSG s",
            b"HMSG a b c d e f g",
        ] {
            assert!(
                Frame::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_line_ends_at_its_crlf_not_at_a_bare_newline() {
        assert_eq!(line_end(b"PONG\r\nPING\r\n"), Some(4));
        assert_eq!(line_end(b"a\nb\r\n"), Some(3));
        assert_eq!(line_end(b"\nPONG"), None);
        assert_eq!(line_end(b""), None);
    }

    #[test]
    fn reply_subjects_of_both_forms_give_sequence_and_pending() {
        assert_eq!(
            sequence_and_pending("$JS.ACK.EVENTS.c.1.42.42.1700000000.7"),
            Some((42, 7))
        );
        assert_eq!(
            sequence_and_pending("$JS.ACK.hub.ACCHASH.EVENTS.c.1.42.42.1700000000.7.xyz"),
            Some((42, 7))
        );
        assert_eq!(sequence_and_pending("_INBOX.x.1"), None);
        assert_eq!(sequence_and_pending("$JS.ACK.EVENTS.c.1.x.1.1.0"), None);
    }

    #[test]
    fn header_blocks_give_status_and_pairs() {
        assert_eq!(status_of("NATS/1.0 404 No Messages\r\n\r\n"), Some("404"));
        assert_eq!(status_of("NATS/1.0\r\nce-id: x\r\n\r\n"), None);
        let pairs: Vec<_> =
            header_lines("NATS/1.0\r\nce-id: a:b\r\nce-type:  t \r\n\r\n").collect();
        assert_eq!(pairs, vec![("ce-id", "a:b"), ("ce-type", "t")]);
    }
}
