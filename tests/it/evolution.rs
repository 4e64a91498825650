//! Schema evolution: events this version does not understand — a type or a
//! dataschema a newer version wrote, a body that does not decode — are
//! recorded by the projections that meet them, and the projections carry
//! on with the events after them (services/README.md "Schema evolution"). Events
//! recorded before `ce-dataschema` became a URI (the bare message name) are
//! read as they always were, and a project's history mixing both spellings
//! chains and audits clean.

use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use zopu_runtime::publish::{NewEvent, Publisher, get_event};
use zopu_runtime::{Shutdown, Store, audit, projection};
use zopu_schema::{Envelope, Event, EventId, OrgId, ProjectId, codec, pb, subjects};
use zopu_tests::{NatsServer, bus};

const LONG: Duration = Duration::from_secs(60);

/// Publishes `template` again with its type, dataschema and body replaced,
/// on the subject of the new type: what a newer (or broken) writer stores.
async fn publish_rewritten(
    bus: &zopu_runtime::nats::Bus,
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

/// Stores `envelope` the way a writer did before `ce-dataschema` became a
/// URI: the bare protobuf message name in the header.
async fn publish_as_recorded(bus: &zopu_runtime::nats::Bus, envelope: &Envelope) -> Result<u64> {
    let (headers, body) = codec::encode(envelope);
    let mut map = async_nats::HeaderMap::new();
    for (name, value) in headers {
        let value = match name {
            codec::DATASCHEMA => envelope.data_schema.clone(),
            _ => value,
        };
        map.insert(name, value.as_str());
    }
    map.insert("Nats-Msg-Id", envelope.idempotency_key.as_str());
    Ok(bus
        .jetstream
        .publish_with_headers(envelope.subject(), map, body)
        .await?
        .await?
        .sequence)
}

/// The `ce-dataschema` header as stored at `sequence`.
async fn stored_dataschema(bus: &zopu_runtime::nats::Bus, sequence: u64) -> Result<String> {
    let message = bus
        .jetstream
        .get_stream_no_info(subjects::EVENTS_STREAM)
        .await?
        .direct_get(sequence)
        .await?;
    let value = message
        .headers
        .get(codec::DATASCHEMA)
        .context("no ce-dataschema header")?;
    Ok(value.as_str().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_mixing_bare_and_uri_dataschemas_chains_and_audits_clean() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project): (OrgId, ProjectId) = ("mixed".parse()?, ProjectId::new());
    let agent = "agent-mixed";
    let publisher = Publisher::new(bus.clone(), "gateway", None);
    let disabled = |reason: &str| pb::AgentDisabled {
        agent_id: agent.into(),
        reason: reason.into(),
        ..Default::default()
    };
    // Version 1, written now.
    let first = publisher
        .append(NewEvent::root(
            org.clone(),
            project,
            &disabled("first"),
            "disable-1",
            None,
        ))
        .await?;
    let first_event = get_event(&bus, first.sequence).await?;
    // Version 2, as an older writer stored it.
    let recorded = Envelope {
        id: EventId::new(),
        event_type: pb::AgentEnabled::TYPE.into(),
        data_schema: pb::AgentEnabled::SCHEMA.into(),
        idempotency_key: "enable-recorded".into(),
        project_version: 2,
        previous_hash: Some(first_event.hash()),
        data: prost::Message::encode_to_vec(&pb::AgentEnabled {
            agent_id: agent.into(),
            ..Default::default()
        })
        .into(),
        ..first_event.clone()
    };
    let recorded_sequence = publish_as_recorded(&bus, &recorded).await?;
    // Version 3, written now on top of the recorded event.
    let third = publisher
        .append(NewEvent::root(
            org.clone(),
            project,
            &disabled("third"),
            "disable-3",
            None,
        ))
        .await?;

    assert_eq!(
        stored_dataschema(&bus, first.sequence).await?,
        "urn:zopu:proto:zopu.v1.AgentDisabled"
    );
    assert_eq!(
        stored_dataschema(&bus, recorded_sequence).await?,
        "zopu.v1.AgentEnabled"
    );
    assert_eq!(
        stored_dataschema(&bus, third.sequence).await?,
        "urn:zopu:proto:zopu.v1.AgentDisabled"
    );
    let read_back = get_event(&bus, recorded_sequence).await?;
    assert_eq!(read_back, recorded);
    assert_eq!(read_back.hash(), recorded.hash());
    let third_event = get_event(&bus, third.sequence).await?;
    assert_eq!(third_event.project_version, 3);
    assert_eq!(third_event.previous_hash, Some(recorded.hash()));

    let report = audit::verify(&bus, None).await?;
    assert!(report.is_clean(), "{:?}", report.findings);
    assert_eq!((report.events, report.projects), (3, 1));
    Ok(())
}
