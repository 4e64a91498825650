//! Artifacts: where each published revision's HTML is stored, and the card
//! each `artifact.published` event shows.
//!
//! Invariants: a revision is stored once and never rewritten (a newer one
//! only marks it superseded). A card is keyed by the stream sequence of the
//! event that published it, which is also the sequence of its timeline item.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use zopu_schema::{Envelope, Event, OrgId, pb};

use super::sequence_keys;

pub(super) const TABLES: &[&str] = &[
    "gw_artifacts",
    "gw_artifact_cards",
    "gw_artifact_card_facts",
    "gw_artifact_card_actions",
    "gw_artifact_publications",
];

pub(super) const SCHEMA: &str = "
CREATE TABLE gw_artifacts (
    artifact_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    work_id TEXT,
    -- The sequence of the event that published it: its card.
    card_sequence INTEGER NOT NULL,
    bucket TEXT NOT NULL,
    object_name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    content_type TEXT NOT NULL,
    superseded_by INTEGER,
    PRIMARY KEY (artifact_id, revision)
);
CREATE TABLE gw_artifact_cards (
    sequence INTEGER PRIMARY KEY,
    org TEXT NOT NULL,
    project_id TEXT NOT NULL,
    artifact_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    kind TEXT NOT NULL,
    title TEXT NOT NULL,
    summary TEXT NOT NULL,
    -- As published; may be empty.
    label TEXT NOT NULL,
    provider TEXT NOT NULL
);
CREATE TABLE gw_artifact_card_facts (
    sequence INTEGER NOT NULL,
    position INTEGER NOT NULL,
    label TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (sequence, position)
);
CREATE TABLE gw_artifact_card_actions (
    sequence INTEGER NOT NULL,
    position INTEGER NOT NULL,
    action_id TEXT NOT NULL,
    label TEXT NOT NULL,
    style TEXT NOT NULL,
    PRIMARY KEY (sequence, position)
);
-- Where an issue draft was published on the tracker (`tracker.issue.created`).
CREATE TABLE gw_artifact_publications (
    org TEXT NOT NULL,
    artifact_id TEXT NOT NULL,
    url TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    PRIMARY KEY (org, artifact_id)
);
";

/// Where a stored artifact revision lives, for serving it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactRecord {
    pub artifact_id: String,
    pub revision: u32,
    pub project_id: String,
    pub bucket: String,
    pub object_name: String,
    pub sha256: String,
    pub size_bytes: u64,
    pub content_type: String,
}

/// An artifact's card as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardRow {
    pub artifact_id: String,
    pub revision: u32,
    /// `project_setup`, `exploration`, `issue` (`unspecified` otherwise).
    pub kind: String,
    pub title: String,
    pub summary: String,
    /// The card's own label; empty when it has none.
    pub label: String,
    pub facts: Vec<CardFactRow>,
    pub actions: Vec<CardActionRow>,
    pub provider: String,
    /// The tracker's address of the issue, once this draft was published:
    /// the card's `Status` then reads `published` and it offers no publish.
    pub published_url: Option<String>,
}

/// One fact on a card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardFactRow {
    pub label: String,
    pub value: String,
}

/// One action on a card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardActionRow {
    pub action_id: String,
    pub label: String,
    pub style: String,
}

/// The stored name of an artifact kind (the names the API shows).
fn kind_name(value: i32) -> &'static str {
    pb::ArtifactKind::try_from(value).map_or("unspecified", zopu_schema::manifest::kind_name)
}

/// Applies what `event` changes of an artifact.
pub(super) fn apply(tx: &Transaction<'_>, event: &Envelope, sequence: u64) -> rusqlite::Result<()> {
    let org = event.org_id.as_str();
    let project = event.project_id.to_string();
    match event.event_type.as_str() {
        t if t == pb::ArtifactPublished::TYPE => {
            if let Ok(m) = event.decode::<pb::ArtifactPublished>() {
                let html = m.html.clone().unwrap_or_default();
                tx.prepare_cached("INSERT OR IGNORE INTO gw_artifacts (artifact_id, revision, org, project_id, work_id, card_sequence, bucket, object_name, sha256, size_bytes, content_type)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)")?
                    .execute(params![
                        m.artifact_id,
                        m.revision,
                        org,
                        project,
                        event.work_id.map(|w| w.to_string()),
                        sequence as i64,
                        html.bucket,
                        html.name,
                        html.sha256,
                        html.size_bytes as i64,
                        html.content_type
                    ])?;
                insert_card(tx, org, &project, sequence, &m)?;
            }
        }
        t if t == pb::TrackerIssueCreated::TYPE => {
            if let Some((
                _,
                zopu_schema::approval::Execution::IssueCreated {
                    url, artifact_id, ..
                },
            )) = zopu_schema::approval::execution_of(event)
                && !artifact_id.is_empty()
            {
                tx.prepare_cached("INSERT OR IGNORE INTO gw_artifact_publications (org, artifact_id, url, sequence) VALUES (?1, ?2, ?3, ?4)")?
                    .execute(params![org, artifact_id, url, sequence as i64])?;
            }
        }
        t if t == pb::ArtifactSuperseded::TYPE => {
            if let Ok(m) = event.decode::<pb::ArtifactSuperseded>() {
                tx.prepare_cached("UPDATE gw_artifacts SET superseded_by = ?1 WHERE artifact_id = ?2 AND revision = ?3 AND org = ?4 AND project_id = ?5")?
                    .execute(params![m.superseded_by_revision, m.artifact_id, m.revision, org, project])?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn insert_card(
    tx: &Transaction<'_>,
    org: &str,
    project: &str,
    sequence: u64,
    published: &pb::ArtifactPublished,
) -> rusqlite::Result<()> {
    let sequence = sequence as i64;
    let card = published.card.clone().unwrap_or_default();
    tx.prepare_cached("INSERT INTO gw_artifact_cards (sequence, org, project_id, artifact_id, revision, kind, title, summary, label, provider)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)")?
        .execute(params![
            sequence,
            org,
            project,
            published.artifact_id,
            published.revision,
            kind_name(published.kind),
            published.title,
            published.summary,
            card.label,
            published.provider
        ])?;
    let mut fact = tx.prepare_cached(
        "INSERT INTO gw_artifact_card_facts (sequence, position, label, value) VALUES (?1, ?2, ?3, ?4)",
    )?;
    for (position, f) in card.facts.iter().enumerate() {
        fact.execute(params![sequence, position as i64, f.label, f.value])?;
    }
    let mut action = tx.prepare_cached(
        "INSERT INTO gw_artifact_card_actions (sequence, position, action_id, label, style) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for (position, a) in card.actions.iter().enumerate() {
        action.execute(params![sequence, position as i64, a.id, a.label, a.style])?;
    }
    Ok(())
}

/// An artifact revision of the organization (the newest when `revision` is
/// `None`) and its card.
pub fn find(
    conn: &Connection,
    org: &OrgId,
    artifact: &str,
    revision: Option<u32>,
) -> rusqlite::Result<Option<(ArtifactRecord, CardRow)>> {
    let found = conn
        .prepare_cached(
            "SELECT artifact_id, revision, project_id, bucket, object_name, sha256, size_bytes, content_type, card_sequence
             FROM gw_artifacts WHERE artifact_id = ?1 AND org = ?2 AND (?3 IS NULL OR revision = ?3)
             ORDER BY revision DESC LIMIT 1",
        )?
        .query_row(params![artifact, org.as_str(), revision], |row| {
            let record = ArtifactRecord {
                artifact_id: row.get(0)?,
                revision: row.get(1)?,
                project_id: row.get(2)?,
                bucket: row.get(3)?,
                object_name: row.get(4)?,
                sha256: row.get(5)?,
                size_bytes: row.get::<_, i64>(6)?.max(0) as u64,
                content_type: row.get(7)?,
            };
            Ok((record, row.get::<_, i64>(8)?.max(0) as u64))
        })
        .optional()?;
    let Some((record, card_sequence)) = found else {
        return Ok(None);
    };
    Ok(card(conn, org, card_sequence)?.map(|card| (record, card)))
}

/// The card published by the event at `sequence`, if it is the organization's.
pub fn card(conn: &Connection, org: &OrgId, sequence: u64) -> rusqlite::Result<Option<CardRow>> {
    Ok(cards(conn, org, &[sequence])?.remove(&sequence))
}

/// The cards published by the events at `sequences` that are the
/// organization's, by sequence: three queries (cards, facts, actions)
/// however many sequences.
pub fn cards(
    conn: &Connection,
    org: &OrgId,
    sequences: &[u64],
) -> rusqlite::Result<HashMap<u64, CardRow>> {
    let mut cards = HashMap::new();
    if sequences.is_empty() {
        return Ok(cards);
    }
    let mut select = conn.prepare_cached(
        "SELECT sequence, artifact_id, revision, kind, title, summary, label, provider FROM gw_artifact_cards
         WHERE org = ?1 AND sequence IN (SELECT value FROM json_each(?2))",
    )?;
    let mut rows = select.query(params![org.as_str(), sequence_keys(sequences)])?;
    while let Some(row) = rows.next()? {
        let card = CardRow {
            artifact_id: row.get(1)?,
            revision: row.get(2)?,
            kind: row.get(3)?,
            title: row.get(4)?,
            summary: row.get(5)?,
            label: row.get(6)?,
            facts: Vec::new(),
            actions: Vec::new(),
            provider: row.get(7)?,
            published_url: None,
        };
        cards.insert(row.get::<_, i64>(0)?.max(0) as u64, card);
    }
    if cards.is_empty() {
        return Ok(cards);
    }
    // Only the organization's cards: their sequences, not the ones asked for.
    let found: Vec<u64> = cards.keys().copied().collect();
    let found = sequence_keys(&found);
    let mut facts = conn.prepare_cached(
        "SELECT sequence, label, value FROM gw_artifact_card_facts
         WHERE sequence IN (SELECT value FROM json_each(?1)) ORDER BY sequence, position",
    )?;
    let mut rows = facts.query([&found])?;
    while let Some(row) = rows.next()? {
        if let Some(card) = cards.get_mut(&(row.get::<_, i64>(0)?.max(0) as u64)) {
            card.facts.push(CardFactRow {
                label: row.get(1)?,
                value: row.get(2)?,
            });
        }
    }
    let mut actions = conn.prepare_cached(
        "SELECT sequence, action_id, label, style FROM gw_artifact_card_actions
         WHERE sequence IN (SELECT value FROM json_each(?1)) ORDER BY sequence, position",
    )?;
    let mut rows = actions.query([&found])?;
    while let Some(row) = rows.next()? {
        if let Some(card) = cards.get_mut(&(row.get::<_, i64>(0)?.max(0) as u64)) {
            card.actions.push(CardActionRow {
                action_id: row.get(1)?,
                label: row.get(2)?,
                style: row.get(3)?,
            });
        }
    }
    let mut publications = conn.prepare_cached(
        "SELECT artifact_id, url FROM gw_artifact_publications
         WHERE org = ?1 AND artifact_id IN (SELECT artifact_id FROM gw_artifact_cards WHERE sequence IN (SELECT value FROM json_each(?2)))",
    )?;
    let mut rows = publications.query(params![org.as_str(), &found])?;
    while let Some(row) = rows.next()? {
        let (artifact_id, url): (String, String) = (row.get(0)?, row.get(1)?);
        for card in cards
            .values_mut()
            .filter(|card| card.artifact_id == artifact_id)
        {
            card.mark_published(&url);
        }
    }
    Ok(cards)
}

impl CardRow {
    /// A published issue draft: its status says so and it offers no second publish.
    fn mark_published(&mut self, url: &str) {
        for fact in self.facts.iter_mut().filter(|fact| fact.label == "Status") {
            fact.value = "published".to_owned();
        }
        self.actions
            .retain(|action| action.action_id != zopu_schema::manifest::PUBLISH_ISSUE_ACTION);
        self.published_url = Some(url.to_owned());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::read_model::tests::{TestStore, envelope};
    use zopu_schema::ProjectId;

    fn published(revision: u32, title: &str) -> pb::ArtifactPublished {
        pb::ArtifactPublished {
            artifact_id: "art-1".into(),
            revision,
            kind: pb::ArtifactKind::Exploration as i32,
            title: title.into(),
            summary: "what was found".into(),
            card: Some(pb::ArtifactCard {
                label: String::new(),
                facts: vec![
                    pb::CardFact {
                        label: "Files".into(),
                        value: "12".into(),
                    },
                    pb::CardFact {
                        label: "Risk".into(),
                        value: "low".into(),
                    },
                ],
                actions: vec![pb::CardAction {
                    id: "create_issue".into(),
                    label: "Draft an issue".into(),
                    style: "primary".into(),
                    ..Default::default()
                }],
            }),
            html: Some(pb::BlobRef {
                bucket: "zopu-artifacts".into(),
                name: format!("art-1/{revision}/x.html"),
                sha256: "cd".repeat(32),
                size_bytes: 2048,
                content_type: "text/html".into(),
            }),
            provider: "offline".into(),
            ..Default::default()
        }
    }

    /// An issue draft published on the tracker: its card says published,
    /// links the issue and offers no second publish.
    #[test]
    fn a_published_issue_card_says_so_and_offers_no_second_publish() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap();
        let draft = pb::ArtifactPublished {
            kind: pb::ArtifactKind::Issue as i32,
            card: Some(pb::ArtifactCard {
                label: "Issue draft".into(),
                facts: vec![pb::CardFact {
                    label: "Status".into(),
                    value: "draft (not published)".into(),
                }],
                actions: vec![pb::CardAction {
                    id: zopu_schema::manifest::PUBLISH_ISSUE_ACTION.into(),
                    label: "Publish to tracker".into(),
                    style: "primary".into(),
                    ..Default::default()
                }],
            }),
            ..published(1, "Add SSO")
        };
        store.apply(&[envelope("acme", project, &draft, 1)]);
        let (_, before) = find(&store.connection, &org, "art-1", None)
            .unwrap()
            .unwrap();
        assert_eq!(before.facts[0].value, "draft (not published)");
        assert_eq!(before.actions.len(), 1);
        assert_eq!(before.published_url, None);

        let created = pb::TrackerIssueCreated {
            approval_id: "approval:art-1:issue.publish".into(),
            artifact_id: "art-1".into(),
            repository: "acme/shop".into(),
            number: 7,
            url: "https://github.com/acme/shop/issues/7".into(),
            ..Default::default()
        };
        store.apply(&[envelope("acme", project, &created, 2)]);
        let (_, after) = find(&store.connection, &org, "art-1", None)
            .unwrap()
            .unwrap();
        assert_eq!(after.facts[0].value, "published");
        assert!(after.actions.is_empty(), "{:?}", after.actions);
        assert_eq!(
            after.published_url.as_deref(),
            Some("https://github.com/acme/shop/issues/7")
        );
        // Another organization's artifact of the same id is not marked.
        let other: OrgId = "other".parse().unwrap();
        assert!(
            find(&store.connection, &other, "art-1", None)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn the_newest_revision_is_found_with_its_card_and_a_revision_is_never_rewritten() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap();
        let first = store.apply(&[envelope("acme", project, &published(1, "First"), 1)]);
        store.apply(&[
            envelope("acme", project, &published(2, "Second"), 2),
            // A second publication of revision 1 does not rewrite it.
            envelope("acme", project, &published(1, "Rewritten"), 3),
        ]);

        let (record, card) = find(&store.connection, &org, "art-1", None)
            .unwrap()
            .unwrap();
        assert_eq!((record.revision, card.title.as_str()), (2, "Second"));
        assert_eq!(record.project_id, project.to_string());
        assert_eq!(record.size_bytes, 2048);

        let (record, card) = find(&store.connection, &org, "art-1", Some(1))
            .unwrap()
            .unwrap();
        assert_eq!(record.object_name, "art-1/1/x.html");
        assert_eq!(
            card,
            CardRow {
                artifact_id: "art-1".into(),
                revision: 1,
                kind: "exploration".into(),
                title: "First".into(),
                summary: "what was found".into(),
                label: String::new(),
                facts: vec![
                    CardFactRow {
                        label: "Files".into(),
                        value: "12".into()
                    },
                    CardFactRow {
                        label: "Risk".into(),
                        value: "low".into()
                    },
                ],
                actions: vec![CardActionRow {
                    action_id: "create_issue".into(),
                    label: "Draft an issue".into(),
                    style: "primary".into(),
                }],
                provider: "offline".into(),
                published_url: None,
            }
        );
        assert_eq!(
            card,
            self::card(&store.connection, &org, first).unwrap().unwrap()
        );
    }

    #[test]
    fn another_organization_finds_neither_the_revision_nor_its_card() {
        let mut store = TestStore::new();
        let sequence = store.apply(&[envelope("acme", ProjectId::new(), &published(1, "A"), 1)]);
        let other: OrgId = "other".parse().unwrap();
        assert!(
            find(&store.connection, &other, "art-1", None)
                .unwrap()
                .is_none()
        );
        assert!(card(&store.connection, &other, sequence).unwrap().is_none());
    }

    #[test]
    fn superseding_marks_the_old_revision_only() {
        let mut store = TestStore::new();
        let project = ProjectId::new();
        store.apply(&[
            envelope("acme", project, &published(1, "A"), 1),
            envelope("acme", project, &published(2, "B"), 2),
            envelope(
                "acme",
                project,
                &pb::ArtifactSuperseded {
                    artifact_id: "art-1".into(),
                    revision: 1,
                    superseded_by_revision: 2,
                },
                3,
            ),
        ]);
        let superseded: Vec<(u32, Option<u32>)> = store
            .connection
            .prepare("SELECT revision, superseded_by FROM gw_artifacts ORDER BY revision")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(superseded, vec![(1, Some(2)), (2, None)]);
    }
}
