//! The outbox table as the event log of the embedded mode: every consumer runs the mesh's own
//! [`run_partition`] over [`OutboxLog`] (one partition per topic, offsets = outbox ids), and
//! stores its next offset beside its effects, as in the mesh.

use std::sync::Arc;

use socialgraph_events::consumer::{BatchHandler, ConsumerSettings, Progress, run_partition};
use socialgraph_events::outbox_log::PARTITION;
use socialgraph_events::{KeyedRecord, OutboxLog};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a read of the log waits for a commit before looking again (commits in this
/// process end the wait at once).
const MAX_WAIT_MS: i32 = 200;

/// Consumes `topic` of `log` into `handler` until `cancel` (the mesh's consumer loop); progress
/// is reported under (`topic`, 0).
pub fn spawn<H: BatchHandler>(log: &Arc<OutboxLog>, topic: &str, handler: Arc<H>, progress: Progress, cancel: &CancellationToken) -> JoinHandle<()> {
    // The wait happens in the log's read (woken by commits), not in idle sleeps between reads.
    let settings = ConsumerSettings { max_wait_ms: MAX_WAIT_MS, idle_max_ms: 1, deep_idle_ms: 1, ..ConsumerSettings::default() };
    let (log, topic, cancel) = (Arc::clone(log), topic.to_owned(), cancel.clone());
    tokio::spawn(run_partition(log, topic, PARTITION, handler, progress, settings, Arc::new(Notify::new()), cancel))
}

/// PublishPost's and DeletePost's log in the embedded mode: the event becomes an outbox row of
/// the content topic (key = author), and the log readers are woken.
pub struct OutboxContentLog {
    /// The log.
    pub log: Arc<OutboxLog>,
    /// The content topic.
    pub topic: String,
}

#[tonic::async_trait]
impl socialgraph_projection::feed::ContentLog for OutboxContentLog {
    async fn append(&self, event: socialgraph_proto::events::v1::ContentEvent) -> Result<(), socialgraph_server::ApiError> {
        let headers = socialgraph_events::headers::event_headers("socialgraph.events.v1.ContentEvent");
        let record = KeyedRecord {
            topic: self.topic.clone(),
            key: socialgraph_events::user_key(event.author_id).to_vec(),
            value: prost::Message::encode_to_vec(&event),
            headers: headers.into_iter().map(|(k, v)| (k, v.into_bytes())).collect(),
            timestamp_ms: crate::now_ms(),
        };
        socialgraph_events::EventLog::append(self.log.as_ref(), vec![record]).await.map_err(|e| match e.downcast::<sea_orm::DbErr>() {
            Ok(db) => socialgraph_server::db_error(*db),
            Err(other) => socialgraph_server::ApiError::Internal(other),
        })
    }
}
