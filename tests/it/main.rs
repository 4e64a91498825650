//! The workspace's one integration-test binary. Every test starts its own
//! nats-server (see `zopu_tests::NatsServer`).

mod agent_api;
mod artifacts;
mod browser;
mod chaos;
mod checks;
mod cluster;
mod conversation;
#[cfg(feature = "docker")]
mod docker;
mod evolution;
mod executor;
mod forgery;
mod foundation;
mod fuzz;
mod gateway;
mod install;
mod lanes;
mod llama;
mod memory;
mod metrics;
mod permissions;
mod private_repositories;
mod registry;
mod scale;
mod secrets;
mod setup;
mod snapshots;
mod specialists;
mod tidy;
mod tls;
mod traces;
