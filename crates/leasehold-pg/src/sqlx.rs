//! The fence guard on sqlx 0.8 (feature `sqlx`): [`guard`],
//! [`guard_token`], [`setup`] and [`guarded`] (with options, with a hook
//! before the commit: [`guarded_with_hook`]), on a
//! [`PgConnection`] or inside a sqlx transaction.
//!
//! The same statements as on tokio-postgres (said once, in the
//! [`guard`](mod@crate::guard) module docs), the same [`Guard`], [`Setup`],
//! [`Guarded`] and [`Error`] answers, the same invariant (a token above
//! the resource's fence is accepted; an equal one only from the holder
//! that wrote it; anything else is [`Guard::Refused`], and the Redis
//! counter is healed), the same spans, events and metrics. This module
//! only runs the statements and maps sqlx's errors: the server's by
//! SQLSTATE, as for tokio-postgres ([`Error::TableMissing`],
//! [`Error::TableOutdated`], [`Error::Unreachable`] for a server starting
//! up, [`Error::SessionEnded`] for a session it ended, a serialization
//! failure [`is_retryable`](Error::is_retryable), ...), and sqlx's own I/O
//! errors, its pool timing out and its worker crashing as
//! [`Error::Unreachable`]. The sqlx error is the source
//! ([`DriverError::as_sqlx`](crate::DriverError::as_sqlx)), and
//! `From<sqlx::Error>` lets a work's `?` turn one into an [`Error`].
//!
//! [`FencingToken`] binds and reads as an `INT8`
//! here too (`.bind(token)`, `row.try_get::<FencingToken, _>(0)`): range
//! checked both ways, `INT8` only.
//!
//! ```no_run
//! use leasehold::Lease;
//! use leasehold_pg::{Guard, Guarded};
//! use sqlx::{Connection, PgConnection};
//!
//! async fn pay(db: &mut PgConnection, lease: &Lease) -> Result<Guarded<i64>, leasehold_pg::Error> {
//!     leasehold_pg::sqlx::setup(db).await?; // creates leasehold_fences and its guard function
//!
//!     // The safe path in one call: BEGIN, the guard first, the work under
//!     // the lease's watchdog, a checked and shielded COMMIT.
//!     leasehold_pg::sqlx::guarded(db, lease, async |tx: &mut PgConnection| {
//!         let left: i64 = sqlx::query_scalar(
//!             "UPDATE accounts SET balance = balance - 10 WHERE name = 'alice' RETURNING balance",
//!         )
//!         .fetch_one(&mut *tx)
//!         .await?;
//!         Ok(left)
//!     })
//!     .await
//! }
//!
//! /// The guard alone, in a transaction of your own.
//! async fn by_hand(db: &mut PgConnection, lease: &Lease) -> Result<bool, leasehold_pg::Error> {
//!     let mut tx = db.begin().await?;
//!     match leasehold_pg::sqlx::guard(&mut tx, lease).await? {
//!         Guard::Accepted => {
//!             sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE name = 'alice'")
//!                 .execute(&mut *tx)
//!                 .await?;
//!             tx.commit().await?;
//!             Ok(true)
//!         }
//!         // A newer holder has written: nothing was written; retry.
//!         Guard::Refused { .. } => Ok(false), // dropping `tx` rolls back
//!     }
//! }
//! ```
//!
//! # The commit's check costs a round trip here
//!
//! [`guarded`] must not call a transaction committed that an error the
//! work swallowed had aborted (PostgreSQL answers `COMMIT` there with a
//! rollback, not an error). On tokio-postgres it sends `SELECT 1; COMMIT`
//! in one batch; sqlx keeps its own count of the transactions it opened
//! and must send the `COMMIT` itself, and its answer does not say whether
//! it rolled back, so here the `SELECT 1` goes first, alone: one more
//! round trip per transaction. It fails with SQLSTATE `25P02` in an aborted
//! transaction, which is then rolled back and reported as
//! [`Error::Aborted`].
//!
//! # Other drivers (diesel-async, ...)
//!
//! Run the statement of the [`guard`](mod@crate::guard) module docs
//! yourself, first in your transaction, with the resource's fence key
//! (`keys.fence()` of its `FencedKeys`), the lease's token as a `bigint`
//! (`lease.fence()`) and its holder (`lease.holder().as_str()`): with
//! diesel-async,
//! `diesel::sql_query(..).bind::<Text, _>(..).bind::<BigInt, _>(..)
//! .bind::<Text, _>(..)` loaded into a row type with the fields
//! `accepted` (`Bool`), `fence` (`BigInt`) and `holder`
//! (`Nullable<Text>`); `accepted` false is a refusal: roll back and call
//! `lease.raise_fence(fence)` and `lease.mark_superseded()` as [`guard`]
//! does. Create the table and the
//! guard's function with [`FENCES_DDL`](crate::FENCES_DDL) in a
//! migration. In this crate a driver is one small module: it runs the
//! statements and maps its errors, and the guard, `setup` and `guarded`
//! are written once.

use ::sqlx::postgres::{PgConnection, Postgres};
use ::sqlx::{Connection, Executor, Row, Transaction};
use leasehold::{FencingToken, HolderId, Lease};

use crate::error::{Error, Result};
use crate::guard::{Guard, Setup, guard_token_with, guard_with, logged};
use crate::guarded::{Commit, Guarded, guarded_by, lease_check, settle};
use crate::options::GuardOptions;
use crate::statements::{GUARD, GUARD_BOUNDED, Statements, TAKE_OVER, Verdict};

impl Statements for PgConnection {
    async fn guard(
        &mut self,
        resource: &str,
        fence: i64,
        holder: &str,
        idle_ms: Option<i64>,
    ) -> Result<Verdict> {
        let sql = if idle_ms.is_some() {
            GUARD_BOUNDED
        } else {
            GUARD
        };
        // Unnamed (`persistent(false)`): a statement prepared on one
        // transaction's server connection is not on the next one's
        // behind PgBouncer in transaction mode.
        let mut query = ::sqlx::query(sql)
            .persistent(false)
            .bind(resource)
            .bind(fence)
            .bind(holder);
        if let Some(idle_ms) = idle_ms {
            query = query.bind(idle_ms);
        }
        let row = query.fetch_one(&mut *self).await?;
        Ok(Verdict {
            accepted: row.try_get(0)?,
            fence: row.try_get(1)?,
            holder: row.try_get(2)?,
        })
    }

    async fn flag(&mut self, sql: &'static str, args: &[&str]) -> Result<bool> {
        let mut query = ::sqlx::query_scalar(sql).persistent(false);
        for arg in args {
            query = query.bind(*arg);
        }
        Ok(query.fetch_one(&mut *self).await?)
    }

    async fn batch(&mut self, sql: &str) -> Result<()> {
        // A query without arguments goes out as a simple query: several
        // statements at once. (Not `raw_sql`: its future cannot be proven
        // `Send` in a spawned task.)
        self.execute(sql).await?;
        Ok(())
    }

    async fn take_over(&mut self, resource: &str, fence: i64, holder: &str) -> Result<bool> {
        Ok(::sqlx::query_scalar(TAKE_OVER)
            .persistent(false)
            .bind(resource)
            .bind(fence)
            .bind(holder)
            .fetch_one(&mut *self)
            .await?)
    }
}

impl From<::sqlx::Error> for Error {
    /// Names the outcome as for tokio-postgres: the server's errors by
    /// SQLSTATE ([`Error::TableMissing`], [`Error::TableOutdated`],
    /// [`Error::Unreachable`], [`Error::SessionEnded`],
    /// [`Error::PermissionDenied`], [`Error::Auth`], [`Error::Aborted`]);
    /// sqlx's I/O errors, its pool timing out and its worker crashing as
    /// [`Error::Unreachable`]; the rest as [`Error::Postgres`].
    fn from(err: ::sqlx::Error) -> Self {
        if let Some(db) = err.as_database_error()
            && let Some(code) = db.code()
        {
            let (code, message) = (code.into_owned(), db.message().to_owned());
            return Error::from_server(&code, &message, err.into());
        }
        if matches!(
            err,
            ::sqlx::Error::Io(_) | ::sqlx::Error::PoolTimedOut | ::sqlx::Error::WorkerCrashed
        ) {
            return Error::Unreachable(err.into());
        }
        Error::Postgres(crate::DriverError::from(err).told())
    }
}

/// [`setup`](crate::guard::setup) on sqlx: creates [`FENCES`](crate::FENCES)
/// or migrates an earlier version's, in its own transaction on a
/// connection (a savepoint inside the caller's transaction), serialized
/// by the same advisory lock; says what it did and logs it.
///
/// # Errors
/// As [`setup`](crate::guard::setup): [`Error::Unreachable`],
/// [`Error::Auth`], [`Error::PermissionDenied`] or [`Error::Postgres`].
///
/// # Cancel safety
/// Cancel safe: if dropped before the commit, the transaction is rolled
/// back (sqlx sends the `ROLLBACK` with the connection's next use) and
/// nothing is created or changed.
pub async fn setup(db: &mut PgConnection) -> Result<Setup> {
    let mut tx = db.begin().await?;
    let done = crate::ddl::setup_in(&mut *tx).await?;
    tx.commit().await?;
    logged(&done);
    Ok(done)
}

/// [`guard_token`](crate::guard::guard_token) on sqlx: guards `resource`
/// with `token`, written by `holder`, in the caller's transaction
/// (`&mut tx`, or `&mut *tx`). Does not touch Redis.
///
/// # Errors
/// As [`guard_token`](crate::guard::guard_token).
///
/// # Cancel safety
/// If the future is dropped, the statement may or may not have run; roll
/// the transaction back (dropping it does).
pub async fn guard_token(
    tx: &mut PgConnection,
    resource: &str,
    token: FencingToken,
    holder: &HolderId,
) -> Result<Guard> {
    guard_token_with(tx, resource, token, holder).await
}

/// [`guard`](crate::guard::guard()) on sqlx: guards every fenced lock of
/// `lease` in the caller's transaction (`&mut tx`, or `&mut *tx`), in one
/// order, and on a refusal heals the Redis counter
/// ([`Lease::raise_fence_for`]), ends the lease
/// ([`Lease::mark_superseded`]) and returns [`Guard::Refused`]: roll back.
///
/// # Errors
/// As [`guard`](crate::guard::guard()): [`Error::NotFenced`] for a lease
/// with no fenced lock, [`Error::TableMissing`] before [`setup`],
/// [`Error::TableOutdated`] for a table [`setup`] has not migrated,
/// [`Error::Aborted`] in a transaction an earlier error aborted, ...
///
/// # Cancel safety
/// As [`guard_token`].
pub async fn guard(tx: &mut PgConnection, lease: &Lease) -> Result<Guard> {
    guard_with(tx, lease, &GuardOptions::default()).await
}

/// [`guard_with_options`](crate::guard_with_options) on sqlx: [`guard`]
/// with `options` (a take-over of an older holder frozen inside its
/// transaction, see [A holder that
/// freezes](mod@crate::guard#a-holder-that-freezes)).
///
/// # Errors
/// As [`guard`].
///
/// # Cancel safety
/// As [`guard_token`].
pub async fn guard_with_options(
    tx: &mut PgConnection,
    lease: &Lease,
    options: &GuardOptions,
) -> Result<Guard> {
    guard_with(tx, lease, options).await
}

/// [`guarded`](crate::guarded()) on sqlx: runs `work` in one transaction
/// on `db`, fenced by `lease`: `BEGIN`, the guard, the work (given the
/// transaction's connection), the check and `COMMIT`, the whole under the
/// lease's watchdog and the commit shielded from it. The same outcomes:
/// [`Guarded::Committed`] with the work's output, [`Guarded::Refused`]
/// (the work did not run, nothing written, the counter healed, the lease
/// ended as superseded),
/// [`Guarded::Lost`] (stopped and rolled back).
///
/// `db` is a connection that is not in a transaction (a pooled one is
/// `&mut *pool.acquire().await?`): inside one, the `COMMIT` would only
/// release a savepoint and the outer transaction would decide, so
/// [`Error::InTransaction`] is returned and nothing runs.
///
/// # Errors
/// What `work` returned (rolled back); this crate's errors through
/// `E: From<Error>`: [`Error::InTransaction`], [`Error::NotFenced`],
/// [`Error::TableMissing`], ..., [`Error::Aborted`] when a statement
/// failed inside a work that then returned `Ok` (rolled back),
/// [`Error::SessionEnded`] when the server ended the session (an
/// idle-in-transaction timeout, an administrator's shutdown) or the
/// connection was lost before the `COMMIT` was sent (retryable),
/// [`Error::CommitUnknown`] when the `COMMIT` got no answer; nothing was
/// written in any case but the last.
///
/// # Cancel safety
/// Dropping the future drops the transaction where it is: rolled back
/// (sqlx sends the `ROLLBACK` with the connection's next use), unless the
/// `COMMIT` was already sent.
pub async fn guarded<T, E>(
    db: &mut PgConnection,
    lease: &Lease,
    work: impl AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
) -> Result<Guarded<T>, E>
where
    E: From<Error>,
{
    guarded_with_options(db, lease, &GuardOptions::default(), work).await
}

/// [`guarded_with_options`](crate::guarded_with_options) on sqlx:
/// [`guarded`] with the guard's `options`.
///
/// # Errors
/// As [`guarded`].
///
/// # Cancel safety
/// As [`guarded`].
pub async fn guarded_with_options<T, E>(
    db: &mut PgConnection,
    lease: &Lease,
    options: &GuardOptions,
    work: impl AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
) -> Result<Guarded<T>, E>
where
    E: From<Error>,
{
    guarded_with_hook(db, lease, options, work, async || {}).await
}

/// [`guarded_with_hook`](crate::guarded_with_hook) on sqlx:
/// [`guarded_with_options`] with `before_commit` run after `work`
/// returned `Ok` and right before the commit (before its check's
/// `SELECT 1`), inside the commit's [shield](Lease::shield) (the watchdog
/// cannot stop it), with the transaction open and the guard's row
/// locked: the place for a fault-injection test's pause (see [A hook
/// before the commit](mod@crate::guarded#a-hook-before-the-commit)). It
/// runs at most once, and not when nothing is to be committed (a
/// refusal, the work's error, the lease lost during the work).
///
/// ```no_run
/// use leasehold::Lease;
/// use leasehold_pg::{GuardOptions, Guarded};
/// use sqlx::PgConnection;
///
/// async fn pay(
///     db: &mut PgConnection,
///     lease: &Lease,
///     before_commit: impl AsyncFnOnce(),
/// ) -> Result<Guarded<u64>, leasehold_pg::Error> {
///     leasehold_pg::sqlx::guarded_with_hook(
///         db,
///         lease,
///         &GuardOptions::default(),
///         async |tx: &mut PgConnection| {
///             let paid = sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE name = 'alice'")
///                 .execute(&mut *tx)
///                 .await?;
///             Ok(paid.rows_affected())
///         },
///         before_commit,
///     )
///     .await
/// }
/// ```
///
/// # Errors
/// As [`guarded`]. A hook that keeps the transaction idle past the
/// guard's idle bound (the lease's TTL, at least 1 s) has its session
/// ended by the server, and nothing written: [`Error::SessionEnded`] (the
/// check's `SELECT 1` finds the session ended before the `COMMIT` goes
/// out).
///
/// # Cancel safety
/// As [`guarded`]: dropped while `before_commit` runs, the transaction
/// is rolled back (its `COMMIT` was not sent).
pub async fn guarded_with_hook<T, E>(
    db: &mut PgConnection,
    lease: &Lease,
    options: &GuardOptions,
    work: impl AsyncFnOnce(&mut PgConnection) -> Result<T, E>,
    before_commit: impl AsyncFnOnce(),
) -> Result<Guarded<T>, E>
where
    E: From<Error>,
{
    if db.is_in_transaction() {
        return Err(E::from(Error::InTransaction));
    }
    let ran = lease
        .run(async {
            let mut tx = db.begin().await.map_err(Error::from)?;
            if let Some(outcome) = guarded_by(guard_with(&mut *tx, lease, options).await)? {
                return Ok(outcome);
            }
            let check = lease_check(lease, options)?;
            let output = work(&mut *tx).await?;
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

/// Commits `tx`, refusing to call a transaction an earlier error aborted
/// committed: `SELECT 1` (or `check`, the lease rows' check) first (it
/// fails in an aborted transaction, which is then rolled back), then
/// sqlx's `COMMIT` (see [the module
/// docs](self#the-commits-check-costs-a-round-trip-here)).
async fn commit(mut tx: Transaction<'_, Postgres>, check: Option<&str>) -> Result<Commit> {
    // Dropped on an error: rolled back. `Error::Aborted` for 25P02.
    if let Err(err) = tx.execute(check.unwrap_or("SELECT 1")).await {
        if matches!(&err, ::sqlx::Error::Database(db)
            if db.code().as_deref() == Some(crate::lease_row::LEASE_ENDED))
        {
            tracing::warn!(
                error = %err,
                "the lease ended before the commit (its row, on the database's clock): rolled back"
            );
            return Ok(Commit::Ended);
        }
        return Err(match Error::from(err) {
            // The connection is gone and the COMMIT was never sent: the
            // transaction did not commit. (A session the server ended,
            // its answer read here, is `SessionEnded` already.)
            Error::Unreachable(source) => Error::SessionEnded(source),
            err => err,
        });
    }
    match tx.commit().await {
        Ok(()) => Ok(Commit::Done),
        // The server refused the COMMIT (a deferred constraint, a
        // serialization failure): it rolled the transaction back. A
        // session terminated in its place may have committed first
        // (`commit_outcome_unknown`): unknown.
        Err(err)
            if matches!(&err, ::sqlx::Error::Database(db)
                if !crate::error::commit_outcome_unknown(db.code().as_deref())) =>
        {
            Err(Error::from(err))
        }
        Err(err) => Err(Error::CommitUnknown(err.into())),
    }
}
