//! The projection part's raw baselines on the broker alone: record transit at an offered rate
//! (produce → fetch), and a parallel fetch of a whole topic.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use rskafka::client::Client;
use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::record::Record;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio_util::sync::CancellationToken;

use crate::backends::{PARTITIONS, create_topic, partition_clients};
use crate::report::{Hist, hist};

/// Offers records at `rate`/s for `secs` s to a fresh topic: one producer task per partition
/// sends every record waiting, one request in flight (like the relay), while a fetch loop per
/// partition reads them back; latency = record offered → record fetched.
pub(super) async fn raw_transit(client: &Client, rate: u32, secs: u64) -> anyhow::Result<Hist> {
    let topic = socialgraph_testkit::unique("sg.bench.transit.");
    create_topic(client, &topic, PARTITIONS).await?;
    let pcs: Vec<Arc<PartitionClient>> = partition_clients(client, &topic).await?.into_iter().map(Arc::new).collect();
    let start = Instant::now();
    let produced = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    let fetchers: Vec<_> = pcs.iter().map(|pcl| tokio::spawn(fetch_transit(Arc::clone(pcl), start, secs, stop.clone()))).collect();
    let mut senders = Vec::new();
    let mut producers = Vec::new();
    for pcl in &pcs {
        let (tx, rx) = unbounded_channel::<u64>();
        senders.push(tx);
        producers.push(tokio::spawn(produce_offered(Arc::clone(pcl), rx, Arc::clone(&produced))));
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    let end = start + Duration::from_secs(secs);
    let mut i = 0u64;
    while Instant::now() < end && i < u64::from(rate) * secs + 1 {
        tick.tick().await;
        let _ = senders[(i % PARTITIONS as u64) as usize].send(start.elapsed().as_micros() as u64);
        i += 1;
    }
    drop(senders);
    let _ = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(producers)).await;
    // Let the fetchers see the last records, then stop them.
    let want = produced.load(Ordering::Relaxed);
    let wait_end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < wait_end {
        let hw = socialgraph_testkit::kafka::high_watermarks(client, &topic).await?;
        if hw.values().sum::<i64>() as u64 >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    let mut h = hist();
    for f in fetchers {
        if let Ok(x) = f.await {
            let _ = h.add(&x);
        }
    }
    Ok(h)
}

/// The fetch loop of one partition of [`raw_transit`]: each record's value starts with the
/// microseconds since `start` it was offered at; records the transit of each until `stop`.
async fn fetch_transit(pcl: Arc<PartitionClient>, start: Instant, secs: u64, stop: CancellationToken) -> Hist {
    let mut h = hist();
    let mut offset = 0i64;
    // Bounded: stops when told, or after secs + 90 s.
    let hard_end = start + Duration::from_secs(secs + 90);
    while !stop.is_cancelled() && Instant::now() < hard_end {
        let Ok((records, _hw)) = pcl.fetch_records(offset, 1..4_000_000, 5).await else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let now = start.elapsed().as_micros() as u64;
        for r in records {
            offset = offset.max(r.offset + 1);
            if let Some(v) = r.record.value.as_deref().and_then(|v| v.get(..8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(v);
                h.saturating_record(now.saturating_sub(u64::from_be_bytes(b)));
            }
        }
    }
    h
}

/// The producer of one partition of [`raw_transit`]: sends every offer waiting (at most 1000)
/// in one request, one request in flight, until the offers end; counts what was produced.
async fn produce_offered(pcl: Arc<PartitionClient>, mut rx: UnboundedReceiver<u64>, produced: Arc<AtomicU64>) {
    while let Some(first) = rx.recv().await {
        let mut offered = vec![first];
        while offered.len() < 1_000 {
            match rx.try_recv() {
                Ok(x) => offered.push(x),
                Err(_) => break,
            }
        }
        let n = offered.len() as u64;
        let records = offered
            .into_iter()
            .map(|t| {
                let mut value = t.to_be_bytes().to_vec();
                value.extend_from_slice(&[0u8; 64]);
                Record { key: Some(t.to_be_bytes().to_vec()), value: Some(value), headers: BTreeMap::new(), timestamp: rskafka::chrono::Utc::now() }
            })
            .collect();
        if pcl.produce(records, Compression::Lz4).await.is_ok() {
            produced.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Fetches every partition from offset 0 to `hw` in parallel; returns (records, seconds).
pub(super) async fn raw_fetch(client: &Client, topic: &str, hw: &BTreeMap<i32, i64>) -> anyhow::Result<(u64, f64)> {
    let mut pcs = Vec::new();
    for (&p, &h) in hw {
        pcs.push((client.partition_client(topic, p, UnknownTopicHandling::Error).await?, h));
    }
    let t = Instant::now();
    let results = futures::future::join_all(pcs.into_iter().map(|(pcl, h)| async move {
        let mut offset = pcl.get_offset(OffsetAt::Earliest).await?;
        let mut n = 0u64;
        let deadline = Instant::now() + Duration::from_secs(900);
        while offset < h {
            if Instant::now() > deadline {
                bail!("raw fetch took longer than 900 s");
            }
            let (records, _) = pcl.fetch_records(offset, 1..4 * 1024 * 1024, 5).await?;
            for r in records {
                if r.offset >= offset {
                    offset = r.offset + 1;
                    n += 1;
                }
            }
        }
        anyhow::Ok(n)
    }))
    .await;
    let mut total = 0;
    for r in results {
        total += r?;
    }
    Ok((total, t.elapsed().as_secs_f64()))
}
