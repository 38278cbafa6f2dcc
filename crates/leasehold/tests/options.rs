//! Every acquire option is honoured by every way of taking a lease, or
//! refused before any I/O with `InvalidOptions`.
#![cfg(all(feature = "handoff", feature = "quorum"))]

use leasehold::Lessor;
use std::time::Duration;

use leasehold::{
    AcquireOptions, CancellationToken, Error, FencedKeys, GiveUpReason, HandoffLocker, Locker,
    Quorum, RetryStrategy,
};
use leasehold_testkit::RedisServer;

mod common;
use common::*;

/// The ways of taking a lease, as a table.
#[derive(Debug, Clone, Copy)]
enum Path {
    Polling,
    Fenced,
    Handoff,
    Relay,
    Quorum,
}

const PATHS: [Path; 5] = [
    Path::Polling,
    Path::Fenced,
    Path::Handoff,
    Path::Relay,
    Path::Quorum,
];

/// What an acquire with the options returned: whether the lease is watched,
/// or the error.
async fn acquire(
    server: &RedisServer,
    path: Path,
    resource: &str,
    opts: &AcquireOptions,
) -> Result<Result<bool, Error>, Box<dyn std::error::Error>> {
    let client = redis::Client::open(server.url())?;
    let keys = FencedKeys::for_resource(resource)?;
    let ttl = 10 * SECOND;
    let locker = Locker::connect(&client).await?;
    let outcome = match path {
        Path::Polling => locker.acquire_with(keys.lock(), ttl, opts).await,
        Path::Fenced => locker.acquire_with(&keys, ttl, opts).await,
        Path::Handoff | Path::Relay => {
            let limit = if matches!(path, Path::Relay) { 16 } else { 0 };
            let handoff = HandoffLocker::builder()
                .relay_limit(limit)
                .build(locker.clone(), &client)
                .await?;
            handoff.acquire_with(keys.lock(), ttl, opts).await
        }
        Path::Quorum => {
            // A node timeout far above a loaded machine's loopback round
            // trip: a slow answer would be a missing vote (QuorumNotReached),
            // not the option under test.
            let quorum = Quorum::builder()
                .node_timeout(SECOND)
                .connect(vec![client.clone()])
                .await?;
            quorum.acquire_with(&keys, ttl, opts).await
        }
    };
    let requests = locker.stats().requests();
    Ok(match outcome {
        Ok(lease) => {
            let watched = lease.is_watched();
            lease.release().await?;
            Ok(watched)
        }
        Err(err @ Error::InvalidOptions(_)) => {
            assert_eq!(requests, 0, "{path:?}: refused after I/O");
            Err(err)
        }
        Err(err) => Err(err),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_is_started_or_refused_on_every_path() -> TestResult {
    let server = RedisServer::start()?;
    let opts = AcquireOptions::new().watchdog(true).wait(HUNG);
    for (i, path) in PATHS.into_iter().enumerate() {
        let outcome = acquire(&server, path, &format!("t:opts:watch:{i}"), &opts).await?;
        match outcome {
            Ok(watched) => assert!(watched, "{path:?}: watchdog asked for, not started"),
            Err(Error::InvalidOptions(why)) => {
                assert!(why.contains("watchdog"), "{path:?}: {why}");
            }
            Err(err) => return Err(format!("{path:?}: {err}").into()),
        }
    }
    Ok(())
}

/// A replica wait the lockers cannot honour is refused before any I/O: a
/// zero timeout (`WAIT n 0` blocks forever), and one at or above the
/// command timeout (1 s here, the default), which the connection would cut
/// short. The quorum refuses any.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_wait_that_cannot_be_honoured_is_refused_before_any_io_on_every_path()
-> TestResult {
    let server = RedisServer::start()?;
    for (n, timeout) in [Duration::ZERO, SECOND, 2 * SECOND].into_iter().enumerate() {
        let opts = AcquireOptions::new().wait_replicas(1, timeout);
        for (i, path) in PATHS.into_iter().enumerate() {
            let outcome = acquire(&server, path, &format!("t:opts:wait:{n}:{i}"), &opts).await?;
            assert!(
                matches!(outcome, Err(Error::InvalidOptions(_))),
                "{timeout:?} {path:?}: {outcome:?}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_retry_and_cancel_give_up_the_same_way_on_every_path() -> TestResult {
    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let mut conn = leasehold_testkit::connection(&client, SECOND).await?;
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let cases = [
        (
            AcquireOptions::new().retry(RetryStrategy::none()),
            GiveUpReason::RetriesExhausted,
        ),
        (
            // Long enough for a loaded machine's attempt to be answered,
            // far shorter than the 60 s the key stays held.
            AcquireOptions::new().wait(Duration::from_millis(300)),
            GiveUpReason::DeadlineExpired,
        ),
        (
            AcquireOptions::new().cancel(cancelled),
            GiveUpReason::Cancelled,
        ),
    ];
    for (i, path) in PATHS.into_iter().enumerate() {
        let resource = format!("t:opts:busy:{i}");
        let keys = FencedKeys::for_resource(&resource)?;
        // Held by someone else for the whole test.
        let _: () = redis::cmd("SET")
            .arg(keys.lock())
            .arg("someone-else")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await?;
        for (opts, reason) in &cases {
            let outcome = acquire(&server, path, &resource, opts).await?;
            match outcome {
                Err(Error::NotAcquired { reason: got, .. }) if got == *reason => {}
                other => return Err(format!("{path:?}, {reason:?}: {other:?}").into()),
            }
        }
    }
    Ok(())
}

/// Every builder refuses a setting it cannot use before any I/O: the
/// client points at a port where nothing listens, so any I/O would be
/// `Unreachable` instead.
#[tokio::test]
async fn every_builder_refuses_bad_settings_before_any_io() -> TestResult {
    let port = leasehold_testkit::free_port()?;
    let nowhere = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let refused = |outcome: Result<(), Error>, what: &str| {
        assert!(
            matches!(outcome, Err(Error::InvalidOptions(_))),
            "{what}: {outcome:?}"
        );
    };
    let zero = Duration::ZERO;
    let locker = Locker::builder().command_timeout(zero);
    refused(locker.connect(&nowhere).await.map(drop), "locker");
    let locker = Locker::builder().fence_ttl(Some(zero));
    refused(locker.connect(&nowhere).await.map(drop), "locker fence");

    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let yours = Locker::connect(&client).await?;

    let quorum = Quorum::builder().node_timeout(zero);
    refused(
        quorum.connect(vec![nowhere.clone()]).await.map(drop),
        "quorum",
    );
    refused(
        Quorum::builder().connect(Vec::new()).await.map(drop),
        "quorum of none",
    );
    refused(
        Quorum::builder()
            .fence_ttl(Some(zero))
            .build(vec![yours.connection().clone()])
            .map(drop),
        "quorum fence",
    );
    Ok(())
}
