//! Lockers through Redis Sentinel follow the primary across a coordinated
//! failover and a killed primary; typed errors for a wrong master name and
//! for sentinels that do not answer.

use std::sync::Arc;
use std::time::Duration;

use leasehold::{
    AcquireOptions, Error, FencedKeys, FencingToken, HandoffLocker, Lessor, Locker, Sentinel,
};
use leasehold_testkit::{RedisSentinel, free_port};
use redis::RedisConnectionInfo;

mod common;
use common::*;

/// Outlasts any failover of the testkit's setup (1 s down-after, a few
/// seconds of election and promotion): a caller that waits this long must
/// not see the failover.
const OUTLASTS_FAILOVER: Duration = Duration::from_secs(30);

fn sentinel(setup: &RedisSentinel) -> Result<Sentinel, leasehold::Error> {
    Sentinel::new(
        setup.sentinel_urls(),
        setup.master(),
        RedisConnectionInfo::default(),
    )
}

/// The lock key's value on the node the sentinels name primary now.
fn on_primary(setup: &RedisSentinel, key: &str) -> Result<String, Box<dyn std::error::Error>> {
    Ok(setup.primary()?.redis_cli(&["GET", key])?)
}

/// Takes and gives back the lease on `keys` until `done` has been seen and
/// then a lease landed on the primary the sentinels name; returns every
/// fence. `NotReplicated` (the replica is not there: promoted, or not
/// back yet) is retried here when `retry_unreplicated`, as a caller of
/// `wait_replicas` does; any other error ends it.
async fn acquire_until<L: Lessor>(
    lessor: &L,
    keys: &FencedKeys,
    opts: &AcquireOptions,
    done: &tokio::sync::watch::Receiver<bool>,
    setup: &RedisSentinel,
    retry_unreplicated: bool,
) -> Result<(Vec<FencingToken>, Duration), Box<dyn std::error::Error + Send + Sync>> {
    let mut fences = Vec::new();
    let mut longest = Duration::ZERO;
    loop {
        let finished = *done.borrow();
        let started = std::time::Instant::now();
        let acquired = lessor.acquire_with(keys, 2 * SECOND, opts).await;
        longest = longest.max(started.elapsed());
        let lease = match acquired {
            Err(Error::NotReplicated { .. }) if retry_unreplicated => {
                tokio::task::yield_now().await;
                continue;
            }
            other => other?,
        };
        fences.push(lease.fence().ok_or("fenced")?);
        let landed = finished
            && setup.primary().is_ok_and(|primary| {
                primary.redis_cli(&["GET", keys.lock()]).ok().as_deref()
                    == Some(lease.token().as_str())
            });
        // The release may meet the failover too; it is not what this
        // checks (a release that cannot know answers an error, and the TTL
        // frees the key).
        let _ = lease.release().await;
        if landed {
            return Ok((fences, longest));
        }
        tokio::task::yield_now().await;
    }
}

/// How many fences were not above the one before.
fn regressions(first: FencingToken, fences: &[FencingToken]) -> usize {
    let mut last = first;
    let mut back = 0;
    for fence in fences {
        if *fence <= last {
            back += 1;
        }
        last = last.max(*fence);
    }
    back
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockers_follow_a_coordinated_failover_and_fences_keep_increasing() -> TestResult {
    let setup = Arc::new(RedisSentinel::start("lh-coordinated")?);
    let sentinel = sentinel(&setup)?;
    let locker = Locker::connect(&sentinel).await?;
    let handoff = HandoffLocker::connect(&sentinel).await?;
    let keys = FencedKeys::for_resource("sentinel:coordinated")?;

    let lease = locker.acquire(&keys, 30 * SECOND).await?;
    assert_eq!(on_primary(&setup, keys.lock())?, lease.token().as_str());
    let first = lease.fence().ok_or("fenced")?;
    lease.release().await?;

    // Two callers run back to back through the failover, each acquire
    // waiting long enough to outlast it. A plain one: no error reaches it,
    // and once the sentinels agree its leases land on the new primary
    // (within the connection's check of the sentinels, every 500 ms). One
    // with `wait_replicas(1)`: a lease is used only once the replica has
    // it, so the old primary grants none after the replica was promoted
    // (it has no replica left), and fencing tokens never go back.
    let plain = AcquireOptions::new().wait(OUTLASTS_FAILOVER);
    let replicated = plain.clone().wait_replicas(1, Duration::from_millis(250));
    let wkeys = FencedKeys::for_resource("sentinel:replicated")?;
    let wfirst = {
        let lease = locker
            .acquire_with(&wkeys, 30 * SECOND, &replicated)
            .await?;
        let fence = lease.fence().ok_or("fenced")?;
        lease.release().await?;
        fence
    };
    let (done_tx, done) = tokio::sync::watch::channel(false);
    let failover = {
        let setup = setup.clone();
        tokio::task::spawn_blocking(move || setup.failover())
    };
    let (plain_fences, replicated_fences, new_primary) = tokio::join!(
        tokio::time::timeout(
            OUTLASTS_FAILOVER,
            acquire_until(&locker, &keys, &plain, &done, &setup, false)
        ),
        tokio::time::timeout(
            OUTLASTS_FAILOVER,
            acquire_until(&locker, &wkeys, &replicated, &done, &setup, true)
        ),
        async {
            let new_primary = failover.await;
            let _ = done_tx.send(true);
            new_primary
        }
    );
    let new_primary = new_primary??;
    assert_eq!(new_primary, setup.servers()[1].port());
    let (plain_fences, plain_longest) = plain_fences?.map_err(|err| err.to_string())?;
    let (replicated_fences, _) = replicated_fences?.map_err(|err| err.to_string())?;
    assert_eq!(
        regressions(wfirst, &replicated_fences),
        0,
        "with wait_replicas: {replicated_fences:?}"
    );
    // Measured, not asserted: without WAIT the old primary, not demoted
    // yet, grants leases (and fences) that the failover then loses.
    eprintln!(
        "plain: {} acquires (the longest took {plain_longest:?}), {} fences not above the one before; wait_replicas: {} acquires",
        plain_fences.len(),
        regressions(first, &plain_fences),
        replicated_fences.len()
    );
    // The last plain lease landed on the new primary: later ones go above it.
    let last = plain_fences.last().copied().unwrap_or(first);
    let lease = locker.acquire_with(&keys, 30 * SECOND, &plain).await?;
    assert_eq!(on_primary(&setup, keys.lock())?, lease.token().as_str());
    assert!(lease.fence().ok_or("fenced")? > last);
    lease.release().await?;

    // The hand-off locker follows too, its pub/sub connection included (a
    // waiter is handed the lock by a release, on the new primary).
    let hkeys = FencedKeys::for_resource("sentinel:handoff")?;
    let held = handoff.acquire_with(&hkeys, 30 * SECOND, &plain).await?;
    assert_eq!(on_primary(&setup, hkeys.lock())?, held.token().as_str());
    let waiter = {
        let handoff = handoff.clone();
        let hkeys = hkeys.clone();
        let plain = plain.clone();
        tokio::spawn(async move { handoff.acquire_with(&hkeys, 30 * SECOND, &plain).await })
    };
    while handoff.queued_in_process(hkeys.lock()) == 0 {
        tokio::task::yield_now().await;
    }
    held.release().await?;
    let next = tokio::time::timeout(OUTLASTS_FAILOVER, waiter).await???;
    assert_eq!(on_primary(&setup, hkeys.lock())?, next.token().as_str());
    next.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_follows_a_killed_primary_under_the_minimal_acl_and_a_wrong_name_is_typed()
-> TestResult {
    let mut setup = RedisSentinel::start("lh-killed")?;

    // The wrong master name: typed, not retryable, at connect.
    let wrong = Sentinel::new(
        setup.sentinel_urls(),
        "no-such-master",
        RedisConnectionInfo::default(),
    )?;
    match Locker::connect(&wrong).await {
        Err(err @ Error::UnknownMaster { .. }) => {
            assert!(!err.is_retryable());
            assert!(err.to_string().contains("no-such-master"), "{err}");
        }
        other => panic!("expected UnknownMaster, got {other:?}"),
    }

    // Under the README's minimal ACL, plus `+role` (the primary's role is
    // checked on every connect): without it, connecting names ROLE.
    for server in setup.servers() {
        let mut args = vec!["ACL", "SETUSER", "locker", "on", ">locker-pw"];
        args.extend_from_slice(LOCK_USER_ACL);
        server.redis_cli(&args)?;
    }
    let limited = Sentinel::from_url(
        &setup
            .url()
            .replace("redis+sentinel://", "redis+sentinel://locker:locker-pw@"),
    )?;
    match Locker::connect(&limited).await {
        Err(Error::NoPermission { command, .. }) => assert_eq!(command, "ROLE"),
        other => panic!("expected NoPermission naming ROLE, got {other:?}"),
    }
    for server in setup.servers() {
        server.redis_cli(&["ACL", "SETUSER", "locker", "+role"])?;
    }
    let locker = Locker::connect(&limited).await?;
    let keys = FencedKeys::for_resource("sentinel:killed")?;
    let lease = locker.acquire(&keys, 30 * SECOND).await?;
    lease.release().await?;

    let killed = setup.kill_primary()?;
    // An acquire that waits long enough gets its lease from the new
    // primary, and no error.
    let opts = AcquireOptions::new().wait(OUTLASTS_FAILOVER);
    let started = std::time::Instant::now();
    let lease = locker.acquire_with(&keys, 30 * SECOND, &opts).await?;
    // Measured, not asserted.
    eprintln!("killed primary: the acquire took {:?}", started.elapsed());
    let new_primary = setup.wait_for_new_primary(killed, OUTLASTS_FAILOVER)?;
    assert_ne!(new_primary, killed);
    assert_eq!(on_primary(&setup, keys.lock())?, lease.token().as_str());
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn no_reachable_sentinel_is_typed() -> TestResult {
    let ports = [free_port()?, free_port()?];
    let url = format!(
        "redis+sentinel://:pw-not-shown@127.0.0.1:{},127.0.0.1:{}/m",
        ports[0], ports[1]
    );
    let sentinel = Sentinel::from_url(&url)?;
    let err = Locker::builder()
        .command_timeout(SECOND)
        .connect(&sentinel)
        .await
        .err()
        .ok_or("no sentinel listens, yet connect succeeded")?;
    assert!(
        matches!(&err, Error::SentinelUnreachable { master, .. } if master == "m"),
        "{err:?}"
    );
    assert!(err.is_retryable());
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("pw-not-shown"), "{shown}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_follows_a_paused_primary_without_hanging() -> TestResult {
    // A paused primary drops no connection and answers no READONLY: its
    // requests time out, and only the sentinels' switch moves the locker.
    let setup = RedisSentinel::start("lh-paused")?;
    let locker = Locker::builder()
        .command_timeout(SECOND)
        .connect(&sentinel(&setup)?)
        .await?;
    let keys = FencedKeys::for_resource("sentinel:paused")?;
    locker.acquire(&keys, 30 * SECOND).await?.release().await?;

    let old = setup.primary_port()?;
    setup.servers()[0].pause()?;
    let opts = AcquireOptions::new().wait(OUTLASTS_FAILOVER);
    let started = std::time::Instant::now();
    let acquired = tokio::time::timeout(
        OUTLASTS_FAILOVER + HUNG,
        locker.acquire_with(&keys, 30 * SECOND, &opts),
    )
    .await;
    eprintln!("paused primary: the acquire took {:?}", started.elapsed());
    let lease = acquired??;
    let new_primary = setup.wait_for_new_primary(old, OUTLASTS_FAILOVER)?;
    assert_ne!(new_primary, old);
    assert_eq!(on_primary(&setup, keys.lock())?, lease.token().as_str());
    lease.release().await?;
    setup.servers()[0].resume()?;
    Ok(())
}
