//! The harness's testcontainers path (only with `--features docker` and a
//! Docker engine; `make test-deploy` runs it against the nats image `make
//! images` builds): the server really runs in a container, listens on
//! loopback, and keeps every acknowledged event across a SIGKILL of the
//! container and its restart.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use testcontainers::bollard::Docker;
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_schema::{OrgId, ProjectId, pb, subjects};
use zopu_tests::{NatsServer, Placement, Sync, bus, history};

async fn running(docker: &Docker, id: &str) -> Result<bool> {
    let inspected = docker
        .inspect_container(
            id,
            None::<testcontainers::bollard::query_parameters::InspectContainerOptions>,
        )
        .await?;
    Ok(inspected
        .state
        .and_then(|state| state.running)
        .unwrap_or(false))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nats_container_keeps_acknowledged_events_across_a_kill() -> Result<()> {
    let mut server = NatsServer::start_at(Placement::Docker, Sync::Always)?;
    assert_eq!(server.placement(), Placement::Docker);
    assert!(
        server.url().starts_with("nats://127.0.0.1:"),
        "{}",
        server.url()
    );
    let id = server.container_id().context("a container id")?;
    let docker = Docker::connect_with_local_defaults()?;
    ensure!(
        running(&docker, &id).await?,
        "container {id} is not running"
    );

    let bus = bus(&server, Duration::from_secs(120)).await?;
    let version = bus.client.server_info().version;
    assert!(version.starts_with("2.1"), "server version {version}");
    let org: OrgId = "docker".parse()?;
    let project = ProjectId::new();
    let publisher = Publisher::new(bus.clone(), "gateway", None);
    let mut acknowledged = Vec::new();
    for i in 0..20 {
        if i == 10 {
            server.kill();
            assert!(
                !running(&docker, &id).await?,
                "container {id} survived the kill"
            );
            server.restart()?;
            assert!(
                running(&docker, &id).await?,
                "container {id} did not restart"
            );
        }
        let message = pb::TimelineMessageSent {
            timeline_id: "global".into(),
            text: format!("m{i}"),
            ..Default::default()
        };
        let appended = publisher
            .append(NewEvent::root(
                org.clone(),
                project,
                &message,
                format!("request:docker-{i}"),
                None,
            ))
            .await?;
        acknowledged.push(appended.event_id);
    }
    let stored: Vec<_> = history(&bus, &subjects::project_events(&org, &project))
        .await?
        .into_iter()
        .map(|(_, event)| event.id)
        .collect();
    assert_eq!(stored, acknowledged);
    drop(bus);
    drop(server);
    ensure!(
        docker
            .inspect_container(
                &id,
                None::<testcontainers::bollard::query_parameters::InspectContainerOptions>
            )
            .await
            .is_err(),
        "container {id} was not removed with the server"
    );
    Ok(())
}
