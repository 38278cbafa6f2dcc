//! The safe path in one call: [`guarded`] begins a transaction, runs the
//! fence guard first, runs your work in the transaction under the lease's
//! watchdog, and commits, the commit shielded from the watchdog; it says
//! what happened in a [`Guarded`].
//!
//! ```no_run
//! use leasehold::Lease;
//! use leasehold_pg::{Guarded, tokio_postgres::Client};
//!
//! /// Pays 10 out of alice's account, if the lease still protects it.
//! async fn pay(db: &mut Client, lease: &Lease) -> Result<Guarded<i64>, leasehold_pg::Error> {
//!     leasehold_pg::guarded(db, lease, async |tx| {
//!         let row = tx
//!             .query_one("SELECT balance FROM accounts WHERE name = 'alice'", &[])
//!             .await?;
//!         let left = row.get::<_, i64>(0) - 10;
//!         tx.execute("UPDATE accounts SET balance = $1 WHERE name = 'alice'", &[&left])
//!             .await?;
//!         Ok(left)
//!     })
//!     .await
//! }
//! ```
//!
//! What each answer means for the data:
//!
//! - `Ok(Guarded::Committed(output))`: the guard accepted the lease, the
//!   work ran to its end and the transaction committed.
//! - `Ok(Guarded::Refused { .. })`: a newer holder (or another holder of
//!   the same token) has written; the work did not run, nothing was
//!   written. The Redis counter was healed and the lease ended
//!   ([`Lease::mark_superseded`]: a leadership term is over, with no call
//!   of yours); retry with a new lease.
//! - `Ok(Guarded::Lost(cause))`: the lease was found lost before the work
//!   finished; the work was stopped at an `.await` and its transaction
//!   rolled back. Nothing was written. With
//!   [`GuardOptions::check_lease_row`] (a lease a
//!   [`PgLocker`](crate::PgLocker) took on this database), also when the
//!   lease's own row was found ended, at the guard or right before the
//!   `COMMIT` (`LostCause::Expired`): see [`lease_row`](crate::lease_row).
//! - `Err(err)` from the work: rolled back, nothing written. Your error
//!   type takes this crate's ([`Error`]) too.
//! - `Err(Error::Aborted)`: a statement failed inside the work and the
//!   work went on to return `Ok` (PostgreSQL would have rolled the
//!   transaction back at `COMMIT` and called it a success): rolled back,
//!   nothing written.
//! - `Err(Error::SessionEnded)`: the server ended the session before the
//!   transaction committed (it sat idle past
//!   `idle_in_transaction_session_timeout`, which the guard lowers to the
//!   lease's TTL, at least 1 s, so that a holder frozen in its
//!   transaction does not stall the next one: see [A holder that
//!   freezes](mod@crate::guard#a-holder-that-freezes); an administrator
//!   shut the server down), or the connection had closed before the `COMMIT` was
//!   sent: nothing written; retryable, on a new connection.
//! - `Err(Error::CommitUnknown)`: the `COMMIT` got no answer; whether it
//!   landed is unknown. Every other error means nothing was written.
//!
//! # A hook before the commit
//!
//! [`guarded_with_hook`] runs a hook of yours after the work returned
//! `Ok` and right before the `COMMIT` is sent, inside the commit's
//! [shield](Lease::shield): the watchdog cannot stop it. It is made for
//! fault-injection tests, where it is the place for a holder pause
//! (`leasehold-chaos`'s `call.pause_point()`): a pause there is a GC
//! pause as the `COMMIT` is sent, which no watchdog can save. While the
//! hook runs, the transaction is open: the work's writes are not visible
//! to anyone else, and the guard's row lock is held, so a newer holder's
//! guard waits for it. What a pause there tests is the guard's row lock:
//! the paused holder is already past its check (the guard accepted it
//! while its lease was valid), its commit lands when it wakes, and the
//! newer holder's guard, which waited for the row, then sees the newer
//! fence and writes after it. Nothing is lost and nothing is written
//! twice, which no check made before the commit could show.
//!
//! ```no_run
//! use leasehold::Lease;
//! use leasehold_pg::{GuardOptions, Guarded, tokio_postgres::Client};
//!
//! /// Pays 10 out of alice's account; `before_commit` runs just before
//! /// the commit (in a chaos test: `async || call.pause_point().await`).
//! async fn pay(
//!     db: &mut Client,
//!     lease: &Lease,
//!     before_commit: impl AsyncFnOnce(),
//! ) -> Result<Guarded<u64>, leasehold_pg::Error> {
//!     leasehold_pg::guarded_with_hook(
//!         db,
//!         lease,
//!         &GuardOptions::default(),
//!         async |tx| {
//!             let paid = tx
//!                 .execute("UPDATE accounts SET balance = balance - 10 WHERE name = 'alice'", &[])
//!                 .await?;
//!             Ok(paid)
//!         },
//!         before_commit,
//!     )
//!     .await
//! }
//! ```
//!
//! - The hook is a parameter of its own, not a [`GuardOptions`] setting:
//!   those are shared with the guard alone ([`guard_with_options`]),
//!   where there is no commit to hook, and they are plain data. As a
//!   parameter, the hook may borrow the caller's locals (a chaos test's
//!   `call`) for as long as `guarded_with_hook` runs: no `'static`, no
//!   boxing, and the returned future is `Send` when the hook's is.
//! - It runs at most once: not when the guard refused, the work returned
//!   `Err` or the lease was found lost during the work (nothing is
//!   committed then). It does run after a work that swallowed a failed
//!   statement and returned `Ok`; the commit's check then answers
//!   [`Error::Aborted`].
//! - In production, use [`guarded`] or [`guarded_with_options`] (they are
//!   this with a hook that does nothing). A hook that waits keeps the
//!   transaction open and the row locked, and the watchdog cannot stop
//!   it: past the guard's idle bound (the lease's TTL, at least 1 s: see
//!   [A holder that freezes](mod@crate::guard#a-holder-that-freezes)) the
//!   server ends the session, and nothing is written. The answer is then
//!   [`Error::SessionEnded`], or [`Error::CommitUnknown`] when the client
//!   had not yet read the server's close as the `COMMIT` went out (a
//!   holder whose whole process was paused).

use leasehold::{FencingToken, Lease, LostCause};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Transaction};

use crate::error::Error;
use crate::guard::{Guard, guard_with_options};
use crate::options::GuardOptions;

/// What a [`guarded`] transaction came to (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a refused or lost transaction wrote nothing: retry it, or say so"]
pub enum Guarded<T> {
    /// The work ran and the transaction committed: its output.
    Committed(T),
    /// The guard refused the lease: nothing written, the work did not run,
    /// and the lease is ended as superseded (its `lost()` says so; a
    /// term's `lost()` resolves).
    Refused {
        /// The resource that refused (the lease's fence key).
        resource: String,
        /// The lease's token.
        token: FencingToken,
        /// The fence the resource has seen: above `token`, or equal to it
        /// from another holder.
        current: FencingToken,
        /// Whether the Redis counter was raised past `current`.
        healed: bool,
    },
    /// The lease was found lost before the work finished: stopped, rolled
    /// back, nothing written.
    Lost(LostCause),
}

impl<T> Guarded<T> {
    /// The output of a committed transaction; `None` when nothing was
    /// written.
    pub fn committed(self) -> Option<T> {
        match self {
            Guarded::Committed(output) => Some(output),
            _ => None,
        }
    }
}

/// Runs `work` in one transaction on `db`, fenced by `lease`: `BEGIN`, the
/// guard ([`guard()`](crate::guard())), the work, `COMMIT`. The whole runs under the
/// lease's watchdog ([`Lease::run`]): a lease found lost stops the work at
/// its next `.await`, before the commit, and the transaction is rolled
/// back. The commit itself is shielded ([`Lease::shield`]), so its answer
/// is never dropped. The guard's statement and the commit's check add no
/// round trip of their own beyond the guard's one.
///
/// # Errors
/// What `work` returned (rolled back); this crate's errors through
/// `E: From<Error>`: connecting or the guard failing
/// ([`Error::NotFenced`] for a lease with no fenced lock,
/// [`Error::TableMissing`] before [`setup`](crate::setup()), ...),
/// [`Error::Aborted`] when a statement failed inside a work that then
/// returned `Ok`, [`Error::SessionEnded`] when the server ended the
/// session or the connection had closed before the `COMMIT` was sent
/// (retryable), [`Error::CommitUnknown`] when the commit got no answer;
/// nothing was written in any case but the last.
///
/// # Cancel safety
/// Dropping the future drops the transaction where it is: rolled back,
/// unless the `COMMIT` was already sent.
pub async fn guarded<T, E>(
    db: &mut Client,
    lease: &Lease,
    work: impl AsyncFnOnce(&Transaction<'_>) -> Result<T, E>,
) -> Result<Guarded<T>, E>
where
    E: From<Error>,
{
    guarded_with_options(db, lease, &GuardOptions::default(), work).await
}

/// [`guarded`] with the guard's `options` ([`guard_with_options`]): with
/// [`take_over_after`](GuardOptions::take_over_after), an older holder
/// frozen inside its transaction is taken over from (see [A holder that
/// freezes](mod@crate::guard#a-holder-that-freezes)).
///
/// # Errors
/// As [`guarded`].
///
/// # Cancel safety
/// As [`guarded`].
pub async fn guarded_with_options<T, E>(
    db: &mut Client,
    lease: &Lease,
    options: &GuardOptions,
    work: impl AsyncFnOnce(&Transaction<'_>) -> Result<T, E>,
) -> Result<Guarded<T>, E>
where
    E: From<Error>,
{
    guarded_with_hook(db, lease, options, work, async || {}).await
}

/// [`guarded_with_options`] with `before_commit` run after `work`
/// returned `Ok` and right before the `COMMIT` is sent, inside the
/// commit's [shield](Lease::shield) (the watchdog cannot stop it), with
/// the transaction open and the guard's row locked: the place for a
/// fault-injection test's pause (see [A hook before the
/// commit](self#a-hook-before-the-commit)). It runs at most once, and
/// not when nothing is to be committed (a refusal, the work's error, the
/// lease lost during the work).
///
/// # Errors
/// As [`guarded`]. A hook that keeps the transaction idle past the
/// guard's idle bound (the lease's TTL, at least 1 s) has its session
/// ended by the server, and nothing written: [`Error::SessionEnded`], or
/// [`Error::CommitUnknown`] when the client had not yet read the close.
///
/// # Cancel safety
/// As [`guarded`]: dropped while `before_commit` runs, the transaction
/// is rolled back (its `COMMIT` was not sent).
pub async fn guarded_with_hook<T, E>(
    db: &mut Client,
    lease: &Lease,
    options: &GuardOptions,
    work: impl AsyncFnOnce(&Transaction<'_>) -> Result<T, E>,
    before_commit: impl AsyncFnOnce(),
) -> Result<Guarded<T>, E>
where
    E: From<Error>,
{
    let ran = lease
        .run(async {
            let tx = db.transaction().await.map_err(Error::from_pg)?;
            if let Some(outcome) = guarded_by(guard_with_options(&tx, lease, options).await)? {
                return Ok(outcome);
            }
            let check = lease_check(lease, options)?;
            let output = work(&tx).await?;
            let committed = lease
                .shield(async {
                    before_commit().await;
                    commit(tx, check.as_deref()).await
                })
                .await?;
            Ok(committed.finish(output))
        })
        .await;
    settle(ran)
}

/// What a guarded commit came to.
pub(crate) enum Commit {
    /// Committed.
    Done,
    /// The commit's check of the lease's rows found one ended: rolled
    /// back, nothing written.
    Ended,
}

impl Commit {
    /// The transaction's outcome, with the work's `output` if it committed.
    pub(crate) fn finish<T>(self, output: T) -> Guarded<T> {
        match self {
            Commit::Done => Guarded::Committed(output),
            Commit::Ended => Guarded::Lost(LostCause::Expired),
        }
    }
}

/// The guard's verdict as the guarded transaction takes it: a refusal, or
/// the lease's rows found ended ([`GuardOptions::check_lease_row`]), is
/// the outcome; `None` goes on.
pub(crate) fn guarded_by<T>(found: Result<Guard, Error>) -> Result<Option<Guarded<T>>, Error> {
    match found {
        Ok(found) => Ok(refused(found)),
        Err(Error::Lease(leasehold::Error::LeaseLost { cause, .. })) => {
            Ok(Some(Guarded::Lost(cause)))
        }
        Err(err) => Err(err),
    }
}

/// The commit's check of the lease's rows, if `options` asks for it.
pub(crate) fn lease_check(lease: &Lease, options: &GuardOptions) -> Result<Option<String>, Error> {
    if !options.check_lease_row {
        return Ok(None);
    }
    Ok(Some(crate::lease_row::commit_check(
        &crate::lease_row::rows(lease)?,
    )))
}

/// The outcome of a refused guard; `None` when it accepted.
pub(crate) fn refused<T>(found: Guard) -> Option<Guarded<T>> {
    match found {
        Guard::Accepted => None,
        Guard::Refused {
            resource,
            token,
            current,
            healed,
            ..
        } => Some(Guarded::Refused {
            resource,
            token,
            current,
            healed,
        }),
    }
}

/// What a guarded transaction run under the lease's watchdog came to:
/// its own outcome, [`Guarded::Lost`] when the watchdog stopped it.
pub(crate) fn settle<T, E: From<Error>>(
    ran: Result<Result<Guarded<T>, E>, leasehold::Error>,
) -> Result<Guarded<T>, E> {
    match ran {
        Ok(outcome) => outcome,
        Err(leasehold::Error::LeaseLost { cause, .. }) => Ok(Guarded::Lost(cause)),
        // The lease could not run the work at all (no runtime for the
        // watchdog): nothing ran.
        Err(err) => Err(E::from(Error::Lease(err))),
    }
}

/// Commits `tx`, refusing to call a transaction an earlier error aborted
/// committed: `SELECT 1` (or `check`, the lease rows' check) and `COMMIT`
/// in one batch (one round trip); in an aborted transaction the first
/// statement fails and the `COMMIT` never runs, as when the check finds
/// the lease ended.
async fn commit(tx: Transaction<'_>, check: Option<&str>) -> Result<Commit, Error> {
    // Closed already (the server ended the session while the work ran,
    // and the client read its last word): the batch below fails to be
    // sent, so no COMMIT goes out. Closed later, it may have gone out.
    let closed = tx.client().is_closed();
    let batch = format!("{}; COMMIT", check.unwrap_or("SELECT 1"));
    match tx.batch_execute(&batch).await {
        Ok(()) => {
            // The COMMIT ended the transaction; the handle's drop would
            // send a ROLLBACK that only draws a warning from the server.
            std::mem::forget(tx);
            Ok(Commit::Done)
        }
        Err(err) if err.code() == Some(&SqlState::IN_FAILED_SQL_TRANSACTION) => {
            drop(tx); // rolled back
            Err(Error::Aborted(err.into()))
        }
        Err(err) if err.code().map(SqlState::code) == Some(crate::lease_row::LEASE_ENDED) => {
            drop(tx); // rolled back
            let message = err.as_db_error().map(|db| db.message().to_owned());
            tracing::warn!(
                message = message.unwrap_or_default(),
                "the lease ended before the commit (its row, on the database's clock): rolled back"
            );
            Ok(Commit::Ended)
        }
        Err(err)
            if err.as_db_error().is_some_and(|db| {
                !crate::error::commit_outcome_unknown(Some(db.code().code()))
            }) =>
        {
            // The server refused the COMMIT (a deferred constraint, a
            // serialization failure) or ended an idle session before it
            // (`SessionEnded`): it rolled the transaction back. A session
            // terminated in its place may have committed first: unknown.
            // With the lease rows' check first in the batch, the error may
            // be the check's (a timeout, a deadlock), the COMMIT not run
            // and the transaction left aborted: the handle's ROLLBACK ends
            // it (after a refused COMMIT it only draws a warning).
            if check.is_some() {
                drop(tx);
            } else {
                std::mem::forget(tx);
            }
            Err(Error::from_pg(err))
        }
        Err(err) if closed && err.is_closed() => Err(Error::SessionEnded(err.into())),
        Err(err) => Err(Error::CommitUnknown(err.into())),
    }
}
