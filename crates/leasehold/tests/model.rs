//! A model-based test of the hand-off and relay protocol against a real
//! Redis: random sequences of acquire, release, drop, cancel and key loss
//! (DEL, early expiry) over two relaying lockers (two "processes"), checked
//! against a reference model after every step, once the system has settled.
//!
//! The model checks, at every quiescent point:
//! - **I1** (confirmed hand-over): a holder whose lease no fault touched is
//!   the only such holder, and the key holds *its* token; a release returns
//!   `Ok` exactly when the model says the key still held the lease's token,
//!   `NotHeld` otherwise (after the key was deleted or expired under it).
//! - **I2** (one fencing token per holder): every new holder's fence is
//!   strictly greater than every fence issued before, and every token is
//!   new.
//! - Liveness: every step settles (each caller holds, waits in a queue, or
//!   gave up as told) within a bound far above what it needs.
#![cfg(feature = "handoff")]

use std::collections::HashSet;
use std::time::Duration;

use leasehold::{
    AcquireOptions, CancellationToken, Error, FencedKeys, GiveUpReason, HandoffLocker, Lease,
    Lessor,
};
use leasehold_testkit::RedisServer;
use proptest::prelude::*;
use redis::AsyncCommands;
use tokio::task::JoinHandle;

const TTL: Duration = Duration::from_secs(30);
/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(20);

#[derive(Debug, Clone)]
enum Op {
    /// A new caller on locker 0 or 1.
    Acquire(usize),
    /// The holder releases (if there is one).
    Release,
    /// The holder drops its lease.
    Drop,
    /// The oldest waiting caller is cancelled.
    Cancel,
    /// The lock key vanishes (eviction, restart, failover).
    Delete,
    /// The lock key expires early (a clock jump).
    Expire,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize).prop_map(Op::Acquire),
        3 => Just(Op::Release),
        1 => Just(Op::Drop),
        1 => Just(Op::Cancel),
        1 => Just(Op::Delete),
        1 => Just(Op::Expire),
    ]
}

/// A caller that has not settled into a lease or an error yet.
struct Waiter {
    cancel: CancellationToken,
    task: JoinHandle<Result<Lease, Error>>,
}

/// A holder, and whether a fault took its key (so it may no longer hold).
struct Holder {
    lease: Lease,
    faulted: bool,
}

struct World {
    lockers: [HandoffLocker; 2],
    conn: leasehold::Connection,
    keys: FencedKeys,
    waiters: Vec<Waiter>,
    holders: Vec<Holder>,
    last_fence: u64,
    tokens: HashSet<String>,
}

impl World {
    fn key(&self) -> &str {
        self.keys.lock()
    }

    async fn apply(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Acquire(i) => {
                let cancel = CancellationToken::new();
                let opts = AcquireOptions::new().wait(HUNG).cancel(cancel.clone());
                let (locker, keys) = (self.lockers[*i].clone(), self.keys.clone());
                let task =
                    tokio::spawn(async move { locker.acquire_with(&keys, TTL, &opts).await });
                self.waiters.push(Waiter { cancel, task });
            }
            Op::Release => {
                if let Some(holder) = self.take_holder() {
                    let outcome = holder.lease.release().await;
                    match (holder.faulted, &outcome) {
                        (false, Ok(())) | (true, Err(Error::NotHeld { .. })) => {}
                        _ => {
                            return Err(format!(
                                "release of a lease the model says is {}: {outcome:?}",
                                if holder.faulted { "gone" } else { "held" }
                            ));
                        }
                    }
                }
            }
            Op::Drop => drop(self.take_holder()),
            Op::Cancel => {
                if let Some(waiter) = self.waiters.first() {
                    waiter.cancel.cancel();
                }
            }
            Op::Delete | Op::Expire => {
                let key = self.key().to_owned();
                let mut conn = self.conn.clone();
                let result: redis::RedisResult<()> = match op {
                    Op::Delete => conn.del(&key).await,
                    _ => conn.pexpire(&key, 1).await,
                };
                result.map_err(|e| e.to_string())?;
                for holder in &mut self.holders {
                    holder.faulted = true;
                }
            }
        }
        self.settle().await
    }

    /// The holder a release or drop acts on: an unfaulted one if any.
    fn take_holder(&mut self) -> Option<Holder> {
        let at = self
            .holders
            .iter()
            .position(|h| !h.faulted)
            .or(if self.holders.is_empty() {
                None
            } else {
                Some(0)
            })?;
        Some(self.holders.remove(at))
    }

    /// Waits until every caller holds, waits in a queue, or gave up, then
    /// checks the model.
    async fn settle(&mut self) -> Result<(), String> {
        let settled = tokio::time::timeout(HUNG, async {
            loop {
                if self.all_queued().await? {
                    // Still the same after a pause: not a snapshot taken
                    // mid-hand-over.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    if self.all_queued().await? {
                        return Ok::<_, String>(());
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        settled.map_err(|_| "the system did not settle (a waiter stuck?)".to_owned())??;
        self.check().await
    }

    /// Collects the finished callers, then whether every caller still
    /// waiting is accounted for by a queue: Redis's or a locker's own.
    async fn all_queued(&mut self) -> Result<bool, String> {
        self.collect().await?;
        let queue = format!("{}:waitq", self.key());
        let mut conn = self.conn.clone();
        let in_redis: usize = conn.zcard(&queue).await.map_err(|e| e.to_string())?;
        let in_process: usize = self
            .lockers
            .iter()
            .map(|l| l.queued_in_process(self.keys.lock()))
            .sum();
        Ok(self.waiters.len() == in_redis + in_process)
    }

    /// Moves finished callers to holders (checking I2) or drops them.
    async fn collect(&mut self) -> Result<(), String> {
        let mut still = Vec::new();
        for waiter in std::mem::take(&mut self.waiters) {
            if !waiter.task.is_finished() {
                still.push(waiter);
                continue;
            }
            let outcome = waiter.task.await.map_err(|e| e.to_string())?;
            match outcome {
                Ok(lease) => {
                    let fence = lease.fence().ok_or("a fenced lease without a fence")?.get();
                    if fence <= self.last_fence {
                        return Err(format!(
                            "I2: fence {fence} after {} was issued",
                            self.last_fence
                        ));
                    }
                    self.last_fence = fence;
                    if !self.tokens.insert(lease.token().as_str().to_owned()) {
                        return Err("I2: a token was handed to two holders".to_owned());
                    }
                    self.holders.push(Holder {
                        lease,
                        faulted: false,
                    });
                }
                Err(Error::NotAcquired {
                    reason: GiveUpReason::Cancelled,
                    ..
                }) if waiter.cancel.is_cancelled() => {}
                Err(err) => return Err(format!("an acquire failed: {err}")),
            }
        }
        self.waiters = still;
        Ok(())
    }

    /// I1 at a quiescent point.
    async fn check(&mut self) -> Result<(), String> {
        let live: Vec<&Holder> = self.holders.iter().filter(|h| !h.faulted).collect();
        if live.len() > 1 {
            return Err(format!(
                "I1: {} holders whose keys no fault touched",
                live.len()
            ));
        }
        if let Some(holder) = live.first() {
            let mut conn = self.conn.clone();
            let stored: Option<String> = conn.get(self.key()).await.map_err(|e| e.to_string())?;
            if stored.as_deref() != Some(holder.lease.token().as_str()) {
                return Err(format!(
                    "I1: a holder works while the key holds {stored:?}, not its token"
                ));
            }
        }
        Ok(())
    }

    /// Ends the run: cancels the waiters, releases the holders.
    async fn finish(mut self) {
        for waiter in &self.waiters {
            waiter.cancel.cancel();
        }
        for waiter in std::mem::take(&mut self.waiters) {
            if let Ok(Ok(lease)) = waiter.task.await {
                let _ = lease.release().await;
            }
        }
        for holder in std::mem::take(&mut self.holders) {
            let _ = holder.lease.release().await;
        }
    }
}

async fn run(server: &RedisServer, case: u32, ops: &[Op]) -> Result<(), String> {
    let client = redis::Client::open(server.url()).map_err(|e| e.to_string())?;
    let mut lockers = Vec::new();
    for _ in 0..2 {
        let handoff = HandoffLocker::builder()
            .relay_limit(2)
            .connect(&client)
            .await
            .map_err(|e| e.to_string())?;
        lockers.push(handoff);
    }
    let lockers: [HandoffLocker; 2] = lockers.try_into().map_err(|_| "two lockers".to_owned())?;
    let conn = leasehold::Locker::builder()
        .command_timeout(Duration::from_secs(1))
        .connect(&client)
        .await
        .map_err(|e| e.to_string())?
        .connection()
        .clone();
    let keys = FencedKeys::for_resource(&format!("model:{case}")).map_err(|e| e.to_string())?;
    let mut world = World {
        lockers,
        conn,
        keys,
        waiters: Vec::new(),
        holders: Vec::new(),
        last_fence: 0,
        tokens: HashSet::new(),
    };
    let mut outcome = Ok(());
    for (step, op) in ops.iter().enumerate() {
        if let Err(err) = world.apply(op).await {
            outcome = Err(format!("step {step} ({op:?}) of {ops:?}: {err}"));
            break;
        }
    }
    world.finish().await;
    outcome
}

#[test]
fn the_relay_protocol_keeps_i1_and_i2_under_random_interleavings() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let server = RedisServer::start().expect("redis-server");
    let case = std::sync::atomic::AtomicU32::new(0);
    let config = ProptestConfig {
        cases: 24,
        max_shrink_iters: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in prop::collection::vec(op(), 1..30))| {
        let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let outcome = runtime.block_on(run(&server, n, &ops));
        prop_assert!(outcome.is_ok(), "{}", outcome.err().unwrap_or_default());
    });
}
