//! The workspace's one integration-test binary. Every test starts its own
//! nats-server (see `zopu_tests::NatsServer`).

mod artifacts;
mod browser;
mod chaos;
mod cluster;
mod conversation;
#[cfg(feature = "docker")]
mod docker;
mod evolution;
mod foundation;
mod gateway;
mod scale;
mod setup;
mod specialists;
