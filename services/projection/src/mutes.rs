//! The mutes timelines leave out, from topic `kafka.account_topic` (relation-svc's
//! AccountEvents of kind MUTE): projection-svc copies each (muter, muted) with its version into
//! `timeline_mute_copy`, newest version wins, in the transaction that stores the offset, and
//! GetTimeline reads the viewer's mutes from that copy: no call to relation-svc on a timeline
//! read (docs/src/architecture/feeds.md#mutes). Other kinds of the topic are skipped.

use std::collections::HashMap;

use prost::Message as _;
use rskafka::record::RecordAndOffset;
use sea_orm::DatabaseConnection;
use socialgraph_domain::now_ms;
use socialgraph_events::consumer::{BatchHandler, BoxError};
use socialgraph_proto::events::v1::{AccountEvent, AccountEventKind};
use socialgraph_storage::mute_versions;
use socialgraph_storage::offsets::{self, StoredOffset};
use socialgraph_storage::retry_tx;

/// AccountEvents (kind MUTE) applied to `timeline_mute_copy`.
pub struct MuteCopier {
    /// The projection database.
    pub db: DatabaseConnection,
    /// Name of this consumer's offsets in `consumer_offset`.
    pub consumer: String,
}

/// The newest (muted, version) per (muter, muted) among `records`' MUTE events.
pub fn newest_mutes(records: &[RecordAndOffset]) -> HashMap<(i64, i64), (bool, i64)> {
    let mut newest: HashMap<(i64, i64), (bool, i64)> = HashMap::new();
    for r in records {
        let Ok(e) = AccountEvent::decode(r.record.value.as_deref().unwrap_or_default()) else { continue };
        if e.kind != AccountEventKind::Mute as i32 || e.user_id <= 0 || e.other_user_id <= 0 || e.user_id == e.other_user_id {
            continue;
        }
        let slot = newest.entry((e.user_id, e.other_user_id)).or_insert((e.muted, e.version));
        if socialgraph_domain::newer_wins(Some(slot.1), e.version) {
            *slot = (e.muted, e.version);
        }
    }
    newest
}

impl BatchHandler for MuteCopier {
    async fn load_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        Ok(offsets::next_offset(&self.db, &self.consumer, topic, partition).await?)
    }

    async fn apply(&self, topic: &str, partition: i32, records: &[RecordAndOffset], next_offset: i64) -> Result<(), BoxError> {
        let mut mutes: Vec<((i64, i64), (bool, i64))> = newest_mutes(records).into_iter().collect();
        // One lock order for concurrent batches.
        mutes.sort_unstable_by_key(|(k, _)| *k);
        let last_event_ms = records.last().map(|r| r.record.timestamp.timestamp_millis());
        retry_tx(8, || async {
            let txn = socialgraph_storage::begin_write(&self.db).await?;
            let now = now_ms();
            for (key, (muted, version)) in &mutes {
                mute_versions::apply_copy(&txn, *key, *muted, *version, now).await?;
            }
            offsets::store(&txn, &self.consumer, topic, StoredOffset { partition, next_offset, last_event_ms }, now).await?;
            txn.commit().await
        })
        .await?;
        Ok(())
    }
}
