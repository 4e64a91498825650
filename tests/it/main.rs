//! The workspace's one integration-test binary. Every test starts its own
//! nats-server (see `zopu_tests::NatsServer`).

mod foundation;
mod artifacts;
mod conversation;
mod setup;
mod gateway;
mod specialists;
