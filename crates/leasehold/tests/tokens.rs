//! A fencing token is never issued twice: after every way Redis can lose or
//! set back a fence counter, the next token is above every token issued
//! before, every way of taking a lease.
#![cfg(all(feature = "handoff", feature = "quorum"))]

use leasehold::Lessor;
use std::time::Duration;

use leasehold::{
    AcquireOptions, DEFAULT_FENCE_TTL, Error, FencedKeys, FencingToken, HandoffLocker,
    HandoffStyle, Lease, Locker, Quorum, RetryStrategy,
};
use leasehold_testkit::{RedisOptions, RedisServer};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SECOND: Duration = Duration::from_secs(1);
/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy)]
enum Kind {
    Polling,
    Handoff,
    Wake,
    Relay,
    Quorum,
}

const KINDS: [Kind; 5] = [
    Kind::Polling,
    Kind::Handoff,
    Kind::Wake,
    Kind::Relay,
    Kind::Quorum,
];

/// The kinds that run on one server, which can have a replica.
const REPLICATED: [Kind; 4] = [Kind::Polling, Kind::Handoff, Kind::Wake, Kind::Relay];

/// One "process" taking leases one way.
enum Way {
    Polling(Locker),
    Handoff(HandoffLocker),
    Quorum(Quorum),
}

impl Way {
    async fn open(
        kind: Kind,
        servers: &[RedisServer],
        fence_ttl: Duration,
    ) -> Result<Way, Box<dyn std::error::Error>> {
        let client = redis::Client::open(servers[0].url())?;
        let fence_ttl = Some(fence_ttl);
        Ok(match kind {
            Kind::Polling => Way::Polling(
                Locker::builder()
                    .fence_ttl(fence_ttl)
                    .connect(&client)
                    .await?,
            ),
            Kind::Handoff | Kind::Wake | Kind::Relay => {
                let (style, limit) = match kind {
                    Kind::Wake => (HandoffStyle::Wake, 0),
                    Kind::Relay => (HandoffStyle::Grant, 16),
                    _ => (HandoffStyle::Grant, 0),
                };
                let locker = Locker::builder()
                    .fence_ttl(fence_ttl)
                    .connect(&client)
                    .await?;
                let handoff = HandoffLocker::builder()
                    .style(style)
                    .relay_limit(limit)
                    .build(locker, &client)
                    .await?;
                Way::Handoff(handoff)
            }
            Kind::Quorum => {
                let clients = servers
                    .iter()
                    .map(|s| redis::Client::open(s.url()))
                    .collect::<Result<Vec<_>, _>>()?;
                Way::Quorum(
                    Quorum::builder()
                        .fence_ttl(fence_ttl)
                        .connect(clients)
                        .await?,
                )
            }
        })
    }

    async fn acquire_with(
        &self,
        keys: &FencedKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease, Error> {
        match self {
            Way::Polling(l) => l.acquire_with(keys, ttl, opts).await,
            Way::Handoff(h) => h.acquire_with(keys, ttl, opts).await,
            Way::Quorum(q) => q.acquire_with(keys, ttl, opts).await,
        }
    }

    /// A fenced lease on `keys` (waiting for it) and its token.
    async fn take(&self, keys: &FencedKeys) -> Result<(Lease, u64), Box<dyn std::error::Error>> {
        let opts = AcquireOptions::new().wait(HUNG);
        let lease = self.acquire_with(keys, 10 * SECOND, &opts).await?;
        let fence = lease.fence().ok_or("a fenced lease without a fence")?;
        Ok((lease, fence.get()))
    }

    /// Takes and releases a lease on `keys`: its token.
    async fn take_and_release(&self, keys: &FencedKeys) -> Result<u64, Box<dyn std::error::Error>> {
        let (lease, fence) = self.take(keys).await?;
        lease.release().await?;
        Ok(fence)
    }
}

fn servers_for(kind: Kind) -> Result<Vec<RedisServer>, Box<dyn std::error::Error>> {
    Ok(match kind {
        Kind::Quorum => RedisServer::start_many(3)?,
        _ => vec![RedisServer::start()?],
    })
}

/// Waits until `done` holds on every server (a quorum finishes its writes
/// on the last node in the background; a replica catches up).
async fn until_every_node(
    servers: &[RedisServer],
    what: &str,
    done: impl Fn(&RedisServer) -> Result<bool, leasehold_testkit::Error>,
) -> TestResult {
    let waited = tokio::time::timeout(HUNG, async {
        for server in servers {
            while !done(server)? {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Ok::<_, leasehold_testkit::Error>(())
    })
    .await;
    waited.map_err(|_| format!("hung waiting for {what}"))??;
    Ok(())
}

/// Waits until every server's counter is `fence` and the lock is free.
async fn until_settled(servers: &[RedisServer], keys: &FencedKeys, fence: u64) -> TestResult {
    let fence = fence.to_string();
    until_every_node(servers, "the counters and locks to settle", |s| {
        Ok(s.redis_cli(&["GET", keys.fence()])? == fence
            && s.redis_cli(&["EXISTS", keys.lock()])? == "0")
    })
    .await
}

/// A way Redis loses a fence counter.
#[derive(Debug, Clone, Copy)]
enum Cause {
    RestartEmpty,
    FlushAll,
    /// Eviction, or anyone's `DEL`.
    FenceKeyDeleted,
    FenceKeyExpired,
}

const CAUSES: [Cause; 4] = [
    Cause::RestartEmpty,
    Cause::FlushAll,
    Cause::FenceKeyDeleted,
    Cause::FenceKeyExpired,
];

impl Cause {
    /// Loses `keys`' counter on every server.
    async fn apply(self, servers: &mut [RedisServer], keys: &FencedKeys) -> TestResult {
        for server in servers.iter_mut() {
            match self {
                Cause::RestartEmpty => server.restart_empty()?,
                Cause::FlushAll => {
                    server.redis_cli(&["FLUSHALL"])?;
                }
                Cause::FenceKeyDeleted => {
                    server.redis_cli(&["DEL", keys.fence()])?;
                }
                Cause::FenceKeyExpired => {
                    server.redis_cli(&["PEXPIRE", keys.fence(), "1"])?;
                }
            }
        }
        until_every_node(servers, "the counter to be gone", |s| {
            Ok(s.redis_cli(&["EXISTS", keys.fence()])? == "0")
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_counter_never_reissues_a_token_every_way_and_cause() -> TestResult {
    let keys = FencedKeys::for_resource("wallet:tokens")?;
    for kind in KINDS {
        for cause in CAUSES {
            let mut servers = servers_for(kind)?;
            let way = Way::open(kind, &servers, DEFAULT_FENCE_TTL).await?;
            let mut issued = Vec::new();
            for _ in 0..3 {
                issued.push(way.take_and_release(&keys).await?);
            }
            // Holder A.
            let (a, fence) = way.take(&keys).await?;
            issued.push(fence);
            a.release().await?;
            drop(way);
            let max = issued.iter().copied().max().ok_or("nothing issued")?;
            until_settled(&servers, &keys, max).await?;
            cause.apply(&mut servers, &keys).await?;
            // Holder B: another process, after the fault.
            let way = Way::open(kind, &servers, DEFAULT_FENCE_TTL).await?;
            let (b, fence) = way.take(&keys).await?;
            assert!(
                fence > max,
                "{kind:?}, {cause:?}: token {fence} reissued after {issued:?}"
            );
            b.release().await?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_lagging_replica_never_reissues_a_token() -> TestResult {
    let keys = FencedKeys::for_resource("wallet:failover")?;
    for kind in REPLICATED {
        // No diskless-sync delay: the replica's first sync starts at once.
        let mut primary = RedisServer::start_with(
            RedisOptions::default().args(["--repl-diskless-sync-delay", "0"]),
        )?;
        let mut replica = RedisServer::start_with(
            RedisOptions::default().replica_of(primary.host(), primary.port()),
        )?;
        let way = Way::open(kind, std::slice::from_ref(&primary), DEFAULT_FENCE_TTL).await?;
        let first = way.take_and_release(&keys).await?;
        let replicated = first.to_string();
        until_every_node(std::slice::from_ref(&replica), "the replica", |s| {
            Ok(s.redis_cli(&["GET", keys.fence()])? == replicated)
        })
        .await?;
        // The replica stops and its link drops (a partition): what the
        // primary issues next never reaches it. (Paused alone, it would
        // still read what the kernel buffered for it on resume.)
        replica.pause()?;
        primary.redis_cli(&["CLIENT", "KILL", "TYPE", "replica"])?;
        let mut issued = vec![first];
        for _ in 0..2 {
            issued.push(way.take_and_release(&keys).await?);
        }
        drop(way);
        primary.kill()?;
        replica.resume()?;
        replica.promote()?;
        let max = issued.iter().copied().max().ok_or("nothing issued")?;
        assert_eq!(
            replica.redis_cli(&["GET", keys.fence()])?,
            replicated,
            "{kind:?}: the replica did not lag (issued {issued:?})"
        );
        let way = Way::open(kind, std::slice::from_ref(&replica), DEFAULT_FENCE_TTL).await?;
        let (lease, fence) = way.take(&keys).await?;
        assert!(
            fence > max,
            "{kind:?}: the promoted replica reissued {fence} after {issued:?}"
        );
        lease.release().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_before_its_first_write_keeps_a_token_nobody_else_gets() -> TestResult {
    let keys = FencedKeys::for_resource("wallet:paused")?;
    for kind in KINDS {
        let mut servers = servers_for(kind)?;
        let x_way = Way::open(kind, &servers, DEFAULT_FENCE_TTL).await?;
        let x = x_way.take_and_release(&keys).await?;
        let y_way = Way::open(kind, &servers, DEFAULT_FENCE_TTL).await?;
        // Y holds its lease, paused before its first write.
        let (y_lease, y) = y_way.take(&keys).await?;
        let y_text = y.to_string();
        until_every_node(&servers, "Y's counter", |s| {
            Ok(s.redis_cli(&["GET", keys.fence()])? == y_text)
        })
        .await?;
        for server in &mut servers {
            server.restart_empty()?;
        }
        let z_way = Way::open(kind, &servers, DEFAULT_FENCE_TTL).await?;
        let (z_lease, z) = z_way.take(&keys).await?;
        assert!(z > y, "{kind:?}: Z got {z}, not above paused Y's {y}");
        // The storage refused Z (it saw x): the guard heals the counter.
        z_lease.raise_fence(FencingToken::new(x)).await?;
        z_lease.release().await?;
        let w = z_way.take_and_release(&keys).await?;
        assert!(
            w > y && w > z,
            "{kind:?}: W got {w} after Y's {y} and Z's {z}"
        );
        let mut tokens = vec![x, y, z, w];
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(tokens.len(), 4, "{kind:?}: x {x}, y {y}, z {z}, w {w}");
        drop(y_lease);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refreshing_a_fenced_lease_keeps_its_fence_key_alive() -> TestResult {
    let keys = FencedKeys::for_resource("wallet:refresh")?;
    let pttl = |server: &RedisServer| -> Result<i64, Box<dyn std::error::Error>> {
        Ok(server.redis_cli(&["PTTL", keys.fence()])?.parse()?)
    };
    for kind in KINDS {
        let servers = servers_for(kind)?;
        let way = Way::open(kind, &servers, 5 * SECOND).await?;
        let (lease, fence) = way.take(&keys).await?;
        let fence = fence.to_string();
        until_every_node(&servers, "the counters", |s| {
            Ok(s.redis_cli(&["GET", keys.fence()])? == fence)
        })
        .await?;
        // The counter would expire soon, while the lease lives on.
        for server in &servers {
            server.redis_cli(&["PEXPIRE", keys.fence(), "500"])?;
        }
        lease.refresh(10 * SECOND).await?;
        // A quorum's refresh answers once a majority extended: a majority
        // now, every node soon.
        let pttls = servers.iter().map(pttl).collect::<Result<Vec<_>, _>>()?;
        let extended = pttls.iter().filter(|p| **p > 1000).count();
        assert!(
            extended > servers.len() / 2,
            "{kind:?}: fence PTTLs after a refresh {pttls:?}"
        );
        let deadline = tokio::time::Instant::now() + HUNG;
        for server in &servers {
            while pttl(server)? <= 1000 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{kind:?}: a node's fence key was not extended: {pttls:?}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        lease.release().await?;
    }
    Ok(())
}

/// The server's clock in microseconds (`TIME`).
fn server_micros(server: &RedisServer) -> Result<u64, Box<dyn std::error::Error>> {
    let time = server.redis_cli(&["TIME"])?;
    let (secs, micros) = time.split_once('\n').ok_or("TIME without two parts")?;
    Ok(secs.parse::<u64>()? * 1_000_000 + micros.parse::<u64>()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_at_least_the_servers_clock_and_fit_lua_and_bigint() -> TestResult {
    let keys = FencedKeys::for_resource("wallet:clock")?;
    let bad_counters: [&[&str]; 3] = [
        &["SET", keys.fence(), "9007199254740992"],
        &["SET", keys.fence(), "abc"],
        &["HSET", keys.fence(), "counter", "1"],
    ];
    for kind in KINDS {
        let servers = servers_for(kind)?;
        let way = Way::open(kind, &servers, DEFAULT_FENCE_TTL).await?;
        let clock = server_micros(&servers[0])?;
        let fence = way.take_and_release(&keys).await?;
        assert!(
            fence >= clock && fence <= FencingToken::MAX.get(),
            "{kind:?}: token {fence}, clock {clock}"
        );
        for bad in bad_counters {
            for server in &servers {
                server.redis_cli(&["DEL", keys.fence()])?;
                server.redis_cli(bad)?;
            }
            let once = AcquireOptions::new().retry(RetryStrategy::none());
            let err = way.acquire_with(&keys, 10 * SECOND, &once).await.err();
            assert!(
                matches!(err, Some(Error::InvalidFence { .. })),
                "{kind:?}, {bad:?}: {err:?}"
            );
            for server in &servers {
                assert_eq!(
                    server.redis_cli(&["EXISTS", keys.lock()])?,
                    "0",
                    "{kind:?}, {bad:?}: a lock without a token"
                );
            }
        }
    }
    Ok(())
}
