//! The metrics this crate records, by name, with their labels.
//!
//! Recorded through the [`metrics`](https://docs.rs/metrics/0.24) facade
//! when the crate feature **`metrics`** is on (off by default; with it off
//! nothing below is compiled into the library but these names). It is
//! independent of `leasehold`'s own `metrics` feature. The library installs
//! no recorder; call `describe()` once after installing yours.
//!
//! No metric is labelled by wallet, resource or token (all unbounded); they
//! are in the traces instead.
//!
//! | name | kind | labels | what it counts |
//! |---|---|---|---|
//! | [`FENCED_WRITES_TOTAL`] | counter | `check`, `outcome` | token-carrying debits ([`debit_fenced`](crate::debit_fenced), [`debit_check_and_set`](crate::debit_check_and_set)) |
//! | [`GUARDED_WRITES_TOTAL`] | counter | `outcome` | resources guarded ([`guard()`](crate::guard()), [`guard_token`](crate::guard_token)): one per resource, so a lease on two fenced keys counts two |
//! | [`STALE_WRITES_REFUSED_TOTAL`] | counter | `kind` | **writes refused as stale**, fenced or guarded: a lease failed and the database caught it (the money alarm) |
//!
//! Label values:
//!
//! - `check`: `token` ([`debit_fenced`](crate::debit_fenced): `fence <
//!   $token`), `token_and_version`
//!   ([`debit_check_and_set`](crate::debit_check_and_set): and `fence =
//!   $read`).
//! - `outcome` of a fenced write: `applied`, `stale_token`, `stale_read`,
//!   `insufficient_funds` (see [`Outcome`](crate::Outcome)), `error` (the
//!   call returned an error).
//! - `outcome` of a guard: `accepted`, `refused`, `error`.
//! - `kind`: `fenced`, `guarded`.

/// Counter: token-carrying debits. Labels `check`, `outcome`.
pub const FENCED_WRITES_TOTAL: &str = "leasehold_pg_fenced_writes_total";

/// Counter: resources guarded by the fence guard. Label `outcome`.
pub const GUARDED_WRITES_TOTAL: &str = "leasehold_pg_guarded_writes_total";

/// Counter: writes refused as stale (a stale token or a stale read; a
/// refused guard). Label `kind`.
pub const STALE_WRITES_REFUSED_TOTAL: &str = "leasehold_pg_stale_writes_refused_total";

/// Label: how a fenced write is conditioned (`token`, `token_and_version`).
pub const LABEL_CHECK: &str = "check";
/// Label: how a write or guard ended.
pub const LABEL_OUTCOME: &str = "outcome";
/// Label: which kind of write was refused (`fenced`, `guarded`).
pub const LABEL_KIND: &str = "kind";

/// Registers the unit and help text of every metric above with the
/// installed recorder (call it once, after installing it).
#[cfg(feature = "metrics")]
pub fn describe() {
    use ::metrics::{Unit, describe_counter};
    describe_counter!(
        FENCED_WRITES_TOTAL,
        Unit::Count,
        "token-carrying debits by check and outcome"
    );
    describe_counter!(
        GUARDED_WRITES_TOTAL,
        Unit::Count,
        "resources guarded by the fence guard, by outcome"
    );
    describe_counter!(
        STALE_WRITES_REFUSED_TOTAL,
        Unit::Count,
        "writes refused as stale: a lease failed and the database caught it"
    );
}

// The hooks the library calls; empty with the feature off.

/// A fenced write ended with `outcome`; `stale` when refused as stale.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn fenced_write(check: &'static str, outcome: &'static str, stale: bool) {
    #[cfg(feature = "metrics")]
    {
        ::metrics::counter!(FENCED_WRITES_TOTAL, LABEL_CHECK => check, LABEL_OUTCOME => outcome)
            .increment(1);
        if stale {
            ::metrics::counter!(STALE_WRITES_REFUSED_TOTAL, LABEL_KIND => "fenced").increment(1);
        }
    }
}

/// A guard ended with `outcome` (`refused`: refused as stale).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn guarded_write(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    {
        ::metrics::counter!(GUARDED_WRITES_TOTAL, LABEL_OUTCOME => outcome).increment(1);
        if outcome == "refused" {
            ::metrics::counter!(STALE_WRITES_REFUSED_TOTAL, LABEL_KIND => "guarded").increment(1);
        }
    }
}
