//! Handling one message of a lane: decode and check it, admit it against
//! its project's chain, run the handler (retrying transient failures in
//! place, stepping aside for an earlier message of the project), then ack
//! it, hand it back, or end it as a dead letter with its reason.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use zopu_schema::{Envelope, codec, pb};

use super::lanes::Processed;
use super::{
    CATCH_UP_MAX, HandlerError, Message, Origin, Reaction, ReactionContext, Runner,
    check_known_type, clipped_with_mark, exhausted, hand_back, handler_outcome, nak, scope_of,
    traced_header,
};
use crate::ledger::Admission;
use crate::metrics;
use crate::publish::{self, NewEvent};
use crate::telemetry::{TRACE_TARGET, propagation};

impl<R: Reaction> Runner<R> {
    /// Handles one message. `abort` stops the run (a lost partition, or an
    /// earlier message of the lane to step aside for); `partition` is the
    /// partition's own token, to tell the two apart.
    pub(super) async fn process(
        &self,
        lane_key: &str,
        message: Message,
        abort: &CancellationToken,
        partition: &CancellationToken,
    ) -> Processed {
        let (work_sequence, delivered) = match message.info() {
            Ok(info) => (info.stream_sequence, info.delivered),
            Err(_) => (0, 1),
        };
        let origin = Origin::of(&message);
        let stream_sequence = origin.as_ref().map_or(0, |origin| origin.sequence);
        let span = tracing::info_span!(
            target: TRACE_TARGET,
            "handle",
            service = %self.shared.service,
            consumer = %self.config.durable,
            subject = origin.as_ref().map_or(message.subject.as_str(), |origin| origin.subject.as_str()),
            event_type = traced_header(&message, codec::TYPE).unwrap_or_default(),
            stream_sequence,
            work_sequence,
            delivered,
            event_id = tracing::field::Empty,
            correlation_id = tracing::field::Empty,
        );
        propagation::continue_trace(&span, traced_header(&message, codec::TRACEPARENT));
        async {
            let envelope = match origin
                .and_then(|origin| {
                    publish::decode_stored_message(&origin.subject, &message.message)
                        .map_err(|error| error.to_string())
                })
                .and_then(|envelope| check_known_type(&envelope).map(|()| envelope))
            {
                Ok(envelope) => envelope,
                Err(reason) => {
                    self.give_up(lane_key, &message, None, delivered, "decode", &reason).await;
                    return Processed::Done;
                }
            };
            tracing::Span::current().record("event_id", tracing::field::display(envelope.id));
            tracing::Span::current().record("correlation_id", tracing::field::display(&envelope.correlation_id));
            if delivered > 1 && !self.caught_up_for_redelivery(&message).await {
                return Processed::Done;
            }
            // Nothing is done for an event that does not extend its chain.
            match self.shared.store.admit(stream_sequence, CATCH_UP_MAX, &self.shared.shutdown).await {
                Admission::Admitted => {}
                Admission::Refused(reason) => {
                    self.give_up(lane_key, &message, None, delivered, "chain", &reason).await;
                    return Processed::Done;
                }
                Admission::NotYet => {
                    hand_back(&self.newest_copy(lane_key, &message)).await;
                    return Processed::Done;
                }
            }
            self.shared.publisher.observe(stream_sequence, &envelope);
            let context = ReactionContext {
                publisher: self.shared.publisher.clone(),
                store: self.shared.store.clone(),
                shutdown: self.shared.shutdown.clone(),
                stream_sequence,
                delivered,
            };
            let runs = self.runs_of(work_sequence);
            if exhausted(runs, delivered, self.config.max_deliver) {
                // Done before give up: the last run may have stored its
                // effects and died before its ack.
                match self.shared.reaction.already_handled(&envelope, &context).await {
                    Ok(true) => {
                        tracing::info!("redelivered past its bound, but its effects are stored; settling");
                        self.settle(lane_key, &message, AckKind::Ack).await;
                    }
                    Ok(false) | Err(_) => {
                        let reason = format!(
                            "delivered {delivered} times, {runs} handler runs without being settled (max_deliver {})",
                            self.config.max_deliver
                        );
                        self.give_up(lane_key, &message, Some((&envelope, &context)), delivered, "handler", &reason).await;
                    }
                }
                return Processed::Done;
            }
            self.count_run(work_sequence, 1);
            let mut attempt = 0usize;
            loop {
                let started = std::time::Instant::now();
                let outcome = self.run_handler(lane_key, &message, &envelope, &context, abort).await;
                metrics::handler_finished(
                    &self.shared.service,
                    &self.config.durable,
                    &envelope.event_type,
                    handler_outcome(&outcome),
                    started.elapsed(),
                );
                match outcome {
                    Ok(()) => {
                        self.settle(lane_key, &message, AckKind::Ack).await;
                        return Processed::Done;
                    }
                    Err(HandlerError::Interrupted | HandlerError::Transient(_)) if self.stepped_aside(abort, partition) => {
                        // Not the message's failure: the run does not count.
                        self.count_run(work_sequence, -1);
                        tracing::info!("stepped aside for an earlier message of the project; it runs again after that one");
                        return Processed::SteppedAside;
                    }
                    Err(HandlerError::Transient(reason)) if attempt < self.config.retry_delays.len() => {
                        let delay = self.config.retry_delays[attempt];
                        attempt += 1;
                        let reason = zopu_secrets::redact(&reason);
                        tracing::warn!(%reason, attempt, retry_in_ms = delay.as_millis() as u64, "transient failure; retrying");
                        if !self.wait_extending(lane_key, &message, delay, abort).await {
                            if self.stepped_aside(abort, partition) {
                                self.count_run(work_sequence, -1);
                                return Processed::SteppedAside;
                            }
                            // Shutting down: hand it back instead of giving up.
                            hand_back(&self.newest_copy(lane_key, &message)).await;
                            return Processed::Done;
                        }
                    }
                    Err(HandlerError::Transient(reason)) => {
                        let reason = format!("gave up after {} attempts: {reason}", attempt + 1);
                        self.give_up(lane_key, &message, Some((&envelope, &context)), delivered, "handler", &reason).await;
                        return Processed::Done;
                    }
                    Err(HandlerError::Permanent(reason)) => {
                        self.give_up(lane_key, &message, Some((&envelope, &context)), delivered, "invalid", &reason).await;
                        return Processed::Done;
                    }
                    Err(HandlerError::Interrupted) => {
                        // Not the message's failure: the run does not count.
                        self.count_run(work_sequence, -1);
                        tracing::info!("handler interrupted (shutdown, or its partition was lost); handing the message back");
                        hand_back(&self.newest_copy(lane_key, &message)).await;
                        return Processed::Done;
                    }
                    Err(HandlerError::Fatal(reason)) => {
                        let reason = zopu_secrets::redact(&reason);
                        tracing::error!(%reason, "fatal handler error; stopping the service");
                        hand_back(&self.newest_copy(lane_key, &message)).await;
                        self.shared.shutdown.cancel();
                        return Processed::Done;
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    pub(super) fn lock_runs(&self) -> std::sync::MutexGuard<'_, HashMap<u64, i64>> {
        self.runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Handler runs of `sequence` (of the work stream) here that ended without settling it.
    pub(super) fn runs_of(&self, sequence: u64) -> i64 {
        self.lock_runs().get(&sequence).copied().unwrap_or(0)
    }

    pub(super) fn count_run(&self, sequence: u64, change: i64) {
        let mut runs = self.lock_runs();
        let count = runs.entry(sequence).or_insert(0);
        *count += change;
        if *count <= 0 {
            runs.remove(&sequence);
        }
    }

    /// A redelivery: make sure the store has seen what an earlier attempt may
    /// have appended. Returns false (message handed back) on shutdown or if
    /// the store does not catch up within the handler timeout.
    pub(super) async fn caught_up_for_redelivery(&self, message: &Message) -> bool {
        let Ok(last) = publish::last_sequence(&self.shared.bus).await else {
            nak(message, Duration::from_secs(1)).await;
            return false;
        };
        tokio::select! {
            () = self.shared.store.wait_for(last) => true,
            () = self.shared.shutdown.cancelled() => {
                hand_back(message).await;
                false
            }
            () = tokio::time::sleep(self.config.handler_timeout) => {
                tracing::warn!(last, checkpoint = self.shared.store.checkpoint(), "store did not catch up; handing the message back");
                nak(message, Duration::from_secs(1)).await;
                false
            }
        }
    }

    /// Runs the handler under its timeout, keeping the lane's messages alive while it works.
    pub(super) async fn run_handler(
        &self,
        lane_key: &str,
        message: &Message,
        envelope: &Envelope,
        context: &ReactionContext,
        abort: &CancellationToken,
    ) -> Result<(), HandlerError> {
        let handler = tokio::time::timeout(
            self.config.handler_timeout,
            self.shared.reaction.handle(envelope, context),
        );
        tokio::pin!(handler);
        let mut heartbeat = tokio::time::interval(self.config.ack_wait / 3);
        heartbeat.tick().await;
        loop {
            tokio::select! {
                outcome = &mut handler => {
                    return outcome.unwrap_or_else(|_| Err(HandlerError::Transient(format!(
                        "handler did not finish within {}s", self.config.handler_timeout.as_secs()))));
                }
                _ = heartbeat.tick() => self.keep_lane_alive(lane_key, message).await,
                // The partition moved to another instance: stop mid-turn
                // (the next owner redoes it; every step is idempotent).
                () = abort.cancelled() => return Err(HandlerError::Interrupted),
            }
        }
    }

    /// Waits `delay` while keeping the lane's messages; false if shutdown came first.
    pub(super) async fn wait_extending(
        &self,
        lane_key: &str,
        message: &Message,
        delay: Duration,
        abort: &CancellationToken,
    ) -> bool {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        let mut heartbeat = tokio::time::interval(self.config.ack_wait / 3);
        loop {
            tokio::select! {
                () = &mut sleep => return true,
                () = self.shared.shutdown.cancelled() => return false,
                () = abort.cancelled() => return false,
                _ = heartbeat.tick() => self.keep_lane_alive(lane_key, message).await,
            }
        }
    }

    /// Acks (or terminates) the newest copy of the message, confirmed by the server.
    pub(super) async fn settle(&self, lane_key: &str, message: &Message, kind: AckKind) {
        let newest = self.newest_copy(lane_key, message);
        for attempt in 1..=5u64 {
            match newest.double_ack_with(kind).await {
                Ok(()) => {
                    if let Ok(info) = newest.info() {
                        self.lock_runs().remove(&info.stream_sequence);
                    }
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, attempt, "ack not confirmed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
                }
            }
        }
        tracing::error!(
            "ack never confirmed; the message may be redelivered (handlers are idempotent)"
        );
    }

    /// Records a dead letter (and the handler's visible failure and notice),
    /// then terminates. `handled`: the decoded event and the handler's
    /// context, unless the message did not decode.
    pub(super) async fn give_up(
        &self,
        lane_key: &str,
        message: &Message,
        handled: Option<(&Envelope, &ReactionContext)>,
        delivered: i64,
        kind: &str,
        reason: &str,
    ) {
        // Reasons are error texts from anywhere (a model's reply, a tool's
        // output, a remote error body): what looks like a secret never
        // reaches the log or the stream.
        let reason = zopu_secrets::redact(reason);
        let reason = reason.as_str();
        let envelope = handled.map(|(envelope, _)| envelope);
        // Filed by where the event is in the log; a copy whose origin is
        // unreadable by its place in the work stream.
        let (stream_sequence, original_subject) = match Origin::of(message) {
            Ok(origin) => (origin.sequence, origin.subject),
            Err(_) => (
                message.info().map_or(0, |info| info.stream_sequence),
                message.subject.to_string(),
            ),
        };
        tracing::error!(%reason, kind, "giving up on message; recording a dead letter");
        let record = pb::DeadLetterRecorded {
            service: self.shared.service.clone(),
            consumer: self.config.durable.clone(),
            original_subject: original_subject.clone(),
            stream_sequence,
            original_event_id: envelope.map(|e| e.id.to_string()).unwrap_or_default(),
            original_event_type: envelope.map(|e| e.event_type.clone()).unwrap_or_default(),
            kind: kind.to_owned(),
            reason: clipped_with_mark(reason, 2000),
            deliveries: u32::try_from(delivered).unwrap_or(u32::MAX),
            payload_sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&message.payload)),
            payload_bytes: message.payload.len() as u64,
        };
        let key = zopu_schema::keys::dead_letter(&self.config.durable, stream_sequence);
        let dead_letter = match envelope {
            Some(envelope) => NewEvent::caused_by(&envelope.context(), &record, key),
            None => {
                let (org, project) = scope_of(&original_subject);
                NewEvent::root(org, project, &record, key, None)
            }
        };
        let mut recorded = self.shared.publisher.append(dead_letter).await.is_ok();
        if let Some(envelope) = envelope
            && let Some(failure) = self.shared.reaction.failure_event(envelope, reason)
        {
            recorded &= self.shared.publisher.append(failure).await.is_ok();
        }
        if recorded
            && let Some((envelope, context)) = handled
            && let Some(notice) = self
                .shared
                .reaction
                .failure_notice(envelope, reason, context)
                .await
        {
            recorded &= self.shared.publisher.append(notice).await.is_ok();
        }
        if recorded {
            metrics::dead_letter(&self.shared.service, &self.config.durable, kind);
            self.settle(lane_key, message, AckKind::Term).await;
        } else {
            // Could not record why: leave it for redelivery rather than lose it.
            tracing::error!("dead letter not recorded; the message will be redelivered");
            nak(&self.newest_copy(lane_key, message), Duration::from_secs(5)).await;
        }
    }
}
