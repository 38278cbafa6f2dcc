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
//! has written. A refusal means a newer leader exists: call
//! [`Term::mark_superseded`] (the term ends at once, its work stops) and
//! campaign again.
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
//!             // ... run jobs; on a guard refusal: term.mark_superseded()
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

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::Budget;
use crate::error::{Error, GiveUpReason, Result};
use crate::fencing::{FencedKeys, FencingToken};
use crate::lease::Lease;
use crate::lessor::Lessor;
use crate::lost::LostCause;
use crate::metrics;
use crate::options::AcquireOptions;
use crate::token::HolderId;
use crate::watchdog::Shared;

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

/// Builds an [`Election`]: [`Election::builder`], the setters, then
/// [`build`](Self::build).
#[must_use]
#[derive(Debug)]
pub struct ElectionBuilder<L> {
    lessor: L,
    name: String,
    candidate: Option<String>,
    ttl: Duration,
    budget: Duration,
    options: AcquireOptions,
    observe_every: Duration,
    step_down: Duration,
}

impl<L: Lessor> ElectionBuilder<L> {
    /// The name this process campaigns under: what [`Election::leader`]
    /// and [`Observer`]s report, and what the `elected` event logs. Not
    /// checked for uniqueness: give each process its own (a host name and
    /// a process id, a pod name). Must not be empty.
    ///
    /// Defaults to `pid <process id>`.
    pub fn candidate(mut self, candidate: impl Into<String>) -> Self {
        self.candidate = Some(candidate.into());
        self
    }

    /// A term's lease TTL: a leader that stops without resigning is
    /// replaced within it. The watchdog refreshes every `ttl / 3`.
    ///
    /// Defaults to [`DEFAULT_TERM_TTL`] (10 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a campaign (or an observer) rides out faults before
    /// returning one: faults must keep every acquire round from winning
    /// for this long. Must be positive.
    ///
    /// Defaults to [`DEFAULT_FAULT_BUDGET`] (30 s).
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// The options of every acquire a campaign makes: the retry strategy
    /// (how often a follower on a [`Locker`](crate::Locker) polls),
    /// `wait_replicas`, a `cancel` token (cancelling it ends a campaign
    /// with [`Error::NotAcquired`]). The campaign decides how long each
    /// acquire waits (and always starts the watchdog), so a `wait` or
    /// `deadline` is refused by
    /// [`build`](Self::build), as is a retry strategy that gives up before
    /// its deadline (`none()`, `max_attempts`): a follower keeps waiting.
    ///
    /// Defaults to [`AcquireOptions::new`].
    pub fn options(mut self, options: AcquireOptions) -> Self {
        self.options = options;
        self
    }

    /// How often an [`Observer`] asks who leads. Must be positive.
    ///
    /// Defaults to [`DEFAULT_OBSERVE_EVERY`] (100 ms).
    pub fn observe_every(mut self, every: Duration) -> Self {
        self.observe_every = every;
        self
    }

    /// How long a candidate that resigned waits before it campaigns
    /// again, on a way whose followers poll ([`Locker`](crate::Locker),
    /// [`Quorum`](crate::Quorum)): a resigner that campaigned at once
    /// would usually win its own lock back before a follower's next
    /// attempt, and resigning would hand nothing on. Set it above the
    /// followers' longest wait between attempts. A
    /// [`HandoffLocker`](crate::HandoffLocker) hands the lock to the first
    /// waiting candidate in the resign itself, so it never waits.
    ///
    /// Defaults to [`DEFAULT_STEP_DOWN`] (50 ms, above the default 5 to
    /// 15 ms between attempts).
    pub fn step_down(mut self, pause: Duration) -> Self {
        self.step_down = pause;
        self
    }

    /// The election, checked. No I/O.
    ///
    /// # Errors
    /// - [`Error::InvalidKey`] for an empty name (or one whose keys would
    ///   not share a slot);
    /// - [`Error::InvalidTtl`] for a TTL Redis would refuse;
    /// - [`Error::InvalidOptions`] for an empty candidate, a zero budget or
    ///   observation period, or options the campaign cannot honour (see
    ///   [`options`](Self::options)).
    pub fn build(self) -> Result<Election<L>> {
        if self.name.is_empty() {
            return Err(Error::InvalidKey {
                key: String::new(),
                reason: "election name is empty",
            });
        }
        crate::lease::check_ttl(self.ttl)?;
        let candidate = self
            .candidate
            .unwrap_or_else(|| format!("pid {}", std::process::id()));
        if candidate.is_empty() {
            return Err(Error::InvalidOptions(
                "election: the candidate name is empty",
            ));
        }
        if self.budget.is_zero() {
            return Err(Error::InvalidOptions(
                "election: the fault budget must be positive",
            ));
        }
        if self.observe_every.is_zero() {
            return Err(Error::InvalidOptions(
                "election: the observation period must be positive",
            ));
        }
        if !matches!(self.options.deadline, crate::options::Deadline::Default) {
            return Err(Error::InvalidOptions(
                "election: options must not set a wait or deadline (each campaign round sets its own)",
            ));
        }
        if self.options.retry.gives_up_early() {
            return Err(Error::InvalidOptions(
                "election: a retry strategy that gives up before the deadline would make followers spin",
            ));
        }
        let keys = FencedKeys::for_resource(&format!("leader:{}", self.name))?;
        let record_key = format!("{}:leader", keys.lock());
        Ok(Election {
            inner: Arc::new(Inner {
                lessor: self.lessor,
                name: self.name,
                candidate,
                keys,
                record_key,
                ttl: self.ttl,
                budget: self.budget,
                options: self.options.watchdog(true),
                observe_every: self.observe_every,
                step_down: self.step_down,
                resigned_at: Arc::default(),
            }),
        })
    }
}

impl<L: Lessor> Election<L> {
    /// An election named `name` over `lessor` (a [`Locker`](crate::Locker),
    /// [`HandoffLocker`](crate::HandoffLocker) or [`Quorum`](crate::Quorum)).
    /// Its lock is `lock:{leader:<name>}`, its fence counter
    /// `fence:{leader:<name>}` and its leader record
    /// `lock:{leader:<name>}:leader` (one slot; the README's ACL covers
    /// them).
    pub fn builder(lessor: L, name: impl Into<String>) -> ElectionBuilder<L> {
        ElectionBuilder {
            lessor,
            name: name.into(),
            candidate: None,
            ttl: DEFAULT_TERM_TTL,
            budget: DEFAULT_FAULT_BUDGET,
            options: AcquireOptions::new(),
            observe_every: DEFAULT_OBSERVE_EVERY,
            step_down: DEFAULT_STEP_DOWN,
        }
    }

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
        let fence = lease
            .fence()
            .ok_or(Error::UnexpectedReply { op: "campaign" })?;
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
        Ok(Term {
            tally: Tally {
                shared: lease.shared().clone(),
                election: inner.name.clone(),
                fence,
                started: Instant::now(),
                ended: false,
            },
            lease,
            fence,
            candidate: inner.candidate.clone(),
            resigned_at: inner.resigned_at.clone(),
        })
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
            .map(|(body, pttl)| Leader::parse(&body, pttl))
            .transpose()
    }

    /// An observer of this election's leader: its first
    /// [`changed`](Observer::changed) says who leads now, each later one
    /// waits for the next change.
    pub fn observe(&self) -> Observer<L> {
        Observer {
            election: self.clone(),
            last: None,
            started: false,
        }
    }
}

/// How a term that [`Election::lead`] ran ended.
#[derive(Debug)]
#[non_exhaustive]
#[must_use]
pub enum TermOutcome<T> {
    /// The work ran to its end, then the term was resigned.
    Finished {
        /// What the work returned.
        output: T,
        /// How resigning went ([`Term::resign`]); an error here does not
        /// undo what the work did.
        resign: Result<()>,
    },
    /// The term was lost before the work finished: the work was stopped at
    /// an `.await` (a transaction not committed was rolled back).
    Lost {
        /// Why.
        cause: LostCause,
        /// The lost term's fencing token.
        fence: FencingToken,
    },
}

/// One candidate's term as leader: its lease (under the watchdog) and its
/// fencing token. See the [module docs](self).
///
/// Give it back with [`resign`](Self::resign) to hand leadership on at
/// once. Dropping it releases the lease in the background (the TTL as the
/// fallback).
#[must_use = "a term should end with `resign().await`; dropping it releases in the background"]
#[derive(Debug)]
pub struct Term {
    lease: Lease,
    fence: FencingToken,
    candidate: String,
    tally: Tally,
    resigned_at: Arc<Mutex<Option<Instant>>>,
}

impl Term {
    /// The term's fencing token: greater than every earlier term's of the
    /// election (see [`FencingToken`] for what that rests on).
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    /// The term's lease: give it to the `leasehold-pg` guard in each
    /// transaction of the term.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The term's holder, as the guard records it.
    pub fn holder(&self) -> HolderId {
        self.lease.holder()
    }

    /// The name this term's candidate campaigned under.
    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// Whether the term is believed to last: not lost, and its lease's
    /// confirmed deadline not passed. A `true` is no proof (a pause can
    /// fall right after it); the guard is what refuses a stale leader.
    pub fn is_leader(&self) -> bool {
        self.lease.lost().is_none() && !self.lease.remaining().is_zero()
    }

    /// Resolves when the term is lost, with why: the lease expired or
    /// changed hands, Redis could not confirm it before its deadline, or
    /// the term was [marked superseded](Self::mark_superseded).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> LostCause {
        if let Ok(token) = self.lease.watch() {
            token.cancelled().await;
        }
        self.lease.lost().unwrap_or(LostCause::Expired)
    }

    /// Runs `work` while the term lasts ([`Lease::run`]): stopped at its
    /// next `.await` when the term is lost, with [`Error::LeaseLost`].
    ///
    /// # Errors
    /// [`Error::LeaseLost`] with the [`LostCause`] when the term was lost
    /// before `work` finished.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work`; the term goes on.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output> {
        self.lease.run(work).await
    }

    /// Ends the term at once because a newer leader exists: the database
    /// refused one of its writes (the `leasehold-pg` guard's
    /// `Guard::Refused`). Work under [`run`](Self::run) stops at its next
    /// `.await` and [`lost`](Self::lost) resolves with
    /// [`LostCause::Superseded`] ([`Lease::mark_superseded`]). Then
    /// [`resign`](Self::resign) (which finds the lock already gone, or
    /// gives it back) and campaign again.
    pub fn mark_superseded(&self) {
        self.lease.mark_superseded();
    }

    /// Steps down: gives the lease back at once (token-checked), so the
    /// next candidate leads without waiting for the TTL. A hand-off
    /// election hands the lock to the first waiting candidate in the same
    /// atomic step; on a polling way this election's next campaign first
    /// waits its [`step_down`](ElectionBuilder::step_down), so a waiting
    /// follower takes over.
    ///
    /// # Errors
    /// As [`Lease::release`]: [`Error::NotHeld`] when the term had already
    /// been lost in Redis; a fault's error when Redis could not be asked
    /// (the TTL ends the term).
    ///
    /// # Cancel safety
    /// As [`Lease::release`].
    pub async fn resign(self) -> Result<()> {
        let Term {
            lease,
            mut tally,
            resigned_at,
            ..
        } = self;
        let lost = lease.lost();
        let released = lease.release().await;
        *resigned_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        tally.end(lost.map_or("resigned", LostCause::label));
        released
    }
}

/// Counts and traces the end of a term, once: at resign, or when dropped.
#[derive(Debug)]
struct Tally {
    shared: Arc<Shared>,
    election: String,
    fence: FencingToken,
    started: Instant,
    ended: bool,
}

impl Tally {
    fn end(&mut self, end: &'static str) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let held = self.started.elapsed();
        tracing::info!(
            target: "leasehold::election",
            election = self.election,
            fence = self.fence.get(),
            end,
            held_ms = u64::try_from(held.as_millis()).unwrap_or(u64::MAX),
            "term ended"
        );
        metrics::term_ended(end, held);
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        let end = self.shared.lost().map_or("dropped", LostCause::label);
        self.end(end);
    }
}

/// Who leads an election, from its leader record.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Leader {
    /// The name the leader campaigned under.
    pub candidate: String,
    /// Its term's fencing token.
    pub fence: FencingToken,
    /// Its holder, as the `leasehold-pg` guard records it.
    pub holder: HolderId,
    /// The lock's time to live when read: the term ends within it unless
    /// the leader's watchdog refreshes it.
    pub expires_within: Duration,
}

impl Leader {
    fn parse(body: &str, pttl: i64) -> Result<Leader> {
        let bad = || Error::UnexpectedReply { op: "read leader" };
        let mut fields = body.splitn(3, '\n');
        let fence = fields
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .filter(|f| *f > 0)
            .ok_or_else(bad)?;
        let holder = fields.next().and_then(HolderId::parse).ok_or_else(bad)?;
        let candidate = fields.next().ok_or_else(bad)?.to_owned();
        Ok(Leader {
            candidate,
            fence: FencingToken::new(fence),
            holder,
            expires_within: Duration::from_millis(u64::try_from(pttl).unwrap_or(0)),
        })
    }
}

/// Reports each change of an election's leader ([`Election::observe`]).
///
/// It asks Redis every [`observe_every`](ElectionBuilder::observe_every),
/// so a change is seen within that period plus a round trip; a leader
/// that stops without resigning is seen gone when its lease runs out.
#[derive(Debug)]
pub struct Observer<L: Lessor> {
    election: Election<L>,
    last: Option<(HolderId, FencingToken)>,
    started: bool,
}

impl<L: Lessor> Observer<L> {
    /// The first call: who leads now (`None`: nobody, or nobody named).
    /// Each later call: waits until that changes (another term, or no
    /// leader) and returns the new state.
    ///
    /// Faults are ridden out for the election's budget.
    ///
    /// # Errors
    /// A fault's error once every read failed for the budget; at once,
    /// what cannot pass (as [`Election::leader`]).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call changes nothing, and the next one
    /// compares with the last state returned.
    pub async fn changed(&mut self) -> Result<Option<Leader>> {
        let inner = &*self.election.inner;
        let mut faults: Option<Budget> = None;
        loop {
            match self.election.leader().await {
                Ok(leader) => {
                    faults = None;
                    let now = leader.as_ref().map(|l| (l.holder, l.fence));
                    if !self.started || now != self.last {
                        self.started = true;
                        self.last = now;
                        return Ok(leader);
                    }
                }
                Err(err) if crate::call::fault_may_pass(&err) => {
                    if inner.fault_budget(&mut faults).is_spent() {
                        return Err(err);
                    }
                }
                Err(err) => return Err(err),
            }
            tokio::time::sleep(inner.observe_every).await;
        }
    }
}
