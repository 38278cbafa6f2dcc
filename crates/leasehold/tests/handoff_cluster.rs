//! Hand-off on a real local Redis Cluster (three masters): waiters reached
//! over sharded pub/sub on the node that owns the lock key, whichever node
//! their lockers were seeded with, through a slot migration and a killed
//! subscription.
#![cfg(all(feature = "cluster", feature = "handoff"))]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use leasehold::{AcquireOptions, Error, HandoffLocker, Lease, Lessor, Locker};
use leasehold_testkit::{Failover, RedisCluster};
use redis::AsyncCommands;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use tokio::task::JoinHandle;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Long enough that a waiter left to its fallback re-check (once per TTL)
/// would wait far past [`HUNG`]: only a hand-off serves it in time.
const TTL: Duration = Duration::from_secs(60);
/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(20);

/// A RESP3 cluster client seeded with `url` only.
fn client(url: &str) -> Result<ClusterClient, redis::RedisError> {
    ClusterClient::builder(vec![url.to_owned()])
        .use_protocol(redis::ProtocolVersion::RESP3)
        .build()
}

/// A hand-off locker (another "process"), relay off so that every waiter
/// queues in Redis, over a cluster client seeded with `url`.
async fn handoff(
    url: &str,
) -> Result<HandoffLocker<ClusterConnection>, Box<dyn std::error::Error>> {
    handoff_with(url, leasehold::DEFAULT_COMMAND_TIMEOUT).await
}

/// [`handoff`] with its own command timeout.
async fn handoff_with(
    url: &str,
    command_timeout: Duration,
) -> Result<HandoffLocker<ClusterConnection>, Box<dyn std::error::Error>> {
    let client = client(url)?;
    let locker = Locker::builder()
        .command_timeout(command_timeout)
        .build(client.get_async_connection().await?)?;
    Ok(HandoffLocker::builder()
        .relay_limit(0)
        .build(locker, &client)
        .await?)
}

/// Waits until `key`'s wait queue holds at least `n` waiters.
async fn until_queued(conn: &mut ClusterConnection, key: &str, n: usize) -> TestResult {
    let queue = format!("{key}:waitq");
    tokio::time::timeout(HUNG, async {
        loop {
            let len: usize = conn.zcard(&queue).await?;
            if len >= n {
                return Ok::<_, redis::RedisError>(());
            }
            tokio::task::yield_now().await;
        }
    })
    .await??;
    Ok(())
}

/// How many times `node` ran `cmd`.
fn calls(
    node: &leasehold_testkit::RedisServer,
    cmd: &str,
) -> Result<u64, Box<dyn std::error::Error>> {
    let info = node.redis_cli(&["INFO", "commandstats"])?;
    let prefix = format!("cmdstat_{cmd}:calls=");
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0))
}

/// Which of the cluster's masters owns `key`'s slot.
fn owner(cluster: &RedisCluster, key: &str) -> Result<usize, Box<dyn std::error::Error>> {
    Ok(cluster.owner_of(cluster.slot_of(key)?)?)
}

/// Spawns waiter `i` on `locker`: it takes the lease, records its turn,
/// checks nobody else holds it, and releases it.
fn waiter(
    locker: &HandoffLocker<ClusterConnection>,
    key: &'static str,
    i: usize,
    order: &Arc<std::sync::Mutex<Vec<usize>>>,
    holders: &Arc<AtomicU32>,
) -> JoinHandle<Result<(), Error>> {
    let (locker, order, holders) = (locker.clone(), order.clone(), holders.clone());
    tokio::spawn(async move {
        let opts = AcquireOptions::new().wait(HUNG);
        let lease = locker.acquire_with(key, TTL, &opts).await?;
        let before = holders.fetch_add(1, Ordering::SeqCst);
        order
            .lock()
            .map_err(|_| Error::InvalidOptions("poisoned"))?
            .push(i);
        tokio::task::yield_now().await;
        holders.fetch_sub(1, Ordering::SeqCst);
        if before != 0 {
            return Err(Error::InvalidOptions("two holders at once"));
        }
        lease.release().await
    })
}

/// Awaits every waiter and checks they were served in arrival order.
async fn served_in_order(
    tasks: Vec<JoinHandle<Result<(), Error>>>,
    order: &std::sync::Mutex<Vec<usize>>,
) -> TestResult {
    let n = tasks.len();
    for task in tasks {
        tokio::time::timeout(HUNG, task).await???;
    }
    let want: Vec<usize> = (0..n).collect();
    assert_eq!(*order.lock().map_err(|_| "poisoned")?, want);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_seeded_with_different_nodes_are_served_in_order_over_sharded_pubsub() -> TestResult
{
    let cluster = RedisCluster::start(3)?;
    let urls = cluster.urls();
    let key = "lock:{handoff:fifo}";
    let home = owner(&cluster, key)?;
    // One locker per node: two of them were seeded with a node that does
    // not own the key (the case classic PUBLISH got wrong: a release found
    // no subscriber on the key's node and dropped the waiter).
    let mut lockers = Vec::new();
    for url in &urls {
        lockers.push(handoff(url).await?);
    }
    let mut conn = client(&urls[0])?.get_async_connection().await?;
    let holder = lockers[home]
        .acquire_with(key, TTL, &AcquireOptions::new())
        .await?;
    let published = calls(&cluster.nodes()[home], "spublish")?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let holders = Arc::new(AtomicU32::new(0));
    let n = 9;
    let mut tasks = Vec::new();
    for i in 0..n {
        tasks.push(waiter(&lockers[i % 3], key, i, &order, &holders));
        until_queued(&mut conn, key, i + 1).await?;
    }
    holder.release().await?;
    served_in_order(tasks, &order).await?;
    // Every waiter after the first was told by the previous one's release,
    // a different locker each time: one SPUBLISH each, on the key's node
    // (the holder's release to waiter 0, of locker 0, too unless the holder
    // is locker 0 itself).
    let publishes = calls(&cluster.nodes()[home], "spublish")? - published;
    let want = n as u64 - u64::from(home == 0);
    assert_eq!(publishes, want, "one SPUBLISH per cross-locker hand-off");
    let left: bool = conn.exists(key).await?;
    assert!(!left, "the last release left the lock behind");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_waiters_are_served_in_order_after_their_slot_moves_to_another_node() -> TestResult {
    let cluster = RedisCluster::start(3)?;
    let urls = cluster.urls();
    let key = "lock:{handoff:moving}";
    let slot = cluster.slot_of(key)?;
    let from = owner(&cluster, key)?;
    let to = (from + 1) % 3;
    let lockers = [handoff(&urls[0]).await?, handoff(&urls[1]).await?];
    let mut conn = client(&urls[2])?.get_async_connection().await?;
    let holder: Lease = lockers[0]
        .acquire_with(key, TTL, &AcquireOptions::new())
        .await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let holders = Arc::new(AtomicU32::new(0));
    let n = 4;
    let mut tasks = Vec::new();
    for i in 0..n {
        tasks.push(waiter(&lockers[(i + 1) % 2], key, i, &order, &holders));
        until_queued(&mut conn, key, i + 1).await?;
    }
    // The slot (the lock, its queue and the waiters' shard channels) moves
    // mid-queue: the source drops the subscriptions (`sunsubscribe`), the
    // lockers subscribe again on the target, the queue moves with the keys.
    cluster.begin_slot_migration(slot, from, to)?;
    cluster.finish_slot_migration(slot, from, to)?;
    assert_eq!(owner(&cluster, key)?, to);
    let channels = || -> Result<usize, Box<dyn std::error::Error>> {
        let listed = cluster.nodes()[to].redis_cli(&[
            "PUBSUB",
            "SHARDCHANNELS",
            "leasehold:handoff:{handoff:moving}:*",
        ])?;
        Ok(listed
            .lines()
            .filter(|l| !l.trim().is_empty() && l.trim() != "(empty array)")
            .count())
    };
    // Both waiting lockers listen on the target before the release (their
    // channels are the test's signal: no sleep).
    tokio::time::timeout(HUNG, async {
        while channels()? < 2 {
            tokio::task::yield_now().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await
    .map_err(|_| "the lockers never subscribed on the slot's new owner")??;
    let published = calls(&cluster.nodes()[to], "spublish")?;
    holder.release().await?;
    served_in_order(tasks, &order).await?;
    assert!(
        calls(&cluster.nodes()[to], "spublish")? > published,
        "the hand-offs went over the new owner's shard channels"
    );
    let left: bool = conn.exists(key).await?;
    assert!(!left, "the last release left the lock behind");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_served_after_its_subscription_is_killed() -> TestResult {
    let cluster = RedisCluster::start(3)?;
    let urls = cluster.urls();
    let key = "lock:{handoff:killed}";
    let home = owner(&cluster, key)?;
    let (a, b) = (handoff(&urls[0]).await?, handoff(&urls[1]).await?);
    let mut conn = client(&urls[2])?.get_async_connection().await?;
    for round in 0..2 {
        let (holding, waiting) = if round == 0 { (&b, &a) } else { (&a, &b) };
        let holder = holding
            .acquire_with(key, TTL, &AcquireOptions::new())
            .await?;
        let task = {
            let waiting = waiting.clone();
            tokio::spawn(async move {
                let opts = AcquireOptions::new().wait(HUNG);
                waiting.acquire_with(key, TTL, &opts).await
            })
        };
        until_queued(&mut conn, key, 1).await?;
        if round == 0 {
            // Every subscription on the key's node dropped: the waiter's
            // locker reconnects and subscribes again, then re-checks.
            let killed = cluster.nodes()[home].redis_cli(&["CLIENT", "KILL", "TYPE", "pubsub"])?;
            assert_ne!(killed.trim(), "0", "no subscription was killed");
        }
        holder.release().await?;
        let lease = tokio::time::timeout(HUNG, task).await???;
        let stored: String = conn.get(key).await?;
        assert_eq!(stored, lease.token().as_str());
        // Round 1: the resubscribed channels carry hand-offs again.
        lease.release().await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_resp2_cluster_client_is_refused_with_a_typed_error() -> TestResult {
    let cluster = RedisCluster::start(3)?;
    let client = ClusterClient::new(cluster.urls())?;
    let locker = Locker::builder().build(client.get_async_connection().await?)?;
    let err = HandoffLocker::builder().build(locker, &client).await.err();
    assert!(matches!(err, Some(Error::InvalidOptions(_))), "{err:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_served_from_the_new_primary_after_a_failover() -> TestResult {
    let cluster = RedisCluster::start_with_replicas(3)?;
    let urls = cluster.urls();
    let key = "lock:{handoff:failover}";
    let index = owner(&cluster, key)?;
    // B's release is the first command its cluster client sends after the
    // failover: it learns the new topology on that command, which can take
    // more than the default 1 s on a loaded machine (CI saw a release time
    // out). The subject here is the waiter, so B is given room for that.
    let (a, b) = (
        handoff(&urls[0]).await?,
        handoff_with(&urls[1], HUNG).await?,
    );
    // A's shard channel for the key, from its base channel.
    let debug = format!("{a:?}");
    let id = debug
        .split("channel: \"leasehold:handoff:")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .ok_or("no channel in the locker's Debug")?;
    let channel = format!("leasehold:handoff:{{handoff:failover}}:{id}");
    let mut conn = client(&urls[2])?.get_async_connection().await?;
    let holder = b.acquire_with(key, TTL, &AcquireOptions::new()).await?;
    let task = {
        let a = a.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            a.acquire_with(key, TTL, &opts).await
        })
    };
    until_queued(&mut conn, key, 1).await?;
    // Coordinated: nothing written is lost. The demoted primary drops the
    // subscription; A must subscribe again on the promoted replica, not on
    // the demoted node (a replica would take it, and releases on the new
    // primary would skip A's waiter as unreachable).
    let promoted = cluster.failover(index, Failover::Coordinated)?;
    let primary = cluster
        .nodes()
        .iter()
        .chain(cluster.replicas())
        .find(|node| node.port() == promoted)
        .ok_or("no promoted node")?;
    tokio::time::timeout(HUNG, async {
        loop {
            let listed = primary.redis_cli(&["PUBSUB", "SHARDNUMSUB", &channel])?;
            if listed.lines().nth(1).map(str::trim) == Some("1") {
                return Ok::<_, Box<dyn std::error::Error>>(());
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .map_err(|_| "the waiter's locker never subscribed on the new primary")??;
    holder.release().await?;
    let lease = tokio::time::timeout(HUNG, task).await???;
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, lease.token().as_str());
    lease.release().await?;
    Ok(())
}
