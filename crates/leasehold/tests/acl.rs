//! Redis ACLs: every command the README's minimal ACL lists is needed by the
//! operation that uses it, and refused it comes back as
//! `Error::NoPermission` naming it, whether we send it or one of our Lua
//! scripts does.

use std::time::Duration;

use leasehold::{AcquireOptions, Error, FencedKeys, FencingToken, Locker};
use leasehold_testkit::RedisServer;

mod common;
use common::*;

/// An operation of the library, run by a user whose ACL lacks one command.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A plain acquire (`SET NX PX GET`).
    Acquire,
    /// A fenced acquire of a free lock (`scripts/acquire_fenced.lua`).
    FencedAcquire,
    /// A fenced acquire of a lock someone else holds.
    FencedAcquireBusy,
    /// A plain lease's refresh (`scripts/refresh.lua`).
    Refresh,
    /// A plain lease's release (`scripts/release.lua`).
    Release,
    /// A fenced lease's `raise_fence` (`scripts/raise_fence.lua`).
    RaiseFence,
    /// An acquire that waits for a replica (`WAIT`).
    WaitReplicas,
    /// Opening a hand-off locker (its pub/sub subscription).
    HandoffConnect,
    /// A hand-off acquire of a free lock (`scripts/handoff_acquire.lua`).
    HandoffAcquire,
    /// The same, fenced.
    HandoffAcquireFenced,
    /// A hand-off acquire of a lock someone else holds: it joins the queue.
    HandoffAcquireBusy,
    /// A hand-off acquire of a free lock with a stale waiter queued.
    HandoffAcquireQueued,
    /// A hand-off acquire of a free lock with a live waiter of another
    /// process queued, which is served first.
    HandoffAcquireServing,
    /// A hand-off lease's release (`scripts/handoff_release.lua`).
    HandoffRelease,
}

/// Every command of the README's minimal ACL, with the operations that
/// need it.
const NEEDED_BY: &[(&str, &[Op])] = &[
    ("set", &[Op::Acquire, Op::FencedAcquire]),
    ("get", &[Op::Refresh, Op::Release, Op::RaiseFence]),
    ("del", &[Op::Release]),
    ("pexpire", &[Op::Refresh, Op::FencedAcquire]),
    ("evalsha", &[Op::Release, Op::FencedAcquire]),
    ("eval", &[Op::Release]),
    ("script|load", &[Op::FencedAcquire]),
    ("incr", &[Op::FencedAcquire, Op::HandoffAcquireFenced]),
    ("type", &[Op::FencedAcquireBusy, Op::HandoffAcquire]),
    ("time", &[Op::HandoffAcquire]),
    ("zadd", &[Op::HandoffAcquireBusy]),
    ("zrange", &[Op::HandoffAcquire]),
    ("zrem", &[Op::HandoffAcquire]),
    ("zpopmin", &[Op::HandoffRelease]),
    ("hget", &[Op::HandoffAcquireQueued]),
    ("hset", &[Op::HandoffAcquireBusy]),
    ("hdel", &[Op::HandoffAcquire]),
    ("pttl", &[Op::HandoffAcquireBusy]),
    ("publish", &[Op::HandoffAcquireServing]),
    ("subscribe", &[Op::HandoffConnect]),
    ("wait", &[Op::WaitReplicas]),
];

/// Runs `op` as the user of `client`, on keys of its own (`n`); `Err` for
/// a failure of the test's own setup, `Ok` with the operation's outcome.
async fn run(
    op: Op,
    server: &RedisServer,
    client: &redis::Client,
    n: usize,
) -> Result<Result<(), Error>, Box<dyn std::error::Error>> {
    let locker = Locker::connect(client).await?;
    let ttl = 10 * SECOND;
    let plain = format!("lock:acl:{n}");
    let fenced = FencedKeys::for_resource(&format!("acl:{n}"))?;
    Ok(match op {
        Op::Acquire => locker.acquire_with(&plain, ttl, &once()).await.map(drop),
        Op::FencedAcquire | Op::FencedAcquireBusy => {
            if matches!(op, Op::FencedAcquireBusy) {
                server.command(&["SET", fenced.lock(), "someone-else", "PX", "60000"])?;
            }
            let outcome = locker.acquire_with(&fenced, ttl, &once()).await.map(drop);
            if outcome.is_err() && matches!(op, Op::FencedAcquire) {
                // No lease without a token: the lock was given back.
                assert_eq!(server.redis_cli(&["EXISTS", fenced.lock()])?, "0");
            }
            outcome
        }
        Op::Refresh => locker.acquire(&plain, ttl).await?.refresh(ttl).await,
        Op::Release => locker.acquire(&plain, ttl).await?.release().await,
        Op::RaiseFence => {
            let lease = locker.acquire(&fenced, ttl).await?;
            lease.raise_fence(FencingToken::new(100)).await
        }
        Op::WaitReplicas => {
            let opts = AcquireOptions::new().wait_replicas(1, Duration::from_millis(10));
            locker.acquire_with(&plain, ttl, &opts).await.map(drop)
        }
        #[cfg(feature = "handoff")]
        Op::HandoffConnect => leasehold::HandoffLocker::builder(locker, client)
            .connect()
            .await
            .map(drop),
        #[cfg(feature = "handoff")]
        Op::HandoffAcquire
        | Op::HandoffAcquireFenced
        | Op::HandoffAcquireBusy
        | Op::HandoffAcquireQueued
        | Op::HandoffAcquireServing
        | Op::HandoffRelease => {
            let handoff = leasehold::HandoffLocker::builder(locker, client)
                .connect()
                .await?;
            let queue = format!("{plain}:waitq");
            match op {
                Op::HandoffAcquireBusy => {
                    server.command(&["SET", &plain, "someone-else", "PX", "60000"])?;
                }
                Op::HandoffAcquireQueued => {
                    server.command(&["ZADD", &queue, "1", "gone"])?;
                }
                Op::HandoffAcquireServing => {
                    let waiters = format!("{plain}:waiters");
                    let entry = "99999999999999 1000 - leasehold:handoff:elsewhere";
                    server.command(&["ZADD", &queue, "1", "elsewhere"])?;
                    server.command(&["HSET", &waiters, "elsewhere", entry])?;
                }
                _ => {}
            }
            if matches!(op, Op::HandoffAcquireFenced) {
                handoff.acquire_with(&fenced, ttl, &once()).await.map(drop)
            } else if matches!(op, Op::HandoffRelease) {
                handoff.acquire(&plain, ttl).await?.release().await
            } else {
                handoff.acquire_with(&plain, ttl, &once()).await.map(drop)
            }
        }
        #[cfg(not(feature = "handoff"))]
        _ => Ok(()),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_command_of_the_minimal_acl_is_needed_and_named_when_refused() -> TestResult {
    let server = RedisServer::start()?;
    let mut granted: Vec<&str> = LOCK_USER_ACL
        .iter()
        .filter_map(|rule| rule.strip_prefix('+'))
        .collect();
    let mut listed: Vec<&str> = NEEDED_BY.iter().map(|(command, _)| *command).collect();
    granted.sort_unstable();
    listed.sort_unstable();
    assert_eq!(granted, listed, "every command of the minimal ACL, once");

    let mut n = 0;
    for (command, ops) in NEEDED_BY {
        let user = format!("without-{}", command.replace('|', "-"));
        let mut rules = vec!["ACL", "SETUSER", &user, "reset", "on", ">pw"];
        let refused = format!("+{command}");
        rules.extend(LOCK_USER_ACL.iter().filter(|rule| **rule != refused));
        server.command(&rules)?;
        let client = redis::Client::open(format!(
            "redis://{user}:pw@{}:{}",
            server.host(),
            server.port()
        ))?;
        for op in *ops {
            n += 1;
            #[cfg(not(feature = "handoff"))]
            if format!("{op:?}").starts_with("Handoff") {
                continue;
            }
            // Each case starts with an empty script cache, as after a
            // restart: EVAL and SCRIPT LOAD are needed then.
            server.command(&["SCRIPT", "FLUSH"])?;
            let outcome = tokio::time::timeout(HUNG, run(*op, &server, &client, n)).await??;
            let err = outcome.err();
            let named = command.to_ascii_uppercase();
            assert!(
                matches!(&err, Some(Error::NoPermission { command, .. }) if *command == named),
                "without {command}, {op:?}: {err:?}"
            );
            assert!(
                !err.as_ref().is_some_and(Error::is_retryable),
                "without {command}, {op:?}: {err:?} must not be retryable"
            );
        }
    }
    Ok(())
}
