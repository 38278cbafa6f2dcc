//! The etcd way of taking a lease (`leasehold_etcd::EtcdLocker`) against a
//! real 3-member etcd cluster: acquire and release; waiters woken by watch
//! in FIFO order; fencing tokens (key revisions) strictly increasing across
//! holders; refresh; a lease revoked (or its key deleted) behind the
//! holder's back is reported lost (refresh, the watchdog, release), a
//! keep-alive's success notwithstanding; giving up (deadline, one look,
//! cancel) leaves no key behind; a stopped leader costs a held lease
//! nothing; several locks in one lease; an election; the fence guard
//! orders etcd holders.

use leasehold::Lessor;
use std::time::Duration;

use leasehold::{AcquireOptions, Error, FencedKeys, GiveUpReason, Lease};
use leasehold_etcd::client::{EtcdClient, EventKind, KeyValue, Range, WatchKeys, WatchStream};
use leasehold_etcd::{EtcdError, EtcdLocker, etcd_error};
use leasehold_testkit::{Direction, EtcdCluster, FaultProxy};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Long enough to ride out an election (about a second with the test
/// kit's timers); a test that waits this long has failed.
const PATIENT: Duration = Duration::from_secs(15);

fn start() -> EtcdCluster {
    EtcdCluster::start(3).expect("etcd cluster (scripts/install-deps.sh installs etcd)")
}

fn patient() -> Instant {
    Instant::now() + PATIENT
}

/// A locker on `cluster` whose keys are all under `prefix`.
async fn locker(cluster: &EtcdCluster, prefix: &str) -> Result<EtcdLocker, Error> {
    locker_at(cluster, prefix, 0).await
}

/// [`locker`], sending to member `first` first.
async fn locker_at(cluster: &EtcdCluster, prefix: &str, first: usize) -> Result<EtcdLocker, Error> {
    let mut endpoints = cluster.endpoints();
    endpoints.swap(0, first);
    EtcdLocker::builder(endpoints)
        .prefix(prefix)
        .command_timeout(Duration::from_secs(3))
        .connect()
        .await
}

/// A raw client, to look at (and meddle with) what the locker wrote.
fn raw(cluster: &EtcdCluster) -> EtcdClient {
    EtcdClient::builder(cluster.endpoints())
        .build()
        .expect("client")
}

/// The waiter keys of `lock` under `prefix`, oldest first.
async fn queue(etcd: &EtcdClient, prefix: &str, lock: &str) -> Vec<KeyValue> {
    let range = Range::prefix(format!("{prefix}lock/{lock}/")).oldest_first();
    etcd.range(&range, patient()).await.expect("read queue").kvs
}

/// A watch on `lock`'s queue from now: tells when a waiter joins.
async fn watch_queue(etcd: &EtcdClient, prefix: &str, lock: &str) -> WatchStream {
    etcd.watch(
        &WatchKeys::prefix(format!("{prefix}lock/{lock}/")),
        0,
        patient(),
    )
    .await
    .expect("watch queue")
}

/// Waits (by watch) for the next waiter to join the queue.
async fn joined(watch: &mut WatchStream) {
    timeout(PATIENT, async {
        loop {
            let batch = watch.next().await.expect("watch");
            if batch
                .events
                .iter()
                .any(|e| e.kind == EventKind::Put && e.kv.version == 1)
            {
                return;
            }
        }
    })
    .await
    .expect("a waiter joined the queue");
}

fn fence(lease: &Lease) -> u64 {
    lease.fence().expect("a fenced lease").get()
}

/// Revokes, behind the holder's back, the etcd lease of the key at the
/// head of `lock`'s queue (an operator's `etcdctl lease revoke`).
async fn revoke_head(etcd: &EtcdClient, prefix: &str, lock: &str) {
    let head = queue(etcd, prefix, lock).await;
    let lease = head.first().expect("a holder").lease;
    assert!(etcd.revoke(lease, patient()).await.expect("revoke"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_taken_given_back_and_leaves_nothing_behind() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-basic/", raw(&cluster));
    let locker = locker(&cluster, prefix).await?;
    let keys = FencedKeys::for_resource("w1")?;
    let lease = locker.acquire(&keys, Duration::from_secs(5)).await?;
    let held = queue(&etcd, prefix, "lock:{w1}").await;
    assert_eq!(held.len(), 1);
    assert_eq!(fence(&lease), u64::try_from(held[0].create_revision)?);
    assert_eq!(lease.fence_key_for("lock:{w1}"), Some("etcd:fence:{w1}"));
    assert!(lease.remaining() > Duration::from_secs(3));
    lease.release().await?;
    assert!(queue(&etcd, prefix, "lock:{w1}").await.is_empty());
    // Tokens strictly increase across holders.
    let mut last = 0;
    for _ in 0..5 {
        let lease = locker.acquire(&keys, Duration::from_secs(5)).await?;
        assert!(fence(&lease) > last, "{} after {last}", fence(&lease));
        last = fence(&lease);
        lease.release().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_watch_in_the_order_they_queued() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-fifo/", raw(&cluster));
    let locker = locker(&cluster, prefix).await?;
    let keys = FencedKeys::for_resource("w2")?;
    let ttl = Duration::from_secs(5);
    let holder = locker.acquire(&keys, ttl).await?;
    let mut joins = watch_queue(&etcd, prefix, "lock:{w2}").await;
    let (won, mut wins) = tokio::sync::mpsc::unbounded_channel();
    let opts = AcquireOptions::new().wait(PATIENT);
    let mut waiters = Vec::new();
    for name in ["a", "b"] {
        let (locker, keys, opts, won) = (locker.clone(), keys.clone(), opts.clone(), won.clone());
        waiters.push(tokio::spawn(async move {
            let lease = locker.acquire_with(&keys, ttl, &opts).await?;
            let _ = won.send((name, lease));
            Ok::<_, Error>(())
        }));
        // The next waiter starts only once this one is in the queue.
        joined(&mut joins).await;
    }
    assert_eq!(queue(&etcd, prefix, "lock:{w2}").await.len(), 3);
    assert!(
        wins.try_recv().is_err(),
        "a waiter won while the lock was held"
    );
    let first_fence = fence(&holder);
    holder.release().await?;
    let (name, a) = timeout(PATIENT, wins.recv()).await?.expect("a winner");
    assert_eq!(name, "a");
    assert!(fence(&a) > first_fence);
    assert!(wins.try_recv().is_err(), "b won while a held the lock");
    let a_fence = fence(&a);
    a.release().await?;
    let (name, b) = timeout(PATIENT, wins.recv()).await?.expect("a winner");
    assert_eq!(name, "b");
    assert!(fence(&b) > a_fence);
    b.release().await?;
    for waiter in waiters {
        waiter.await??;
    }
    assert!(queue(&etcd, prefix, "lock:{w2}").await.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giving_up_on_a_held_lock_leaves_no_key_behind() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-give-up/", raw(&cluster));
    let locker = locker(&cluster, prefix).await?;
    let holder = locker.acquire("busy", Duration::from_secs(5)).await?;
    let mut changes = watch_queue(&etcd, prefix, "busy").await;
    let opts = AcquireOptions::new().wait(Duration::from_millis(300));
    let started = Instant::now();
    match locker
        .acquire_with("busy", Duration::from_secs(30), &opts)
        .await
    {
        Err(Error::NotAcquired {
            reason: GiveUpReason::DeadlineExpired,
            ..
        }) => {}
        other => panic!("expected NotAcquired, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    // The waiter's key goes with its lease, long before its 30 s TTL
    // (revoked; the revoke may finish just after the acquire returned: it
    // is not awaited past the caller's deadline). Then only the holder is
    // queued.
    left(&mut changes).await;
    assert_eq!(queue(&etcd, prefix, "busy").await.len(), 1);
    // One look, no wait: given up at once.
    let once = AcquireOptions::new().retry(leasehold::RetryStrategy::none());
    assert!(matches!(
        locker
            .acquire_with("busy", Duration::from_secs(5), &once)
            .await,
        Err(Error::NotAcquired {
            reason: GiveUpReason::RetriesExhausted,
            ..
        })
    ));
    holder.release().await?;
    assert!(queue(&etcd, prefix, "busy").await.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_extends_the_lease_and_a_revoked_lease_is_reported_lost() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-refresh/", raw(&cluster));
    let locker = locker(&cluster, prefix).await?;
    let ttl = Duration::from_secs(5);
    let lease = locker.acquire("r", ttl).await?;
    let before = lease.valid_until();
    lease.refresh(ttl).await?;
    assert!(lease.valid_until() > before);
    assert!(matches!(
        lease.refresh(ttl * 2).await,
        Err(Error::InvalidOptions(_))
    ));
    revoke_head(&etcd, prefix, "r").await;
    assert!(matches!(
        lease.refresh(ttl).await,
        Err(Error::NotHeld { .. })
    ));
    assert!(lease.lost().is_some());
    assert!(matches!(lease.release().await, Err(Error::NotHeld { .. })));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_stops_the_work_when_the_lease_is_revoked() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-watchdog/", raw(&cluster));
    let locker = locker(&cluster, prefix).await?;
    let lease = locker.acquire("wd", Duration::from_secs(3)).await?;
    let (started, mut running) = tokio::sync::oneshot::channel();
    let work = lease.run(async move {
        let _ = started.send(());
        std::future::pending::<()>().await;
    });
    let meddle = async {
        (&mut running).await.expect("work started");
        revoke_head(&etcd, prefix, "wd").await;
    };
    let (ran, ()) = timeout(PATIENT, async { tokio::join!(work, meddle) }).await?;
    assert!(matches!(ran, Err(Error::LeaseLost { .. })), "{ran:?}");
    assert!(matches!(lease.release().await, Err(Error::NotHeld { .. })));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lease_survives_its_leader_stopping() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-leader/", raw(&cluster));
    // The locker talks to the leader first, so the refresh must move.
    let leader = cluster.wait_for_leader(PATIENT)?;
    let locker = locker_at(&cluster, prefix, leader).await?;
    let ttl = Duration::from_secs(8);
    let lease = locker.acquire("l", ttl).await?;
    cluster.member(leader).stop()?;
    let before = lease.valid_until();
    lease.refresh(ttl).await?;
    assert!(lease.valid_until() > before);
    assert!(lease.lost().is_none());
    // Still held: another acquirer does not get it.
    let opts = AcquireOptions::new().wait(Duration::from_millis(500));
    assert!(matches!(
        locker.acquire_with("l", ttl, &opts).await,
        Err(Error::NotAcquired { .. })
    ));
    lease.release().await?;
    assert!(queue(&etcd, prefix, "l").await.is_empty());
    Ok(())
}

/// Waits until `member` answers a quorum read again (its health check), a
/// resumed member having caught up.
async fn healthy_again(cluster: &EtcdCluster, member: usize) -> TestResult {
    let member = cluster.member(member);
    timeout(PATIENT, async {
        while !tokio::task::block_in_place(|| member.is_healthy()) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await?;
    Ok(())
}

/// One slow member costs a held lease nothing (issue 37): the member the
/// holder talks to is paused (SIGSTOP: its connections stay open, nothing
/// answers) for longer than the lease's TTL, then the member it moved to.
/// Each refresh of the watchdog moves on to a member that answers within
/// its own bound (a third of the TTL), and the next ones start there, so
/// the lease is never lost. The command timeout (3 s) is longer than the
/// TTL: the refresh's attempts fit its bound, not the command timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lease_rides_out_its_member_paused_past_its_ttl_twice() -> TestResult {
    let cluster = start();
    let leader = cluster.wait_for_leader(PATIENT)?;
    let (first, second) = ((leader + 1) % cluster.len(), (leader + 2) % cluster.len());
    // The followers first (the cluster keeps its leader throughout): the
    // holder talks to `first`, and to `second` once `first` is silent.
    let endpoints = [first, second, leader].map(|member| cluster.member(member).endpoint());
    let locker = EtcdLocker::builder(endpoints)
        .prefix("t-slow/")
        .command_timeout(Duration::from_secs(3))
        .connect()
        .await?;
    let ttl = Duration::from_secs(2);
    let lease = locker.acquire("slow", ttl).await?;
    let lost = lease.watch()?;
    for member in [first, second] {
        cluster.member(member).pause()?;
        // Past the TTL: only refreshes that moved on keep the lease.
        let _ = timeout(ttl + ttl / 2, lost.cancelled()).await;
        cluster.member(member).resume()?;
        assert!(
            lease.lost().is_none(),
            "lost while m{member} was paused: {:?}",
            lease.lost()
        );
        healthy_again(&cluster, member).await?;
    }
    // Still held: another caller does not get it.
    let other = locker_at(&cluster, "t-slow/", leader).await?;
    let opts = AcquireOptions::new().wait(Duration::ZERO);
    assert!(matches!(
        other.acquire_with("slow", ttl, &opts).await,
        Err(Error::NotAcquired { .. })
    ));
    assert!(lease.lost().is_none(), "{:?}", lease.lost());
    lease.release().await?;
    Ok(())
}

/// A waiter keeps its place while the member it talks to is paused past
/// its TTL (issue 37): its keep-alives move on to a member that answers
/// within their period (a third of the TTL), so its etcd lease, and with
/// it its key and its place in the queue, lives on. The waiter that
/// queued after it, on the leader, is served after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_keeps_its_place_while_its_member_is_paused_past_its_ttl() -> TestResult {
    let cluster = start();
    let prefix = "t-slow-waiter/";
    // 2 s, not etcd's 1 s minimum: the keep-alives' move to another member
    // must land within a third of it, which a busy 2-core machine (the
    // whole suite beside) once missed at 1 s.
    let ttl = Duration::from_secs(2);
    let leader = cluster.wait_for_leader(PATIENT)?;
    let follower = (leader + 1) % cluster.len();
    let on_leader = locker_at(&cluster, prefix, leader).await?;
    // The holder's watchdog keeps it (its member is not paused) until it
    // lets go.
    let holder = on_leader
        .acquire_with("w", ttl, &AcquireOptions::new().watchdog(true))
        .await?;
    let mut joins = watch_queue(&raw(&cluster), prefix, "w").await;
    let waiter = |locker: EtcdLocker| {
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(PATIENT);
            locker.acquire_with("w", ttl, &opts).await
        })
    };
    let first = waiter(locker_at(&cluster, prefix, follower).await?);
    joined(&mut joins).await;
    let second = waiter(on_leader.clone());
    joined(&mut joins).await;
    cluster.member(follower).pause()?;
    // Past the waiters' TTL.
    tokio::time::sleep(ttl * 3).await;
    cluster.member(follower).resume()?;
    healthy_again(&cluster, follower).await?;
    assert!(holder.lost().is_none(), "{:?}", holder.lost());
    holder.release().await?;
    let lease = timeout(PATIENT, first).await???;
    if second.is_finished() {
        // Served while the first holds it, or given up with an error:
        // either fails, and says which.
        let outcome = second.await?.map(|lease| lease.fence());
        panic!("the second waiter finished while the first held the lock: {outcome:?}");
    }
    lease.release().await?;
    timeout(PATIENT, second).await???.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_accepts_the_newer_etcd_holder_and_refuses_the_older() -> TestResult {
    let cluster = start();
    let pg = leasehold_testkit::PostgresServer::start()?;
    let mut db = leasehold_pg::connect(&pg.url()).await?;
    leasehold_pg::setup(&mut db).await?;
    let (prefix, etcd) = ("t-guard/", raw(&cluster));
    let locker = locker(&cluster, prefix).await?;
    let keys = FencedKeys::for_resource("g")?;
    let ttl = Duration::from_secs(5);
    let old = locker.acquire(&keys, ttl).await?;
    // The old holder's lease ends behind its back (it is paused, say),
    // and a newer holder takes the lock.
    revoke_head(&etcd, prefix, "lock:{g}").await;
    let new = locker.acquire(&keys, ttl).await?;
    assert!(fence(&new) > fence(&old));
    let tx = db.transaction().await?;
    assert!(leasehold_pg::guard(&tx, &new).await?.is_accepted());
    tx.commit().await?;
    let tx = db.transaction().await?;
    let refused = leasehold_pg::guard(&tx, &old).await?;
    assert!(!refused.is_accepted(), "{refused:?}");
    tx.rollback().await?;
    new.release().await?;
    assert!(matches!(old.release().await, Err(Error::NotHeld { .. })));
    Ok(())
}

/// Moving a resource from Redis to etcd: a Redis fence (about 1.8 x
/// 10^15) and an etcd revision (small) are never compared. Each backend
/// has its own row for the resource in the fence table, so the guard is not
/// confused by the switch (an etcd holder is not refused as "older" than
/// the last Redis holder, and the Redis row keeps ordering Redis holders).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_and_etcd_holders_of_one_resource_are_fenced_in_rows_of_their_own() -> TestResult {
    let cluster = start();
    let redis = leasehold_testkit::RedisServer::start()?;
    let pg = leasehold_testkit::PostgresServer::start()?;
    let mut db = leasehold_pg::connect(&pg.url()).await?;
    leasehold_pg::setup(&mut db).await?;
    let keys = FencedKeys::for_resource("moving")?;
    let ttl = Duration::from_secs(5);
    let on_redis = leasehold::Locker::connect(&leasehold::client(&redis.url())?).await?;
    let on_etcd = locker(&cluster, "t-moving/").await?;

    let before = on_redis.acquire(&keys, ttl).await?;
    let (redis_row, redis_fence) = (
        before
            .fence_key_for(before.key())
            .ok_or("redis fence key")?
            .to_owned(),
        fence(&before),
    );
    let tx = db.transaction().await?;
    assert!(leasehold_pg::guard(&tx, &before).await?.is_accepted());
    tx.commit().await?;
    before.release().await?;

    let after = on_etcd.acquire(&keys, ttl).await?;
    let (etcd_row, etcd_fence) = (
        after
            .fence_key_for(after.key())
            .ok_or("etcd fence key")?
            .to_owned(),
        fence(&after),
    );
    assert!(
        etcd_fence < redis_fence,
        "a revision is far below a redis fence"
    );
    assert_ne!(redis_row, etcd_row);
    let tx = db.transaction().await?;
    assert!(leasehold_pg::guard(&tx, &after).await?.is_accepted());
    tx.commit().await?;
    after.release().await?;

    let rows: Vec<(String, i64)> = db
        .query(
            "SELECT resource, fence FROM leasehold_fences WHERE resource = ANY($1)",
            &[&vec![redis_row.clone(), etcd_row.clone()]],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (resource, stored) in rows {
        let expected = if resource == redis_row {
            redis_fence
        } else {
            etcd_fence
        };
        assert_eq!(u64::try_from(stored)?, expected, "{resource}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_the_queue_and_bad_options_are_refused() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-cancel/", raw(&cluster));
    let locker = locker(&cluster, prefix).await?;
    let ttl = Duration::from_secs(5);
    let holder = locker.acquire("c", ttl).await?;
    let mut joins = watch_queue(&etcd, prefix, "c").await;
    let cancel = leasehold::CancellationToken::new();
    let opts = AcquireOptions::new().wait(PATIENT).cancel(cancel.clone());
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.acquire_with("c", ttl, &opts).await })
    };
    joined(&mut joins).await;
    assert_eq!(queue(&etcd, prefix, "c").await.len(), 2);
    cancel.cancel();
    match timeout(PATIENT, waiter).await?? {
        Err(Error::NotAcquired {
            reason: GiveUpReason::Cancelled,
            ..
        }) => {}
        other => panic!("expected a cancelled acquire, got {other:?}"),
    }
    assert_eq!(queue(&etcd, prefix, "c").await.len(), 1);
    holder.release().await?;
    // etcd commits on a majority: there are no replicas to wait for.
    let replicas = AcquireOptions::new().wait_replicas(1, Duration::from_millis(100));
    assert!(matches!(
        locker.acquire_with("c", ttl, &replicas).await,
        Err(Error::InvalidOptions(_))
    ));
    assert!(queue(&etcd, prefix, "c").await.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_locks_are_taken_as_one_lease_and_kept_by_one_watchdog() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-all/", raw(&cluster));
    let locker = locker(&cluster, prefix).await?;
    let (a, b) = (
        FencedKeys::for_resource("x")?,
        FencedKeys::for_resource("y")?,
    );
    let ttl = Duration::from_secs(3);
    let opts = AcquireOptions::new().watchdog(true);
    let lease = locker.acquire_all([&b, &a], ttl, &opts).await?;
    assert_eq!(lease.keys().collect::<Vec<_>>(), ["lock:{x}", "lock:{y}"]);
    let (fx, fy) = (
        lease.fence_for("lock:{x}").expect("fenced"),
        lease.fence_for("lock:{y}").expect("fenced"),
    );
    assert!(fx < fy, "taken in key order");
    // Past the TTL (etcd would have ended both etcd leases), kept by the
    // one watchdog.
    let first = lease.valid_until();
    tokio::time::sleep_until(first + Duration::from_secs(1)).await;
    assert!(lease.valid_until() > first);
    assert!(lease.lost().is_none());
    assert_eq!(queue(&etcd, prefix, "lock:{x}").await.len(), 1);
    assert_eq!(queue(&etcd, prefix, "lock:{y}").await.len(), 1);
    // Another caller does not get either.
    let once = AcquireOptions::new().retry(leasehold::RetryStrategy::none());
    assert!(locker.acquire_with(&a, ttl, &once).await.is_err());
    lease.release().await?;
    assert!(queue(&etcd, prefix, "lock:{x}").await.is_empty());
    assert!(queue(&etcd, prefix, "lock:{y}").await.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_over_etcd_names_its_leader_and_hands_over_on_resign() -> TestResult {
    let cluster = start();
    let locker = locker(&cluster, "t-election/").await?;
    let election = |name: &str| {
        leasehold::Election::builder(locker.clone(), "jobs")
            .candidate(name)
            .ttl(Duration::from_secs(3))
            .build()
    };
    let (one, two) = (election("one")?, election("two")?);
    assert!(one.leader().await?.is_none());
    let term = one.campaign().await?;
    let leader = one.leader().await?.expect("a leader");
    assert_eq!(leader.candidate, "one");
    assert_eq!(leader.fence, term.fence());
    assert!(leader.expires_within > Duration::ZERO);
    let second = tokio::spawn(async move {
        let term = two.campaign().await?;
        let leader = two.leader().await?;
        Ok::<_, Error>((term, leader))
    });
    let first_fence = term.fence();
    term.resign().await?;
    let (term, leader) = timeout(PATIENT, second).await???;
    assert!(term.fence() > first_fence);
    assert_eq!(leader.expect("a leader").candidate, "two");
    term.resign().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_checks_the_key_not_just_the_keep_alive() -> TestResult {
    use leasehold_etcd::client::{Op, Txn};
    let cluster = start();
    let (prefix, etcd) = ("t-key-loss/", raw(&cluster));
    let locker = locker(&cluster, prefix).await?;
    let ttl = Duration::from_secs(5);
    let lease = locker.acquire("k", ttl).await?;
    // An operator deletes the lock key; its etcd lease lives on, so a
    // keep-alive alone would still succeed.
    let head = queue(&etcd, prefix, "k").await;
    let key = head.first().expect("a holder").key.clone();
    etcd.txn(&Txn::new().then(Op::delete(key)), patient())
        .await?;
    assert!(etcd.keep_alive_once(head[0].lease, patient()).await? > 0);
    assert!(matches!(
        lease.refresh(ttl).await,
        Err(Error::NotHeld { .. })
    ));
    assert!(matches!(lease.release().await, Err(Error::NotHeld { .. })));
    // The release revoked the etcd lease all the same.
    assert!(etcd.time_to_live(head[0].lease, patient()).await?.is_none());
    Ok(())
}

/// A holder of `lock` talking to the leader, and a waiter for it (spawned,
/// waiting up to `wait`) talking to a follower, already in the queue; the
/// follower's index. A follower, so that the test can take it away and
/// the cluster keeps its leader (stopping the leader would make the
/// holder's release, a write under way during the election, end with an
/// unknown outcome: another test's subject).
async fn a_waiter_on_a_follower(
    cluster: &EtcdCluster,
    prefix: &str,
    lock: &'static str,
    ttl: Duration,
    wait: Duration,
) -> Result<
    (Lease, JoinHandle<Result<Lease, Error>>, usize),
    Box<dyn std::error::Error + Send + Sync>,
> {
    let leader = cluster.wait_for_leader(PATIENT)?;
    let follower = (leader + 1) % cluster.len();
    let holder = locker_at(cluster, prefix, leader)
        .await?
        .acquire(lock, ttl)
        .await?;
    let waiter_side = locker_at(cluster, prefix, follower).await?;
    let mut joins = watch_queue(&raw(cluster), prefix, lock).await;
    let waiter = tokio::spawn(async move {
        let opts = AcquireOptions::new().wait(wait);
        waiter_side.acquire_with(lock, ttl, &opts).await
    });
    joined(&mut joins).await;
    Ok((holder, waiter, follower))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_member_stops_still_gets_the_lock_when_it_is_released() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-watch-moves/", raw(&cluster));
    let (holder, waiter, follower) =
        a_waiter_on_a_follower(&cluster, prefix, "m", Duration::from_secs(5), PATIENT).await?;
    // The member the waiter watches on goes away; its watch breaks and
    // must resume on another member, missing nothing.
    cluster.member(follower).stop()?;
    assert!(!waiter.is_finished());
    let held = token_of(&holder);
    holder.release().await?;
    let lease = timeout(PATIENT, waiter).await???;
    assert_eq!(lease.key(), "m");
    assert_eq!(queue(&etcd, prefix, "m").await.len(), 1);
    assert_ne!(lease.token(), &held);
    lease.release().await?;
    Ok(())
}

/// The member a waiter watches on is paused (silent: its connections stay
/// open, nothing answers): the waiter's watch moves to another member, so
/// the release is seen while the member is still paused, not when it
/// wakes (nor never, within the wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_member_is_paused_still_gets_the_lock_when_it_is_released() -> TestResult {
    let cluster = start();
    let prefix = "t-watch-paused/";
    let wait = Duration::from_secs(10);
    let (holder, waiter, follower) =
        a_waiter_on_a_follower(&cluster, prefix, "p", Duration::from_secs(3), wait).await?;
    cluster.member(follower).pause()?;
    holder.release().await?;
    let lease = timeout(PATIENT, waiter).await??;
    let still_paused = cluster.member(follower).is_paused();
    cluster.member(follower).resume()?;
    let lease = lease?;
    assert!(still_paused);
    assert_eq!(lease.key(), "p");
    lease.release().await?;
    Ok(())
}

/// A copy of the holder's token, to tell the next holder from it.
fn token_of(lease: &Lease) -> leasehold::LeaseToken {
    lease.token().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_answer_is_lost_is_settled_on_another_member() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-unknown/", raw(&cluster));
    // A follower, so that the cluster keeps its leader while it is paused.
    let paused = (cluster.wait_for_leader(PATIENT)? + 1) % cluster.len();
    let mut endpoints = cluster.endpoints();
    endpoints.swap(0, paused);
    let locker = EtcdLocker::builder(endpoints)
        .prefix(prefix)
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await?;
    let lease = locker.acquire("u", Duration::from_secs(10)).await?;
    // The member the locker talks to stops answering: the delete sent
    // there may or may not be applied. The guarded delete is sent again
    // on another member, where the key is still ours, and its success is
    // known (a NotHeld here would be a claim the release cannot know).
    cluster.member(paused).pause()?;
    let released = lease.release().await;
    cluster.member(paused).resume()?;
    assert!(released.is_ok(), "{released:?}");
    assert!(queue(&etcd, prefix, "u").await.is_empty());
    Ok(())
}

/// The release's delete is applied but its answer is held up (the
/// replies of the member it went to are delayed past the release's time):
/// the try on another member finds it applied (the released key its
/// transaction wrote under our etcd lease), so the release is a success it
/// knows, not an unknown outcome; and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_applied_whose_answer_is_lost_is_known_to_be_released() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-applied/", raw(&cluster));
    let proxy = FaultProxy::start(cluster.member(0).client_addr())?;
    let mut endpoints = cluster.endpoints();
    endpoints[0] = format!("http://{}", proxy.addr());
    let locker = EtcdLocker::builder(endpoints)
        .prefix(prefix)
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await?;
    let lease = locker.acquire("a", Duration::from_secs(10)).await?;
    proxy.set_latency(Direction::Downstream, Duration::from_secs(10));
    let released = lease.release().await;
    assert!(released.is_ok(), "{released:?}");
    let left = etcd.range(&Range::prefix(prefix), patient()).await?.kvs;
    assert!(left.is_empty(), "{left:?}");
    Ok(())
}

/// A cluster out of space (etcd's `NOSPACE` alarm: every write that
/// stores is refused, deletes and revokes still apply): a holder still
/// gives its lock back (the delete alone, without the released key); an
/// acquire rides it out within its wait, as on a full Redis: one whose
/// wait runs out during it gets the refusal, typed, and one whose wait
/// outlasts the alarm takes the lock once an operator clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_out_of_space_still_takes_its_locks_back() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-nospace/", raw(&cluster));
    let locker = locker(&cluster, prefix).await?;
    let lease = locker.acquire("s", Duration::from_secs(10)).await?;
    cluster.member(0).set_no_space_alarm(true)?;
    let released = lease.release().await;
    assert!(released.is_ok(), "{released:?}");
    assert!(queue(&etcd, prefix, "s").await.is_empty());
    let patient_one = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(PATIENT);
            locker
                .acquire_with("s", Duration::from_secs(10), &opts)
                .await
        })
    };
    let opts = AcquireOptions::new().wait(Duration::from_secs(1));
    let refused = locker
        .acquire_with("s", Duration::from_secs(10), &opts)
        .await;
    match &refused {
        Err(err) if etcd_error(err).is_some_and(EtcdError::is_no_space) => {}
        other => panic!("an acquire whose wait ran out on a full cluster: {other:?}"),
    }
    assert!(!patient_one.is_finished());
    cluster.member(0).set_no_space_alarm(false)?;
    let lease = timeout(PATIENT, patient_one).await???;
    lease.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_and_an_unreachable_cluster_fail_at_connect() {
    let nobody = EtcdLocker::builder(["http://127.0.0.1:1"])
        .command_timeout(Duration::from_millis(300))
        .connect()
        .await;
    assert!(
        matches!(&nobody, Err(Error::Service { op: "connect", .. })),
        "{nobody:?}"
    );
    assert!(matches!(
        EtcdLocker::builder(["not a url"]).connect().await,
        Err(Error::Service { op: "connect", .. })
    ));
    assert!(matches!(
        EtcdLocker::builder(["http://127.0.0.1:1"])
            .command_timeout(Duration::ZERO)
            .connect()
            .await,
        Err(Error::InvalidOptions(_))
    ));
    assert!(matches!(
        EtcdLocker::builder(Vec::<String>::new()).connect().await,
        Err(Error::Service { op: "connect", .. })
    ));
}

/// Waits (by watch) for a key to leave the queue.
async fn left(watch: &mut WatchStream) {
    timeout(PATIENT, async {
        loop {
            let batch = watch.next().await.expect("watch");
            if batch.events.iter().any(|e| e.kind == EventKind::Delete) {
                return;
            }
        }
    })
    .await
    .expect("a key left the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquire_and_a_dropped_lease_leave_nothing_behind() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-dropped/", raw(&cluster));
    let locker = locker(&cluster, prefix).await?;
    let ttl = Duration::from_secs(30);
    let holder = locker.acquire("d", ttl).await?;
    let mut changes = watch_queue(&etcd, prefix, "d").await;
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(PATIENT);
            locker.acquire_with("d", ttl, &opts).await
        })
    };
    joined(&mut changes).await;
    waiter.abort();
    // Gone long before its 30 s TTL: the dropped acquire revoked its lease.
    left(&mut changes).await;
    assert_eq!(queue(&etcd, prefix, "d").await.len(), 1);
    drop(holder);
    left(&mut changes).await;
    assert!(queue(&etcd, prefix, "d").await.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_a_leader_election_within_its_wait() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-election-fault/", raw(&cluster));
    let leader = cluster.wait_for_leader(PATIENT)?;
    let follower = (leader + 1) % cluster.len();
    let holder_side = locker_at(&cluster, prefix, follower).await?;
    let mut endpoints = cluster.endpoints();
    endpoints.swap(0, follower);
    // One request cannot outlast the election: the waiter's requests fail
    // while it runs (keep-alives every 0.67 s among them), and the wait
    // must ride that out.
    let waiter_side = EtcdLocker::builder(endpoints)
        .prefix(prefix)
        .command_timeout(Duration::from_millis(300))
        .connect()
        .await?;
    let holder = holder_side.acquire("e", Duration::from_secs(10)).await?;
    let mut joins = watch_queue(&etcd, prefix, "e").await;
    let waiter = tokio::spawn(async move {
        let opts = AcquireOptions::new().wait(PATIENT);
        waiter_side
            .acquire_with("e", Duration::from_secs(2), &opts)
            .await
    });
    joined(&mut joins).await;
    cluster.member(leader).stop()?;
    tokio::task::block_in_place(|| cluster.wait_for_leader(PATIENT))?;
    assert!(!waiter.is_finished());
    holder.release().await?;
    let lease = timeout(PATIENT, waiter).await???;
    assert_eq!(lease.key(), "e");
    lease.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_started_during_an_election_gets_the_lock_within_its_wait() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-election-start/", raw(&cluster));
    let leader = cluster.wait_for_leader(PATIENT)?;
    let mut endpoints = cluster.endpoints();
    endpoints.swap(0, (leader + 1) % cluster.len());
    // Each request gives up after 300 ms; the cluster has no leader for
    // at least its 500 ms election timeout.
    let locker = EtcdLocker::builder(endpoints)
        .prefix(prefix)
        .command_timeout(Duration::from_millis(300))
        .connect()
        .await?;
    cluster.member(leader).stop()?;
    let opts = AcquireOptions::new().wait(PATIENT);
    let lease = locker
        .acquire_with(
            FencedKeys::for_resource("s")?,
            Duration::from_secs(3),
            &opts,
        )
        .await?;
    assert!(lease.remaining() > Duration::ZERO);
    assert_eq!(queue(&etcd, prefix, "lock:{s}").await.len(), 1);
    lease.release().await?;
    assert!(queue(&etcd, prefix, "lock:{s}").await.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_etcd_lease_ends_joins_the_queue_again() -> TestResult {
    let cluster = start();
    let (prefix, etcd) = ("t-rejoin/", raw(&cluster));
    let locker = locker(&cluster, prefix).await?;
    let ttl = Duration::from_secs(5);
    let holder = locker.acquire("j", ttl).await?;
    let mut joins = watch_queue(&etcd, prefix, "j").await;
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(PATIENT);
            locker.acquire_with("j", ttl, &opts).await
        })
    };
    joined(&mut joins).await;
    let first = queue(&etcd, prefix, "j").await[1].clone();
    assert!(etcd.revoke(first.lease, patient()).await?);
    // The waiter finds its key gone and joins again, at the back.
    joined(&mut joins).await;
    let again = queue(&etcd, prefix, "j").await;
    assert_eq!(again.len(), 2);
    assert_ne!(again[1].key, first.key);
    assert!(!waiter.is_finished());
    holder.release().await?;
    let lease = timeout(PATIENT, waiter).await???;
    assert_eq!(
        queue(&etcd, prefix, "j").await[0].create_revision,
        again[1].create_revision
    );
    lease.release().await?;
    Ok(())
}

/// What an etcd caller can get from a cluster that stops answering names
/// etcd, never Redis: a refresh, the watchdog's loss, a release after it,
/// an acquire; busy and lost leases name no service wrongly either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_of_a_silent_cluster_names_etcd() -> TestResult {
    let cluster = start();
    let locker = EtcdLocker::builder(cluster.endpoints())
        .prefix("t-names/")
        .command_timeout(Duration::from_millis(600))
        .connect()
        .await?;
    let lease = locker.acquire("names", Duration::from_secs(2)).await?;
    assert_eq!(lease.service(), leasehold::Service::ETCD);
    // Busy: a second caller's give-up.
    let busy = locker
        .acquire_with(
            "names",
            Duration::from_secs(2),
            &AcquireOptions::new().wait(Duration::ZERO),
        )
        .await
        .err()
        .ok_or("a second holder")?;
    let mut said = vec![busy.to_string()];
    for member in cluster.members() {
        member.pause()?;
    }
    let silent = async {
        let refresh = lease.refresh(Duration::from_secs(2)).await.err();
        // The work runs under the watchdog until it cannot confirm the
        // lease before its deadline.
        let ran = lease.run(std::future::pending::<()>()).await.err();
        let acquire = locker
            .acquire_with(
                "names-other",
                Duration::from_secs(2),
                &AcquireOptions::new().wait(Duration::from_millis(300)),
            )
            .await
            .err();
        (refresh, ran, acquire)
    };
    let (refresh, ran, acquire) = timeout(PATIENT, silent).await?;
    let released = timeout(PATIENT, lease.release()).await?.err();
    for member in cluster.members() {
        member.resume()?;
    }
    let ran = ran.ok_or("the work ran to the end on a silent cluster")?;
    assert!(matches!(ran, Error::LeaseLost { .. }), "{ran:?}");
    for (what, err) in [
        ("refresh", refresh),
        ("run", Some(ran)),
        ("acquire", acquire),
        ("release", released),
    ] {
        let err = err.ok_or(format!("{what} succeeded on a silent cluster"))?;
        let text = err.to_string();
        assert!(text.contains("etcd"), "{what}: {text}");
        said.push(text);
    }
    for text in said {
        assert!(!text.to_lowercase().contains("redis"), "{text}");
    }
    Ok(())
}

/// The suite's faults on a real etcd cluster: a lock expired by revoking
/// its holder's etcd lease (an operator's `etcdctl lease revoke`), every
/// member paused with SIGSTOP. A fence counter cannot be lost on its own
/// (the token is the key's revision), so that fault is not offered.
struct OnEtcd<'a> {
    cluster: &'a EtcdCluster,
    raw: EtcdClient,
    prefix: &'a str,
}

fn testkit(err: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::service(
        leasehold::Service::named("testkit"),
        "fault",
        leasehold::backend::ServiceFault::Refused,
        err,
    )
}

impl leasehold::conformance::Faults for OnEtcd<'_> {
    fn offers(&self) -> leasehold::conformance::Offered {
        leasehold::conformance::Offered::ALL.lose_fence(false)
    }

    async fn expire(&self, key: &str) -> leasehold::Result<()> {
        revoke_head(&self.raw, self.prefix, key).await;
        Ok(())
    }

    async fn pause(&self) -> leasehold::Result<()> {
        let members = self.cluster.members();
        members.iter().try_for_each(|m| m.pause().map_err(testkit))
    }

    async fn resume(&self) -> leasehold::Result<()> {
        let members = self.cluster.members();
        members.iter().try_for_each(|m| m.resume().map_err(testkit))
    }
}

/// etcd keeps the `LockService` contract's checks: the conformance suite
/// passes every check it can run (a lost counter is not a fault etcd can
/// have: the token is a revision).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_passes_the_conformance_suite() -> TestResult {
    use leasehold::conformance::{self, Settings, Verdict};
    let cluster = start();
    let prefix = "t-conformance/";
    let (one, other) = (
        locker(&cluster, prefix).await?,
        locker(&cluster, prefix).await?,
    );
    let faults = OnEtcd {
        cluster: &cluster,
        raw: raw(&cluster),
        prefix,
    };
    let settings = Settings::default().hang(PATIENT);
    let report = conformance::run_pair(&one, &other, &faults, &settings).await;
    assert!(report.is_ok(), "{report}");
    let skipped: Vec<_> = report
        .checks
        .iter()
        .filter(|c| matches!(c.verdict, Verdict::Skipped(_)))
        .map(|c| c.name)
        .collect();
    assert_eq!(skipped, ["a_lost_counter_is_healed_or_said"], "{report}");
    Ok(())
}
