//! The invariants, table-driven over every way of taking a lease: polling,
//! hand-off (Grant and Wake, relay off), relay, and a quorum. Each "process"
//! is its own locker with its own connections.
#![cfg(all(feature = "handoff", feature = "quorum"))]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use leasehold::{
    AcquireOptions, Error, FencedKeys, FencingToken, HandoffLocker, HandoffStyle, Lease, Locker,
    Quorum,
};
use leasehold_testkit::RedisServer;
use redis::AsyncCommands;

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

/// One "process" taking leases one way.
#[derive(Clone)]
enum Way {
    Polling(Locker),
    Handoff(HandoffLocker),
    Quorum(Quorum),
}

impl Way {
    async fn open(kind: Kind, servers: &[RedisServer]) -> Result<Way, Box<dyn std::error::Error>> {
        let client = redis::Client::open(servers[0].url())?;
        Ok(match kind {
            Kind::Polling => Way::Polling(Locker::connect(&client).await?),
            Kind::Handoff | Kind::Wake | Kind::Relay => {
                let (style, limit) = match kind {
                    Kind::Wake => (HandoffStyle::Wake, 0),
                    Kind::Relay => (HandoffStyle::Grant, 16),
                    _ => (HandoffStyle::Grant, 0),
                };
                let handoff = HandoffLocker::builder()
                    .style(style)
                    .relay_limit(limit)
                    .connect(&client)
                    .await?;
                Way::Handoff(handoff)
            }
            Kind::Quorum => {
                let clients = servers
                    .iter()
                    .map(|s| redis::Client::open(s.url()))
                    .collect::<Result<Vec<_>, _>>()?;
                Way::Quorum(Quorum::connect(clients).await?)
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

    async fn acquire_all(
        &self,
        keys: &[&FencedKeys],
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease, Error> {
        let keys = keys.iter().copied();
        match self {
            Way::Polling(l) => l.acquire_all(keys, ttl, opts).await,
            Way::Handoff(h) => h.acquire_all(keys, ttl, opts).await,
            Way::Quorum(q) => q.acquire_all(keys, ttl, opts).await,
        }
    }

    async fn with_lock(&self, keys: &FencedKeys) -> Result<Option<FencingToken>, Error> {
        let opts = AcquireOptions::new().wait(HUNG);
        let work = async |lease: &Lease| lease.fence();
        let done = match self {
            Way::Polling(l) => l.with_lock(keys, 10 * SECOND, &opts, work).await,
            Way::Handoff(h) => h.with_lock(keys, 10 * SECOND, &opts, work).await,
            Way::Quorum(q) => q.with_lock(keys, 10 * SECOND, &opts, work).await,
        }?;
        done.release?;
        Ok(done.output)
    }
}

fn servers_for(kind: Kind) -> Result<Vec<RedisServer>, Box<dyn std::error::Error>> {
    Ok(match kind {
        Kind::Quorum => RedisServer::start_many(3)?,
        _ => vec![RedisServer::start()?],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fenced_holder_gets_its_own_strictly_greater_token_every_way() -> TestResult {
    for kind in KINDS {
        let servers = servers_for(kind)?;
        let ways = [
            Way::open(kind, &servers).await?,
            Way::open(kind, &servers).await?,
        ];
        let keys = FencedKeys::for_resource("wallet:fences")?;
        let holders = Arc::new(AtomicU32::new(0));
        let fences = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for caller in 0..16 {
            let way = ways[caller % 2].clone();
            let (keys, holders, fences) = (keys.clone(), holders.clone(), fences.clone());
            tasks.push(tokio::spawn(async move {
                let opts = AcquireOptions::new().wait(HUNG);
                let lease = way.acquire_with(&keys, 10 * SECOND, &opts).await?;
                if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                    return Err(Error::InvalidOptions("two holders at once"));
                }
                let fence = lease.fence();
                fences
                    .lock()
                    .map_err(|_| Error::InvalidOptions("poisoned"))?
                    .push(fence);
                tokio::task::yield_now().await;
                holders.fetch_sub(1, Ordering::SeqCst);
                lease.release().await
            }));
        }
        for task in tasks {
            tokio::time::timeout(HUNG, task).await???;
        }
        let fences = fences.lock().map_err(|_| "poisoned")?.clone();
        assert_eq!(fences.len(), 16, "{kind:?}");
        let fences: Vec<u64> = fences
            .into_iter()
            .map(|f| {
                f.map(FencingToken::get)
                    .ok_or("a fenced lease without a fence")
            })
            .collect::<Result<_, _>>()?;
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "{kind:?}: fences not strictly increasing in holding order: {fences:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_in_opposite_directions_never_deadlock_every_way() -> TestResult {
    for kind in KINDS {
        let servers = servers_for(kind)?;
        let ways = [
            Way::open(kind, &servers).await?,
            Way::open(kind, &servers).await?,
        ];
        let a = FencedKeys::for_resource("wallet:a")?;
        let b = FencedKeys::for_resource("wallet:b")?;
        let mut tasks = Vec::new();
        for (i, way) in ways.into_iter().enumerate() {
            let (a, b) = (a.clone(), b.clone());
            tasks.push(tokio::spawn(async move {
                let order = if i == 0 { [&a, &b] } else { [&b, &a] };
                // Short deadline per transfer: a deadlock would show as a
                // NotAcquired, not as a hang.
                let opts = AcquireOptions::new().wait(10 * SECOND);
                for _ in 0..10 {
                    let lease = way.acquire_all(&order, 10 * SECOND, &opts).await?;
                    let keys: Vec<&str> = lease.keys().collect();
                    if keys != [a.lock(), b.lock()] {
                        return Err(Error::InvalidOptions("keys not in the global order"));
                    }
                    if lease.fence_for(a.lock()).is_none() || lease.fence_for(b.lock()).is_none() {
                        return Err(Error::InvalidOptions("a fenced key without its fence"));
                    }
                    tokio::task::yield_now().await;
                    lease.release().await?;
                }
                Ok::<_, Error>(())
            }));
        }
        for task in tasks {
            let outcome = tokio::time::timeout(HUNG, task).await??;
            assert!(outcome.is_ok(), "{kind:?}: {outcome:?}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_runs_the_work_while_held_and_releases_every_way() -> TestResult {
    for kind in KINDS {
        let servers = servers_for(kind)?;
        let way = Way::open(kind, &servers).await?;
        let keys = FencedKeys::for_resource("wallet:scoped")?;
        let fence = way.with_lock(&keys).await?;
        assert!(fence.is_some(), "{kind:?}");
        // A quorum's release answers once a majority deleted its key (the
        // rest finish in the background): a majority must be clear now,
        // and every node soon.
        let mut holding = Vec::new();
        for server in &servers {
            let client = redis::Client::open(server.url())?;
            let mut conn = leasehold_testkit::connection(&client, SECOND).await?;
            let left: bool = conn.exists(keys.lock()).await?;
            holding.push((conn, left));
        }
        let left = holding.iter().filter(|(_, left)| *left).count();
        assert!(
            left < servers.len().div_ceil(2),
            "{kind:?}: with_lock left the lock behind on {left} of {} nodes",
            servers.len()
        );
        tokio::time::timeout(HUNG, async {
            for (conn, _) in &mut holding {
                while conn.exists::<_, bool>(keys.lock()).await? {
                    tokio::task::yield_now().await;
                }
            }
            Ok::<_, redis::RedisError>(())
        })
        .await??;
        let again = way.with_lock(&keys).await?;
        assert!(again > fence, "{kind:?}: {again:?} after {fence:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_fence_counter_heals_with_one_raise_every_way() -> TestResult {
    for kind in KINDS {
        let servers = servers_for(kind)?;
        let way = Way::open(kind, &servers).await?;
        let keys = FencedKeys::for_resource("wallet:heal")?;
        let opts = AcquireOptions::new().wait(HUNG);
        // The storage has seen a fence above the servers' clocks (issued by
        // a counter that ran ahead of them, since lost).
        let stored = FencingToken::new(FencingToken::MAX.get() - 1_000_000);
        let lease = way.acquire_with(&keys, 10 * SECOND, &opts).await?;
        let low = lease.fence().ok_or("no fence")?;
        assert!(low < stored, "{kind:?}: {low}");
        lease.raise_fence(stored).await?;
        // Raising never lowers.
        lease.raise_fence(FencingToken::new(3)).await?;
        lease.release().await?;
        let lease = way.acquire_with(&keys, 10 * SECOND, &opts).await?;
        let next = lease.fence().ok_or("no fence")?;
        assert!(next > stored, "{kind:?}: {next} after raising to {stored}");
        lease.release().await?;
        // A plain lock has no counter to raise.
        let plain = match &way {
            Way::Polling(l) => l.acquire("wallet:heal:plain", 10 * SECOND).await?,
            Way::Handoff(h) => h.acquire("wallet:heal:plain", 10 * SECOND).await?,
            Way::Quorum(q) => q.acquire("wallet:heal:plain", 10 * SECOND).await?,
        };
        let err = plain.raise_fence(stored).await.err();
        assert!(
            matches!(err, Some(Error::InvalidKey { .. })),
            "{kind:?}: {err:?}"
        );
        plain.release().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_counters_expire_after_their_last_use_every_way() -> TestResult {
    for kind in KINDS {
        let servers = servers_for(kind)?;
        let way = Way::open(kind, &servers).await?;
        let keys = FencedKeys::for_resource("wallet:expiry")?;
        let lease = way
            .acquire_with(&keys, 10 * SECOND, &AcquireOptions::new())
            .await?;
        lease.release().await?;
        let default = i64::try_from(leasehold::DEFAULT_FENCE_TTL.as_millis())?;
        let expiring = |pttl: i64| pttl > 0 && pttl <= default;
        // A quorum's acquire answers once a majority voted (the rest land
        // in the background): a majority's counters must expire now, and
        // every node's soon.
        let mut nodes = Vec::new();
        for server in &servers {
            let client = redis::Client::open(server.url())?;
            let mut conn = leasehold_testkit::connection(&client, SECOND).await?;
            let pttl: i64 = conn.pttl(keys.fence()).await?;
            nodes.push((conn, pttl));
        }
        let now = nodes.iter().filter(|(_, pttl)| expiring(*pttl)).count();
        assert!(
            now > servers.len() / 2,
            "{kind:?}: PTTLs {:?}",
            nodes.iter().map(|(_, pttl)| *pttl).collect::<Vec<_>>()
        );
        tokio::time::timeout(HUNG, async {
            for (conn, pttl) in &mut nodes {
                while *pttl == -2 {
                    *pttl = conn.pttl(keys.fence()).await?;
                    tokio::task::yield_now().await;
                }
            }
            Ok::<_, redis::RedisError>(())
        })
        .await??;
        for (_, pttl) in &nodes {
            assert!(expiring(*pttl), "{kind:?}: PTTL {pttl}");
        }
    }
    // Kept forever when asked.
    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let locker = Locker::builder().fence_ttl(None).connect(&client).await?;
    let keys = FencedKeys::for_resource("wallet:forever")?;
    locker.acquire(&keys, SECOND).await?.release().await?;
    assert_eq!(server.redis_cli(&["PTTL", keys.fence()])?, "-1");
    let zero = Locker::builder()
        .fence_ttl(Some(Duration::ZERO))
        .connect(&client)
        .await
        .err();
    assert!(matches!(zero, Some(Error::InvalidOptions(_))), "{zero:?}");
    Ok(())
}
