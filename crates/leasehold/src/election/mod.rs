//! Leadership: one process at a time does a singleton's work (the
//! scheduler, the migration, the consumer), with a fencing token per term.
//!
//! # What a term is, and what it is not
//!
//! An [`Election`] is a named lease that candidates take turns holding. A
//! candidate that wins gets a [`Term`]: the [`Lease`] on the election's
//! lock, started under its watchdog, and the [`FencingToken`] issued with
//! it, which is the term's number: every later term's token is greater.
//! The term lasts as long as the lease: the watchdog keeps it every
//! `ttl / 3`, and when the lease is lost (a pause past the TTL, Redis
//! unreachable until the lease's deadline, the key gone) the term is over,
//! [`Term::lost`] resolves and the work under [`Term::run`] is stopped at
//! its next `.await`.
//!
//! Like every lease, a term is an **efficiency** mechanism, not a proof:
//! a leader paused past its TTL wakes up believing it still leads, and for
//! a moment two processes act as leader. What makes the singleton's writes
//! **correct** is the database: run each write of the term in a
//! transaction guarded by the term's lease (the `leasehold-pg` guard,
//! `guard(&tx, term.lease())`), which refuses a term older than one that
//! has written. A refusal means a newer leader exists: the guard ends the
//! term at once ([`Term::mark_superseded`], which a check of your own
//! calls by hand), its work stops, and the candidate campaigns again.
//!
//! **Side effects outside the guarded database are not fenced.** An email
//! sent, an HTTP call to a payment provider, a message published: nothing
//! refuses a stale leader's. Give each one an idempotency key derived from
//! what it is for (the job's id, the slot's time), never from the term, so
//! that two leaders doing the same job send the same key and the receiver
//! keeps one; or write the intent in the guarded transaction (an outbox
//! row) and let a relay send it after the commit.
//!
//! # Waiting, handing over, riding out faults
//!
//! [`Election::campaign`] waits until the candidate leads. Followers wait
//! the way the election's [`Lessor`] waits: a [`HandoffLocker`] queues them
//! in Redis and a resigning leader hands the lock to the first of them in
//! the same atomic step (no polling); a [`Locker`] polls with its retry
//! strategy (5 to 15 ms by default); a [`Quorum`] polls every node. A
//! leader that stops without resigning is replaced when its lease runs out
//! (one TTL at most); one that resigns ([`Term::resign`]) is replaced at
//! once. On a polling way a resigned candidate stands back for its
//! [`step_down`](ElectionBuilder::step_down) before it campaigns again, or
//! its own request would usually win the lock back before a follower's.
//!
//! Measured with three candidate processes at a 1 s TTL (`leasehold bench
//! leader`, BENCHMARKS.md; medians of 20 rounds, two runs): a resigned
//! leader is replaced in 0.6 to 0.7 ms with a [`HandoffLocker`], 3 to 4 ms
//! with a [`Locker`] and 4 to 5 ms with a [`Quorum`] (slowest round 12
//! ms; target 50 ms); a stopped one (SIGSTOP) at 0.78 to 0.84 TTL after
//! the stop, one TTL after its last refresh plus 2.5 ms (hand-off) or 4
//! to 5 ms (polling), never later than TTL + 6 ms (target TTL + 100 ms).
//! Under a Redis restart (empty; one node of a quorum) and killed
//! connections, 10 rounds per way in each of two runs, 0 errors reached
//! the candidates (target 0). A restart's empty server ends the term it
//! held (a lost term, not an error); connections killed every 300 ms no
//! longer do, since the watchdog retries a refresh that met a dropped
//! connection within the same period (they ended it in every round
//! before).
//!
//! A campaign rides out faults (Redis restarting, a killed connection, a
//! full server, a failover) as the acquire does, round after round, and
//! returns a fault's error only when faults have kept every round from
//! winning for the election's [`budget`](ElectionBuilder::budget): a fault
//! shorter than the budget never reaches the caller. Errors that cannot
//! pass (a wrong password, a missing permission, a key of the wrong type)
//! return at once.
//!
//! # Who leads
//!
//! The winner names itself: a leader record beside the lock (its
//! candidate name, fencing token and [`HolderId`]), written only while the
//! lock holds the winner's token, and believed by readers only while the
//! lock still holds the token it was written with (the record carries the
//! token's hash; the token never leaves Redis). [`Election::leader`] reads
//! it once; an [`Observer`] reports each change. For a [`Quorum`] a record
//! counts when a majority of nodes agree on it.
//!
//! # Tracing and metrics
//!
//! INFO events under the target `leasehold::election`: `elected`
//! (`election`, `candidate`, `fence`) and `term ended` (`election`,
//! `fence`, `end`: `resigned`, `expired`, `unreachable`, `superseded` or
//! `dropped`, and `held_ms`). With the `metrics` feature,
//! [`TERMS_TOTAL`](crate::metrics::TERMS_TOTAL) and
//! [`TERM_SECONDS`](crate::metrics::TERM_SECONDS).
//!
//! ```no_run
//! use std::time::Duration;
//! use leasehold::{Election, HandoffLocker};
//!
//! # async fn demo(redis: redis::Client) -> leasehold::Result<()> {
//! let locker = HandoffLocker::connect(&redis).await?;
//! let election = Election::builder(locker, "scheduler")
//!     .candidate("worker-1")
//!     .ttl(Duration::from_secs(5))
//!     .build()?;
//! loop {
//!     let term = election.campaign().await?;
//!     // Leader until the term is lost; every write guarded with
//!     // `term.lease()` in its transaction.
//!     let ran = term
//!         .run(async {
//!             // ... run jobs; a guard refusal ends the term here
//!         })
//!         .await;
//!     match ran {
//!         Ok(()) => term.resign().await?, // done: hand over at once
//!         Err(_lost) => continue,         // the term was lost: campaign again
//!     }
//!     break;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! [`HandoffLocker`]: crate::HandoffLocker
//! [`Locker`]: crate::Locker
//! [`Quorum`]: crate::Quorum

// This file holds the `Election` and its campaign; `builder` its
// settings, `term` a leader's `Term`, `observer` who leads (`Leader`,
// `Observer`).
mod builder;
mod observer;
mod serve;
mod term;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::Budget;
use crate::error::{Error, GiveUpReason, Result};
use crate::fencing::FencedKeys;
use crate::lease::Lease;
use crate::lessor::Lessor;
use crate::metrics;
use crate::options::AcquireOptions;

#[cfg(doc)]
use crate::fencing::FencingToken;
#[cfg(doc)]
use crate::lost::LostCause;
#[cfg(doc)]
use crate::token::HolderId;

pub use self::builder::ElectionBuilder;
pub use self::observer::{Leader, Observer};
pub use self::serve::Served;
pub use self::term::{Term, TermOutcome};

/// A term's TTL unless set: 10 s.
pub const DEFAULT_TERM_TTL: Duration = Duration::from_secs(10);

/// How long a campaign or an observer rides out faults unless set: 30 s.
pub const DEFAULT_FAULT_BUDGET: Duration = Duration::from_secs(30);

/// How often an [`Observer`] asks who leads unless set: 100 ms.
pub const DEFAULT_OBSERVE_EVERY: Duration = Duration::from_millis(100);

/// How long a resigned candidate waits before it campaigns again on a
/// polling way unless set: 50 ms.
pub const DEFAULT_STEP_DOWN: Duration = Duration::from_millis(50);

/// The shortest round of a campaign: one acquire that waits this long (or
/// the TTL, if longer; never longer than the budget).
const MIN_ROUND: Duration = Duration::from_secs(1);

/// The pause after a round that failed quickly, so a fault that fails every
/// request at once is not asked in a busy loop.
const FAULT_PAUSE: Duration = Duration::from_millis(100);

/// A leader election on one name, over any way of taking a lease.
///
/// Cheap to clone (the clones share one election); every candidate process
/// builds its own with the same name. See the [module docs](self) for what
/// a term guarantees and what it does not.
pub struct Election<L: Lessor> {
    inner: Arc<Inner<L>>,
}

struct Inner<L> {
    lessor: L,
    name: String,
    candidate: String,
    keys: FencedKeys,
    record_key: String,
    ttl: Duration,
    budget: Duration,
    options: AcquireOptions,
    observe_every: Duration,
    step_down: Duration,
    /// When a term of this election last resigned (shared with its terms).
    resigned_at: Arc<Mutex<Option<Instant>>>,
}

impl<L> Inner<L> {
    /// The fault budget of a run of faults: `faults`, started now at the
    /// first fault of the run (`None`: no fault since the last answer).
    fn fault_budget(&self, faults: &mut Option<Budget>) -> Budget {
        *faults.get_or_insert_with(|| Budget::from_now(self.budget))
    }
}

impl<L: Lessor> Clone for Election<L> {
    fn clone(&self) -> Self {
        Election {
            inner: self.inner.clone(),
        }
    }
}

impl<L: Lessor> std::fmt::Debug for Election<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.inner.name)
            .field("candidate", &self.inner.candidate)
            .field("ttl", &self.inner.ttl)
            .field("budget", &self.inner.budget)
            .finish_non_exhaustive()
    }
}

impl<L: Lessor> Election<L> {
    /// The election's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The name this process campaigns under.
    pub fn candidate(&self) -> &str {
        &self.inner.candidate
    }

    /// The election's lock and fence counter.
    pub fn keys(&self) -> &FencedKeys {
        &self.inner.keys
    }

    /// A term's TTL.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Waits until this candidate leads, and returns its term (its lease
    /// under the watchdog, its fencing token), after naming it in the
    /// leader record.
    ///
    /// Waits without end while another candidate leads: in rounds of one
    /// acquire each (the TTL or 1 s, whichever is longer, at most the
    /// budget). Faults are ridden out (see the [module docs](self)).
    /// Bound it with the options' `cancel` token or your own timeout.
    ///
    /// # Errors
    /// - a fault's error (retryable: [`Error::is_retryable`]) once faults
    ///   have kept every round from winning for the budget;
    /// - at once, what cannot pass: [`Error::NoPermission`], a wrong
    ///   password, [`Error::WrongType`], [`Error::InvalidFence`], ...;
    /// - [`Error::NotAcquired`] ([`GiveUpReason::Cancelled`]) when the
    ///   options' cancel token is cancelled.
    ///
    /// # Cancel safety
    /// Cancel safe, as an acquire: a lock won by a request still in flight
    /// is released in the background, and the TTL is the fallback.
    pub async fn campaign(&self) -> Result<Term> {
        let inner = &*self.inner;
        if !inner.lessor.hands_over() {
            let resigned = *inner
                .resigned_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(resigned) = resigned {
                tokio::time::sleep_until(resigned + inner.step_down).await;
            }
        }
        let round = inner.budget.min(inner.ttl.max(MIN_ROUND));
        // The fault budget, started when the first round in a row that
        // ended in a fault ended: a fault is reported once it is spent.
        let mut faults: Option<Budget> = None;
        loop {
            let started = Instant::now();
            let opts = inner.options.clone().wait(round);
            match inner
                .lessor
                .acquire_with(&inner.keys, inner.ttl, &opts)
                .await
            {
                Ok(lease) => return self.begin(lease).await,
                Err(Error::NotAcquired { reason, .. }) if reason != GiveUpReason::Cancelled => {
                    faults = None;
                }
                Err(err) if crate::call::fault_may_pass(&err) => {
                    if inner.fault_budget(&mut faults).is_spent() {
                        return Err(err);
                    }
                    tracing::debug!(
                        target: "leasehold::election",
                        election = inner.name,
                        error = %err,
                        "campaign round failed; riding it out"
                    );
                    if started.elapsed() < FAULT_PAUSE {
                        tokio::time::sleep(FAULT_PAUSE).await;
                    }
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// The term that starts with `lease`, named in the leader record.
    async fn begin(&self, lease: Lease) -> Result<Term> {
        let inner = &*self.inner;
        // A lease on fenced keys always carries its token.
        let fence = lease.fence().ok_or(Error::UnexpectedReply {
            service: lease.service(),
            op: "campaign",
        })?;
        let holder = lease.holder();
        let body = format!("{}\n{}\n{}", fence.get(), holder, inner.candidate);
        let announced = crate::call::retrying(
            Instant::now(),
            lease.valid_until(),
            lease.command_timeout(),
            |_deadline| lease.announce(&inner.record_key, &body),
        )
        .await;
        match announced {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                target: "leasehold::election",
                election = inner.name,
                fence = fence.get(),
                "the term's lease was gone before it could be announced"
            ),
            Err(err) => tracing::warn!(
                target: "leasehold::election",
                election = inner.name,
                fence = fence.get(),
                error = %err,
                "could not name the new leader; observers see no leader for this term"
            ),
        }
        tracing::info!(
            target: "leasehold::election",
            election = inner.name,
            candidate = inner.candidate,
            fence = fence.get(),
            "elected"
        );
        metrics::term_started();
        Ok(Term::new(
            lease,
            fence,
            inner.candidate.clone(),
            inner.name.clone(),
            inner.resigned_at.clone(),
        ))
    }

    /// One term: [`campaign`](Self::campaign), run `work` under the term
    /// ([`Term::run`]: stopped at its next `.await` if the term is lost),
    /// then [`resign`](Term::resign) at once, handing leadership on.
    ///
    /// A `work` that panics unwinds through this call: the term's lease is
    /// dropped (released in the background, the TTL as the fallback) and
    /// the term is counted as `dropped`; what the work committed before the
    /// panic stays committed.
    ///
    /// # Errors
    /// As [`campaign`](Self::campaign). A lost term is not an error:
    /// [`TermOutcome::Lost`].
    ///
    /// # Cancel safety
    /// Dropping the future drops the work at its current `.await` and the
    /// term (released in the background).
    pub async fn lead<T>(&self, work: impl AsyncFnOnce(&Term) -> T) -> Result<TermOutcome<T>> {
        let term = self.campaign().await?;
        let fence = term.fence();
        match term.run(work(&term)).await {
            Ok(output) => {
                let resign = term.resign().await;
                Ok(TermOutcome::Finished { output, resign })
            }
            Err(Error::LeaseLost { cause, .. }) => {
                let _ = term.resign().await;
                Ok(TermOutcome::Lost { cause, fence })
            }
            Err(err) => Err(err),
        }
    }

    /// Who leads now, as Redis sees it: `None` when nobody holds the
    /// election's lock, or its holder has not named itself (a term whose
    /// announcement failed), or the record belongs to an earlier term.
    ///
    /// # Errors
    /// What the read met ([`Error::Timeout`], [`Error::Unreachable`],
    /// [`Error::QuorumNotReached`], [`Error::NoPermission`], ...);
    /// [`Error::UnexpectedReply`] for a record this library did not write.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let inner = &*self.inner;
        let record = inner
            .lessor
            .leader_record(inner.keys.lock(), &inner.record_key)
            .await?;
        record
            .map(|(body, pttl)| Leader::parse(&body, pttl, inner.lessor.service()))
            .transpose()
    }
}
