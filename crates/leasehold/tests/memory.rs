//! A full server (`maxmemory` reached, `noeviction`) is a fault to ride
//! out, not a refusal: an acquire that meets `OOM` retries within its wait
//! and wins once memory frees, or says `OutOfMemory` when the wait runs
//! out; a release gives the lock back even on a full server, every way.
#![cfg(all(feature = "handoff", feature = "quorum"))]

use leasehold::Lessor;
use std::time::Duration;

use leasehold::{AcquireOptions, Error, FencedKeys, HandoffLocker, Lease, Locker, Quorum};
use leasehold_testkit::RedisServer;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(30);
/// Longer than `HUNG`: a lock given back by its TTL, not its release, fails.
const TTL: Duration = Duration::from_secs(120);
/// Each quorum node's vote timeout here.
const NODE_TIMEOUT: Duration = Duration::from_secs(1);
/// The wait of an acquire meant to run out on a full server: room for
/// more than one attempt, so a loaded machine that holds up the first
/// answers (connecting, loading the scripts) does not decide the verdict;
/// an attempt the deadline cuts short adds nothing to an earlier refusal.
const FULL_WAIT: Duration = Duration::from_secs(4);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Polling,
    Handoff,
    /// Hand-off, the holder and the waiter in one process: the lock passes
    /// between them by the relay.
    Relay,
    Quorum,
}

const KINDS: [Kind; 4] = [Kind::Polling, Kind::Handoff, Kind::Relay, Kind::Quorum];

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
            Kind::Handoff => Way::Handoff(HandoffLocker::builder().connect(&client).await?),
            Kind::Relay => Way::Handoff(
                HandoffLocker::builder()
                    .relay_limit(16)
                    .connect(&client)
                    .await?,
            ),
            Kind::Quorum => {
                let clients = servers
                    .iter()
                    .map(|s| redis::Client::open(s.url()))
                    .collect::<Result<Vec<_>, _>>()?;
                // A vote may take far longer than the default 50 ms on a
                // loaded 2-core machine (a fresh clone's CI run saw
                // `QuorumNotReached { got: 0, failed_nodes: 3 }` here, the
                // votes slower than the node timeout): these tests are about
                // what a full server answers, not how fast.
                Way::Quorum(
                    Quorum::builder()
                        .node_timeout(NODE_TIMEOUT)
                        .connect(clients)
                        .await?,
                )
            }
        })
    }

    async fn take(&self, keys: &FencedKeys, wait: Duration) -> Result<Lease, Error> {
        let opts = AcquireOptions::new().wait(wait);
        match self {
            Way::Polling(l) => l.acquire_with(keys, TTL, &opts).await,
            Way::Handoff(h) => h.acquire_with(keys, TTL, &opts).await,
            Way::Quorum(q) => q.acquire_with(keys, TTL, &opts).await,
        }
    }
}

fn servers(kind: Kind) -> Result<Vec<RedisServer>, leasehold_testkit::Error> {
    match kind {
        Kind::Quorum => RedisServer::start_many(3),
        _ => Ok(vec![RedisServer::start()?]),
    }
}

/// Fills every server: no write that needs memory is accepted.
fn fill(servers: &[RedisServer]) -> TestResult {
    for server in servers {
        server.command(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])?;
        server.command(&["CONFIG", "SET", "maxmemory", "1"])?;
    }
    Ok(())
}

/// Frees every server.
fn free(servers: &[RedisServer]) -> TestResult {
    for server in servers {
        server.command(&["CONFIG", "SET", "maxmemory", "0"])?;
    }
    Ok(())
}

/// How many commands `server` refused for memory (`INFO errorstats`).
fn refused_for_memory(server: &RedisServer) -> Result<u64, Box<dyn std::error::Error>> {
    let info = server.redis_cli(&["INFO", "errorstats"])?;
    Ok(info
        .lines()
        .find_map(|line| line.trim().strip_prefix("errorstat_OOM:count="))
        .map(str::parse)
        .transpose()?
        .unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_on_a_full_server_wins_once_memory_frees_every_way() -> TestResult {
    for kind in KINDS {
        let servers = servers(kind)?;
        let way = Way::open(kind, &servers).await?;
        let keys = FencedKeys::for_resource("memory:wins")?;
        fill(&servers)?;
        let waiting = async { way.take(&keys, HUNG).await };
        let freeing = async {
            // Once the acquire has met the full server, memory frees.
            while refused_for_memory(&servers[0])? == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            free(&servers)
        };
        let (lease, freed) =
            tokio::time::timeout(HUNG, async { tokio::join!(waiting, freeing) }).await?;
        freed?;
        let lease = lease.map_err(|err| format!("{kind:?}: {err:?}"))?;
        assert!(lease.fence().is_some(), "{kind:?}");
        lease.release().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_runs_out_of_wait_on_a_full_server_says_so_every_way() -> TestResult {
    for kind in KINDS {
        let servers = servers(kind)?;
        let way = Way::open(kind, &servers).await?;
        let keys = FencedKeys::for_resource("memory:full")?;
        fill(&servers)?;
        let err = way.take(&keys, FULL_WAIT).await.err();
        assert!(
            matches!(&err, Some(Error::OutOfMemory { .. })),
            "{kind:?}: {err:?}"
        );
        let err = err.ok_or("no error")?;
        assert!(err.is_retryable(), "{kind:?}");
        // Said once: in our message, not again from the server.
        let text = format!("{err}");
        assert!(text.contains("out of memory"), "{kind:?}: {text}");
        assert!(!text.contains("OOM"), "{kind:?}: {text}");
        // And the whole chain says the server's words once.
        let mut chain = text.clone();
        let mut source = std::error::Error::source(&err);
        while let Some(inner) = source {
            chain.push_str(&format!(": {inner}"));
            source = inner.source();
        }
        assert_eq!(
            chain.matches("command not allowed").count(),
            1,
            "{kind:?}: {chain}"
        );
        free(&servers)?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_release_gives_the_lock_back_on_a_full_server_every_way() -> TestResult {
    for kind in KINDS {
        let servers = servers(kind)?;
        let a = Way::open(kind, &servers).await?;
        let b = match kind {
            Kind::Relay => a.clone(),
            _ => Way::open(kind, &servers).await?,
        };
        let keys = FencedKeys::for_resource("memory:release")?;
        let lease = a.take(&keys, HUNG).await?;
        // Another holder waits (for hand-off: queued in Redis, to be
        // granted the lock on release).
        let waiting = tokio::spawn({
            // A waiter of the same process queues in process.
            let keys = keys.clone();
            async move { b.take(&keys, HUNG).await.map(|lease| lease.fence()) }
        });
        match (kind, &a) {
            (Kind::Handoff, _) => {
                while servers[0].redis_cli(&["ZCARD", &format!("{}:waitq", keys.lock())])? != "1" {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            (Kind::Relay, Way::Handoff(h)) => {
                while h.queued_in_process(keys.lock()) != 1 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            _ => {}
        }
        fill(&servers)?;
        let released = lease.release().await;
        assert!(released.is_ok(), "{kind:?}: {released:?}");
        free(&servers)?;
        let next = tokio::time::timeout(HUNG, waiting).await??;
        assert!(
            matches!(next, Ok(Some(_))),
            "{kind:?}: the waiter got {next:?}"
        );
    }
    Ok(())
}
