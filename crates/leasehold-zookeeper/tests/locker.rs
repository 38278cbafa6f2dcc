//! ZooKeeper as the lock service (`ZkLocker`) against a throwaway
//! ZooKeeper server: the conformance suite with the faults it can offer,
//! then the queue's own promises (FIFO, no node left behind by a waiter
//! that gave up, was cancelled or lost its create's answer, the TTL rule,
//! a node deleted by hand, seen by the holder's watch, fences across
//! holders).
//!
//! A ZooKeeper server is a JVM, heavy on a small machine, so this file
//! starts one, with a 1 s tick (sessions of 2 to 20 s, for the suite's
//! 10 s TTL), and one test runs every scenario on it in turn, each on its
//! own keys, reporting every scenario that failed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::backend::{Claim, Held, Reply, ServiceFault, Step, Wake};
use leasehold::conformance::{self, Faults, Offered, Settings, Verdict};
use leasehold::{
    AcquireOptions, CancellationToken, Error, FencedKeys, FencingToken, GiveUpReason, Lessor,
    LockService, LostCause, RetryStrategy, Service,
};
use leasehold_testkit::ZooKeeperEnsemble;
use leasehold_zookeeper::ZkLocker;
use tokio::time::Instant;
use zookeeper_client::Client;

use common::{PATIENCE, until_contenders};

mod common;

type TestResult = common::TestResult;

struct Zk {
    ensemble: ZooKeeperEnsemble,
    raw: Client,
    locker: ZkLocker,
    other: ZkLocker,
}

fn testkit(err: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::service(
        Service::named("testkit"),
        "fault",
        ServiceFault::Refused,
        err,
    )
}

/// The contenders in the lock `key`'s directory, lowest sequence first.
async fn contenders(raw: &Client, dir: &str) -> Result<Vec<String>, zookeeper_client::Error> {
    let mut children = match raw.list_children(dir).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(err) => return Err(err),
    };
    children.sort_by(|a, b| a[a.len().saturating_sub(10)..].cmp(&b[b.len().saturating_sub(10)..]));
    Ok(children)
}

impl Faults for Zk {
    fn offers(&self) -> Offered {
        // No lose_fence: the token is the lock node's czxid, which no
        // counter keeps; losing it means rebuilding the ensemble.
        Offered::ALL.lose_fence(false)
    }

    /// Deletes the holder's node (the lowest contender) by hand.
    async fn expire(&self, key: &str) -> leasehold::Result<()> {
        let dir = self.locker.lock_path(key);
        let nodes = contenders(&self.raw, &dir).await.map_err(testkit)?;
        let holder = nodes.first().ok_or_else(|| testkit(std::fmt::Error))?;
        self.raw
            .delete(&format!("{dir}/{holder}"), None)
            .await
            .map_err(testkit)
    }

    async fn pause(&self) -> leasehold::Result<()> {
        for member in self.ensemble.members() {
            member.pause().map_err(testkit)?;
        }
        Ok(())
    }

    async fn resume(&self) -> leasehold::Result<()> {
        for member in self.ensemble.members() {
            member.resume().map_err(testkit)?;
        }
        Ok(())
    }
}

async fn conformance_suite(zk: &Zk) -> TestResult {
    let report = conformance::run_pair(&zk.locker, &zk.other, zk, &Settings::default()).await;
    let skipped: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| c.verdict != Verdict::Passed)
        .map(|c| c.name)
        .collect();
    if !report.is_ok() || skipped != ["a_lost_counter_is_healed_or_said"] {
        return Err(format!("{report}").into());
    }
    Ok(())
}

/// Waiters are served in the order they queued.
async fn fifo(zk: &Zk) -> TestResult {
    let key = "fifo";
    let dir = zk.locker.lock_path(key);
    let ttl = Duration::from_secs(10);
    let holder = zk.locker.acquire(key, ttl).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for n in 1..=3 {
        let (locker, tx) = (
            if n % 2 == 0 {
                zk.other.clone()
            } else {
                zk.locker.clone()
            },
            tx.clone(),
        );
        waiters.push(tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(PATIENCE);
            let lease = locker.acquire_with(key, ttl, &opts).await?;
            let _ = tx.send(n);
            lease.release().await
        }));
        until_contenders(&zk.raw, &dir, n + 1).await?;
    }
    holder.release().await?;
    for waiter in waiters {
        waiter.await??;
    }
    drop(tx);
    let mut order = Vec::new();
    while let Some(n) = rx.recv().await {
        order.push(n);
    }
    if order != [1, 2, 3] {
        return Err(format!("served in the order {order:?}").into());
    }
    Ok(())
}

/// A waiter that gives up at its deadline, one that is cancelled and one
/// whose acquire is dropped leave no node: the holder's successor wins at
/// its first step.
async fn waiters_that_leave_leave_nothing(zk: &Zk) -> TestResult {
    let key = "leavers";
    let dir = zk.locker.lock_path(key);
    let ttl = Duration::from_secs(10);
    let holder = zk.locker.acquire(key, ttl).await?;

    let short = AcquireOptions::new().wait(Duration::from_millis(300));
    let gave_up = zk.other.acquire_with(key, ttl, &short).await;
    if !matches!(gave_up, Err(Error::NotAcquired { .. })) {
        return Err(format!("a waiter past its deadline: {gave_up:?}").into());
    }
    until_contenders(&zk.raw, &dir, 1).await?;

    let cancel = CancellationToken::new();
    let opts = AcquireOptions::new().wait(PATIENCE).cancel(cancel.clone());
    let other = zk.other.clone();
    let cancelled = tokio::spawn(async move { other.acquire_with(key, ttl, &opts).await });
    until_contenders(&zk.raw, &dir, 2).await?;
    cancel.cancel();
    let cancelled = cancelled.await?;
    if !matches!(
        cancelled,
        Err(Error::NotAcquired {
            reason: GiveUpReason::Cancelled,
            ..
        })
    ) {
        return Err(format!("a cancelled waiter: {cancelled:?}").into());
    }
    until_contenders(&zk.raw, &dir, 1).await?;

    let other = zk.other.clone();
    let dropped = tokio::spawn(async move {
        let opts = AcquireOptions::new().wait(PATIENCE);
        other.acquire_with(key, ttl, &opts).await
    });
    until_contenders(&zk.raw, &dir, 2).await?;
    dropped.abort();
    let _ = dropped.await;
    until_contenders(&zk.raw, &dir, 1).await?;

    holder.release().await?;
    let once = AcquireOptions::new().retry(RetryStrategy::none());
    let next = zk.other.acquire_with(key, ttl, &once).await?;
    next.release().await?;
    Ok(())
}

/// A create whose answer never came (the server paused while it was out)
/// leaves no node once the server is back: the acquire's end found it by
/// its prefix and deleted it.
async fn a_lost_create_leaves_nothing(zk: &Zk) -> TestResult {
    let key = "lost-create";
    let dir = zk.locker.lock_path(key);
    let ttl = Duration::from_secs(10);
    // The directory exists, so the create is the first request out.
    zk.locker.acquire(key, ttl).await?.release().await?;
    zk.pause().await?;
    let short = AcquireOptions::new().wait(Duration::from_millis(300));
    let lost = zk.locker.acquire_with(key, ttl, &short).await;
    zk.resume().await?;
    if lost.is_ok() {
        return Err("an acquire while the server was paused won".into());
    }
    // The same session's next request is served after the create, if it
    // ever landed: the directory then shows it, until it is deleted.
    zk.locker
        .acquire("lost-create-probe", ttl)
        .await?
        .release()
        .await?;
    until_contenders(&zk.raw, &dir, 0).await?;
    let once = AcquireOptions::new().retry(RetryStrategy::none());
    zk.other
        .acquire_with(key, ttl, &once)
        .await?
        .release()
        .await?;
    Ok(())
}

/// A TTL above the negotiated session timeout is refused before any I/O;
/// the session timeout itself is accepted.
async fn ttl_above_the_session_is_refused(zk: &Zk) -> TestResult {
    let session = zk.locker.session_timeout();
    let too_long = zk
        .locker
        .acquire("ttl-rule", session + Duration::from_millis(1))
        .await;
    if !matches!(too_long, Err(Error::InvalidOptions(_))) {
        return Err(format!("a ttl above the session timeout: {too_long:?}").into());
    }
    zk.locker
        .acquire("ttl-rule", session)
        .await?
        .release()
        .await?;
    Ok(())
}

/// A holder whose node an operator deleted is told by its watchdog: the
/// work under it stops with `LeaseLost`.
async fn a_deleted_node_is_a_lost_lease(zk: &Zk) -> TestResult {
    let key = "deleted";
    let opts = AcquireOptions::new().wait(PATIENCE);
    let got = zk
        .locker
        .with_lock(key, Duration::from_secs(1), &opts, async |lease| {
            zk.expire(lease.key()).await?;
            std::future::pending::<()>().await;
            Ok::<(), Error>(())
        })
        .await;
    if !matches!(got, Err(Error::LeaseLost { .. })) {
        return Err(format!("work under a deleted node: {:?}", got.map(|d| d.output)).into());
    }
    Ok(())
}

/// A `ZkLocker` that counts the refreshes sent through it and notes how
/// many had been sent when its holder's watch fired.
#[derive(Clone)]
struct Counted {
    inner: ZkLocker,
    refreshes: Arc<AtomicU32>,
    /// The refreshes sent when the holder's watch fired, once it did.
    fired_after: Arc<Mutex<Option<u32>>>,
    /// Told when a holder's watch first waits (its request sent).
    armed: Arc<tokio::sync::Notify>,
}

impl Counted {
    fn new(inner: ZkLocker) -> Counted {
        Counted {
            inner,
            refreshes: Arc::default(),
            fired_after: Arc::default(),
            armed: Arc::default(),
        }
    }

    fn fired_after(&self) -> Option<u32> {
        *self
            .fired_after
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl LockService for Counted {
    type Entry = <ZkLocker as LockService>::Entry;

    fn service(&self) -> Service {
        self.inner.service()
    }

    fn command_timeout(&self) -> Duration {
        self.inner.command_timeout()
    }

    fn fence_key_of(&self, fence_key: &str) -> String {
        self.inner.fence_key_of(fence_key)
    }

    fn check_ttl(&self, ttl: Duration) -> leasehold::Result<()> {
        self.inner.check_ttl(ttl)
    }

    fn step<'a>(
        &'a self,
        claim: &'a Claim,
        entry: &'a mut Self::Entry,
        deadline: Instant,
    ) -> Reply<'a, Step> {
        self.inner.step(claim, entry, deadline)
    }

    fn undo<'a>(
        &'a self,
        claim: &'a Claim,
        entry: &'a mut Self::Entry,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        self.inner.undo(claim, entry, deadline)
    }

    fn leave<'a>(
        &'a self,
        claim: &'a Claim,
        entry: &'a mut Self::Entry,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        self.inner.leave(claim, entry, deadline)
    }

    fn abandon(&self, claim: Claim, entry: Self::Entry, maybe_taken: bool) {
        self.inner.abandon(claim, entry, maybe_taken);
    }

    fn refresh<'a>(&'a self, held: &'a Held, ttl: Duration, deadline: Instant) -> Reply<'a, bool> {
        self.refreshes.fetch_add(1, Ordering::SeqCst);
        self.inner.refresh(held, ttl, deadline)
    }

    fn release<'a>(&'a self, held: &'a Held, deadline: Instant) -> Reply<'a, bool> {
        self.inner.release(held, deadline)
    }

    fn raise_fence<'a>(
        &'a self,
        fence_key: &'a str,
        at_least: FencingToken,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        self.inner.raise_fence(fence_key, at_least, deadline)
    }

    fn watch_held(&self, held: &Held) -> Option<Wake> {
        let mut watch = self.inner.watch_held(held)?;
        let (refreshes, fired_after) = (self.refreshes.clone(), self.fired_after.clone());
        let armed = self.armed.clone();
        Some(Box::pin(async move {
            let mut told = false;
            std::future::poll_fn(|cx| {
                let polled = watch.as_mut().poll(cx);
                if polled.is_pending() && !told {
                    told = true;
                    armed.notify_one();
                }
                polled
            })
            .await;
            let sent = refreshes.load(Ordering::SeqCst);
            let mut fired = fired_after
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            fired.get_or_insert(sent);
        }))
    }
}

/// Waits until `lost` fires, then checks the loss was the watch's: it
/// fired before any refresh was sent, and one refresh (the confirming
/// one) was sent in all.
async fn found_lost_by_the_watch(counted: &Counted, lost: &CancellationToken) -> TestResult {
    tokio::time::timeout(PATIENCE, lost.cancelled())
        .await
        .map_err(|_| "the lease was never found lost")?;
    let (fired_after, refreshes) = (
        counted.fired_after(),
        counted.refreshes.load(Ordering::SeqCst),
    );
    if fired_after != Some(0) || refreshes != 1 {
        return Err(format!(
            "the watch fired after {fired_after:?} refreshes; {refreshes} refreshes in all"
        )
        .into());
    }
    Ok(())
}

/// A holder's node deleted by another ZooKeeper client is a lost lease at
/// once: the holder's watch fires before any refresh was sent, and the one
/// refresh that confirms it (the node gone) ends the lease. The TTL is the
/// session timeout (20 s), so the first refresh on the timer is due ~6.7 s
/// after the win: without the watch, that refresh finds the loss, with no
/// watch fired, and this fails.
async fn a_deleted_node_is_seen_by_the_holders_watch(zk: &Zk) -> TestResult {
    let key = "watched";
    let counted = Counted::new(zk.locker.clone());
    let ttl = zk.locker.session_timeout();
    let opts = AcquireOptions::new().watchdog(true);
    let lease = counted.acquire_with(key, ttl, &opts).await?;
    let lost = lease.watch()?;
    // Deleted before or after the watch is set: one set on a missing node
    // fires at once, one set before fires on the deletion.
    zk.expire(key).await?;
    found_lost_by_the_watch(&counted, &lost).await?;
    if lease.lost() != Some(LostCause::Expired) {
        return Err(format!("lost as {:?}", lease.lost()).into());
    }
    let released = lease.release().await;
    if !matches!(released, Err(Error::NotHeld { .. })) {
        return Err(format!("the release of a deleted node: {released:?}").into());
    }
    Ok(())
}

/// A change of the holder's node's data (what an election's leader
/// record writes) is not a loss: the watch is set again, with no refresh
/// sent, and a deletion after it is still seen at once.
async fn a_data_change_on_the_held_node_is_not_a_loss(zk: &Zk) -> TestResult {
    let key = "watched-data";
    let counted = Counted::new(zk.locker.clone());
    let ttl = zk.locker.session_timeout();
    let opts = AcquireOptions::new().watchdog(true);
    let lease = counted.acquire_with(key, ttl, &opts).await?;
    let lost = lease.watch()?;
    tokio::time::timeout(PATIENCE, counted.armed.notified())
        .await
        .map_err(|_| "the holder's watch never waited")?;
    // A request on the holder's session, answered after its watch's.
    LockService::leader_record(&zk.locker, key, "probe").await?;
    let dir = zk.locker.lock_path(key);
    let node = contenders(&zk.raw, &dir)
        .await?
        .first()
        .cloned()
        .ok_or("no holder's node")?;
    zk.raw
        .set_data(&format!("{dir}/{node}"), b"changed", None)
        .await?;
    // The change's event reaches the session before this answer.
    LockService::leader_record(&zk.locker, key, "probe").await?;
    if lease.lost().is_some() || lost.is_cancelled() {
        return Err(format!("a data change lost the lease: {:?}", lease.lost()).into());
    }
    zk.expire(key).await?;
    // A wake on the data change would have cost a refresh (finding the
    // node ours) and left the deletion to the timed refresh: two.
    found_lost_by_the_watch(&counted, &lost).await?;
    Ok(())
}

/// Tokens grow across holders on two sessions, a waiter's included, and
/// are the lock nodes' creation zxids.
async fn fences_grow_across_holders(zk: &Zk) -> TestResult {
    let keys = FencedKeys::for_resource("fenced")?;
    let ttl = Duration::from_secs(10);
    let opts = AcquireOptions::new().wait(PATIENCE);
    let mut last = None;
    for round in 0..4 {
        let locker = if round % 2 == 0 {
            &zk.locker
        } else {
            &zk.other
        };
        let lease = locker.acquire_with(&keys, ttl, &opts).await?;
        let dir = zk.locker.lock_path(lease.key());
        let (_, stat) = zk
            .raw
            .get_data(&format!("{dir}/{}", contenders(&zk.raw, &dir).await?[0]))
            .await?;
        let fence = lease.fence().ok_or("a fenced lease without a token")?;
        if i64::try_from(fence.get())? != stat.czxid {
            return Err(format!("token {fence:?}, node czxid {}", stat.czxid).into());
        }
        if last.is_some_and(|last| fence <= last) {
            return Err(format!("token {fence:?} after {last:?}").into());
        }
        last = Some(fence);
        // A waiter queued now is served next, with a higher token.
        let other = if round % 2 == 0 {
            zk.other.clone()
        } else {
            zk.locker.clone()
        };
        let (waiting_keys, waiting_opts) = (keys.clone(), opts.clone());
        let waiter =
            tokio::spawn(
                async move { other.acquire_with(&waiting_keys, ttl, &waiting_opts).await },
            );
        until_contenders(&zk.raw, &dir, 2).await?;
        lease.release().await?;
        let next = waiter.await??;
        let fence = next.fence().ok_or("a fenced lease without a token")?;
        if last.is_some_and(|last| fence <= last) {
            return Err(format!("the waiter's token {fence:?} after {last:?}").into());
        }
        last = Some(fence);
        next.release().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_locker_keeps_every_promise() -> TestResult {
    let ensemble = ZooKeeperEnsemble::start_with(1, Duration::from_secs(1))?;
    let hosts = ensemble.connect_string();
    let connect = |hosts: String| async move {
        ZkLocker::builder()
            .session_timeout(Duration::from_secs(20))
            .connect(&hosts)
            .await
    };
    let zk = Zk {
        raw: Client::connect(&hosts).await?,
        locker: connect(hosts.clone()).await?,
        other: connect(hosts.clone()).await?,
        ensemble,
    };
    let mut failed = Vec::new();
    macro_rules! scenario {
        ($name:ident) => {
            let start = std::time::Instant::now();
            let outcome = $name(&zk).await;
            eprintln!(
                "{} in {:?}: {:?}",
                stringify!($name),
                start.elapsed(),
                outcome
            );
            if let Err(err) = outcome {
                failed.push(format!("{}: {err}", stringify!($name)));
            }
        };
    }
    scenario!(ttl_above_the_session_is_refused);
    scenario!(fifo);
    scenario!(waiters_that_leave_leave_nothing);
    scenario!(fences_grow_across_holders);
    scenario!(a_deleted_node_is_a_lost_lease);
    scenario!(a_deleted_node_is_seen_by_the_holders_watch);
    scenario!(a_data_change_on_the_held_node_is_not_a_loss);
    scenario!(a_lost_create_leaves_nothing);
    scenario!(conformance_suite);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    Ok(())
}
