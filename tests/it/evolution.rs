//! Schema evolution: events this version does not understand — a type or a
//! dataschema a newer version wrote, a body that does not decode — are
//! recorded by the projections that meet them, and the projections carry
//! on with the events after them (README "Schema evolution").

use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use zopu_core::publish::{NewEvent, Publisher, get_event};
use zopu_core::{Shutdown, Store, projection};
use zopu_schema::{Envelope, OrgId, ProjectId, codec, pb, subjects};
use zopu_tests::{NatsServer, bus};

const LONG: Duration = Duration::from_secs(60);

/// Publishes `template` again with its type, dataschema and body replaced,
/// on the subject of the new type: what a newer (or broken) writer stores.
async fn publish_rewritten(
    bus: &zopu_core::nats::Bus,
    template: &Envelope,
    event_type: &str,
    schema: &str,
    body: &'static [u8],
) -> Result<u64> {
    let (headers, _) = codec::encode(template);
    let mut map = async_nats::HeaderMap::new();
    let id = uuid::Uuid::now_v7().to_string();
    for (name, value) in headers {
        let value = match name {
            codec::TYPE => event_type.to_owned(),
            codec::DATASCHEMA => schema.to_owned(),
            codec::ID => id.clone(),
            _ => value,
        };
        map.insert(name, value.as_str());
    }
    map.insert("Nats-Msg-Id", id.as_str());
    let subject = subjects::event(&template.org_id, &template.project_id, event_type);
    Ok(bus
        .jetstream
        .publish_with_headers(subject, map, Bytes::from_static(body))
        .await?
        .await?
        .sequence)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projections_record_events_they_do_not_understand_and_carry_on() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let (org, project): (OrgId, ProjectId) = ("evolve".parse()?, ProjectId::new());
    let agent = "agent-evolve";
    let publisher = Publisher::new(bus.clone(), "gateway", None);
    let disabled = pb::AgentDisabled {
        agent_id: agent.into(),
        reason: "paused by the operator".into(),
        ..Default::default()
    };
    let first = publisher
        .append(NewEvent::root(
            org.clone(),
            project,
            &disabled,
            "disable-1",
            None,
        ))
        .await?;
    let template = get_event(&bus, first.sequence).await?;
    // A dataschema version this binary lacks, a type it lacks, and a body
    // that does not decode as its (known) dataschema.
    let newer_schema = publish_rewritten(
        &bus,
        &template,
        "agent.disabled",
        "zopu.v2.AgentDisabled",
        b"\x0a\x03abc",
    )
    .await?;
    let newer_type = publish_rewritten(
        &bus,
        &template,
        "project.archived",
        "zopu.v1.ProjectArchived",
        b"",
    )
    .await?;
    let broken = publish_rewritten(
        &bus,
        &template,
        "agent.disabled",
        "zopu.v1.AgentDisabled",
        b"\xff\xff\xff",
    )
    .await?;
    let enabled = pb::AgentEnabled {
        agent_id: agent.into(),
        ..Default::default()
    };
    let last = publisher
        .append(NewEvent::root(
            org.clone(),
            project,
            &enabled,
            "enable-1",
            None,
        ))
        .await?;

    // An old projection (the specialists' state used to retry the broken
    // body forever) applies the event after all three.
    let store = Store::open(&dir.path().join("specialists.sqlite"))?;
    let shutdown = Shutdown::new();
    let running = tokio::spawn(projection::run(
        bus.clone(),
        store.clone(),
        zopu_specialists::state::State,
        shutdown.clone(),
    ));
    tokio::time::timeout(LONG, store.wait_for(last.sequence))
        .await
        .context("the projection stalled on an event it does not understand")?;
    assert_eq!(
        zopu_specialists::state::disabled(&store, agent)?,
        None,
        "the event after the unknown ones was not applied"
    );
    let recorded: Vec<(u64, String)> = store.read(|conn| {
        conn.prepare("SELECT sequence, reason FROM zopu_undecodable ORDER BY sequence")?
            .query_map([], |row| Ok((row.get::<_, i64>(0)? as u64, row.get(1)?)))?
            .collect()
    })?;
    let sequences: Vec<u64> = recorded.iter().map(|(sequence, _)| *sequence).collect();
    assert_eq!(
        sequences,
        vec![newer_schema, newer_type, broken],
        "{recorded:?}"
    );
    assert!(
        recorded[0].1.contains("zopu.v2.AgentDisabled") && recorded[0].1.contains("newer version"),
        "{recorded:?}"
    );
    assert!(
        recorded[1]
            .1
            .contains("unknown event type project.archived"),
        "{recorded:?}"
    );
    assert!(recorded[2].1.contains("does not decode"), "{recorded:?}");
    shutdown.cancel();
    running.await??;
    Ok(())
}
