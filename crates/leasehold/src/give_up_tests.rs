//! Whatever the strategy and options, giving up is one variant:
//! [`Error::NotAcquired`] with the reason that actually stopped the wait.
//! Deterministic: paused tokio time and a fake Redis whose lock is always busy.

use crate::Lessor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redis::{Cmd, RedisFuture, Value};
use tokio_util::sync::CancellationToken;

use crate::{AcquireOptions, Error, GiveUpReason, Locker, RetryStrategy};

const MS: Duration = Duration::from_millis(1);

/// A Redis whose lock key is always held by someone else. Cancels `cancel`
/// when it receives its `cancel_at`-th `SET`; with `silent_after`, never
/// answers a `SET` after that many (a stalled server, or one too loaded to
/// answer in time), nor, with `all_silent`, anything else once it went
/// silent (the undo of an attempt that may have landed included).
#[derive(Clone)]
struct BusyRedis {
    sets: Arc<AtomicU32>,
    cancel: Option<(u32, CancellationToken)>,
    silent_after: Option<u32>,
    all_silent: bool,
}

impl redis::aio::ConnectionLike for BusyRedis {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let is_set = matches!(cmd.args_iter().next(), Some(redis::Arg::Simple(b"SET")));
        Box::pin(async move {
            if is_set {
                let n = self.sets.fetch_add(1, Ordering::SeqCst) + 1;
                if let Some((at, token)) = &self.cancel
                    && n == *at
                {
                    token.cancel();
                }
                if self.silent_after.is_some_and(|busy| n > busy) {
                    std::future::pending::<()>().await;
                }
                return Ok(Value::BulkString(b"someone-else".to_vec()));
            }
            let went_silent = self
                .silent_after
                .is_some_and(|busy| self.sets.load(Ordering::SeqCst) > busy);
            if self.all_silent && went_silent {
                std::future::pending::<()>().await;
            }
            Ok(Value::Int(0))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a redis::Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

fn strategies() -> Vec<(&'static str, RetryStrategy)> {
    vec![
        ("none", RetryStrategy::none()),
        ("constant", RetryStrategy::constant(10 * MS)),
        ("linear", RetryStrategy::linear(5 * MS, 20 * MS)),
        ("exponential", RetryStrategy::exponential(16 * MS, 128 * MS)),
        (
            "exponential+jitter",
            RetryStrategy::exponential(16 * MS, 128 * MS).with_full_jitter(),
        ),
        ("uniform", RetryStrategy::default()),
        (
            "decorrelated",
            RetryStrategy::decorrelated_jitter(5 * MS, 100 * MS),
        ),
        (
            "zero+jitter",
            RetryStrategy::constant(Duration::ZERO).with_full_jitter(),
        ),
    ]
}

async fn give_up(opts: AcquireOptions, cancel_at: Option<(u32, CancellationToken)>) -> Error {
    let fake = BusyRedis {
        sets: Arc::default(),
        cancel: cancel_at,
        silent_after: None,
        all_silent: false,
    };
    let locker = Locker::builder().build(fake).expect("default settings");
    match locker
        .acquire_with("k", Duration::from_secs(1), &opts)
        .await
    {
        Ok(_) => panic!("the fake lock is always busy"),
        Err(err) => err,
    }
}

#[tokio::test(start_paused = true)]
async fn every_strategy_and_option_gives_up_with_not_acquired() {
    for (name, strategy) in strategies() {
        let retries = strategy != RetryStrategy::none();

        // Deadline: the wait is capped at exactly the deadline.
        let wait = 300 * MS;
        let err = give_up(AcquireOptions::new().retry(strategy).wait(wait), None).await;
        match err {
            Error::NotAcquired {
                reason,
                waited,
                attempts,
                ..
            } if retries => {
                assert_eq!(reason, GiveUpReason::DeadlineExpired, "{name}");
                assert_eq!(waited, wait, "{name}: a wait overshot the deadline");
                assert!(attempts > 1, "{name}");
            }
            Error::NotAcquired {
                reason, attempts, ..
            } => {
                assert_eq!(reason, GiveUpReason::RetriesExhausted, "{name}");
                assert_eq!(attempts, 1, "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }

        // Cancelled before the first attempt.
        let token = CancellationToken::new();
        token.cancel();
        let err = give_up(AcquireOptions::new().retry(strategy).cancel(token), None).await;
        assert!(
            matches!(
                err,
                Error::NotAcquired {
                    reason: GiveUpReason::Cancelled,
                    attempts: 0,
                    ..
                }
            ),
            "{name}: {err:?}"
        );

        // Cancelled while waiting (the fake cancels on its second SET),
        // with a deadline and an attempt limit set too.
        let token = CancellationToken::new();
        let opts = AcquireOptions::new()
            .retry(strategy.max_attempts(50))
            .wait(Duration::from_secs(60))
            .cancel(token.clone());
        let err = give_up(opts, Some((2, token))).await;
        match err {
            Error::NotAcquired {
                reason, attempts, ..
            } if retries => {
                assert_eq!(reason, GiveUpReason::Cancelled, "{name}");
                assert_eq!(attempts, 2, "{name}");
            }
            Error::NotAcquired { reason, .. } => {
                assert_eq!(reason, GiveUpReason::RetriesExhausted, "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }

        // Attempt limit, with a far deadline and an idle cancel token.
        let opts = AcquireOptions::new()
            .retry(strategy.max_attempts(4))
            .wait(Duration::from_secs(60))
            .cancel(CancellationToken::new());
        let err = give_up(opts, None).await;
        let want = if retries { 4 } else { 1 };
        assert!(
            matches!(
                err,
                Error::NotAcquired { reason: GiveUpReason::RetriesExhausted, attempts, .. }
                    if attempts == want
            ),
            "{name}: {err:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn stats_count_every_request() {
    let locker = Locker::builder()
        .build(BusyRedis {
            sets: Arc::default(),
            cancel: None,
            silent_after: None,
            all_silent: false,
        })
        .expect("default settings");
    let opts = AcquireOptions::new().retry(RetryStrategy::constant(MS).max_attempts(3));
    let err = locker
        .acquire_with("k", Duration::from_secs(1), &opts)
        .await;
    assert!(err.is_err());
    let stats = locker.stats();
    assert_eq!(stats.acquire_requests, 3);
    assert_eq!(stats.acquisitions, 0);
}

/// The last attempt of a wait gets only what is left of it. When Redis
/// had answered "busy" just before and that short attempt times out, the
/// wait ran out, not Redis: `NotAcquired`, with no fault. When Redis never
/// answered, the fault is the answer. When it answered "busy" and then
/// failed until the wait ran out, the lock was busy and the server also
/// failed: `NotAcquired` carrying the fault.
#[tokio::test(start_paused = true)]
async fn a_last_attempt_cut_short_by_the_wait_gives_up_as_not_acquired() {
    let acquire = |busy: u32, wait: Duration, all_silent: bool| async move {
        let fake = BusyRedis {
            sets: Arc::default(),
            cancel: None,
            silent_after: Some(busy),
            all_silent,
        };
        let locker = Locker::builder()
            .command_timeout(500 * MS)
            .build(fake)
            .expect("valid settings");
        let opts = AcquireOptions::new()
            .retry(RetryStrategy::constant(60 * MS))
            .wait(wait);
        locker
            .acquire_with("k", Duration::from_secs(1), &opts)
            .await
    };
    // Busy, then an attempt with 40 ms of the wait left that gets no answer.
    match acquire(1, 100 * MS, false).await {
        Err(Error::NotAcquired {
            reason: GiveUpReason::DeadlineExpired,
            attempts: 2,
            fault: None,
            ..
        }) => {}
        other => panic!("busy, then cut short: {other:?}"),
    }
    // Never answered: the caller learns Redis was the problem, during its
    // acquire (also when the last request was the undo of an attempt that
    // may have landed: a release the caller never asked for).
    match acquire(0, 100 * MS, false).await {
        Err(Error::Timeout { op: "acquire", .. }) => {}
        other => panic!("never answered: {other:?}"),
    }
    // Busy, then attempts that had their whole command timeout until the
    // wait ran out: busy, and the server also failed at the end.
    let busy_then_silent = |err: &Error| {
        matches!(
            err,
            Error::NotAcquired {
                reason: GiveUpReason::DeadlineExpired,
                fault: Some(fault),
                ..
            } if matches!(**fault, Error::Timeout { op: "acquire", .. })
        )
    };
    match acquire(1, 2000 * MS, false).await {
        Err(err) if busy_then_silent(&err) => {
            assert!(err.is_retryable() && err.is_contention(), "{err:?}");
            // The fault is the error's source, named once.
            let source = std::error::Error::source(&err).map(ToString::to_string);
            assert!(
                source.is_some_and(|s| s.contains("did not answer acquire")),
                "{err}"
            );
        }
        other => panic!("busy, then a full timeout: {other:?}"),
    }
    // The same with the undo of that attempt unanswered too: the caller
    // asked for a lock, and hears of a fault during its acquire, not of a
    // release it never asked for.
    match acquire(1, 2000 * MS, true).await {
        Err(err) if busy_then_silent(&err) => {}
        other => panic!("busy, then silent, undo included: {other:?}"),
    }
}
