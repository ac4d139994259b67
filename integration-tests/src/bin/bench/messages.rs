//! Part messages: SendMessage vs the raw transaction (message insert, conversation update,
//! outbox insert) on PostgreSQL; ListConversations of a user with 1,000 conversations vs its
//! SQL query; a send to a group of 500 until every member's unread count shows it in
//! counter-svc.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
use socialgraph_integration_tests::messages::{message_client, message_on, unread_counter_config};
use socialgraph_integration_tests::spawn_counter;
use socialgraph_proto::counter::v1 as cpb;
use socialgraph_proto::message::v1::{CreateGroupRequest, ListConversationsRequest, SendMessageRequest};
use socialgraph_testkit::{Backend, TestDb};

use crate::MessagesArgs;
use crate::load::{closed_loop, mix};
use crate::report::{header, print_table, progress, row, summarize};

/// Runs the part.
pub(crate) async fn run(a: &MessagesArgs) -> anyhow::Result<()> {
    header("messages: SendMessage on PostgreSQL, ListConversations, a group of 500");
    let max_time = Duration::from_secs(a.max_secs);
    progress(&format!("SendMessage RPC, {} sends over {} users, concurrency {}", a.sends, a.users, a.concurrency));
    let (db, svc, _, relation) = message_on(Backend::Postgres, false).await?;
    let client = message_client(&svc).await?;
    let users = a.users;
    let c = client.clone();
    let rpc = closed_loop(a.concurrency, a.sends, max_time, move |_, i| {
        let mut c = c.clone();
        let from = (mix(i as u64) % users as u64) as i64 + 1;
        let to = (from + 1 + (mix(i as u64 + 7) % (users as u64 - 1)) as i64 - 1) % users + 1;
        async move {
            let req = SendMessageRequest {
                sender_id: from,
                recipient_id: to,
                conversation_id: 0,
                client_message_id: format!("b{i}"),
                body: vec![b'x'; 64],
            };
            c.send_message(req).await?;
            Ok(())
        }
    })
    .await;
    progress("raw transaction: message insert + conversation update + outbox insert");
    let raw = raw_sends(a, max_time).await?;
    print_table(
        &format!("SendMessage: {} sends over random pairs of {} users, 64-byte bodies, concurrency {}", a.sends, a.users, a.concurrency),
        "SendMessage RPC",
        "raw SQL tx",
        &[
            row("throughput", rpc.rate(), raw.rate(), "/s"),
            row("p50 latency", rpc.p50(), raw.p50(), "ms"),
            row("p99 latency", rpc.p99(), raw.p99(), "ms"),
        ],
        &[rpc.describe("RPC"), raw.describe("raw")],
    );
    summarize("SendMessage, concurrency 32", rpc.rate(), raw.rate(), "/s", "(no target: measured)");

    progress("ListConversations of a user with 1,000 conversations");
    let owner = users + 1;
    for peer in 1..=1_000 {
        let req = SendMessageRequest {
            sender_id: owner,
            recipient_id: peer,
            conversation_id: 0,
            client_message_id: format!("o{peer}"),
            body: b"hi".to_vec(),
        };
        client.clone().send_message(req).await?;
    }
    let c = client.clone();
    let list = closed_loop(1, a.reads, max_time, move |_, _| {
        let mut c = c.clone();
        async move {
            let page =
                c.list_conversations(ListConversationsRequest { user_id: owner, page_size: 50, page_token: String::new() }).await?.into_inner();
            anyhow::ensure!(page.conversations.len() == 50, "a full page");
            Ok(())
        }
    })
    .await;
    let pool = socialgraph_storage::connect(&db.url, 4).await?;
    let p = pool.clone();
    let sql = closed_loop(1, a.reads, max_time, move |_, _| {
        let pool = p.clone();
        async move {
            socialgraph_storage::messages::conversations_of(&pool, owner, None, 51).await?;
            Ok(())
        }
    })
    .await;
    print_table(
        "ListConversations: first page of 50 of a user with 1,000 conversations, one caller",
        "RPC",
        "its SQL (member ⋈ conversation)",
        &[row("p50 latency", list.p50(), sql.p50(), "ms"), row("p99 latency", list.p99(), sql.p99(), "ms")],
        &[],
    );
    pool.close().await.ok();
    svc.stop().await?;
    relation.stop().await?;
    db.drop_db().await?;
    group_send(a).await
}

/// The raw transaction of a send (the baseline) on a fresh database, over conversations created beforehand.
async fn raw_sends(a: &MessagesArgs, max_time: Duration) -> anyhow::Result<crate::report::Run> {
    let db = TestDb::create(Backend::Postgres).await?;
    let pool = socialgraph_storage::connect(&db.url, 32).await?;
    let conversations = 1_000i64;
    for id in 1..=conversations {
        let sql = format!(
            "INSERT INTO conversation (id, kind, owner_id, title, last_seq, member_count, created_at_ms, updated_at_ms) VALUES ({id}, 2, 1, '', 0, 2, 0, 0)"
        );
        pool.execute_unprepared(&sql).await?;
    }
    let p = pool.clone();
    let run = closed_loop(a.concurrency, a.sends, max_time, move |_, i| {
        let pool = p.clone();
        let c = (mix(i as u64) % conversations as u64) as i64 + 1;
        async move {
            let tx = pool.begin().await?;
            let seq: i64 = tx
                .query_one_raw(Statement::from_sql_and_values(
                    DbBackend::Postgres,
                    "UPDATE conversation SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq",
                    [c.into()],
                ))
                .await?
                .ok_or_else(|| anyhow::anyhow!("no conversation"))?
                .try_get_by_index(0)?;
            tx.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "INSERT INTO message (conversation_id, seq, sender_id, client_message_id, body, sent_at_ms) VALUES ($1, $2, 1, $3, $4, 0)",
                [c.into(), seq.into(), format!("r{i}").into(), vec![b'x'; 64].into()],
            ))
            .await?;
            tx.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "INSERT INTO outbox (topic, partition_key, payload, headers, created_at_ms) VALUES ('sg.message.v1', $1, $2, '', 0)",
                [c.into(), vec![0u8; 96].into()],
            ))
            .await?;
            tx.commit().await?;
            Ok(())
        }
    })
    .await;
    pool.close().await.ok();
    db.drop_db().await?;
    Ok(run)
}

/// One message to a group of 500, then the time until counter-svc shows every member's unread.
async fn group_send(a: &MessagesArgs) -> anyhow::Result<()> {
    progress("a group of 500: time from a send until every member's unread count shows it in counter-svc");
    let (db, svc, topic, relation) = message_on(Backend::Postgres, true).await?;
    let counter = spawn_counter(unread_counter_config(&svc, &topic).0).await?;
    let mut m = message_client(&svc).await?;
    let mut c = counter.counter().await?;
    let group = m
        .create_group(CreateGroupRequest { creator_id: 1, member_ids: (2..=500).collect(), title: "bench".into() })
        .await?
        .into_inner()
        .conversation_id;
    let members: Arc<Vec<i64>> = Arc::new((2..=500).collect());
    // A first read builds each member's counts from message-svc; from then on what the reads
    // show is what the consumer kept.
    for u in members.iter() {
        c.get_unread_counts(cpb::GetUnreadCountsRequest { user_id: *u }).await?;
    }
    let mut sends = Vec::new();
    let mut visible = Vec::new();
    for round in 1..=a.group_rounds as i64 {
        let started = Instant::now();
        let req = SendMessageRequest {
            sender_id: 1,
            recipient_id: 0,
            conversation_id: group,
            client_message_id: format!("g{round}"),
            body: b"all".to_vec(),
        };
        m.send_message(req).await?;
        sends.push(started.elapsed().as_secs_f64() * 1000.0);
        let deadline = started + Duration::from_secs(60);
        'wait: loop {
            for u in members.iter() {
                let n = c.get_unread_counts(cpb::GetUnreadCountsRequest { user_id: *u }).await?.into_inner().total_unread;
                if n < round {
                    anyhow::ensure!(Instant::now() < deadline, "member {u} did not see round {round} within 60 s");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue 'wait;
                }
            }
            break;
        }
        visible.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    print_table(
        &format!("A group of 500 members, {} sends one after another", a.group_rounds),
        "mean",
        "max",
        &[row("SendMessage latency", mean(&sends), max(&sends), "ms"), row("send → every member's unread visible", mean(&visible), max(&visible), "ms")],
        &["visible = the send returned, the relay published, counter-svc copied 499 memberships, and 499 GetUnreadCounts reads (one caller) all show it".into()],
    );
    counter.stop().await?;
    svc.stop().await?;
    relation.stop().await?;
    db.drop_db().await
}
