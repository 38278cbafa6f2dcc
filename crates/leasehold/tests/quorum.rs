//! Redlock over three independent throwaway servers.
#![cfg(feature = "quorum")]

use leasehold::Lessor;
use std::time::Duration;

use leasehold::{AcquireOptions, CancellationToken, Error, FencedKeys, Quorum, RetryStrategy};
use leasehold_testkit::RedisServer;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TTL: Duration = Duration::from_secs(30);
/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(10);

async fn quorum_over(servers: &[RedisServer]) -> Result<Quorum, Box<dyn std::error::Error>> {
    let clients = servers
        .iter()
        .map(|s| redis::Client::open(s.url()))
        .collect::<Result<Vec<_>, _>>()?;
    // A vote may take far longer than the default 50 ms on a loaded
    // 2-core machine (CI saw four tests miss their majority while other
    // builds ran); the tests are about the votes, not about how fast they
    // come. A paused server still times out, a little later.
    Ok(Quorum::builder()
        .node_timeout(NODE_TIMEOUT)
        .connect(clients)
        .await?)
}

/// Each node's vote timeout in these tests.
const NODE_TIMEOUT: Duration = Duration::from_millis(500);

fn keys(resource: &str) -> Result<FencedKeys, Error> {
    FencedKeys::for_resource(resource)
}

fn once() -> AcquireOptions {
    AcquireOptions::new()
        .retry(RetryStrategy::none())
        .wait(Duration::from_secs(2))
}

/// Polls a condition on a server until it holds (no blind sleeps).
async fn until(mut condition: impl FnMut() -> bool) -> TestResult {
    tokio::time::timeout(HUNG, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await?;
    Ok(())
}

fn has_key(server: &RedisServer, key: &str) -> bool {
    server.redis_cli(&["EXISTS", key]).is_ok_and(|r| r == "1")
}

#[tokio::test]
async fn acquires_on_all_and_refuses_a_second_holder() -> TestResult {
    let servers = RedisServer::start_many(3)?;
    let quorum = quorum_over(&servers).await?;
    assert_eq!(quorum.needed(), 2);

    let a = quorum
        .acquire_with(&keys("wallet:1")?, TTL, &once())
        .await?;
    assert_eq!(a.key(), "lock:{wallet:1}");
    // The acquire returns once a majority answered; the third vote lands too.
    until(|| servers.iter().all(|s| has_key(s, "lock:{wallet:1}"))).await?;
    let err = quorum
        .acquire_with(&keys("wallet:1")?, TTL, &once())
        .await
        .err();
    assert!(matches!(err, Some(Error::NotAcquired { .. })), "{err:?}");

    let first = a.fence().ok_or("a fenced quorum lease has a fence")?;
    a.release().await?;
    assert!(servers.iter().all(|s| !has_key(s, "lock:{wallet:1}")));
    let b = quorum
        .acquire_with(&keys("wallet:1")?, TTL, &once())
        .await?;
    let second = b.fence().ok_or("a fenced quorum lease has a fence")?;
    assert!(second > first, "{first} then {second}");
    b.release().await?;
    Ok(())
}

#[tokio::test]
async fn a_minority_down_still_acquires_a_majority_down_refuses() -> TestResult {
    let mut servers = RedisServer::start_many(3)?;
    let quorum = quorum_over(&servers).await?;
    servers[0].kill()?;
    let lease = quorum
        .acquire_with(&keys("wallet:2")?, TTL, &once())
        .await?;
    lease.release().await?;

    servers[1].pause()?;
    let outcome =
        tokio::time::timeout(HUNG, quorum.acquire_with(&keys("wallet:2")?, TTL, &once())).await?;
    servers[1].resume()?;
    let err = outcome.err();
    assert!(
        matches!(
            err,
            Some(Error::QuorumNotReached {
                got: 1,
                needed: 2,
                failed_nodes: 2,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(err.as_ref().is_some_and(Error::is_retryable));
    // The one vote it got was rolled back.
    assert!(!has_key(&servers[2], "lock:{wallet:2}"));
    Ok(())
}

#[tokio::test]
async fn partial_acquisitions_are_rolled_back() -> TestResult {
    let servers = RedisServer::start_many(3)?;
    let quorum = quorum_over(&servers).await?;
    // Someone else holds the lock on two of three nodes.
    for server in &servers[..2] {
        server.redis_cli(&["SET", "lock:{wallet:3}", "other", "PX", "30000"])?;
    }
    let err = quorum
        .acquire_with(&keys("wallet:3")?, TTL, &once())
        .await
        .err();
    assert!(matches!(err, Some(Error::NotAcquired { .. })), "{err:?}");
    assert!(
        !has_key(&servers[2], "lock:{wallet:3}"),
        "the minority vote was left behind"
    );
    for server in &servers[..2] {
        assert_eq!(server.redis_cli(&["GET", "lock:{wallet:3}"])?, "other");
    }
    Ok(())
}

#[tokio::test]
async fn fencing_tokens_survive_a_minority_restarting_empty() -> TestResult {
    let mut servers = RedisServer::start_many(3)?;
    let quorum = quorum_over(&servers).await?;
    let mut last = 0;
    for round in 0..6 {
        // A different node loses everything before every lease.
        servers[round % 3].restart()?;
        let lease = tokio::time::timeout(
            HUNG,
            quorum.acquire_with(
                &keys("wallet:4")?,
                TTL,
                &AcquireOptions::new().wait(Duration::from_secs(5)),
            ),
        )
        .await??;
        assert!(
            lease.fence().map_or(0, |f| f.get()) > last,
            "round {round}: {:?} after {last}",
            lease.fence()
        );
        last = lease.fence().map_or(0, |f| f.get());
        lease.release().await?;
    }
    Ok(())
}

#[tokio::test]
async fn fencing_tokens_never_repeat_when_every_node_loses_its_data() -> TestResult {
    // With no node remembering the last token, the votes come from the
    // nodes' clocks: the next token is still above every earlier one.
    let mut servers = RedisServer::start_many(3)?;
    let quorum = quorum_over(&servers).await?;
    let mut issued = Vec::new();
    for _ in 0..3 {
        let lease = quorum
            .acquire_with(&keys("wallet:5")?, TTL, &once())
            .await?;
        issued.push(lease.fence().ok_or("fenced")?);
        lease.release().await?;
    }
    for server in &mut servers {
        server.restart()?;
    }
    let lease = tokio::time::timeout(
        HUNG,
        quorum.acquire_with(
            &keys("wallet:5")?,
            TTL,
            &AcquireOptions::new().wait(Duration::from_secs(5)),
        ),
    )
    .await??;
    let fence = lease.fence().ok_or("fenced")?;
    assert!(
        issued.iter().all(|old| *old < fence),
        "{fence} after {issued:?}"
    );
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn a_cancelled_acquire_releases_what_it_got() -> TestResult {
    let servers = RedisServer::start_many(3)?;
    let quorum = quorum_over(&servers).await?;
    // Others hold node 1; node 2 hangs: node 0's yes vote is never enough.
    servers[1].redis_cli(&["SET", "lock:{wallet:6}", "other", "PX", "30000"])?;
    servers[2].pause()?;
    let cancel = CancellationToken::new();
    let opts = AcquireOptions::new()
        .wait(Duration::from_secs(30))
        .cancel(cancel.clone());
    let waiter = {
        let quorum = quorum.clone();
        tokio::spawn(async move {
            quorum
                .acquire_with(&keys("wallet:6")?, TTL, &opts)
                .await
                .map(|_| ())
        })
    };
    until(|| has_key(&servers[0], "lock:{wallet:6}")).await?;
    cancel.cancel();
    let err = waiter.await?.err();
    servers[2].resume()?;
    assert!(
        matches!(
            err,
            Some(Error::NotAcquired {
                reason: leasehold::GiveUpReason::Cancelled,
                ..
            })
        ),
        "{err:?}"
    );
    until(|| !has_key(&servers[0], "lock:{wallet:6}")).await?;
    until(|| !has_key(&servers[2], "lock:{wallet:6}")).await?;
    assert_eq!(servers[1].redis_cli(&["GET", "lock:{wallet:6}"])?, "other");
    Ok(())
}

#[tokio::test]
async fn release_after_expiry_reports_not_held() -> TestResult {
    let servers = RedisServer::start_many(3)?;
    let quorum = quorum_over(&servers).await?;
    // Long enough that a loaded machine's votes still leave it valid (a
    // 20 ms lease was sometimes not won at all); the test then waits for
    // the servers to expire it.
    let lease = quorum
        .acquire_with(&keys("wallet:7")?, Duration::from_millis(500), &once())
        .await?;
    until(|| servers.iter().all(|s| !has_key(s, "lock:{wallet:7}"))).await?;
    let err = lease.release().await.err();
    assert!(matches!(err, Some(Error::NotHeld { .. })), "{err:?}");
    Ok(())
}

#[tokio::test]
async fn refresh_extends_the_lease_on_the_quorum() -> TestResult {
    let mut servers = RedisServer::start_many(3)?;
    let quorum = quorum_over(&servers).await?;
    let lease = quorum
        .acquire_with(&keys("wallet:8")?, TTL, &once())
        .await?;
    servers[0].kill()?;
    lease.refresh(TTL * 4).await?;
    assert_eq!(lease.ttl(), TTL * 4);
    for server in &servers[1..] {
        let pttl: u64 = server.redis_cli(&["PTTL", "lock:{wallet:8}"])?.parse()?;
        assert!(pttl > TTL.as_millis() as u64, "not extended: {pttl}");
    }
    // Taken over on a majority behind our back: the refresh must say so and
    // leave the other holder's keys alone.
    for server in &servers[1..] {
        server.redis_cli(&["SET", "lock:{wallet:8}", "other", "PX", "30000"])?;
    }
    let err = lease.refresh(TTL).await.err();
    assert!(matches!(err, Some(Error::NotHeld { .. })), "{err:?}");
    assert_eq!(servers[1].redis_cli(&["GET", "lock:{wallet:8}"])?, "other");
    Ok(())
}

#[tokio::test]
async fn a_broken_counter_on_a_minority_neither_stops_nor_fails_the_acquire() -> TestResult {
    let servers = RedisServer::start_many(3)?;
    let quorum = quorum_over(&servers).await?;
    let keys = keys("wallet:7")?;
    servers[0].redis_cli(&["SET", keys.fence(), "not a counter"])?;
    // Two good nodes are a majority: the lock and a token.
    let lease = quorum.acquire_with(&keys, TTL, &once()).await?;
    assert!(lease.fence().is_some());
    // Busy on the good nodes: contention (retried), not InvalidFence.
    let err = quorum.acquire_with(&keys, TTL, &once()).await.err();
    assert!(matches!(err, Some(Error::NotAcquired { .. })), "{err:?}");
    lease.release().await?;
    // A majority broken: the counter, named, not a quorum to wait for.
    servers[1].redis_cli(&["SET", keys.fence(), "not a counter"])?;
    let err = quorum.acquire_with(&keys, TTL, &once()).await.err();
    assert!(matches!(err, Some(Error::InvalidFence { .. })), "{err:?}");
    Ok(())
}
