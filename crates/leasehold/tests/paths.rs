//! The invariants, table-driven over every way of taking a lease: polling,
//! hand-off (Grant and Wake, relay off), relay, and a quorum. Each "process"
//! is its own locker with its own connections.
#![cfg(all(feature = "handoff", feature = "quorum"))]

use leasehold::Lessor;
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

/// How a token-checked step reached a server: its own command, or one of
/// the Lua scripts (`EVALSHA`, or `EVAL` when the cache was empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Set,
    Delex,
    Delifeq,
    Script,
}

/// What refresh and release are sent as on the server `info` (`INFO
/// server`) describes, from the servers' docs (and, for Valkey 8.1 and
/// Redis 7, a try on them): `None` for a server not in the table.
fn sent_on(info: &str) -> Option<(Sent, Sent)> {
    let version = |name: &str| -> Option<(u32, u32)> {
        let value = info.lines().find_map(|l| l.trim().strip_prefix(name))?;
        let mut parts = value.split('.');
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    match (version("valkey_version:"), version("redis_version:")) {
        (Some(v), _) if v >= (9, 0) => Some((Sent::Set, Sent::Delifeq)),
        (Some(v), _) if v >= (8, 1) => Some((Sent::Set, Sent::Script)),
        (Some(_), _) => Some((Sent::Script, Sent::Script)),
        (None, Some(v)) if v >= (8, 4) => Some((Sent::Set, Sent::Delex)),
        (None, Some(_)) => Some((Sent::Script, Sent::Script)),
        (None, None) => None,
    }
}

/// Each server's count of the commands a token-checked step can be sent
/// as (`INFO commandstats`).
async fn sent_counts(
    conns: &mut [redis::aio::ConnectionManager],
) -> Result<Vec<[u64; 4]>, Box<dyn std::error::Error>> {
    let mut counts = Vec::new();
    for conn in conns {
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await?;
        let calls = |command: &str| -> u64 {
            stats
                .lines()
                .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
                .and_then(|rest| rest.split(',').next()?.parse().ok())
                .unwrap_or(0)
        };
        counts.push([
            calls("set"),
            calls("delex"),
            calls("delifeq"),
            calls("evalsha") + calls("eval"),
        ]);
    }
    Ok(counts)
}

/// Asserts that between `before` and `after` every server saw the step
/// only as `sent` (a command once).
fn assert_sent(what: &str, sent: Sent, before: &[[u64; 4]], after: &[[u64; 4]]) {
    let column = [Sent::Set, Sent::Delex, Sent::Delifeq, Sent::Script];
    for (node, (b, a)) in before.iter().zip(after).enumerate() {
        for (i, as_) in column.iter().enumerate() {
            let delta = a[i] - b[i];
            if *as_ == sent && sent == Sent::Script {
                // EVALSHA, then EVAL of it when the cache is empty; and a
                // quorum's fence step may land on a minority late.
                assert!(delta >= 1, "{what}, node {node}: no script");
            } else if *as_ == sent {
                assert_eq!(delta, 1, "{what}, node {node}: {as_:?}");
            } else {
                assert_eq!(delta, 0, "{what}, node {node}: {as_:?}, expected {sent:?}");
            }
        }
    }
}

/// Refresh and release take the server's own commands where it has them
/// (detected from `INFO server`), each step on its own: on Valkey 8.1 a
/// refresh is `SET ... IFEQ` and a release the script; on Redis 7 both
/// are scripts. A fenced refresh is the script everywhere (it keeps the
/// counter alive), and a hand-off release is its own script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_step_is_sent_as_the_servers_command_or_the_script_every_way() -> TestResult {
    for kind in KINDS {
        let servers = servers_for(kind)?;
        let info = servers[0].redis_cli(&["INFO", "server"])?;
        let Some((refresh_as, release_as)) = sent_on(&info) else {
            eprintln!("no expectation for this server; skipped:\n{info}");
            return Ok(());
        };
        let release_as = match kind {
            Kind::Handoff | Kind::Wake | Kind::Relay => Sent::Script,
            Kind::Polling | Kind::Quorum => release_as,
        };
        let mut conns = Vec::new();
        for server in &servers {
            let client = redis::Client::open(server.url())?;
            conns.push(leasehold_testkit::connection(&client, SECOND).await?);
        }
        let way = Way::open(kind, &servers).await?;
        let fenced = FencedKeys::for_resource("wallet:sent")?;
        for plain in [true, false] {
            let key = if plain {
                "wallet:sent:plain"
            } else {
                fenced.lock()
            };
            let lease = if plain {
                match &way {
                    Way::Polling(l) => l.acquire(key, 10 * SECOND).await?,
                    Way::Handoff(h) => h.acquire(key, 10 * SECOND).await?,
                    Way::Quorum(q) => q.acquire(key, 10 * SECOND).await?,
                }
            } else {
                way.acquire_with(&fenced, 10 * SECOND, &AcquireOptions::new())
                    .await?
            };
            // A quorum answers once a majority did: wait for every node
            // (and for the acquire's stragglers) before counting.
            let settled = async |conns: &mut Vec<redis::aio::ConnectionManager>,
                                 done: &dyn Fn(i64) -> bool| {
                tokio::time::timeout(HUNG, async {
                    for conn in conns.iter_mut() {
                        while !done(conn.pttl::<_, i64>(key).await?) {
                            tokio::task::yield_now().await;
                        }
                    }
                    Ok::<_, redis::RedisError>(())
                })
                .await
            };
            settled(&mut conns, &|pttl| pttl > 0).await??;
            let before = sent_counts(&mut conns).await?;
            lease.refresh(60 * SECOND).await?;
            settled(&mut conns, &|pttl| pttl > 10_000).await??;
            let after = sent_counts(&mut conns).await?;
            let what = format!("{kind:?} refresh, plain {plain}");
            let expected = if plain { refresh_as } else { Sent::Script };
            assert_sent(&what, expected, &before, &after);

            lease.release().await?;
            settled(&mut conns, &|pttl| pttl == -2).await??;
            let last = sent_counts(&mut conns).await?;
            let what = format!("{kind:?} release, plain {plain}");
            assert_sent(&what, release_as, &after, &last);
        }
    }
    Ok(())
}
