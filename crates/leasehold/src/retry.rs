//! Retry strategies as data: what to wait between attempts on a busy lock.
//!
//! A [`RetryStrategy`] is a small `Copy` value built with `const fn`s; calling
//! [`RetryStrategy::waits`] turns it into an iterator of [`Duration`]s, one per
//! failed attempt. The iterator ending means "stop retrying". The caller's
//! deadline always caps the total: a strategy never makes an acquire wait past
//! it, and the error that comes back when it gives up is the same
//! [`Error::NotAcquired`](crate::Error::NotAcquired) whatever the strategy.
//!
//! Why randomise? Callers that fail together and back off on the same schedule
//! wake together: every round one of them wins and the rest collide again (a
//! thundering herd). Spreading the waits at random breaks the lockstep.
//!
//! Why wait at all? Every polling strategy sends a request per wait per
//! waiter, and lets a lucky caller win again and again. When many callers
//! queue on one key, the hand-off mode ([`HandoffLocker`](crate::HandoffLocker))
//! wakes exactly one waiter per release instead.
//!
//! # The strategies
//!
//! | builder | waits (before jitter) |
//! |---|---|
//! | [`none`](RetryStrategy::none) | none: one attempt |
//! | [`constant(d)`](RetryStrategy::constant) | `d, d, d, ...` |
//! | [`linear(step, max)`](RetryStrategy::linear) | `step, 2 step, 3 step, ...` capped at `max` |
//! | [`exponential(min, max)`](RetryStrategy::exponential) | `min, 2 min, 4 min, ...` capped at `max` |
//! | [`uniform(min, max)`](RetryStrategy::uniform) | random in `[min, max)` |
//! | [`decorrelated_jitter(min, max)`](RetryStrategy::decorrelated_jitter) | random in `[min, 3 previous)`, capped at `max` |
//!
//! [`with_full_jitter`](RetryStrategy::with_full_jitter) replaces any wait `d`
//! with a random wait in `[1 ms, d + 1 ms)`, and
//! [`max_attempts`](RetryStrategy::max_attempts) bounds the number of tries.
//!
//! ## Exponential backoff and bsm/redislock
//!
//! bsm/redislock's `ExponentialBackoff(16ms, 128ms)` waits `2^(n+1)` ms
//! clamped to `[min, max]`: 16 ms three times (4 and 8 are raised to the
//! minimum), then 32, 64, and 128 ms from then on. Ours doubles from `min`:
//! 16, 32, 64, then 128 ms. We do not copy redislock's schedule: it depends on
//! absolute millisecond powers of two rather than on `min` (a 1 s minimum
//! would repeat nine times before growing). Both are deterministic, so both
//! produce the same lockstep herd under contention, which is the point of
//! the tutorial's Step 4.

use std::time::Duration;

use rand::{RngExt, SeedableRng, rngs::SmallRng};

thread_local! {
    /// The generator each [`Waits`] is seeded from, per thread.
    static JITTER: std::cell::RefCell<Option<SmallRng>> = const { std::cell::RefCell::new(None) };
}

/// How long to wait between attempts to take a busy lock.
///
/// Defaults to [`RetryStrategy::uniform`] between 5 ms and 15 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryStrategy {
    base: Base,
    full_jitter: bool,
    max_attempts: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    None,
    Constant(Duration),
    Linear { step: Duration, max: Duration },
    Exponential { min: Duration, max: Duration },
    Uniform { min: Duration, max: Duration },
    Decorrelated { min: Duration, max: Duration },
}

impl Default for RetryStrategy {
    fn default() -> Self {
        RetryStrategy::uniform(Duration::from_millis(5), Duration::from_millis(15))
    }
}

impl RetryStrategy {
    const fn from_base(base: Base) -> Self {
        RetryStrategy {
            base,
            full_jitter: false,
            max_attempts: None,
        }
    }

    /// One attempt, no retries.
    pub const fn none() -> Self {
        RetryStrategy::from_base(Base::None)
    }

    /// The same wait every time.
    pub const fn constant(wait: Duration) -> Self {
        RetryStrategy::from_base(Base::Constant(wait))
    }

    /// `step`, `2 * step`, `3 * step`, ... capped at `max`.
    pub const fn linear(step: Duration, max: Duration) -> Self {
        RetryStrategy::from_base(Base::Linear { step, max })
    }

    /// `min`, `2 * min`, `4 * min`, ... capped at `max` (see the module docs
    /// for how this differs from bsm/redislock). Deterministic: every
    /// caller that failed at the same moment retries at the same moment.
    /// Combine with [`with_full_jitter`](Self::with_full_jitter) under
    /// contention.
    pub const fn exponential(min: Duration, max: Duration) -> Self {
        RetryStrategy::from_base(Base::Exponential { min, max })
    }

    /// A fresh random wait in `[min, max)` every time (the tutorial's Step 2
    /// waits 5 to 15 ms this way).
    pub const fn uniform(min: Duration, max: Duration) -> Self {
        RetryStrategy::from_base(Base::Uniform { min, max })
    }

    /// "Decorrelated jitter": each wait is random in `[min, 3 * previous)`,
    /// capped at `max`.
    pub const fn decorrelated_jitter(min: Duration, max: Duration) -> Self {
        RetryStrategy::from_base(Base::Decorrelated { min, max })
    }

    /// Replaces each wait `d` of the strategy with a random wait in
    /// `[1 ms, d + 1 ms)` ("full jitter"). The 1 ms floor keeps a random zero
    /// from ever looking like "stop retrying" or a busy loop.
    pub const fn with_full_jitter(mut self) -> Self {
        self.full_jitter = true;
        self
    }

    /// Stops after `attempts` attempts in total (the first one included).
    /// Defaults to no limit: the deadline decides.
    pub const fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Whether the strategy stops retrying before the deadline (one
    /// attempt, or a number of them).
    pub(crate) const fn gives_up_early(&self) -> bool {
        matches!(self.base, Base::None) || self.max_attempts.is_some()
    }

    /// The waits, seeded from this thread's jitter generator (itself
    /// seeded once from the operating system, or from the clock if that
    /// fails: jitter needs no secrecy, only spread, and never panics).
    pub fn waits(&self) -> Waits {
        let rng = JITTER.with(|cell| {
            let mut slot = cell.borrow_mut();
            let source = slot.get_or_insert_with(|| {
                let seed = getrandom::u64().unwrap_or_else(|_| {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    // Truncation is fine: any bits spread the waits.
                    now.as_nanos() as u64 ^ u64::from(std::process::id())
                });
                SmallRng::seed_from_u64(seed)
            });
            SmallRng::from_rng(source)
        });
        self.waits_with(rng)
    }

    /// The waits with a fixed seed, for reproducible sequences in tests and
    /// benchmarks.
    pub fn waits_seeded(&self, seed: u64) -> Waits {
        self.waits_with(SmallRng::seed_from_u64(seed))
    }

    fn waits_with(&self, rng: SmallRng) -> Waits {
        Waits {
            strategy: *self,
            rng,
            retries: 0,
            previous: Duration::ZERO,
        }
    }
}

/// An iterator over the waits of a [`RetryStrategy`]. `None` means give up.
#[derive(Debug, Clone)]
pub struct Waits {
    strategy: RetryStrategy,
    rng: SmallRng,
    retries: u32,
    previous: Duration,
}

fn random_between(rng: &mut SmallRng, low: Duration, high: Duration) -> Duration {
    if high <= low {
        return low;
    }
    rng.random_range(low..high)
}

impl Iterator for Waits {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let s = self.strategy;
        if let Some(max) = s.max_attempts {
            // `retries + 1` attempts have been made when the caller asks.
            if self.retries.saturating_add(1) >= max {
                return None;
            }
        }
        let n = self.retries;
        let base = match s.base {
            Base::None => return None,
            Base::Constant(d) => d,
            Base::Linear { step, max } => step.saturating_mul(n.saturating_add(1)).min(max),
            Base::Exponential { min, max } => {
                let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
                min.saturating_mul(factor).clamp(min, max.max(min))
            }
            Base::Uniform { min, max } => random_between(&mut self.rng, min, max),
            Base::Decorrelated { min, max } => {
                let upper = self.previous.max(min).saturating_mul(3);
                random_between(&mut self.rng, min, upper).min(max)
            }
        };
        self.previous = base;
        self.retries = self.retries.saturating_add(1);
        if s.full_jitter {
            let ms = Duration::from_millis(1);
            return Some(ms + random_between(&mut self.rng, Duration::ZERO, base));
        }
        Some(base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn take(s: RetryStrategy, n: usize) -> Vec<Duration> {
        s.waits_seeded(7).take(n).collect()
    }

    #[test]
    fn none_gives_up_at_once() {
        assert_eq!(RetryStrategy::none().waits().next(), None);
    }

    #[test]
    fn exponential_doubles_and_caps() {
        let got = take(RetryStrategy::exponential(16 * MS, 128 * MS), 6);
        let want: Vec<_> = [16, 32, 64, 128, 128, 128].map(|m| m * MS).into();
        assert_eq!(got, want);
    }

    #[test]
    fn exponential_is_not_redislocks_schedule() {
        // redislock: 16, 16, 16, 32, 64, 128; ours reaches the cap sooner.
        let got = take(RetryStrategy::exponential(16 * MS, 128 * MS), 4);
        assert_ne!(got[1], 16 * MS);
        assert_eq!(got[3], 128 * MS);
    }

    #[test]
    fn waits_never_fall_below_min_even_when_max_is_smaller() {
        let got = take(RetryStrategy::exponential(20 * MS, 10 * MS), 3);
        assert_eq!(got, vec![20 * MS; 3]);
    }

    #[test]
    fn jittered_sequences_repeat_with_a_seed_and_differ_across_seeds() {
        let s = RetryStrategy::exponential(16 * MS, 128 * MS).with_full_jitter();
        let a: Vec<_> = s.waits_seeded(1).take(30).collect();
        let b: Vec<_> = s.waits_seeded(1).take(30).collect();
        let c: Vec<_> = s.waits_seeded(2).take(30).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn linear_grows_by_step_and_caps() {
        let got = take(RetryStrategy::linear(10 * MS, 25 * MS), 4);
        assert_eq!(got, vec![10 * MS, 20 * MS, 25 * MS, 25 * MS]);
    }

    #[test]
    fn uniform_stays_in_range_and_varies() {
        let got = take(RetryStrategy::default(), 200);
        assert!(got.iter().all(|d| *d >= 5 * MS && *d < 15 * MS));
        assert!(got.iter().any(|d| *d != got[0]));
    }

    #[test]
    fn full_jitter_never_waits_zero() {
        let got = take(
            RetryStrategy::constant(Duration::ZERO).with_full_jitter(),
            50,
        );
        assert!(got.iter().all(|d| *d == MS));
        let got = take(
            RetryStrategy::exponential(16 * MS, 128 * MS).with_full_jitter(),
            500,
        );
        assert!(got.iter().all(|d| *d >= MS && *d < 129 * MS));
    }

    #[test]
    fn seeded_sequences_repeat() {
        let s = RetryStrategy::decorrelated_jitter(5 * MS, 100 * MS);
        assert_eq!(take(s, 20), take(s, 20));
        assert!(take(s, 100).iter().all(|d| *d >= 5 * MS && *d <= 100 * MS));
    }

    #[test]
    fn max_attempts_counts_the_first_attempt() {
        let s = RetryStrategy::constant(MS).max_attempts(3);
        assert_eq!(s.waits().count(), 2);
        assert_eq!(
            RetryStrategy::constant(MS).max_attempts(1).waits().count(),
            0
        );
    }
}
