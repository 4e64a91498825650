//! Events as stored, for tests of what reads them (feature `test-support`).

use crate::{Envelope, Event, EventId, OrgId, ProjectId};

/// `payload` as the first event of `project` in `org`, from `zopu/setup`,
/// at the Unix epoch: a root event (its own cause and correlation).
pub fn envelope<E: Event>(payload: &E, org: &OrgId, project: ProjectId) -> Envelope {
    let id = EventId::new();
    Envelope {
        id,
        source: "zopu/setup".into(),
        event_type: E::TYPE.into(),
        time: time::OffsetDateTime::UNIX_EPOCH,
        data_schema: E::SCHEMA.into(),
        org_id: org.clone(),
        project_id: project,
        correlation_id: id.into(),
        causation_id: id,
        work_id: None,
        thread_id: None,
        flow_run_id: None,
        dispatch_id: None,
        traceparent: None,
        idempotency_key: id.to_string(),
        project_version: 1,
        previous_hash: None,
        data: payload.encode_to_vec().into(),
    }
}
