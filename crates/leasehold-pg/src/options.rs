//! Per-call settings of the guard: [`GuardOptions`].

use std::time::Duration;

/// How the guard treats a transaction that holds its row: for
/// [`guard_with_options`](crate::guard_with_options),
/// [`guarded_with_options`](crate::guarded_with_options) and
/// [`guarded_with_hook`](crate::guarded_with_hook) (and their sqlx
/// forms). `GuardOptions::default()` is what [`guard`](crate::guard())
/// and [`guarded`](crate::guarded()) use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub struct GuardOptions {
    pub(crate) take_over_after: Option<Duration>,
    pub(crate) check_lease_row: bool,
}

impl GuardOptions {
    /// The defaults: no take-over, no check of the lease's own rows.
    pub fn new() -> GuardOptions {
        GuardOptions::default()
    }

    /// Takes the resource over from an older holder frozen inside its
    /// transaction: when the guard has waited `wait` for the resource's
    /// row (`lock_timeout`) and this lease is still valid, the guard ends
    /// the session of the transaction that holds the row if it belongs
    /// to an older holder that guarded the same way
    /// (`pg_terminate_backend`), then takes the row.
    /// That is what frees a holder frozen *during* a statement (a backend
    /// blocked writing its answer to a stopped client), which no timeout
    /// ends. See [A holder that
    /// freezes](mod@crate::guard#a-holder-that-freezes) for what it
    /// takes (the `pg_signal_backend` role, or the same role as the
    /// frozen holder; without it the guard waits, as without this
    /// option, and logs a WARN), what it costs (two round trips more per
    /// guarded resource) and the one rule: take the guard this way in
    /// every transaction of the resource (a holder guarded without it is
    /// never taken over). A `wait` under 1 ms counts as 1 ms.
    ///
    /// Defaults to off: the guard waits for the row as long as it takes.
    pub fn take_over_after(mut self, wait: Duration) -> GuardOptions {
        self.take_over_after = Some(wait.max(Duration::from_millis(1)));
        self
    }

    /// Checks the lease's own rows too, for a lease a
    /// [`PgLocker`](crate::PgLocker) took on the database this transaction
    /// writes to: the guard reads them after the fence check (each still
    /// ours, unexpired on the database's clock), and
    /// [`guarded`](crate::guarded()) checks them again right before the
    /// `COMMIT` (on tokio-postgres in the `COMMIT`'s own batch, no round
    /// trip of its own), so a holder that froze after its guard and thawed
    /// past its lease's end is refused at commit even when nobody has
    /// taken the lock since, which the fence alone cannot see. Either
    /// check failing is [`Guarded::Lost`](crate::Guarded::Lost) with
    /// `LostCause::Expired` from `guarded` (from the guard alone,
    /// [`Error::Lease`](crate::Error::Lease) with `LeaseLost`): nothing
    /// written. No lock on a lease row is held during the work. See the
    /// [`lease_row`](crate::lease_row) module.
    ///
    /// Defaults to off. On with a lease another service granted, the
    /// guard refuses it ([`Error::Lease`](crate::Error::Lease) with
    /// `InvalidOptions`): it has no rows here to check.
    pub fn check_lease_row(mut self, check: bool) -> GuardOptions {
        self.check_lease_row = check;
        self
    }
}
