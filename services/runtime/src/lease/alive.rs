//! Whether an instance still has a connection: each instance working a
//! reaction's partitions answers requests on its own subject
//! ([`subjects::lease_alive_subject`], core NATS, nothing stored) for as
//! long as its connection lives. The server drops the subscription the
//! moment the connection closes (a process killed, a network cut), and a
//! request to a subject nobody subscribes to comes back at once as "no
//! responders". So a holder whose heartbeat is late is asked, and one that
//! is gone hands its partitions over in well under its lease's TTL.
//!
//! A probe that times out or fails otherwise says nothing: the holder is
//! then treated as alive until its heartbeat expires, as without probes.

use std::time::Duration;

use futures::StreamExt;
use zopu_schema::subjects;

use crate::Error;

/// What a probe of one instance found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// It answered: its connection lives.
    Connected,
    /// The server knows no subscriber: its connection is gone.
    Gone,
    /// No answer in time, or the request failed: nothing is known.
    Unknown,
}

/// This instance's answering side, for as long as the value lives.
#[derive(Debug)]
pub struct Answering {
    task: tokio::task::JoinHandle<()>,
    /// Whether a probe of our own subject came back: a deployment whose
    /// permissions deny the subject gets no answers from anyone, and must
    /// not read that as everyone gone.
    pub probes_work: bool,
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts answering on `consumer`'s alive subject for `instance`, then
/// probes it once to learn whether probes work here.
pub async fn answer(
    client: &async_nats::Client,
    consumer: &str,
    instance: &str,
    timeout: Duration,
) -> Result<Answering, Error> {
    let subject = subjects::lease_alive_subject(consumer, instance);
    let mut requests = client
        .subscribe(subject.clone())
        .await
        .map_err(|error| Error::jetstream("answer on the alive subject", error))?;
    let replies = client.clone();
    let task = tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            if let Some(reply) = request.reply {
                // A reply lost with the connection is what a probe reads
                // as "gone" anyway.
                let _ = replies.publish(reply, bytes::Bytes::new()).await;
            }
        }
    });
    let probes_work = probe(client, &subject, timeout).await == Probe::Connected;
    if !probes_work {
        tracing::warn!(%subject, "this instance cannot reach its own alive subject (permissions?); a peer's partitions move only when its heartbeat expires");
    }
    Ok(Answering { task, probes_work })
}

/// Asks whether whoever answers on `subject` still has a connection.
pub async fn probe(client: &async_nats::Client, subject: &str, timeout: Duration) -> Probe {
    let request = client.request(subject.to_owned(), bytes::Bytes::new());
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(_)) => Probe::Connected,
        Ok(Err(error)) if error.kind() == async_nats::RequestErrorKind::NoResponders => Probe::Gone,
        Ok(Err(_)) | Err(_) => Probe::Unknown,
    }
}
