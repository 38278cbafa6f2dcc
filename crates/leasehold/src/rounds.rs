//! The retry loop that every way of taking a lease shares.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, GiveUpReason, Result};
use crate::options::AcquireOptions;

/// What one attempt to take a lock found.
pub(crate) enum Attempt<T> {
    /// The lock is ours; `T` is whatever the attempt learned (a fence, ...).
    Won(T),
    /// Someone else holds it.
    Busy,
}

/// One `attempt` per round, each bounded by the caller's deadline and
/// `command_timeout` and raced against the caller's cancellation token, with
/// waits from the retry strategy in between. Returns what the winning attempt
/// returned and when it was sent.
///
/// If an attempt is abandoned mid-flight (timeout, lost connection, cancel,
/// or the whole future dropped) its requests may still land, so `abandon`
/// runs to undo them; it must not block.
pub(crate) async fn acquire_rounds<T, F, Fut, A>(
    key: &str,
    opts: &AcquireOptions,
    command_timeout: Duration,
    mut attempt: F,
    abandon: A,
) -> Result<(T, Instant)>
where
    F: FnMut(Instant) -> Fut,
    Fut: Future<Output = Result<Attempt<T>>>,
    A: Fn(),
{
    let start = Instant::now();
    let deadline = opts.deadline_from(start);
    let mut waits = opts.retry.waits();
    let mut attempts: u32 = 0;
    let give_up = |attempts, reason| Error::NotAcquired {
        key: key.to_owned(),
        attempts,
        waited: start.elapsed(),
        reason,
    };
    loop {
        if opts.cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
            return Err(give_up(attempts, GiveUpReason::Cancelled));
        }
        let sent_at = Instant::now();
        if sent_at >= deadline {
            return Err(give_up(attempts, GiveUpReason::DeadlineExpired));
        }
        attempts = attempts.saturating_add(1);
        let call_deadline = deadline.min(sent_at + command_timeout);
        let in_flight = OnAbandon::new(&abandon);
        let request = attempt(call_deadline);
        let outcome = match &opts.cancel {
            Some(cancel) => tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(give_up(attempts, GiveUpReason::Cancelled)),
                outcome = request => outcome,
            },
            None => request.await,
        };
        match outcome {
            Ok(Attempt::Won(won)) => {
                in_flight.disarm();
                return Ok((won, sent_at));
            }
            Ok(Attempt::Busy) => in_flight.disarm(),
            // A request that timed out or lost its connection may still have
            // landed: `in_flight` undoes it on drop.
            Err(err @ (Error::Timeout { .. } | Error::Unreachable { .. })) => return Err(err),
            Err(err) => {
                in_flight.disarm();
                return Err(err);
            }
        }
        let Some(wait) = waits.next() else {
            return Err(give_up(attempts, GiveUpReason::RetriesExhausted));
        };
        let wake = deadline.min(Instant::now() + wait);
        if !sleep_until(wake, opts).await {
            return Err(give_up(attempts, GiveUpReason::Cancelled));
        }
    }
}

/// Sleeps until `wake`; false if the caller's token was cancelled first.
async fn sleep_until(wake: Instant, opts: &AcquireOptions) -> bool {
    match &opts.cancel {
        Some(cancel) => tokio::select! {
            biased;
            () = cancel.cancelled() => false,
            () = tokio::time::sleep_until(wake) => true,
        },
        None => {
            tokio::time::sleep_until(wake).await;
            true
        }
    }
}

/// Runs its callback on drop unless disarmed.
struct OnAbandon<'a, A: Fn()> {
    abandon: &'a A,
    armed: bool,
}

impl<'a, A: Fn()> OnAbandon<'a, A> {
    fn new(abandon: &'a A) -> Self {
        OnAbandon {
            abandon,
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl<A: Fn()> Drop for OnAbandon<'_, A> {
    fn drop(&mut self) {
        if self.armed {
            (self.abandon)();
        }
    }
}
