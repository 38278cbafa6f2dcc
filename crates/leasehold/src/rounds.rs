//! The retry loop that every way of taking a lease shares, what it
//! reports of one acquire's progress (attempts made, time spent waiting),
//! and the adapter that hands it a [`LockService`]'s steps ([`Steps`]).
//!
//! The adapter sits beside the loop, not beside the acquire's entry: an
//! acquire's wait goes from its entry (module `acquire`) into the loop,
//! and from the loop's attempt straight to the service's step, so a reader
//! following it never comes back to a file already left.

use std::iter::Peekable;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Claim, LockService, StepKind, Wake};
use crate::budget::Budget;
use crate::call::fault_may_pass;
use crate::error::{Error, GiveUpReason, Result};
use crate::fencing::FencingToken;
use crate::node::Attempt;
use crate::options::AcquireOptions;
use crate::retry::Waits;

/// One acquire's retry rounds: its deadline, the attempts made so far, the
/// strategy's remaining waits, and how giving up is reported. Every way of
/// taking a lease (polling, fenced, quorum, hand-off) counts and gives up
/// through this, so the same options always give the same
/// [`Error::NotAcquired`].
pub(crate) struct Rounds<'a> {
    key: &'a str,
    opts: &'a AcquireOptions,
    command_timeout: Duration,
    budget: Budget,
    waits: Peekable<std::iter::Skip<Waits>>,
    attempts: u32,
    /// Whether the last attempt's request had less than the command
    /// timeout: the caller's deadline cut it short.
    cut_short: bool,
    /// Whether the service ever answered that someone else holds the lock.
    saw_busy: bool,
    /// The fault that may pass met since the service last answered.
    fault: Option<Error>,
}

impl<'a> Rounds<'a> {
    /// Rounds for an acquire of `key` within `budget`, each request bounded
    /// by `command_timeout` too.
    pub(crate) fn new(
        key: &'a str,
        opts: &'a AcquireOptions,
        budget: Budget,
        command_timeout: Duration,
    ) -> Self {
        // Attempts this acquire already made (a take again after a win
        // too few replicas acknowledged): the count, and the strategy's
        // waits, go on from there, so `max_attempts` bounds them all.
        let done = Progress::attempts_so_far();
        let skipped = usize::try_from(done).unwrap_or(usize::MAX);
        Rounds {
            key,
            opts,
            command_timeout,
            budget,
            waits: opts.retry.waits().skip(skipped).peekable(),
            attempts: done,
            cut_short: false,
            saw_busy: false,
            fault: None,
        }
    }

    /// When the caller stops waiting.
    pub(crate) fn deadline(&self) -> Instant {
        self.budget.deadline()
    }

    /// The error for giving up now, for `reason`, leaving aside any fault
    /// being ridden out (for a cancel, or where none can be).
    pub(crate) fn give_up(&self, reason: GiveUpReason) -> Error {
        Error::NotAcquired {
            key: self.key.to_owned(),
            attempts: self.attempts,
            waited: self.budget.start().elapsed(),
            reason,
            fault: None,
        }
    }

    /// The error for running out of wait now, for `reason`: the one rule
    /// every way gives up by. With no fault being ridden out,
    /// [`give_up`](Self::give_up)'s. During a fault, after the service had
    /// said the lock was busy, `NotAcquired` carrying the fault: the lock
    /// was held by someone else, and the service also failed at the end.
    /// During a fault, with the lock never seen busy, the fault itself:
    /// the service, not contention, kept the caller from the lock.
    pub(crate) fn ran_out(&mut self, reason: GiveUpReason) -> Error {
        match self.fault.take() {
            None => self.give_up(reason),
            Some(fault) if !self.saw_busy && reason != GiveUpReason::Cancelled => fault,
            Some(fault) => Error::NotAcquired {
                key: self.key.to_owned(),
                attempts: self.attempts,
                waited: self.budget.start().elapsed(),
                reason,
                fault: Some(Box::new(fault)),
            },
        }
    }

    /// Notes that the service answered: someone else holds the lock.
    pub(crate) fn busy(&mut self) {
        self.saw_busy = true;
        self.fault = None;
    }

    /// Notes a fault that may pass, met by the last request: what giving
    /// up during it reports ([`ran_out`](Self::ran_out)). A timeout only
    /// because the caller's deadline cut the request short, right after an
    /// answer or another fault, says nothing new: the wait ran out.
    pub(crate) fn met(&mut self, err: Error) {
        if self.timed_out_at_the_deadline(&err) && (self.fault.is_some() || self.saw_busy) {
            return;
        }
        self.fault = Some(err);
    }

    /// Gives up if the caller's token is already cancelled.
    pub(crate) fn check_cancelled(&self) -> Result<()> {
        match &self.opts.cancel {
            Some(cancel) if cancel.is_cancelled() => Err(self.give_up(GiveUpReason::Cancelled)),
            _ => Ok(()),
        }
    }

    /// Starts an attempt: gives up if cancelled or past the deadline, else
    /// counts it and returns its send time and the deadline of its request
    /// (the caller's, capped by the command timeout).
    pub(crate) fn attempt(&mut self) -> Result<(Instant, Instant)> {
        let sent_at = self.request()?;
        self.attempts = self.attempts.saturating_add(1);
        Progress::update(|p| p.attempt(self.attempts, sent_at));
        let (deadline, cut_short) = self.budget.for_request(sent_at, self.command_timeout);
        self.cut_short = cut_short;
        Ok((sent_at, deadline))
    }

    /// Now, for a request about to be sent: gives up if cancelled or past
    /// the deadline.
    fn request(&mut self) -> Result<Instant> {
        self.check_cancelled()?;
        let now = Instant::now();
        if now >= self.budget.deadline() {
            return Err(self.ran_out(GiveUpReason::DeadlineExpired));
        }
        Ok(now)
    }

    /// Whether the last attempt was a timeout only because the caller's
    /// deadline left it less than the command timeout, and that deadline
    /// has now passed.
    fn timed_out_at_the_deadline(&self, err: &Error) -> bool {
        self.cut_short && is_timeout(err) && self.budget.is_spent()
    }

    /// The strategy's next wait; gives up when none is left.
    /// Once it returns a wait, the acquire counts as waiting for the lock
    /// until its next attempt (or its end).
    pub(crate) fn next_wait(&mut self) -> Result<Duration> {
        let Some(wait) = self.waits.next() else {
            return Err(self.ran_out(GiveUpReason::RetriesExhausted));
        };
        let now = Instant::now();
        Progress::update(|p| p.wait_from(now));
        Ok(wait)
    }

    /// Resolves when the caller's token is cancelled; never without one.
    pub(crate) async fn cancelled(&self) {
        self.opts.cancelled().await;
    }
}

/// `$work`'s output, unless the caller's token (of `$rounds`, a
/// [`Rounds`]) is cancelled first: then `$work` is dropped and the acquire
/// gives up (`Err(NotAcquired { reason: Cancelled })`).
///
/// A macro, not an `async fn` taking the future: such a function holds its
/// argument twice (as the argument and in the `select!` it awaits), and
/// the acquire's futures grew by that at every layer above (moved with
/// `memcpy`, seen in callgrind and perf).
macro_rules! unless_cancelled {
    ($rounds:expr, $work:expr) => {{
        let rounds: &$crate::rounds::Rounds<'_> = $rounds;
        ::tokio::select! {
            biased;
            () = rounds.cancelled() => {
                Err(rounds.give_up($crate::error::GiveUpReason::Cancelled))
            }
            output = $work => Ok(output),
        }
    }};
}

tokio::task_local! {
    /// The progress of the acquire this task is running, if it is observed
    /// (see [`Progress::observe`]).
    static PROGRESS: Arc<Mutex<Progress>>;
}

/// How far one acquire of one key got: what its trace span and metrics
/// report, whatever way took it. [`Rounds`] updates it as it goes, so every
/// way reports the same thing without passing it around.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Progress {
    /// Attempts made (requests for the lock, or a queued wait in process).
    pub(crate) attempts: u32,
    /// Time spent waiting for the lock (asleep between attempts, queued),
    /// not counting a wait still running.
    waited: Duration,
    /// When the wait still running started.
    waiting_since: Option<Instant>,
}

impl Progress {
    /// Runs `acquire` with its progress recorded into `into` (readable even
    /// if the future is dropped half-way).
    ///
    /// Not an `async fn`: one would hold `acquire` twice (as its argument
    /// and inside the scope it awaits), doubling the acquire's future, which
    /// every layer above then moves (callgrind and perf: `memcpy`).
    pub(crate) fn observe<F: Future>(
        into: Arc<Mutex<Progress>>,
        acquire: F,
    ) -> impl Future<Output = F::Output> {
        PROGRESS.scope(into, acquire)
    }

    /// The progress recorded in `shared` so far, a running wait counted up
    /// to `now`.
    pub(crate) fn read(shared: &Mutex<Progress>, now: Instant) -> Progress {
        let mut progress = *shared.lock().unwrap_or_else(PoisonError::into_inner);
        progress.end_wait(now);
        progress
    }

    /// Time spent waiting for the lock.
    pub(crate) fn waited(&self) -> Duration {
        self.waited
    }

    /// Attempts made so far by the acquire this task runs (0 if none is
    /// observed).
    pub(crate) fn attempts_so_far() -> u32 {
        PROGRESS
            .try_with(|shared| {
                shared
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .attempts
            })
            .unwrap_or(0)
    }

    /// Applies `f` to the progress of the acquire this task runs, if any.
    fn update(f: impl FnOnce(&mut Progress)) {
        let _ = PROGRESS
            .try_with(|shared| f(&mut shared.lock().unwrap_or_else(PoisonError::into_inner)));
    }

    fn attempt(&mut self, attempts: u32, at: Instant) {
        self.end_wait(at);
        self.attempts = attempts;
    }

    fn wait_from(&mut self, at: Instant) {
        self.end_wait(at);
        self.waiting_since = Some(at);
    }

    fn end_wait(&mut self, at: Instant) {
        if let Some(since) = self.waiting_since.take() {
            self.waited += at.saturating_duration_since(since);
        }
    }
}

/// Whether `err` may be a request that ran out of time: Redis's timeout,
/// a quorum the nodes did not make in time, or a service's fault that may
/// pass (a service outside the crate cannot say more; at a spent deadline,
/// the deadline is what cut it short).
fn is_timeout(err: &Error) -> bool {
    matches!(
        err,
        Error::Timeout { .. }
            | Error::QuorumNotReached { .. }
            | Error::Service {
                fault: crate::error::ServiceFault::Transient | crate::error::ServiceFault::Unknown,
                ..
            }
    )
}

/// One acquire's requests, as the retry loop ([`drive`]) sees them: an
/// attempt at the lock, the undo of an attempt whose outcome is unknown,
/// and what to do when the acquire ends without a win.
pub(crate) trait Attempts {
    /// What a winning attempt returns.
    type Won;

    /// One attempt, bounded by `deadline`: won or busy.
    fn attempt(&mut self, deadline: Instant) -> impl Future<Output = Result<Attempt<Self::Won>>>;

    /// Gives back what an attempt with an unknown outcome may have taken,
    /// bounded by `deadline`.
    fn undo(&mut self, deadline: Instant) -> impl Future<Output = Result<()>>;

    /// The acquire ended (or was dropped) without a win; `maybe_taken`
    /// when an attempt's outcome is still unknown. Must not block.
    fn abandon(&mut self, maybe_taken: bool);

    /// The wait between two attempts: until `until` (the retry
    /// strategy's next wait, capped by the deadline) by default. A queued
    /// service waits for what its last attempt left it (a wake-up, a
    /// signal that the lock is ours), until `deadline` at most. Raced
    /// against the caller's cancellation (dropped then): must be cancel
    /// safe, keeping in `self` whatever it received.
    fn pause(&mut self, until: Instant, _deadline: Instant) -> impl Future<Output = ()> {
        tokio::time::sleep_until(until)
    }

    /// The acquire ended with an error (not dropped): give up any place
    /// an attempt keeps (a queue entry) now, by `deadline`, before the
    /// caller hears it; [`abandon`](Self::abandon) runs after it.
    fn leave(&mut self, _deadline: Instant) -> impl Future<Output = ()> {
        async {}
    }
}

/// The one retry loop: one attempt per round for an acquire within
/// `budget`, each bounded by the budget's deadline and `command_timeout`
/// and raced against the caller's cancellation token, with a pause in
/// between ([`Attempts::pause`]: the retry strategy's wait, or what a
/// queued service waits for: a wake-up, a release's signal). Returns what the winning attempt returned and when it was
/// sent.
///
/// # Riding out transient faults
///
/// An attempt that fails for a reason that can pass (a timeout, a lost
/// connection, `LOADING`, `TRYAGAIN`, `MASTERDOWN`, `CLUSTERDOWN`, ...:
/// [`Error::is_retryable`]) does not end the acquire: it is retried like a
/// busy lock, until the caller's deadline. Such an attempt may still have
/// landed (the reply was lost, not the request), so before the next attempt
/// `undo` gives back whatever it may have taken (a token-checked delete of
/// our own token: it can never touch another holder's lock), and only once
/// that is confirmed does the next attempt go out, with the same token. So a
/// retried acquire never holds a lock it does not know of, and the undo
/// never races an attempt of ours. If the deadline comes first, the
/// acquire gives up by [`Rounds::ran_out`]'s rule: `NotAcquired` if the
/// service ever answered "busy" (carrying the fault it was riding out at
/// the end, if any), else the last fault itself (the caller learns that
/// the service, not contention, was the problem). A last attempt that
/// timed out only because the caller's deadline gave it less than the
/// command timeout adds nothing to what was known: that acquire ran out of
/// wait.
///
/// If the acquire ends without a win (gave up, failed, cancelled, or its
/// future dropped), `abandon` runs, told whether an attempt may still
/// land; it must not block. Before that, an acquire that ends with an
/// error (not one dropped) first awaits `leave`, until the budget's
/// deadline at most: a queued service gives up its place before the
/// caller hears the error.
pub(crate) async fn drive<A: Attempts>(
    key: &str,
    opts: &AcquireOptions,
    budget: Budget,
    command_timeout: Duration,
    attempts: A,
) -> Result<(A::Won, Instant)> {
    let mut rounds = Rounds::new(key, opts, budget, command_timeout);
    let mut driver = Driver {
        attempts,
        owed: false,
        won: false,
    };
    // The rounds, until a win or the error that ends them.
    let err = loop {
        match round(&mut rounds, &mut driver).await {
            Err(gave_up) => break gave_up,
            Ok(Ok(Some(won))) => {
                driver.won = true;
                return Ok(won);
            }
            Ok(Ok(None)) => rounds.busy(),
            // What an attempt cut short by the deadline may have taken is
            // undone by `abandon` (the undo is still owed).
            // An attempt whose outcome is unknown is ridden out as well:
            // the undo owed goes before the next attempt.
            Ok(Err(err)) if fault_may_pass(&err) || crate::call::may_have_acted(&err) => {
                tracing::debug!(key, error = %err, "acquire attempt failed; retrying within the deadline");
                rounds.met(err);
            }
            Ok(Err(err)) => break err,
        }
        let wait = match rounds.next_wait() {
            Ok(wait) => wait,
            Err(gave_up) => break gave_up,
        };
        let deadline = rounds.deadline();
        let until = deadline.min(Instant::now() + wait);
        if let Err(cancelled) = unless_cancelled!(&rounds, driver.attempts.pause(until, deadline)) {
            break cancelled;
        }
    };
    let deadline = rounds.deadline();
    let _ = tokio::time::timeout_at(deadline, driver.attempts.leave(deadline)).await;
    Err(err)
}

/// An acquire's [`Attempts`] and whether an undo is owed; abandons on
/// drop unless it won.
struct Driver<A: Attempts> {
    attempts: A,
    /// Whether an attempt of ours may have landed without our knowing.
    owed: bool,
    won: bool,
}

impl<A: Attempts> Drop for Driver<A> {
    fn drop(&mut self) {
        if !self.won {
            self.attempts.abandon(self.owed);
        }
    }
}

/// A fault of the undo (a token-checked delete, a release to Redis) as the
/// caller sees it: a fault during its acquire, not of a release it never
/// asked for.
fn during_acquire(err: Error) -> Error {
    match err {
        Error::Timeout { service, after, .. } => Error::Timeout {
            service,
            op: "acquire",
            after,
        },
        Error::Unreachable { source, .. } => Error::Unreachable {
            op: "acquire",
            source,
        },
        Error::Redis { source, .. } => Error::Redis {
            op: "acquire",
            source,
        },
        Error::OutOfMemory { source, .. } => Error::OutOfMemory {
            op: "acquire",
            source,
        },
        Error::Service {
            service,
            fault,
            source,
            ..
        } => Error::Service {
            service,
            op: "acquire",
            fault,
            source,
        },
        other => other,
    }
}

/// One round: the undo an earlier attempt still owes (if any), then one
/// attempt. `Ok(Ok(None))` when the lock is busy; `Ok(Err(_))` when a
/// request failed; `Err(_)` when the acquire gives up (cancelled, or out of
/// wait: [`Rounds::ran_out`]'s error, final).
async fn round<A: Attempts>(
    rounds: &mut Rounds<'_>,
    driver: &mut Driver<A>,
) -> Result<Result<Option<(A::Won, Instant)>>> {
    if driver.owed {
        let now = rounds.request()?;
        let (deadline, _) = rounds.budget.for_request(now, rounds.command_timeout);
        if let Err(err) = unless_cancelled!(rounds, driver.attempts.undo(deadline))? {
            return Ok(Err(during_acquire(err)));
        }
        driver.owed = false;
    }
    let (sent_at, call_deadline) = rounds.attempt()?;
    // From here until its answer, the attempt may land.
    driver.owed = true;
    let answer = unless_cancelled!(rounds, driver.attempts.attempt(call_deadline))?;
    // Won or busy: we know. A refusal (bad input, no permission, wrong
    // type, `LOADING`) or a request that never left did not act. Only a
    // timeout or a connection lost with the request out leaves it unknown.
    driver.owed = matches!(&answer, Err(err) if crate::call::may_have_acted(err));
    Ok(answer.map(|answer| match answer {
        Attempt::Won(won) => Some((won, sent_at)),
        Attempt::Busy => None,
    }))
}

/// One acquire of a service, as the retry loop drives it: its claim, its
/// entry (the service's state across steps) and the last step's wake-up.
pub(crate) struct Steps<'s, S: LockService> {
    service: &'s S,
    claim: &'s Claim,
    /// Always `Some` until [`abandon`](Attempts::abandon) takes it.
    entry: Option<S::Entry>,
    wake: Option<Wake>,
}

impl<'s, S: LockService> Steps<'s, S> {
    /// The steps of one acquire of `service` for `claim`, with a fresh
    /// entry.
    pub(crate) fn new(service: &'s S, claim: &'s Claim) -> Self {
        Steps {
            service,
            claim,
            entry: Some(S::Entry::default()),
            wake: None,
        }
    }

    fn entry(&mut self) -> &mut S::Entry {
        self.entry.get_or_insert_with(S::Entry::default)
    }
}

impl<S: LockService> Attempts for Steps<'_, S> {
    type Won = Option<FencingToken>;

    async fn attempt(&mut self, deadline: Instant) -> Result<Attempt<Option<FencingToken>>> {
        let (service, claim) = (self.service, self.claim);
        let step = service.step(claim, self.entry(), deadline).await?;
        Ok(match step.kind {
            StepKind::Won(fence) => Attempt::Won(fence),
            StepKind::Busy(wake) => {
                self.wake = wake;
                Attempt::Busy
            }
        })
    }

    async fn undo(&mut self, deadline: Instant) -> Result<()> {
        let (service, claim) = (self.service, self.claim);
        service.undo(claim, self.entry(), deadline).await
    }

    fn abandon(&mut self, maybe_taken: bool) {
        let entry = self.entry.take().unwrap_or_default();
        self.service.abandon(self.claim.clone(), entry, maybe_taken);
    }

    /// A busy step's wake-up says when to look again (the deadline still
    /// bounds the wait); without one, the strategy's wait.
    async fn pause(&mut self, until: Instant, deadline: Instant) {
        match self.wake.take() {
            None => tokio::time::sleep_until(until).await,
            Some(wake) => {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = wake => {}
                }
            }
        }
    }

    async fn leave(&mut self, deadline: Instant) {
        let (service, claim) = (self.service, self.claim);
        if let Err(err) = service.leave(claim, self.entry(), deadline).await {
            tracing::debug!(key = claim.key(), error = %err, "could not leave the queue; abandoning");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn quorum_lost(key: &str) -> Error {
        Error::QuorumNotReached {
            key: key.to_owned(),
            got: 0,
            needed: 2,
            failed_nodes: 3,
        }
    }

    /// Rounds for a wait of `wait` (300 ms command timeout) whose first
    /// attempt met a fault that may pass, and whose second is sent.
    fn after_a_fault(opts: &AcquireOptions, wait: Duration) -> Rounds<'_> {
        let mut rounds = Rounds::new("k", opts, Budget::from_now(wait), 300 * MS);
        rounds.attempt().expect("within the wait");
        rounds.met(Error::NotReplicated {
            key: "k".to_owned(),
            acked: 0,
            wanted: 1,
        });
        rounds.attempt().expect("within the wait");
        rounds
    }

    /// A quorum the nodes did not make in the sliver of wait the deadline
    /// left says nothing new: the fault met before is what the caller
    /// hears. One lost with the whole command timeout is news.
    #[tokio::test(start_paused = true)]
    async fn a_quorum_cut_short_by_the_deadline_keeps_the_fault_before_it() {
        let opts = AcquireOptions::new();
        let mut rounds = after_a_fault(&opts, 100 * MS);
        tokio::time::sleep(100 * MS).await;
        rounds.met(quorum_lost("cut short"));
        assert!(
            matches!(
                rounds.ran_out(GiveUpReason::DeadlineExpired),
                Error::NotReplicated { .. }
            ),
            "the fault before the cut-short attempt"
        );

        let mut rounds = after_a_fault(&opts, 1000 * MS);
        tokio::time::sleep(300 * MS).await;
        rounds.met(quorum_lost("whole timeout"));
        assert!(
            matches!(
                rounds.ran_out(GiveUpReason::DeadlineExpired),
                Error::QuorumNotReached { key, .. } if key == "whole timeout"
            ),
            "a quorum lost with time to answer is the news"
        );
    }
}

#[cfg(test)]
mod steps_tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::backend::{Claim, Held, LockService, Reply, Step};
    use crate::{AcquireOptions, Lessor, RetryStrategy, Service};

    /// A queued service: busy until `free_at`, and says so with a wake-up
    /// at that moment.
    #[derive(Clone)]
    struct Queued {
        free_at: Instant,
        steps: Arc<AtomicU32>,
        left: Arc<AtomicU32>,
    }

    impl LockService for Queued {
        type Entry = ();

        fn service(&self) -> Service {
            Service::named("queued")
        }

        fn command_timeout(&self) -> Duration {
            Duration::from_secs(1)
        }

        fn step<'a>(&'a self, _: &'a Claim, (): &'a mut (), _: Instant) -> Reply<'a, Step> {
            self.steps.fetch_add(1, Ordering::SeqCst);
            let free_at = self.free_at;
            Box::pin(async move {
                Ok(if Instant::now() >= free_at {
                    Step::won(None)
                } else {
                    Step::busy_until(tokio::time::sleep_until(free_at))
                })
            })
        }

        fn undo<'a>(&'a self, _: &'a Claim, (): &'a mut (), _: Instant) -> Reply<'a, ()> {
            Box::pin(async { Ok(()) })
        }

        fn leave<'a>(&'a self, _: &'a Claim, (): &'a mut (), _: Instant) -> Reply<'a, ()> {
            self.left.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(()) })
        }

        fn refresh<'a>(&'a self, _: &'a Held, _: Duration, _: Instant) -> Reply<'a, bool> {
            Box::pin(async { Ok(true) })
        }

        fn release<'a>(&'a self, _: &'a Held, _: Instant) -> Reply<'a, bool> {
            Box::pin(async { Ok(true) })
        }
    }

    /// A busy step with a wake-up is stepped again at the wake-up, not at
    /// the strategy's (much shorter) waits: two steps, where polling every
    /// millisecond made thousands.
    #[tokio::test(start_paused = true)]
    async fn a_queued_service_is_stepped_again_at_its_wake_up_alone() -> crate::Result<()> {
        let service = Queued {
            free_at: Instant::now() + Duration::from_secs(5),
            steps: Arc::default(),
            left: Arc::default(),
        };
        let opts = AcquireOptions::new()
            .retry(RetryStrategy::constant(Duration::from_millis(1)))
            .wait(Duration::from_secs(10));
        let lease = service
            .acquire_with("k", Duration::from_secs(1), &opts)
            .await?;
        lease.release().await?;
        assert_eq!(service.steps.load(Ordering::SeqCst), 2);
        Ok(())
    }

    /// An acquire that gives up leaves its place (the service's `leave`)
    /// before the caller hears it, once; one that wins does not.
    #[tokio::test(start_paused = true)]
    async fn an_acquire_that_gives_up_leaves_before_it_returns() -> crate::Result<()> {
        let service = Queued {
            free_at: Instant::now() + Duration::from_secs(5),
            steps: Arc::default(),
            left: Arc::default(),
        };
        let opts = AcquireOptions::new().wait(Duration::from_secs(1));
        let gave_up = service
            .acquire_with("k", Duration::from_secs(1), &opts)
            .await;
        assert!(
            matches!(gave_up, Err(crate::Error::NotAcquired { .. })),
            "{gave_up:?}"
        );
        assert_eq!(service.left.load(Ordering::SeqCst), 1);
        let opts = AcquireOptions::new().wait(Duration::from_secs(10));
        let lease = service
            .acquire_with("k", Duration::from_secs(1), &opts)
            .await?;
        lease.release().await?;
        assert_eq!(service.left.load(Ordering::SeqCst), 1);
        Ok(())
    }
}
