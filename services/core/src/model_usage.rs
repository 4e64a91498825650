//! The model-token tally behind the daily budget per organization.
//!
//! Every model call is recorded as `agent.llm.completed` with the prompt and
//! completion tokens the provider reported (by the conversation agent and
//! the specialists alike). A projection that enforces the budget keeps this
//! table in its own file — [`SCHEMA`] in its migration, [`TABLE`] in its
//! tables, [`apply`] on each event — and asks [`tokens_used`] before calling
//! the model. Rows are keyed by stream sequence, so replays are idempotent
//! and a reader can count only what was stored before a given event; only
//! the current and previous UTC day are kept per organization.

use rusqlite::{Connection, Transaction, params};
use zopu_schema::{Envelope, Event, OrgId, pb};

/// The table's name (for `Projection::tables`).
pub const TABLE: &str = "zopu_model_usage";

/// Creates the table (part of a projection's migration).
pub const SCHEMA: &str = "CREATE TABLE zopu_model_usage (
    org TEXT NOT NULL, day TEXT NOT NULL, sequence INTEGER NOT NULL, tokens INTEGER NOT NULL,
    PRIMARY KEY (org, sequence));
CREATE INDEX zopu_model_usage_day ON zopu_model_usage (org, day, sequence);";

/// The UTC calendar day of `time`, `YYYY-MM-DD` (the budget's period).
pub fn utc_day(time: time::OffsetDateTime) -> String {
    let time = time.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}",
        time.year(),
        u8::from(time.month()),
        time.day()
    )
}

/// Records the tokens of an `agent.llm.completed` event; ignores any other.
pub fn apply(tx: &Transaction<'_>, event: &Envelope, sequence: u64) -> rusqlite::Result<()> {
    if event.event_type != pb::AgentLlmCompleted::TYPE {
        return Ok(());
    }
    let Ok(completed) = event.decode::<pb::AgentLlmCompleted>() else {
        return Ok(());
    };
    let tokens = i64::from(completed.prompt_tokens) + i64::from(completed.completion_tokens);
    let sequence = i64::try_from(sequence).unwrap_or(i64::MAX);
    let (org, day) = (event.org_id.as_str(), utc_day(event.time));
    tx.prepare_cached(
        "INSERT OR REPLACE INTO zopu_model_usage (org, day, sequence, tokens) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![org, day, sequence, tokens])?;
    tx.prepare_cached("DELETE FROM zopu_model_usage WHERE org = ?1 AND day < date(?2, '-1 day')")?
        .execute(params![org, day])
        .map(|_| ())
}

/// Tokens `org` used on `day` (UTC), counting the calls stored before `before`.
pub fn tokens_used(
    conn: &Connection,
    org: &OrgId,
    day: &str,
    before: u64,
) -> rusqlite::Result<u64> {
    let before = i64::try_from(before).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "SELECT COALESCE(SUM(tokens), 0) FROM zopu_model_usage WHERE org = ?1 AND day = ?2 AND sequence < ?3",
    )?
    .query_row(params![org.as_str(), day, before], |row| row.get::<_, i64>(0))
    .map(|tokens| u64::try_from(tokens).unwrap_or(0))
}

/// The failure message when `used` reached `budget` on `day`; `setting` is
/// the configuration key that sets the budget.
pub fn exceeded_message(used: u64, budget: u64, day: &str, setting: &str) -> String {
    format!(
        "This organization's daily model budget is used up ({used} of {budget} tokens on {day}, UTC); it renews at midnight UTC. The operator sets {setting}."
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn days_are_utc_calendar_days() {
        let time = time::OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        assert_eq!(utc_day(time), "2023-11-14");
        let late = time.to_offset(time::UtcOffset::from_hms(10, 0, 0).unwrap());
        assert_eq!(utc_day(late), "2023-11-14");
    }

    #[test]
    fn usage_is_summed_per_org_and_day_before_a_sequence() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let tx = conn.transaction().unwrap();
        for (org, day, sequence, tokens) in [
            ("acme", "2026-12-01", 1, 10),
            ("acme", "2026-12-01", 5, 7),
            ("acme", "2026-11-30", 2, 100),
            ("other", "2026-12-01", 3, 1000),
        ] {
            tx.execute(
                "INSERT INTO zopu_model_usage (org, day, sequence, tokens) VALUES (?1, ?2, ?3, ?4)",
                params![org, day, sequence, tokens],
            )
            .unwrap();
        }
        tx.commit().unwrap();
        let acme: OrgId = "acme".parse().unwrap();
        assert_eq!(
            tokens_used(&conn, &acme, "2026-12-01", u64::MAX).unwrap(),
            17
        );
        assert_eq!(tokens_used(&conn, &acme, "2026-12-01", 5).unwrap(), 10);
        assert_eq!(
            tokens_used(&conn, &acme, "2026-12-02", u64::MAX).unwrap(),
            0
        );
    }
}
