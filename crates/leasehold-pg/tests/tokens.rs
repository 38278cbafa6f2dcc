//! Through the guard, every way of taking a lease: after Redis loses the
//! fence counter, the new holder writes and the old one is refused; and
//! where a token *is* issued twice (a counter lost while it ran ahead of
//! the server's clock), only the first holder to write with it may write.

use leasehold::Lessor;
use std::time::Duration;

use leasehold::{AcquireOptions, FencedKeys, FencingToken, HandoffLocker, Lease, Locker, Quorum};
use leasehold_pg::Guard;
use leasehold_pg::tokio_postgres::Client;
use leasehold_testkit::RedisServer;

mod common;
use common::server;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
enum Kind {
    Polling,
    Handoff,
    Quorum,
}

/// One "process" taking leases one way, opened on `servers`.
enum Way {
    Polling(Locker),
    Handoff(HandoffLocker),
    Quorum(Quorum),
}

impl Way {
    async fn open(kind: Kind, servers: &[RedisServer]) -> Result<Way, Box<dyn std::error::Error>> {
        let client = leasehold::redis::Client::open(servers[0].url())?;
        Ok(match kind {
            Kind::Polling => Way::Polling(Locker::connect(&client).await?),
            Kind::Handoff => Way::Handoff(HandoffLocker::builder().connect(&client).await?),
            Kind::Quorum => {
                let clients = servers
                    .iter()
                    .map(|s| leasehold::redis::Client::open(s.url()))
                    .collect::<Result<Vec<_>, _>>()?;
                Way::Quorum(Quorum::connect(clients).await?)
            }
        })
    }

    async fn take(&self, keys: &FencedKeys) -> Result<Lease, leasehold::Error> {
        let opts = AcquireOptions::new().wait(HUNG);
        match self {
            Way::Polling(l) => l.acquire_with(keys, TTL, &opts).await,
            Way::Handoff(h) => h.acquire_with(keys, TTL, &opts).await,
            Way::Quorum(q) => q.acquire_with(keys, TTL, &opts).await,
        }
    }
}

/// One guarded transaction of `lease` that commits when accepted.
async fn write(db: &mut Client, lease: &Lease) -> Result<Guard, Box<dyn std::error::Error>> {
    let tx = db.transaction().await?;
    let guard = leasehold_pg::guard(&tx, lease).await?;
    if guard.is_accepted() {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(guard)
}

fn fence(lease: &Lease) -> Result<FencingToken, &'static str> {
    lease.fence().ok_or("a fenced lease without a fence")
}

/// How Redis loses the lock and its counter.
#[derive(Debug, Clone, Copy)]
enum Cause {
    /// A restart without persistence (or a failover to an empty replica).
    RestartEmpty,
    /// `FLUSHALL`.
    FlushAll,
    /// Both keys evicted (`DEL`).
    Evicted,
    /// Both keys expired.
    Expired,
}

impl Cause {
    fn apply(self, servers: &mut [RedisServer], keys: &FencedKeys) -> TestResult {
        for server in servers {
            match self {
                Cause::RestartEmpty => server.restart_empty()?,
                Cause::FlushAll => drop(server.redis_cli(&["FLUSHALL"])?),
                Cause::Evicted => drop(server.redis_cli(&["DEL", keys.lock(), keys.fence()])?),
                Cause::Expired => {
                    server.redis_cli(&["PEXPIRE", keys.lock(), "1"])?;
                    server.redis_cli(&["PEXPIRE", keys.fence(), "1"])?;
                    while server.redis_cli(&["EXISTS", keys.lock(), keys.fence()])? != "0" {
                        std::thread::yield_now();
                    }
                }
            }
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_loses_the_counter_the_new_holder_writes_and_the_old_one_is_refused_every_way()
-> TestResult {
    let pg = server()?;
    let mut db = leasehold_pg::connect(&pg.url()).await?;
    leasehold_pg::setup(&mut db).await?;
    for kind in [Kind::Polling, Kind::Handoff, Kind::Quorum] {
        let mut servers = match kind {
            Kind::Quorum => RedisServer::start_many(3)?,
            _ => vec![RedisServer::start()?],
        };
        for cause in [
            Cause::RestartEmpty,
            Cause::FlushAll,
            Cause::Evicted,
            Cause::Expired,
        ] {
            let keys = FencedKeys::for_resource(&format!("tokens:{cause:?}:{kind:?}"))?;
            let a = Way::open(kind, &servers).await?.take(&keys).await?;
            assert_eq!(
                write(&mut db, &a).await?,
                Guard::Accepted,
                "{kind:?} {cause:?}"
            );
            // Every node has A's lock and token (a quorum finishes its last
            // node in the background); then every node loses them.
            for server in &servers {
                while server.redis_cli(&["EXISTS", keys.lock()])? != "1" {
                    tokio::task::yield_now().await;
                }
            }
            cause.apply(&mut servers, &keys)?;
            let b = Way::open(kind, &servers).await?.take(&keys).await?;
            assert!(
                fence(&b)? > fence(&a)?,
                "{kind:?} {cause:?}: {:?} after {:?}",
                b.fence(),
                a.fence()
            );
            assert_eq!(
                write(&mut db, &b).await?,
                Guard::Accepted,
                "{kind:?} {cause:?}"
            );
            // A, paused through all of it, wakes up and writes again.
            let late = write(&mut db, &a).await?;
            assert!(
                matches!(&late, Guard::Refused { current, .. } if *current == fence(&b)?),
                "{kind:?} {cause:?}: the old holder was {late:?}"
            );
            let _ = b.release().await;
            drop(a);
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_issued_twice_lets_only_its_first_writer_write() -> TestResult {
    let pg = server()?;
    let mut db = leasehold_pg::connect(&pg.url()).await?;
    leasehold_pg::setup(&mut db).await?;
    let redis = RedisServer::start()?;
    let client = leasehold::redis::Client::open(redis.url())?;
    let keys = FencedKeys::for_resource("tokens:twice")?;
    // What the clock floor cannot cover: a counter that ran ahead of the
    // server's clock (issued by a server whose clock was ahead), then lost.
    // Ahead of the clock, tokens are consecutive.
    let ahead = FencingToken::MAX.get() - 1_000_000;
    redis.redis_cli(&["SET", keys.fence(), &ahead.to_string()])?;
    let locker = Locker::connect(&client).await?;
    let x = locker.acquire(&keys, TTL).await?;
    assert_eq!(write(&mut db, &x).await?, Guard::Accepted);
    x.release().await?;
    // Y takes the next token and pauses before its first write.
    let y = Locker::connect(&client).await?.acquire(&keys, TTL).await?;
    assert_eq!(fence(&y)?.get(), ahead + 2);
    // The counter is lost, and the lock with it (Y's lease "expired").
    redis.redis_cli(&["FLUSHALL"])?;
    // Z's token comes from the clock, below what the table has seen: it is
    // refused, and the guard heals the counter to the stored fence.
    let z = locker.acquire(&keys, TTL).await?;
    let refused = write(&mut db, &z).await?;
    assert!(
        matches!(refused, Guard::Refused { healed: true, .. }),
        "{refused:?}"
    );
    z.release().await?;
    // W gets the stored fence + 1: Y's token, issued a second time.
    let w = locker.acquire(&keys, TTL).await?;
    assert_eq!(w.fence(), y.fence(), "the token was not issued twice");
    assert_ne!(w.holder(), y.holder());
    assert_eq!(write(&mut db, &w).await?, Guard::Accepted);
    // Y wakes up and writes with the same token: refused, W wrote it.
    let late = write(&mut db, &y).await?;
    match &late {
        Guard::Refused {
            token,
            current,
            writer,
            ..
        } => {
            assert_eq!(token, current);
            assert_eq!(writer.as_deref(), Some(w.holder().as_str()));
        }
        Guard::Accepted => return Err("two holders wrote under one token".into()),
    }
    // W keeps writing under its lease.
    assert_eq!(write(&mut db, &w).await?, Guard::Accepted);
    w.release().await?;
    drop(y);
    Ok(())
}
