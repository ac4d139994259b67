//! relation-svc's write rules on every database and every write path, with the service called
//! directly (no transport). First the Follow rule, in one table: relation-svc writes a Follow or
//! an Unfollow by two paths, one PostgreSQL statement (a compare-and-set with the cap, the
//! account states and the block in SQL, `libs/storage/src/cas.rs`) and a transaction in Rust
//! (MariaDB, SQLite, and PostgreSQL when asked). Every case of the table runs through every path
//! on a fresh database each: the outcome (changed or not, the version, or the refusal's code,
//! reason and metadata), the edge row left behind and the relation events written must be what
//! the table says, and the same on every path, so neither path can drift from the rule.
//! Then the rule of blocks and mutes around an account's deletion: none can be added while it
//! runs, so none outlives it.

use std::sync::Arc;

use prometheus::IntCounter;
use prost::Message;
use socialgraph_domain::EdgeState;
use socialgraph_proto::events::v1::{RelationEvent, RelationEventKind};
use socialgraph_relation::lifecycle::Caller;
use socialgraph_relation::service::Relations;
use socialgraph_storage::accounts::AccountStatus;
use socialgraph_storage::edges::{self, EdgeTable};
use socialgraph_testkit::{Backend, TestDb};
use tonic::Code;

/// The cap every case runs under.
const CAP: i64 = 3;

#[derive(Debug, Clone, Copy)]
enum Step {
    Follow(i64, i64),
    Unfollow(i64, i64),
    Block(i64, i64),
    Unblock(i64, i64),
    Status(i64, AccountStatus),
    Lock(i64),
}

/// What the acting step must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The edge changed to this version, with one event.
    Changed(i64),
    /// Nothing changed; the edge is at this version (0: no edge).
    Unchanged(i64),
    /// A follow request is pending instead (a locked followee).
    Requested,
    /// Refused with this code and ErrorInfo reason; nothing written.
    Refused(Code, &'static str),
}

struct Case {
    name: &'static str,
    setup: &'static [Step],
    act: Step,
    expect: Expect,
}

use AccountStatus::{Deactivated, Suspended};
use Expect::{Changed, Refused, Requested, Unchanged};
use Step::{Block, Follow, Lock, Status, Unblock, Unfollow};

const PRECONDITION: Code = Code::FailedPrecondition;

const CASES: &[Case] = &[
    Case { name: "a new follow", setup: &[], act: Follow(1, 2), expect: Changed(1) },
    Case { name: "a repeated follow", setup: &[Follow(1, 2)], act: Follow(1, 2), expect: Unchanged(1) },
    Case { name: "a follow after an unfollow", setup: &[Follow(1, 2), Unfollow(1, 2)], act: Follow(1, 2), expect: Changed(3) },
    Case { name: "following oneself", setup: &[], act: Follow(1, 1), expect: Refused(Code::InvalidArgument, "SELF_FOLLOW") },
    Case { name: "the follower blocks the followee", setup: &[Block(1, 2)], act: Follow(1, 2), expect: Refused(PRECONDITION, "BLOCKED") },
    Case { name: "the followee blocks the follower", setup: &[Block(2, 1)], act: Follow(1, 2), expect: Refused(PRECONDITION, "BLOCKED") },
    Case {
        name: "a block ended the follow and was lifted",
        setup: &[Follow(1, 2), Block(2, 1), Unblock(2, 1)],
        act: Follow(1, 2),
        expect: Changed(3),
    },
    Case {
        name: "at the cap",
        setup: &[Follow(1, 2), Follow(1, 3), Follow(1, 4)],
        act: Follow(1, 5),
        expect: Refused(PRECONDITION, "FOLLOWING_LIMIT"),
    },
    Case {
        name: "a pending request counts toward the cap",
        setup: &[Follow(1, 2), Follow(1, 3), Lock(4), Follow(1, 4)],
        act: Follow(1, 5),
        expect: Refused(PRECONDITION, "FOLLOWING_LIMIT"),
    },
    Case {
        name: "an unfollow makes room under the cap",
        setup: &[Follow(1, 2), Follow(1, 3), Follow(1, 4), Unfollow(1, 4)],
        act: Follow(1, 5),
        expect: Changed(1),
    },
    Case { name: "a repeat at the cap is not refused", setup: &[Follow(1, 2), Follow(1, 3), Follow(1, 4)], act: Follow(1, 4), expect: Unchanged(1) },
    Case { name: "the follower deactivated", setup: &[Status(1, Deactivated)], act: Follow(1, 2), expect: Refused(PRECONDITION, "ACCOUNT_INACTIVE") },
    Case { name: "the followee suspended", setup: &[Status(2, Suspended)], act: Follow(1, 2), expect: Refused(PRECONDITION, "ACCOUNT_INACTIVE") },
    Case { name: "a locked followee", setup: &[Lock(2)], act: Follow(1, 2), expect: Requested },
    Case { name: "an unfollow", setup: &[Follow(1, 2)], act: Unfollow(1, 2), expect: Changed(2) },
    Case { name: "an unfollow of no edge", setup: &[], act: Unfollow(1, 2), expect: Unchanged(0) },
    Case { name: "a repeated unfollow", setup: &[Follow(1, 2), Unfollow(1, 2)], act: Unfollow(1, 2), expect: Unchanged(2) },
];

/// A refusal: its code, ErrorInfo reason and metadata.
type Refusal = (Code, String, Vec<(String, String)>);

/// What a path did with a case: the outcome, the edge row after it, the relation events the
/// acting step wrote (kind, follower, followee, version).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    outcome: Result<(bool, i64, bool), Refusal>,
    edge: Option<(EdgeState, i64)>,
    events: Vec<(i32, i64, i64, i64)>,
}

const TOPIC: &str = "sg.relation.rule";

async fn relations(db: &TestDb, transaction: bool) -> anyhow::Result<Relations> {
    let mut config = socialgraph_relation::config::Config::default();
    config.database.url = db.url.clone();
    config.kafka.relation_topic = TOPIC.into();
    config.limits.following_cap = CAP;
    let r = Relations::new(db.conn.clone(), None, None, config, Arc::new(tokio::sync::Notify::new()), IntCounter::new("bypassed", "test")?);
    Ok(if transaction { r.with_transaction_writes() } else { r })
}

async fn relation_events(db: &TestDb) -> anyhow::Result<Vec<(i32, i64, i64, i64)>> {
    let rows = socialgraph_storage::outbox::fetch(&db.conn, 10_000).await?;
    rows.iter()
        .filter(|r| r.row.topic == TOPIC)
        .map(|r| {
            let e = RelationEvent::decode(r.row.payload.as_slice())?;
            Ok((e.kind, e.follower_id, e.followee_id, e.version))
        })
        .collect()
}

/// Runs `step`; the outcome as (changed, version, requested) or the refusal.
async fn run(r: &Relations, step: Step) -> Result<(bool, i64, bool), tonic::Status> {
    let out = match step {
        Follow(a, b) => r.follow(a, b).await.map(|o| (o.changed, o.edge.version, o.requested)),
        Unfollow(a, b) => r.unfollow(a, b).await.map(|o| (o.changed, o.version, false)),
        Block(a, b) => r.block(a, b).await.map(|_| (true, 0, false)),
        Unblock(a, b) => r.unblock(a, b).await.map(|changed| (changed, 0, false)),
        Status(u, status) => r.set_account_status(u, status, Caller::Admin).await.map(|(_, changed)| (changed, 0, false)),
        Lock(u) => r.set_locked(u, true).await.map(|(changed, _)| (changed, 0, false)),
    };
    out.map_err(tonic::Status::from)
}

async fn check(backend: Backend, transaction: bool, case: &Case) -> anyhow::Result<Seen> {
    let db = TestDb::create(backend).await?;
    let r = relations(&db, transaction).await?;
    for step in case.setup {
        run(&r, *step).await.map_err(|e| anyhow::anyhow!("{}: setup {step:?}: {e}", case.name))?;
    }
    let before = relation_events(&db).await?.len();
    let outcome = run(&r, case.act).await.map_err(|s| {
        use tonic_types::StatusExt;
        let (reason, mut metadata) = match s.get_error_details().error_info() {
            Some(info) => (info.reason.clone(), info.metadata.clone().into_iter().collect::<Vec<_>>()),
            None => (String::new(), Vec::new()),
        };
        metadata.sort();
        (s.code(), reason, metadata)
    });
    let (Follow(a, b) | Unfollow(a, b)) = case.act else { anyhow::bail!("{}: the act is a follow or an unfollow", case.name) };
    let edge = edges::get(&db.conn, EdgeTable::Following, a, b, false).await?.map(|e| (e.state, e.version));
    let events = relation_events(&db).await?.split_off(before);
    db.drop_db().await?;
    Ok(Seen { outcome, edge, events })
}

/// The table's expectation of a case, against what a path did.
fn expected(case: &Case, seen: &Seen) -> Result<(), String> {
    let (Follow(a, b) | Unfollow(a, b)) = case.act else { return Err("the act is a follow or an unfollow".into()) };
    let following = matches!(case.act, Follow(..));
    let kind = if following { RelationEventKind::Followed } else { RelationEventKind::Unfollowed } as i32;
    let state = if following { EdgeState::Following } else { EdgeState::NotFollowing };
    let ok = match case.expect {
        Changed(v) => seen.outcome == Ok((true, v, false)) && seen.edge == Some((state, v)) && seen.events == [(kind, a, b, v)],
        Unchanged(v) => {
            let edge_ok = if v == 0 { seen.edge.is_none() } else { seen.edge.is_some_and(|(_, ev)| ev == v) };
            matches!(seen.outcome, Ok((false, got, false)) if got == v) && edge_ok && seen.events.is_empty()
        }
        Requested => {
            matches!(seen.outcome, Ok((_, _, true))) && seen.edge.is_none_or(|(s, _)| s == EdgeState::NotFollowing) && seen.events.is_empty()
        }
        Refused(code, reason) => matches!(&seen.outcome, Err((c, r, _)) if *c == code && r == reason) && seen.events.is_empty(),
    };
    if ok { Ok(()) } else { Err(format!("expected {:?}, saw {seen:?}", case.expect)) }
}

async fn table_holds(paths: &[(Backend, bool)]) -> anyhow::Result<()> {
    let mut faults = Vec::new();
    for case in CASES {
        let mut seen_by: Vec<((Backend, bool), Seen)> = Vec::new();
        for &(backend, transaction) in paths {
            let seen = check(backend, transaction, case).await?;
            if let Err(e) = expected(case, &seen) {
                faults.push(format!("{} ({backend:?}, transaction {transaction}): {e}", case.name));
            }
            seen_by.push(((backend, transaction), seen));
        }
        let first = &seen_by[0];
        for other in &seen_by[1..] {
            if other.1 != first.1 {
                faults.push(format!("{}: {:?} saw {:?}, {:?} saw {:?}", case.name, first.0, first.1, other.0, other.1));
            }
        }
    }
    assert!(faults.is_empty(), "the Follow rule differs between its paths or from its table:\n{}", faults.join("\n"));
    println!("{} cases, each the same on {paths:?}", CASES.len());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_follow_rule_is_one_table_on_postgres_statement_and_transaction() -> anyhow::Result<()> {
    table_holds(&[(Backend::Postgres, false), (Backend::Postgres, true)]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_follow_rule_is_one_table_on_mariadb_and_sqlite() -> anyhow::Result<()> {
    table_holds(&[(Backend::MariaDb, true), (Backend::Sqlite, true)]).await
}

/// A new block or mute of an account being deleted is refused (the deletion's last step ends
/// every one the account is in, and one added after it would outlive the account with no event
/// to undo it); lifting one is not refused; once the deletion is done the id is a fresh account.
async fn no_restriction_outlives_a_deletion(backend: Backend) -> anyhow::Result<()> {
    let db = TestDb::create(backend).await?;
    let r = relations(&db, false).await?;
    r.set_mute(3, 2, true).await.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    r.delete_account(2).await.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let refused = |out: Result<(bool, i64, bool), tonic::Status>, what: &str| match out {
        Err(s) if s.code() == PRECONDITION && socialgraph_integration_tests::reason(&s) == "ACCOUNT_DELETING" => Ok(()),
        other => Err(anyhow::anyhow!("{backend:?}: {what} of an account being deleted: expected ACCOUNT_DELETING, got {other:?}")),
    };
    refused(run(&r, Block(1, 2)).await, "a block")?;
    refused(run(&r, Block(2, 1)).await, "a block by it")?;
    let r = &r;
    let mute = |a, b| async move { r.set_mute(a, b, true).await.map(|c| (c, 0, false)).map_err(tonic::Status::from) };
    refused(mute(1, 2).await, "a mute")?;
    refused(mute(2, 1).await, "a mute by it")?;
    assert!(r.set_mute(3, 2, false).await.map_err(|e| anyhow::anyhow!("{e:?}"))?, "{backend:?}: an unmute is not refused");

    let mut steps = 0;
    while !matches!(r.job_step(2).await.map_err(|e| anyhow::anyhow!("{e:?}"))?, socialgraph_relation::lifecycle::Step::Done) {
        steps += 1;
        anyhow::ensure!(steps < 600, "{backend:?}: the deletion did not finish");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    run(r, Block(1, 2)).await.map_err(|e| anyhow::anyhow!("{backend:?}: a block of the fresh account: {e}"))?;
    assert!(r.set_mute(1, 2, true).await.map_err(|e| anyhow::anyhow!("{e:?}"))?, "{backend:?}: a mute of the fresh account");
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_block_or_mute_outlives_a_deletion() -> anyhow::Result<()> {
    for backend in [Backend::Postgres, Backend::MariaDb, Backend::Sqlite] {
        no_restriction_outlives_a_deletion(backend).await?;
    }
    Ok(())
}
