//! Connecting to NATS: retry on first connect, unlimited reconnects, every
//! connection event logged, and a refusal to run against a nats-server
//! older than 2.12 or without JetStream.

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
}

/// Connects to `url` as `name`. The first connection is retried for up to
/// `first_connect_timeout`; after that the client reconnects forever.
pub async fn connect(url: &str, name: &str, first_connect_timeout: Duration) -> Result<Bus, Error> {
    let events_url = url.to_owned();
    let options = async_nats::ConnectOptions::new()
        .name(name)
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(5))
        .event_callback(move |event| {
            let url = events_url.clone();
            async move {
                match event {
                    async_nats::Event::Connected => tracing::info!(%url, "nats connected"),
                    async_nats::Event::Closed => tracing::info!(%url, "nats connection closed"),
                    async_nats::Event::Disconnected => {
                        tracing::warn!(%url, "nats disconnected; reconnecting")
                    }
                    other => tracing::warn!(%url, event = %other, "nats connection event"),
                }
            }
        });
    let connecting = async_nats::connect_with_options(url, options);
    let client = tokio::time::timeout(first_connect_timeout, connecting)
        .await
        .map_err(|_| Error::Connect {
            url: url.to_owned(),
            reason: format!(
                "no server answered within {}s (is nats-server running? `make run` starts one)",
                first_connect_timeout.as_secs()
            ),
        })?
        .map_err(|error| Error::Connect {
            url: url.to_owned(),
            reason: error.to_string(),
        })?;
    // `retry_on_initial_connect` returns before the handshake; wait for it.
    let deadline = tokio::time::Instant::now() + first_connect_timeout;
    while client.connection_state() != async_nats::connection::State::Connected {
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Connect {
                url: url.to_owned(),
                reason: format!(
                    "no server answered within {}s (is nats-server running? `make run` starts one)",
                    first_connect_timeout.as_secs()
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check_server(url, &client.server_info())?;
    let jetstream = jetstream::new(client.clone());
    jetstream
        .query_account()
        .await
        .map_err(|_| Error::JetStreamDisabled {
            url: url.to_owned(),
        })?;
    Ok(Bus {
        client,
        jetstream,
        url: url.to_owned(),
    })
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
    use super::*;

    fn info(version: &str) -> async_nats::ServerInfo {
        async_nats::ServerInfo {
            version: version.into(),
            jetstream: true,
            ..Default::default()
        }
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
