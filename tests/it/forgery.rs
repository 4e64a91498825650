//! Forged events: NATS permissions bind a writer to subjects, not to header
//! values, so a writer allowed on one organization's subjects can store a
//! message whose `ce-*` headers claim another organization, project and
//! type. Every reader decodes through the subject check: the projections
//! (the core key index and the gateway's read model) record such a message
//! in `zopu_undecodable` with the reason, file nothing from it, and go on;
//! a reaction ends it as a dead-letter event filed under the subject's own
//! org and project, and handles the next message.

use std::time::Duration;

use anyhow::{Context, Result};
use zopu_core::publish::{NewEvent, Publisher};
use zopu_core::store::KeyIndex;
use zopu_core::{
    HandlerError, Projection, Reaction, ReactionConfig, ReactionContext, Runtime, Shutdown, Store,
    projection,
};
use zopu_gateway::read_model::{GatewayProjection, artifacts, timeline};
use zopu_schema::{CorrelationId, Envelope, Event, EventId, OrgId, ProjectId, codec, pb, subjects};
use zopu_tests::{NatsServer, bus, wait_for};

const LONG: Duration = Duration::from_secs(60);

fn published(artifact_id: &str, object_name: &str) -> pb::ArtifactPublished {
    pb::ArtifactPublished {
        build_id: format!("build-{artifact_id}"),
        artifact_id: artifact_id.into(),
        revision: 1,
        title: "Setup".into(),
        html: Some(pb::BlobRef {
            bucket: subjects::ARTIFACTS_BUCKET.into(),
            name: object_name.into(),
            sha256: "ab".repeat(32),
            size_bytes: 10,
            content_type: "text/html".into(),
        }),
        ..Default::default()
    }
}

/// An `artifact.published` of the victim's org and project, written as the
/// artifacts service would write it.
fn forged_envelope(victim: &OrgId, victim_project: ProjectId, key: &str) -> Envelope {
    let id = EventId::new();
    Envelope {
        id,
        source: "zopu/artifacts".into(),
        event_type: pb::ArtifactPublished::TYPE.into(),
        time: time::OffsetDateTime::now_utc(),
        data_schema: pb::ArtifactPublished::SCHEMA.into(),
        org_id: victim.clone(),
        project_id: victim_project,
        correlation_id: CorrelationId::from(id),
        causation_id: id,
        work_id: None,
        thread_id: None,
        flow_run_id: None,
        dispatch_id: None,
        traceparent: None,
        idempotency_key: key.into(),
        project_version: 1,
        previous_hash: None,
        data: prost::Message::encode_to_vec(&published(
            "art-forged",
            "victim-artifact/1/secret.html",
        ))
        .into(),
    }
}

/// Passes on the id of every message it is given.
#[derive(Debug, Clone)]
struct Recorder {
    handled: tokio::sync::mpsc::Sender<EventId>,
}

impl Reaction for Recorder {
    async fn handle(&self, event: &Envelope, _: &ReactionContext) -> Result<(), HandlerError> {
        self.handled
            .send(event.id)
            .await
            .map_err(|_| HandlerError::Fatal("the test stopped listening".into()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projections_refuse_an_event_whose_headers_claim_another_org() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let attacker: OrgId = "attacker".parse()?;
    let victim: OrgId = "victim".parse()?;
    let (attacker_project, victim_project) = (ProjectId::new(), ProjectId::new());

    // The victim's project exists.
    let gateway = Publisher::new(bus.clone(), "gateway", None);
    gateway
        .append(NewEvent::root(
            victim.clone(),
            victim_project,
            &pb::ProjectSetupRequested {
                repository_url: "https://example.com/victim.git".into(),
                branch: "main".into(),
                setup_revision: 1,
                project_name: "victim".into(),
                ..Default::default()
            },
            "request:victim",
            None,
        ))
        .await?;

    // On the attacker's own subject for `timeline.message.sent`, headers that
    // claim the victim's org and project and `artifact.published`.
    let forged = forged_envelope(&victim, victim_project, "forged:artifacts-key");
    let stored_on = subjects::event(&attacker, &attacker_project, pb::TimelineMessageSent::TYPE);
    let (headers, body) = codec::encode(&forged);
    let mut map = async_nats::HeaderMap::new();
    for (name, value) in &headers {
        map.insert(*name, value.as_str());
    }
    map.insert("Nats-Msg-Id", forged.idempotency_key.as_str());
    let forged_sequence = bus
        .jetstream
        .publish_with_headers(stored_on.clone(), map, body)
        .await?
        .await?
        .sequence;

    // A genuine event after it, of the attacker's own org.
    let genuine = Publisher::new(bus.clone(), "artifacts", None)
        .append(NewEvent::root(
            attacker.clone(),
            attacker_project,
            &published("art-genuine", "art-genuine/1/x.html"),
            "genuine:artifacts-key",
            None,
        ))
        .await?;

    // A user message after it, on the same subject.
    let message = gateway
        .append(NewEvent::root(
            attacker.clone(),
            attacker_project,
            &pb::TimelineMessageSent {
                text: "hello".into(),
                ..Default::default()
            },
            "request:after-forgery",
            None,
        ))
        .await?;

    // A reaction on `timeline.message.sent`.
    let shutdown = Shutdown::new();
    let runtime = Runtime::start(
        "reactor",
        &zopu_tests::core_config(&server, &dir.path().join("reactor")),
        shutdown.clone(),
    )
    .await?;
    let (handled, mut handled_ids) = tokio::sync::mpsc::channel(16);
    runtime.spawn_reaction(
        ReactionConfig {
            ack_wait: Duration::from_secs(2),
            ..ReactionConfig::new(
                "reactor-forgery".into(),
                vec![subjects::events_of_type(pb::TimelineMessageSent::TYPE)],
            )
        },
        Recorder { handled },
    );

    // The core key index of the artifacts service and the gateway's read
    // model, fed by one pump as a service runs them.
    let store = Store::open(&dir.path().join("forgery.sqlite"))?;
    let projections: Vec<Box<dyn Projection>> = vec![
        Box::new(KeyIndex::of_source("zopu/artifacts")),
        Box::new(GatewayProjection),
    ];
    let running = tokio::spawn(projection::run_all(
        bus.clone(),
        store.clone(),
        projections,
        None,
        shutdown.clone(),
    ));
    tokio::time::timeout(LONG, store.wait_for(message.sequence))
        .await
        .context("the projections did not reach the genuine event after the forged one")?;
    assert!(
        !running.is_finished(),
        "the pump stopped on the forged event"
    );

    // Nothing of the forgery is filed, under the victim or anywhere.
    for org in [&victim, &attacker] {
        let found = store.read(|conn| artifacts::find(conn, org, "art-forged", None))?;
        assert!(
            found.is_none(),
            "forged artifact filed under {org}: {found:?}"
        );
    }
    let victim_timeline =
        store.read(|conn| timeline::items(conn, &victim, &victim_project, None, 0, 100))?;
    assert!(
        victim_timeline
            .iter()
            .all(|item| item.sequence != forged_sequence),
        "forged event on the victim's timeline: {victim_timeline:?}"
    );
    let attacker_timeline =
        store.read(|conn| timeline::items(conn, &attacker, &attacker_project, None, 0, 100))?;
    assert!(
        attacker_timeline
            .iter()
            .all(|item| item.sequence != forged_sequence),
        "forged event on the attacker's timeline: {attacker_timeline:?}"
    );
    assert_eq!(
        store.key_sequence(&forged.idempotency_key)?,
        None,
        "the forged idempotency key would make the artifacts service skip a real effect"
    );

    // The genuine event after it is applied.
    let (record, _) = store
        .read(|conn| artifacts::find(conn, &attacker, "art-genuine", None))?
        .context("the genuine artifact after the forgery was not applied")?;
    assert_eq!(record.project_id, attacker_project.to_string());
    assert_eq!(
        store.key_sequence("genuine:artifacts-key")?,
        Some(genuine.sequence)
    );

    // Each projection recorded the forgery with the reason.
    let recorded: Vec<(String, u64, String)> = store.read(|conn| {
        conn.prepare(
            "SELECT projection, sequence, reason FROM zopu_undecodable ORDER BY projection",
        )?
        .query_map([], |row| {
            Ok((row.get(0)?, row.get::<_, i64>(1)? as u64, row.get(2)?))
        })?
        .collect()
    })?;
    let projections: Vec<&str> = recorded.iter().map(|(name, ..)| name.as_str()).collect();
    assert_eq!(projections, ["gateway", "zopu_keys"], "{recorded:?}");
    for (_, sequence, reason) in &recorded {
        assert_eq!(*sequence, forged_sequence, "{recorded:?}");
        assert!(
            reason.contains(&stored_on) && reason.contains(&forged.subject()),
            "the reason names neither subject: {reason}"
        );
    }

    // The reaction: a dead letter with the reason, filed under the
    // subject's org and project, and the next message handled.
    let dead_letter = wait_for(
        &bus,
        &subjects::events_of_type(pb::DeadLetterRecorded::TYPE),
        LONG,
        |_| true,
    )
    .await?;
    let record: pb::DeadLetterRecorded = dead_letter.decode()?;
    assert_eq!(record.stream_sequence, forged_sequence, "{record:?}");
    assert_eq!(record.original_subject, stored_on);
    assert_eq!(record.kind, "decode");
    assert!(
        record.reason.contains(&forged.subject()),
        "the reason does not name the claimed subject: {}",
        record.reason
    );
    assert_eq!(
        (&dead_letter.org_id, dead_letter.project_id),
        (&attacker, attacker_project),
        "the dead letter is filed where the message was stored"
    );
    // The project's messages are handled in stream order: the first one
    // handled is the message after the forgery.
    let first = tokio::time::timeout(LONG, handled_ids.recv())
        .await
        .context("the reaction did not handle the message after the forgery")?;
    assert_eq!(
        first,
        Some(message.event_id),
        "the reaction handled the forgery"
    );
    let dead_letters = zopu_tests::history(
        &bus,
        &subjects::events_of_type(pb::DeadLetterRecorded::TYPE),
    )
    .await?;
    assert_eq!(dead_letters.len(), 1, "{dead_letters:?}");

    shutdown.cancel();
    running.await??;
    shutdown.wait(LONG).await;
    Ok(())
}
