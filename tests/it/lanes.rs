//! A project's lane keeps stream order when a message is handed back: its
//! redelivery goes before the later messages delivered meanwhile, even when
//! one of them is already running and waits for it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::reaction::{HandlerError, Reaction, ReactionConfig, ReactionContext};
use zopu_runtime::{Runtime, Shutdown};
use zopu_schema::{Envelope, Event, OrgId, ProjectId, pb, subjects};
use zopu_tests::{NatsServer, bus};

const LONG: Duration = Duration::from_secs(60);

/// How long a later message waits for an earlier one before it gives up
/// and goes on out of order (as the conversation agent ends an abandoned
/// turn): past the test's own deadline, so only a lane that stalls reaches it.
const EARLIER_WAIT: Duration = Duration::from_secs(90);

/// Hands the first message back on its first run (as a handler stopped by
/// its partition moving does); every later message waits until the ones
/// before it were handled, as the conversation agent's turns do.
#[derive(Debug, Clone, Default)]
struct WaitsForEarlier {
    /// Texts in the order their handling finished; "(waited out)" marks a
    /// message that went on without its predecessor.
    handled: Arc<tokio::sync::watch::Sender<Vec<String>>>,
    handed_back: Arc<Mutex<bool>>,
}

impl Reaction for WaitsForEarlier {
    async fn handle(&self, event: &Envelope, ctx: &ReactionContext) -> Result<(), HandlerError> {
        let text = event.decode::<pb::TimelineMessageSent>()?.text;
        let position: usize = text
            .strip_prefix("message ")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| HandlerError::Permanent(format!("unexpected text {text:?}")))?;
        if position == 0 {
            let mut handed_back = self.handed_back.lock().expect("not poisoned");
            if !*handed_back {
                *handed_back = true;
                return Err(HandlerError::Interrupted);
            }
        }
        let mut handled = self.handled.subscribe();
        let earlier_done = handled.wait_for(|done| done.len() >= position);
        let outcome = match tokio::time::timeout(EARLIER_WAIT, earlier_done).await {
            Ok(_) => text,
            Err(_) => format!("{text} (waited out)"),
        };
        let done = pb::AgentAcknowledged {
            text: outcome.clone(),
            ..Default::default()
        };
        ctx.publisher
            .append(NewEvent::caused_by(
                &event.context(),
                &done,
                format!("done:{}", event.id),
            ))
            .await?;
        self.handled.send_modify(|done| done.push(outcome));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_back_message_goes_before_the_later_ones_of_its_project() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let config = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, config.duplicate_window).await?;
    let org: OrgId = "lanes".parse()?;
    let project = ProjectId::new();
    let gateway = Publisher::new(bus.clone(), "gateway", None);
    let count = 4;
    for position in 0..count {
        let sent = pb::TimelineMessageSent {
            timeline_id: "global".into(),
            text: format!("message {position}"),
            ..Default::default()
        };
        gateway
            .append(NewEvent::root(
                org.clone(),
                project,
                &sent,
                format!("request:{position}"),
                None,
            ))
            .await?;
    }

    let shutdown = Shutdown::new();
    let runtime = Runtime::start("reactor", &config, shutdown.clone()).await?;
    let reaction = WaitsForEarlier::default();
    runtime.spawn_reaction(
        ReactionConfig {
            ack_wait: Duration::from_secs(2),
            max_deliver: 10,
            ..ReactionConfig::new(
                "reactor-lanes".into(),
                vec![subjects::events_of_type(pb::TimelineMessageSent::TYPE)],
            )
        },
        reaction.clone(),
    );
    let mut handled = reaction.handled.subscribe();
    tokio::time::timeout(LONG, handled.wait_for(|done| done.len() == count))
        .await
        .context("the project's messages were not all handled: its lane stalled behind a later message waiting for the handed-back one")??;
    let order = handled.borrow().clone();
    let expected: Vec<String> = (0..count).map(|n| format!("message {n}")).collect();
    assert_eq!(order, expected, "the lane did not keep stream order");
    assert!(*reaction.handed_back.lock().expect("not poisoned"));
    shutdown.cancel();
    assert!(shutdown.wait(LONG).await);
    Ok(())
}
