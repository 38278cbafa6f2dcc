//! The metrics this crate records, by name, with their labels.
//!
//! Recorded through the [`metrics`](https://docs.rs/metrics/0.24) facade
//! when the crate feature **`metrics`** is on (it is off by default; with
//! it off nothing below is compiled into the library but these names). The
//! library installs no recorder: install one in your binary (for example
//! `metrics-exporter-prometheus`) and call `describe()` once to give each
//! metric its help text.
//!
//! Every label has a small, fixed set of values, listed below. **No metric
//! is labelled by lock key**: keys can be unbounded (one per wallet), and a
//! label per key would grow the recorder without limit. Keys are in the
//! traces instead (see the crate docs, *Tracing*).
//!
//! | name | kind | labels | what it counts |
//! |---|---|---|---|
//! | [`ACQUIRE_SECONDS`] | histogram (s) | `mode`, `outcome` | each acquire of one lock key, from the call to the lease (or error): the latency callers see, waits included |
//! | [`ACQUIRE_WAIT_SECONDS`] | histogram (s) | `mode`, `outcome` | the part of it spent waiting for a busy lock: asleep between attempts, or queued; 0 when the first attempt won |
//! | [`ACQUIRE_ATTEMPTS`] | histogram | `mode`, `outcome` | requests for the lock per acquire (a queued or relayed wait in process counts as one) |
//! | [`GIVE_UPS_TOTAL`] | counter | `mode`, `reason` | acquires that stopped waiting: [`Error::NotAcquired`](crate::Error::NotAcquired) |
//! | [`LEASES_LOST_TOTAL`] | counter | `cause` | leases found lost while held, once per lease: by the watchdog or by a [`refresh`](crate::Lease::refresh) |
//! | [`RELEASES_TOTAL`] | counter | `outcome`, `trigger` | lock keys given back; `outcome="not_held"` is a **stale release**: the lease had expired or changed hands while held |
//! | [`REFRESHES_TOTAL`] | counter | `by`, `outcome` | refreshes of a lease (all its keys), by the watchdog or the caller |
//! | [`HANDOFFS_TOTAL`] | counter | `via` | leases a waiter of this process was handed by a release instead of taking them with its own `SET` (hand-off mode) |
//! | [`TERMS_TOTAL`] | counter | | leadership terms this process won ([`Election`](crate::Election)) |
//! | [`TERM_SECONDS`] | histogram (s) | `end` | how long each term of this process lasted, when it ended |
//! | [`HANDOFF_WAITERS`] | gauge | `queue` | callers of this process waiting in hand-off mode right now: in Redis's queue, or queued in process behind another task |
//!
//! Label values:
//!
//! - `mode`: `poll` ([`Locker`](crate::Locker)), `handoff`
//!   ([`HandoffLocker`](crate::HandoffLocker)), `quorum`
//!   ([`Quorum`](crate::Quorum)).
//! - `outcome` of an acquire: `acquired`; `gave_up` (the lock stayed busy:
//!   see `reason`); `error` (any other error: Redis unreachable, quorum not
//!   reached, not replicated, ...); `dropped` (the caller dropped the
//!   acquire future, e.g. under its own timeout).
//! - `reason`: `retries_exhausted`, `deadline_expired`, `cancelled`
//!   ([`GiveUpReason`](crate::GiveUpReason)).
//! - `cause`: `expired` (the key no longer held our token), `unreachable`
//!   (Redis could not confirm the lease before its deadline), `superseded`
//!   (marked so after the database refused it as stale)
//!   ([`LostCause`](crate::LostCause)).
//! - `outcome` of a release: `released`, `not_held`, `error` (Redis could
//!   not be asked; the TTL ends the lease). `trigger`: `release`
//!   ([`Lease::release`](crate::Lease::release), `with_lock`) or `drop` (a
//!   lease dropped without release, given back in the background).
//! - `outcome` of a refresh: `ok`, `not_held`, `error` (a failed watchdog
//!   refresh is retried until the lease's deadline). `by`: `watchdog`,
//!   `caller`.
//! - `via`: `grant` (a release set the lock to our token and told us),
//!   `recheck` (our re-check found it handed to us), `relay` (a task of
//!   this locker passed it on in process).
//! - `queue`: `redis`, `process`.
//! - `end` of a term: `resigned`, `expired`, `unreachable`, `superseded`
//!   ([`LostCause`](crate::LostCause)), `dropped` (the term was dropped
//!   without resigning).
//!
//! A lease on several keys (`acquire_all`) records one acquire per key and
//! one release per key.

/// Histogram, seconds: the latency of one acquire of one lock key, from the
/// call to the lease or the error, waits included. Labels `mode`,
/// `outcome`.
pub const ACQUIRE_SECONDS: &str = "leasehold_acquire_seconds";

/// Histogram, seconds: how long one acquire waited for a busy lock (asleep
/// between attempts or queued; request round trips excluded). Labels
/// `mode`, `outcome`.
pub const ACQUIRE_WAIT_SECONDS: &str = "leasehold_acquire_wait_seconds";

/// Histogram: requests for the lock made by one acquire. Labels `mode`,
/// `outcome`.
pub const ACQUIRE_ATTEMPTS: &str = "leasehold_acquire_attempts";

/// Counter: acquires that gave up ([`Error::NotAcquired`](crate::Error::NotAcquired)).
/// Labels `mode`, `reason`.
pub const GIVE_UPS_TOTAL: &str = "leasehold_give_ups_total";

/// Counter: leases found lost while held, once per lease. Label `cause`.
pub const LEASES_LOST_TOTAL: &str = "leasehold_leases_lost_total";

/// Counter: lock keys given back. Labels `outcome` (`not_held`: a stale
/// release), `trigger`.
pub const RELEASES_TOTAL: &str = "leasehold_releases_total";

/// Counter: lease refreshes. Labels `by`, `outcome`.
pub const REFRESHES_TOTAL: &str = "leasehold_refreshes_total";

/// Counter: leases handed to a waiter of this process in hand-off mode.
/// Label `via`.
pub const HANDOFFS_TOTAL: &str = "leasehold_handoffs_total";

/// Gauge: callers of this process waiting in hand-off mode. Label `queue`.
pub const HANDOFF_WAITERS: &str = "leasehold_handoff_waiters";

/// Counter: leadership terms won by this process
/// ([`Election`](crate::Election)). No labels.
pub const TERMS_TOTAL: &str = "leasehold_terms_total";

/// Histogram, seconds: how long a term of this process lasted, counted
/// when it ends. Label `end`.
pub const TERM_SECONDS: &str = "leasehold_term_seconds";

/// Label: how a leadership term ended.
pub const LABEL_END: &str = "end";

/// Label: how the lease is taken (`poll`, `handoff`, `quorum`).
pub const LABEL_MODE: &str = "mode";
/// Label: how an acquire, release or refresh ended.
pub const LABEL_OUTCOME: &str = "outcome";
/// Label: why an acquire gave up.
pub const LABEL_REASON: &str = "reason";
/// Label: why a lease was lost.
pub const LABEL_CAUSE: &str = "cause";
/// Label: what gave a lock back (`release`, `drop`).
pub const LABEL_TRIGGER: &str = "trigger";
/// Label: who refreshed (`watchdog`, `caller`).
pub const LABEL_BY: &str = "by";
/// Label: how a lease was handed over (`grant`, `recheck`, `relay`).
pub const LABEL_VIA: &str = "via";
/// Label: where a hand-off waiter waits (`redis`, `process`).
pub const LABEL_QUEUE: &str = "queue";

/// Registers the unit and help text of every metric above with the
/// installed recorder (call it once, after installing it). Recording works
/// without it; exporters just have no help text.
#[cfg(feature = "metrics")]
pub fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        ACQUIRE_SECONDS,
        Unit::Seconds,
        "acquire latency per lock key, waits included"
    );
    describe_histogram!(
        ACQUIRE_WAIT_SECONDS,
        Unit::Seconds,
        "time an acquire waited for a busy lock"
    );
    describe_histogram!(
        ACQUIRE_ATTEMPTS,
        Unit::Count,
        "requests for the lock per acquire"
    );
    describe_counter!(GIVE_UPS_TOTAL, Unit::Count, "acquires that gave up waiting");
    describe_counter!(
        LEASES_LOST_TOTAL,
        Unit::Count,
        "leases found lost while held"
    );
    describe_counter!(
        RELEASES_TOTAL,
        Unit::Count,
        "lock keys given back; outcome=not_held is a stale release"
    );
    describe_counter!(REFRESHES_TOTAL, Unit::Count, "lease refreshes");
    describe_counter!(
        HANDOFFS_TOTAL,
        Unit::Count,
        "leases handed to a waiter of this process"
    );
    describe_counter!(TERMS_TOTAL, Unit::Count, "leadership terms won");
    describe_histogram!(
        TERM_SECONDS,
        Unit::Seconds,
        "how long a leadership term lasted"
    );
    describe_gauge!(
        HANDOFF_WAITERS,
        Unit::Count,
        "callers of this process waiting in hand-off mode"
    );
}

// The hooks the library calls: one line at each place something happens.
// With the feature off they are empty and inlined away.

use std::time::Duration;

/// How an acquire ended, as a label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    Acquired,
    GaveUp,
    Error,
    Dropped,
}

impl AcquireOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AcquireOutcome::Acquired => "acquired",
            AcquireOutcome::GaveUp => "gave_up",
            AcquireOutcome::Error => "error",
            AcquireOutcome::Dropped => "dropped",
        }
    }
}

/// One acquire of one key ended.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn acquire(
    mode: &'static str,
    outcome: AcquireOutcome,
    reason: Option<&'static str>,
    elapsed: Duration,
    waited: Duration,
    attempts_made: u32,
) {
    #[cfg(feature = "metrics")]
    {
        let outcome = outcome.as_str();
        if let Some([seconds, wait, attempts]) = fixed::acquire(mode, outcome) {
            ::metrics::with_recorder(|r| {
                r.register_histogram(seconds, &fixed::METADATA)
                    .record(elapsed);
                r.register_histogram(wait, &fixed::METADATA).record(waited);
                r.register_histogram(attempts, &fixed::METADATA)
                    .record(f64::from(attempts_made));
            });
        } else {
            ::metrics::histogram!(ACQUIRE_SECONDS, LABEL_MODE => mode, LABEL_OUTCOME => outcome)
                .record(elapsed);
            ::metrics::histogram!(ACQUIRE_WAIT_SECONDS, LABEL_MODE => mode, LABEL_OUTCOME => outcome)
                .record(waited);
            ::metrics::histogram!(ACQUIRE_ATTEMPTS, LABEL_MODE => mode, LABEL_OUTCOME => outcome)
                .record(f64::from(attempts_made));
        }
        if let Some(reason) = reason {
            ::metrics::counter!(GIVE_UPS_TOTAL, LABEL_MODE => mode, LABEL_REASON => reason)
                .increment(1);
        }
    }
}

/// A lease was found lost (counted once per lease).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn lease_lost(cause: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(LEASES_LOST_TOTAL, LABEL_CAUSE => cause).increment(1);
}

/// One key was given back (`outcome`: `released`, `not_held`, `error`).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn release(outcome: &'static str, dropped: bool) {
    #[cfg(feature = "metrics")]
    {
        let trigger = if dropped { "drop" } else { "release" };
        if let Some([key]) = fixed::release(outcome, trigger) {
            ::metrics::with_recorder(|r| {
                r.register_counter(key, &fixed::METADATA).increment(1);
            });
        } else {
            ::metrics::counter!(RELEASES_TOTAL, LABEL_OUTCOME => outcome, LABEL_TRIGGER => trigger)
                .increment(1);
        }
    }
}

/// The keys of the metrics recorded once or more per lease, as statics:
/// the `metrics` macros build each record's key (its labels allocated when
/// their values are not literals, and the whole key hashed) on every
/// record, even with no recorder installed. A static key is built, and
/// hashed, at compile time. The keys are the same as the macros'.
/// This module's path, the metrics' target.
#[cfg(feature = "metrics")]
const MODULE: &str = module_path!();

#[cfg(feature = "metrics")]
mod fixed {
    use ::metrics::{Key, Label, Level, Metadata};

    use super::{
        ACQUIRE_ATTEMPTS, ACQUIRE_SECONDS, ACQUIRE_WAIT_SECONDS, LABEL_MODE, LABEL_OUTCOME,
        LABEL_TRIGGER, RELEASES_TOTAL,
    };

    /// What the macros in `metrics.rs` record with: that module's path,
    /// level INFO.
    pub(super) static METADATA: Metadata<'static> =
        Metadata::new(super::MODULE, Level::INFO, Some(super::MODULE));

    /// The static keys of the metrics named, with the labels given.
    macro_rules! keys {
        ($labels:expr, [$($name:expr),+]) => {
            [$(Key::from_static_parts($name, $labels)),+]
        };
    }

    /// Matches `(a, b)` against the pairs given, each with its own static
    /// labels `k1 = a, k2 = b`: the static keys of the `n` metrics `names`
    /// with those labels; `None` for any other pair.
    macro_rules! pairs {
        ($a:expr, $b:expr; $k1:expr, $k2:expr; $n:literal $names:tt; $(($v1:literal, $v2:literal)),* $(,)?) => {
            match ($a, $b) {
                $(($v1, $v2) => {
                    static LABELS: [Label; 2] = [
                        Label::from_static_parts($k1, $v1),
                        Label::from_static_parts($k2, $v2),
                    ];
                    static KEYS: [Key; $n] = keys!(&LABELS, $names);
                    Some(&KEYS)
                })*
                _ => None,
            }
        };
    }

    /// The keys of an acquire's three histograms (seconds, wait seconds,
    /// attempts) for its `mode` and `outcome`.
    pub(super) fn acquire(mode: &str, outcome: &str) -> Option<&'static [Key; 3]> {
        pairs!(mode, outcome; LABEL_MODE, LABEL_OUTCOME;
            3 [ACQUIRE_SECONDS, ACQUIRE_WAIT_SECONDS, ACQUIRE_ATTEMPTS];
            ("poll", "acquired"), ("poll", "gave_up"), ("poll", "error"), ("poll", "dropped"),
            ("handoff", "acquired"), ("handoff", "gave_up"), ("handoff", "error"), ("handoff", "dropped"),
            ("quorum", "acquired"), ("quorum", "gave_up"), ("quorum", "error"), ("quorum", "dropped"),
        )
    }

    /// The key of a release's counter for its `outcome` and `trigger`.
    pub(super) fn release(outcome: &str, trigger: &str) -> Option<&'static [Key; 1]> {
        pairs!(outcome, trigger; LABEL_OUTCOME, LABEL_TRIGGER; 1 [RELEASES_TOTAL];
            ("released", "release"), ("not_held", "release"), ("error", "release"),
            ("released", "drop"), ("not_held", "drop"), ("error", "drop"),
        )
    }
}

/// A lease was refreshed (`outcome`: `ok`, `not_held`, `error`).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn refresh(by: &'static str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(REFRESHES_TOTAL, LABEL_BY => by, LABEL_OUTCOME => outcome).increment(1);
}

/// This process won a leadership term.
pub(crate) fn term_started() {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(TERMS_TOTAL).increment(1);
}

/// A term of this process ended (`end`: `resigned`, a lost cause,
/// `dropped`) after `held`.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn term_ended(end: &'static str, held: Duration) {
    #[cfg(feature = "metrics")]
    ::metrics::histogram!(TERM_SECONDS, LABEL_END => end).record(held.as_secs_f64());
}

/// A waiter of this process was handed a lease (`via`: `grant`,
/// `recheck`, `relay`).
#[cfg(feature = "handoff")]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn handoff(via: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(HANDOFFS_TOTAL, LABEL_VIA => via).increment(1);
}

/// Where a hand-off waiter waits.
#[cfg(feature = "handoff")]
#[derive(Debug, Clone, Copy)]
pub(crate) enum Queue {
    Redis,
    Process,
}

/// Counts one waiter in [`HANDOFF_WAITERS`] while it lives.
#[cfg(feature = "handoff")]
#[derive(Debug)]
pub(crate) struct Waiter {
    #[cfg(feature = "metrics")]
    queue: &'static str,
}

#[cfg(feature = "handoff")]
impl Waiter {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn enter(queue: Queue) -> Waiter {
        #[cfg(feature = "metrics")]
        {
            let queue = match queue {
                Queue::Redis => "redis",
                Queue::Process => "process",
            };
            ::metrics::gauge!(HANDOFF_WAITERS, LABEL_QUEUE => queue).increment(1.0);
            Waiter { queue }
        }
        #[cfg(not(feature = "metrics"))]
        Waiter {}
    }
}

#[cfg(all(feature = "metrics", feature = "handoff"))]
impl Drop for Waiter {
    fn drop(&mut self) {
        ::metrics::gauge!(HANDOFF_WAITERS, LABEL_QUEUE => self.queue).decrement(1.0);
    }
}
