//! The callers: tasks that take the lock, write, and release, recording
//! each step.

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leasehold::{
    AcquireOptions, CancellationToken, DynLessor, Error, FencedKeys, FencingToken, Lease, Lessor,
};
use rand::{RngExt, SeedableRng, rngs::StdRng};

use crate::history::{Kind, WriteOutcome};
use crate::recorder::Recorder;

/// How the callers take the lock before they write: from any way of taking
/// a lease (a [`Lessor`]: polling, hand-off or a quorum, on one server or a
/// cluster), fenced or plain; or not at all ([`Lock::none`]).
///
/// ```no_run
/// # async fn demo(lab: &leasehold_chaos::Lab) -> Result<(), Box<dyn std::error::Error>> {
/// use leasehold::{HandoffLocker, Locker};
/// use leasehold_chaos::Lock;
///
/// let client = leasehold::redis::Client::open(lab.redis_url())?;
/// let fenced = Lock::new(Locker::connect(&client).await?, true);
/// let queued = Lock::new(HandoffLocker::connect(&client).await?, true);
/// let blind = Lock::new(Locker::connect(&client).await?, false);
/// # let _ = (fenced, queued, blind, Lock::none());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Lock {
    /// `None`: no Redis lock.
    lessor: Option<DynLessor>,
    /// Whether a lease carries a fencing token.
    fenced: bool,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("none", &self.is_none())
            .field("fenced", &self.fenced)
            .finish_non_exhaustive()
    }
}

impl Lock {
    /// Leases from `lessor`. With `fenced`, on a resource's lock key and
    /// fence counter (`lock:{resource}`, `fence:{resource}`), so each lease
    /// carries a fencing token; otherwise on the lock key alone (a plain
    /// lease). The fence is a choice of keys, not of way: any way gives
    /// either.
    pub fn new(lessor: impl Lessor, fenced: bool) -> Lock {
        Lock {
            lessor: Some(DynLessor::new(lessor)),
            fenced,
        }
    }

    /// No Redis lock: the database alone keeps the write right.
    pub fn none() -> Lock {
        Lock {
            lessor: None,
            fenced: false,
        }
    }

    /// The way of taking a lease, `None` for [`Lock::none`].
    pub(crate) fn lessor(&self) -> Option<&DynLessor> {
        self.lessor.as_ref()
    }

    /// Whether this is [`Lock::none`]: the callers take no lease.
    pub fn is_none(&self) -> bool {
        self.lessor.is_none()
    }

    /// Takes the lock on `resource` (`lock:{resource}`, with
    /// `fence:{resource}` when fenced); `None` for [`Lock::none`].
    ///
    /// # Errors
    /// As the way's `acquire_with`.
    pub async fn acquire(
        &self,
        resource: &str,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> leasehold::Result<Option<Lease>> {
        let keys = FencedKeys::for_resource(resource)?;
        match &self.lessor {
            None => Ok(None),
            Some(lessor) if self.fenced => lessor.acquire_with(&keys, ttl, opts).await.map(Some),
            Some(lessor) => lessor.acquire_with(keys.lock(), ttl, opts).await.map(Some),
        }
    }

    /// [`acquire`](Self::acquire) as operation `op` of `actor`, recorded
    /// in the history: `Acquire` before, then `Acquired` or
    /// `AcquireFailed` (nothing for [`Lock::none`]).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), after recording it.
    pub(crate) async fn acquire_recorded(
        &self,
        recorder: &Recorder,
        actor: &str,
        op: u64,
        resource: &str,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> leasehold::Result<Option<Lease>> {
        if self.is_none() {
            return Ok(None);
        }
        let key = lock_key(resource);
        recorder.record(
            actor,
            Kind::Acquire {
                op,
                key: key.clone(),
            },
        );
        let acquired = self.acquire(resource, ttl, opts).await;
        match &acquired {
            Ok(Some(lease)) => recorder.record(
                actor,
                Kind::Acquired {
                    op,
                    key,
                    token: label(lease),
                    fence: lease.fence().map(FencingToken::get),
                },
            ),
            Ok(None) => {}
            Err(err) => recorder.record(
                actor,
                Kind::AcquireFailed {
                    op,
                    key,
                    reason: reason(err),
                },
            ),
        }
        acquired
    }
}

/// The lock key of `resource`, as [`Lock::acquire`] names it.
pub fn lock_key(resource: &str) -> String {
    FencedKeys::for_resource(resource).map_or_else(
        |_| format!("lock:{{{resource}}}"),
        |keys| keys.lock().to_owned(),
    )
}

/// A switch the nemesis flips to stall the next holder that reaches a
/// [`Call::pause_point`], as a long GC pause or a swapped-out process
/// would: the in-process stand-in for pausing a worker process.
#[derive(Clone, Default)]
pub struct Stall {
    armed_ms: Arc<AtomicU64>,
    /// Block the caller's thread instead of sleeping on the runtime (see
    /// [`Stall::freezing`]).
    freeze: bool,
}

/// What [`Stall::armed_ms`] holds to stop the whole process instead of
/// sleeping.
const STOP_PROCESS: u64 = u64::MAX;

impl Stall {
    /// A switch whose stall blocks the caller's OS thread (a
    /// `std::thread::sleep`) instead of sleeping on the runtime: for callers
    /// that each run on their own single-threaded runtime (the
    /// [`Harness`](crate::Harness)'s), that stops everything on it, the
    /// lease's watchdog included, as a real process pause would.
    pub fn freezing() -> Stall {
        Stall {
            freeze: true,
            ..Stall::default()
        }
    }

    /// The next caller to reach a pause point stalls for `length`.
    pub fn arm(&self, length: Duration) {
        let ms = u64::try_from(length.as_millis())
            .unwrap_or(STOP_PROCESS - 1)
            .clamp(1, STOP_PROCESS - 1);
        self.armed_ms.store(ms, Ordering::SeqCst);
    }

    /// The next caller to reach a pause point stops this whole process
    /// (SIGSTOP to itself) until someone sends it SIGCONT: a real process
    /// pause, placed where it hurts, between a holder's read and its
    /// write. For worker processes; the nemesis resumes them.
    pub fn arm_process_stop(&self) {
        self.armed_ms.store(STOP_PROCESS, Ordering::SeqCst);
    }

    /// Disarms the switch if no caller took it.
    pub fn disarm(&self) {
        self.armed_ms.store(0, Ordering::SeqCst);
    }

    /// Takes the armed stall in ms (or [`STOP_PROCESS`]), if any (only one
    /// caller gets it).
    fn take(&self) -> Option<u64> {
        match self.armed_ms.swap(0, Ordering::SeqCst) {
            0 => None,
            ms => Some(ms),
        }
    }
}

/// One write the harness asks of the system under test.
pub struct Call<'a> {
    /// Who: `w{worker}.t{task}`.
    pub actor: &'a str,
    /// The resource to write (a wallet, a queue, any state the lock
    /// protects).
    pub resource: &'a str,
    /// The amount drawn for this write (a debit, for a wallet; use it or
    /// not).
    pub amount: i64,
    /// The lease held while writing (`None` for [`Lock::none`]).
    pub lease: Option<&'a Lease>,
    pub(crate) stall: &'a Stall,
}

impl<'a> Call<'a> {
    /// A call made by a caller loop of your own, for a lock that is not a
    /// [`Lessor`] (a control on another lock service: `leasehold chaos`'s
    /// etcd Lock RPC mode): `lease` is `None`, and `stall` is the switch
    /// the nemesis arms for a holder pause ([`pause_point`](Self::pause_point)
    /// honours it as it does in [`Callers`]' calls).
    pub fn new(
        actor: &'a str,
        resource: &'a str,
        amount: i64,
        lease: Option<&'a Lease>,
        stall: &'a Stall,
    ) -> Call<'a> {
        Call {
            actor,
            resource,
            amount,
            lease,
            stall,
        }
    }

    /// The lease's fencing token, if the lock is fenced.
    pub fn fence(&self) -> Option<FencingToken> {
        self.lease.and_then(Lease::fence)
    }

    /// Put this between the read and the write of a read-modify-write: the
    /// harness may stall the caller here past its lease (the holder-pause
    /// fault, in process), which is where a stale write comes from.
    pub async fn pause_point(&self) {
        match self.stall.take() {
            Some(STOP_PROCESS) => {
                // Stops every thread of the process until SIGCONT; if the
                // signal cannot be sent, the caller goes on unpaused.
                if let Err(err) = leasehold_testkit::stop_this_process() {
                    tracing::warn!(error = %err, "could not stop this process");
                }
            }
            Some(ms) if self.stall.freeze => std::thread::sleep(Duration::from_millis(ms)),
            Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            None => {}
        }
    }
}

/// What a write did, as the system under test reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The outcome.
    pub outcome: WriteOutcome,
    /// A short reason for a failure (never a secret).
    pub detail: Option<String>,
}

impl Written {
    /// A failed or unknown write with a reason.
    pub fn with_detail(outcome: WriteOutcome, detail: impl Into<String>) -> Written {
        Written {
            outcome,
            detail: Some(detail.into()),
        }
    }
}

impl From<WriteOutcome> for Written {
    fn from(outcome: WriteOutcome) -> Written {
        Written {
            outcome,
            detail: None,
        }
    }
}

/// The callers of one process: `tasks` concurrent loops, each taking the
/// lock on a random resource, writing once (or, in terms, up to
/// [`writes_per_lease`](Self::writes_per_lease) times), and releasing,
/// until stopped.
#[derive(Debug, Clone)]
pub struct Callers {
    /// This process's worker index (the `w` of `w{worker}.t{task}`).
    pub worker: u32,
    /// How many concurrent callers.
    pub tasks: u32,
    /// The resources (wallets) to write.
    pub resources: Vec<String>,
    /// The lease TTL.
    pub ttl: Duration,
    /// How long an acquire waits for the lock before giving up.
    pub wait: Duration,
    /// Whether the lease's watchdog refreshes it and stops a write whose
    /// lease was lost (a write stopped mid-flight is recorded `unknown`).
    pub watchdog: bool,
    /// The amounts to debit, drawn at random.
    pub amounts: RangeInclusive<i64>,
    /// The workload's seed (each caller draws from its own stream).
    pub seed: u64,
    /// Writes per lease: 1, a lock per write; more, a **term**: the
    /// caller keeps one lease for up to this many writes on its resource,
    /// as a leader does, so that a pause or a fault falls inside the term.
    /// The term ends early when the lease is found lost, or when the
    /// database refuses a write as stale (the caller then marks the lease
    /// superseded, as a leader must). At least 1.
    pub writes_per_lease: u32,
}

impl Callers {
    /// Runs the callers until `stop` is cancelled, then lets each finish
    /// the write it is in (a write is never cut short by the stop) and
    /// release. Concurrent on the current task, so `write` need not be
    /// `Send`. With [`watchdog`](Self::watchdog), a write whose lease is
    /// found lost is dropped where it is and recorded unknown (a write of
    /// this process may have landed as it was cut).
    pub async fn run<W>(
        &self,
        lock: &Lock,
        recorder: &Recorder,
        stop: &CancellationToken,
        stall: &Stall,
        write: &W,
    ) where
        W: AsyncFn(Call<'_>) -> Written,
    {
        let callers = (0..self.tasks).map(|task| {
            let write = async |call: Call<'_>| self.cut_when_lost(call, write).await;
            self.caller(task, lock, recorder, stop, stall, write)
        });
        futures_util::future::join_all(callers).await;
    }

    /// `write(call)`, dropped and recorded unknown if the watchdog finds
    /// the call's lease lost first.
    async fn cut_when_lost<W>(&self, call: Call<'_>, write: &W) -> Written
    where
        W: AsyncFn(Call<'_>) -> Written,
    {
        let lost = match (call.lease, self.watchdog) {
            (Some(lease), true) => lease.watch().ok(),
            _ => None,
        };
        match lost {
            Some(lost) => {
                tokio::select! {
                    biased;
                    () = lost.cancelled() => Written::with_detail(
                        WriteOutcome::Unknown,
                        "the watchdog stopped the write: lease lost",
                    ),
                    written = write(call) => written,
                }
            }
            None => write(call).await,
        }
    }

    /// Caller `task`: takes the lock on a random resource, writes once
    /// through `write`, releases, until `stop`; records each step, and
    /// every error the lock returned that contention does not explain
    /// ([`Kind::CallerError`]: an acquire that failed other than
    /// `NotAcquired`, a release other than `NotHeld` / `LeaseLost`, a lease
    /// the watchdog gave up on as unreachable). The one caller loop of both
    /// the worker processes ([`run`](Self::run)) and the
    /// [`Harness`](crate::Harness)'s threads.
    pub(crate) async fn caller<W>(
        &self,
        task: u32,
        lock: &Lock,
        recorder: &Recorder,
        stop: &CancellationToken,
        stall: &Stall,
        mut write: W,
    ) where
        W: AsyncFnMut(Call<'_>) -> Written,
    {
        let actor = format!("w{}.t{task}", self.worker);
        let mut rng = StdRng::seed_from_u64(
            self.seed
                ^ (u64::from(self.worker) << 32 | u64::from(task))
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        let opts = AcquireOptions::new()
            .wait(self.wait)
            .watchdog(self.watchdog)
            .cancel(stop.clone());
        let mut op = 0u64;
        while !stop.is_cancelled() && !self.resources.is_empty() {
            let resource = &self.resources[rng.random_range(0..self.resources.len())];
            let amount = rng.random_range(self.amounts.clone());
            let key = lock_key(resource);
            op += 1;
            let lease = match lock
                .acquire_recorded(recorder, &actor, op, resource, self.ttl, &opts)
                .await
            {
                Ok(lease) => lease,
                Err(err) => {
                    if !matches!(err, Error::NotAcquired { .. }) {
                        recorder.record(&actor, caller_error("acquire", &key, &err));
                        // A server fault: do not spin on it.
                        tokio::select! {
                            () = stop.cancelled() => {}
                            () = tokio::time::sleep(Duration::from_millis(20)) => {}
                        }
                    }
                    continue;
                }
            };
            let mut amount = amount;
            for nth in 0..self.writes_per_lease.max(1) {
                // A term's later writes: while it lasts, and not past the
                // stop (the first write always runs, as a lock's does).
                if nth > 0 {
                    if stop.is_cancelled() || lease.as_ref().is_some_and(|l| l.lost().is_some()) {
                        break;
                    }
                    amount = rng.random_range(self.amounts.clone());
                }
                op += 1;
                let started_us = recorder.now_us();
                let call = Call {
                    actor: &actor,
                    resource,
                    amount,
                    lease: lease.as_ref(),
                    stall,
                };
                let fence = call.fence().map(FencingToken::get);
                let written = write(call).await;
                let refused = written.outcome == WriteOutcome::RefusedStale;
                recorder.record(
                    &actor,
                    Kind::Write {
                        op,
                        started_us,
                        key: if lease.is_some() {
                            key.clone()
                        } else {
                            String::new()
                        },
                        resource: resource.clone(),
                        amount,
                        fence,
                        outcome: written.outcome,
                        detail: written.detail,
                    },
                );
                if refused {
                    // A newer holder has written: this one's term is over.
                    if let Some(lease) = &lease
                        && self.writes_per_lease > 1
                    {
                        lease.mark_superseded();
                    }
                    break;
                }
            }
            if let Some(lease) = lease {
                release_recorded(recorder, &actor, key, lease).await;
            }
        }
    }
}

/// Records how `lease` ended: lost (and, when the watchdog gave it up as
/// unreachable, a refresh [`Kind::CallerError`]), then its release and any
/// release error.
async fn release_recorded(recorder: &Recorder, actor: &str, key: String, lease: Lease) {
    let token = label(&lease);
    if let Some(cause) = lease.lost() {
        record_lost(recorder, actor, &key, &token, cause);
    }
    // Stamped when the holder lets go: it writes nothing after, and Redis
    // may hand the lock on before the reply is back.
    let released_at = recorder.now_us();
    let outcome = match lease.release().await {
        Ok(()) => "released",
        Err(Error::NotHeld { .. } | Error::LeaseLost { .. }) => "not_held",
        Err(err) => {
            recorder.record(actor, caller_error("release", &key, &err));
            "error"
        }
    };
    recorder.record_at(
        released_at,
        actor,
        Kind::Released {
            key,
            token,
            outcome: outcome.to_owned(),
        },
    );
}

/// Records that the lease `token` on `key` was lost for `cause`, and,
/// when the watchdog gave it up as unreachable, a refresh
/// [`Kind::CallerError`].
pub(crate) fn record_lost(
    recorder: &Recorder,
    actor: &str,
    key: &str,
    token: &str,
    cause: leasehold::LostCause,
) {
    recorder.record(
        actor,
        Kind::Lost {
            key: key.to_owned(),
            token: token.to_owned(),
            cause: cause_name(cause).to_owned(),
        },
    );
    if cause == leasehold::LostCause::Unreachable {
        recorder.record(
            actor,
            Kind::CallerError {
                call: "refresh".to_owned(),
                key: key.to_owned(),
                error: "lease_lost_unreachable".to_owned(),
                detail: cause.to_string(),
            },
        );
    }
}

/// A short label of a lease's token: its first 8 hex digits, enough to
/// tell holders apart in one run, too short to release anyone's lock.
pub fn label(lease: &Lease) -> String {
    lease.token().as_str().chars().take(8).collect()
}

/// The give-up reason of an acquire error, as the history names it.
pub(crate) fn reason(err: &Error) -> String {
    match err {
        Error::NotAcquired { reason, .. } => reason.to_string().replace(' ', "_"),
        err if err.is_retryable() => "unreachable".to_owned(),
        _ => "error".to_owned(),
    }
}

/// A [`Kind::CallerError`] for `err`, returned by `call` on `key`.
pub(crate) fn caller_error(call: &str, key: &str, err: &Error) -> Kind {
    let error = match err {
        Error::Timeout { .. } => "timeout",
        Error::Unreachable { .. } => "unreachable",
        Error::Auth(_) => "auth",
        Error::NoPermission { .. } => "no_permission",
        Error::QuorumNotReached { .. } => "quorum_not_reached",
        Error::NotReplicated { .. } => "not_replicated",
        _ => "other",
    };
    Kind::CallerError {
        call: call.to_owned(),
        key: key.to_owned(),
        error: error.to_owned(),
        detail: with_sources(err),
    }
}

/// `err` and its sources, `: `-separated: the detail a reader of a history
/// needs to tell one Redis reply from another.
fn with_sources(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn cause_name(cause: leasehold::LostCause) -> &'static str {
    match cause {
        leasehold::LostCause::Expired => "expired",
        leasehold::LostCause::Unreachable => "unreachable",
        leasehold::LostCause::Superseded => "superseded",
        _ => "other",
    }
}
