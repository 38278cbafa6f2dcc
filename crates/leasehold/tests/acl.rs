//! Redis ACLs: every command the README's minimal ACL lists is needed by the
//! operation that uses it, and refused it comes back as
//! `Error::NoPermission` naming it, whether we send it or one of our Lua
//! scripts does; and a locker whose user vanished (an empty restart)
//! works again as soon as the user is back.

use leasehold::Lessor;
use std::time::Duration;

use leasehold::{AcquireOptions, Error, FencedKeys, FencingToken, Locker};
use leasehold_testkit::RedisServer;

mod common;
use common::*;

/// The list these tests grant is the README's line, word for word: a rule
/// added to one and not the other would make these tests prove the wrong
/// ACL.
#[test]
fn the_tested_acl_is_the_readmes() -> Result<(), Box<dyn std::error::Error>> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))?;
    let line = readme
        .lines()
        .find_map(|line| line.strip_prefix("ACL SETUSER locker on >password "))
        .ok_or("no `ACL SETUSER locker on >password` line in the README")?;
    let readme_rules: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(readme_rules, LOCK_USER_ACL);
    Ok(())
}

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
    (
        "get",
        &[
            Op::Refresh,
            Op::Release,
            Op::FencedAcquire,
            Op::HandoffAcquireFenced,
        ],
    ),
    ("del", &[Op::Release]),
    ("pexpire", &[Op::Refresh, Op::RaiseFence]),
    ("evalsha", &[Op::Release, Op::FencedAcquire]),
    ("eval", &[Op::Release]),
    ("script|load", &[Op::FencedAcquire]),
    ("type", &[Op::FencedAcquireBusy, Op::HandoffAcquire]),
    ("time", &[Op::FencedAcquire, Op::HandoffAcquire]),
    ("zadd", &[Op::HandoffAcquireBusy]),
    ("zrange", &[Op::HandoffAcquire]),
    ("zrem", &[Op::HandoffAcquire]),
    ("zpopmin", &[Op::HandoffRelease]),
    ("hget", &[Op::HandoffAcquireQueued]),
    ("hset", &[Op::HandoffAcquireBusy]),
    ("hdel", &[Op::HandoffAcquire]),
    ("pttl", &[Op::HandoffAcquireBusy]),
    ("spublish", &[Op::HandoffAcquireServing]),
    ("pubsub|shardnumsub", &[Op::HandoffAcquireServing]),
    ("ssubscribe", &[Op::HandoffConnect]),
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
            let opts = AcquireOptions::new()
                .wait_replicas(1, Duration::from_millis(10))
                .wait(Duration::from_millis(100));
            locker.acquire_with(&plain, ttl, &opts).await.map(drop)
        }
        #[cfg(feature = "handoff")]
        Op::HandoffConnect => leasehold::HandoffLocker::builder()
            .build(locker, client)
            .await
            .map(drop),
        #[cfg(feature = "handoff")]
        Op::HandoffAcquire
        | Op::HandoffAcquireFenced
        | Op::HandoffAcquireBusy
        | Op::HandoffAcquireQueued
        | Op::HandoffAcquireServing
        | Op::HandoffRelease => {
            let handoff = leasehold::HandoffLocker::builder()
                .build(locker, client)
                .await?;
            let queue = format!("{plain}:waitq");
            // A live waiter of another process: subscribed (as an admin) to
            // the shard channel its entry names, while the operation runs.
            let mut _listener = None;
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
                    let info = redis::IntoConnectionInfo::into_connection_info(server.url())?;
                    let resp3 = info
                        .redis_settings()
                        .clone()
                        .set_protocol(redis::ProtocolVersion::RESP3);
                    let admin = redis::Client::open(info.set_redis_settings(resp3))?;
                    let mut listener = admin.get_multiplexed_async_connection().await?;
                    redis::cmd("SSUBSCRIBE")
                        .arg("leasehold:handoff:elsewhere")
                        .exec_async(&mut listener)
                        .await?;
                    _listener = Some(listener);
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
        let refused = format!("+{command}");
        let rules: Vec<&str> = LOCK_USER_ACL
            .iter()
            .copied()
            .filter(|rule| *rule != refused)
            .collect();
        server.set_acl_user(&user, "pw", &rules)?;
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

/// Everything an error says, its sources included, `Display` and `Debug`.
fn all_text(err: &Error) -> String {
    let mut text = format!("{err} {err:?}");
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        text.push_str(&format!(" {inner} {inner:?}"));
        source = inner.source();
    }
    text
}

/// How many failed authentications the server has logged (`ACL LOG`).
fn auth_failures(server: &RedisServer) -> Result<i64, Box<dyn std::error::Error>> {
    Ok(server
        .acl_log()?
        .iter()
        .filter(|refusal| refusal.reason == "auth")
        .map(|refusal| refusal.count)
        .sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_authenticates_again_once_its_user_is_back() -> TestResult {
    const PASSWORD: &str = "correct-horse-battery";
    let mut server = RedisServer::start()?;
    server.set_acl_user("locker", PASSWORD, LOCK_USER_ACL)?;
    let client = redis::Client::open(format!(
        "redis://locker:{PASSWORD}@{}:{}",
        server.host(),
        server.port()
    ))?;
    let locker = Locker::connect(&client).await?;
    let conn = locker.connection().clone();
    assert!(
        !format!("{conn:?} {locker:?}").contains(PASSWORD),
        "{conn:?}"
    );
    let key = "lock:reauth";
    locker.acquire(key, SECOND).await?.release().await?;

    // An empty restart: the user is gone. The request that finds the old
    // connection broken fails as unreachable; the reconnect is refused.
    server.restart_empty()?;
    let refused = tokio::time::timeout(HUNG, async {
        loop {
            match locker.acquire_with(key, SECOND, &once()).await {
                Err(Error::Unreachable { .. }) => continue,
                other => return other,
            }
        }
    })
    .await?;
    let err = refused.err().ok_or("acquired without a user")?;
    assert!(matches!(err, Error::Auth(_)), "{err:?}");
    assert!(err.is_retryable(), "{err:?}: the user may come back");
    assert!(!all_text(&err).contains(PASSWORD), "{}", all_text(&err));

    // A caller that retries in a tight loop gets the same typed error at
    // once, and the server sees the handshake again only with backoff.
    let before = auth_failures(&server)?;
    let hammering = tokio::time::Instant::now();
    let mut calls = 0;
    while hammering.elapsed() < Duration::from_secs(1) {
        let err = locker.acquire_with(key, SECOND, &once()).await.err();
        assert!(matches!(err, Some(Error::Auth(_))), "{err:?}");
        calls += 1;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let handshakes = auth_failures(&server)? - before;
    assert!(
        (1..=12).contains(&handshakes),
        "{handshakes} refused handshakes for {calls} calls in 1 s"
    );

    // The user is back: the same locker works again.
    server.set_acl_user("locker", PASSWORD, LOCK_USER_ACL)?;
    let lease = tokio::time::timeout(HUNG, async {
        loop {
            match locker.acquire_with(key, SECOND, &once()).await {
                Ok(lease) => return Ok(lease),
                Err(err) if err.is_retryable() => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(err) => return Err(err),
            }
        }
    })
    .await??;
    lease.release().await?;
    Ok(())
}
