//! The fence guard: fencing for any transaction on any table.
//!
//! # What it does
//!
//! One small table, [`FENCES`] (`leasehold_fences (resource, fence,
//! holder)`), holds for each resource the highest fencing token that has
//! written it and the holder that wrote it (a [`HolderId`]: derived from
//! the lease's token, not the secret token itself). The guard is one
//! statement, run first in the caller's own transaction:
//!
//! ```sql
//! WITH fences AS (SELECT FROM leasehold_fences)
//! SELECT accepted, fence, holder FROM leasehold_guard($1, $2, $3);
//! -- $1 resource, $2 token (bigint), $3 holder;
//! -- accepted false: refused, and (fence, holder) is who beat us
//! ```
//!
//! `leasehold_guard` is a small PL/pgSQL function that [`setup`] installs
//! beside the table ([`FENCES_DDL`] holds both). It locks the resource's
//! row (`SELECT ... FOR UPDATE`; it inserts the row if there is none)
//! and then decides, in the database, in every transaction:
//!
//! - our token is **newer** than the row's: the row is raised to our
//!   token and holder; accepted;
//! - the **same token from the same holder** (one lease, several
//!   transactions: a leader's term): accepted, and the row is left as it
//!   is: the transaction pays a row lock, not a new row version;
//! - anything else (an older token, the same token from another holder,
//!   or from a row written before the table recorded holders): refused,
//!   nothing written, and the function returns the row's fence and holder.
//!
//! Either way the row stays locked by our transaction until it ends.
//! Nothing is remembered in the client between transactions: each one
//! asks the database, which compares with the row as last committed:
//! under `READ COMMITTED` each statement of the function takes a new
//! snapshot, and a `FOR UPDATE` that waited for a rival's transaction
//! reads the version the rival committed, not the one its snapshot saw.
//! (That is why it is a function: in one plain statement, an `INSERT ...
//! ON CONFLICT DO UPDATE ... WHERE fence < $2` locks the row without
//! rewriting it but returns nothing, and a `SELECT` beside it sees the
//! statement's snapshot, which after a wait can be a version the rival
//! has since replaced: the equal-token hole again.)
//! **Accepted**: go on with any reads and writes, on any tables, as many
//! as you like, and commit. **Refused**: a newer token, or the same token
//! from another holder, has written; nothing was written by the guard;
//! roll back. Users of other drivers or languages can run exactly this
//! statement, with `$3` the lease's [`Lease::holder`]
//! (`lease.holder().as_str()`).
//!
//! (The unused `WITH` names the table before the function, so that a
//! database without it answers "no such table", reported as
//! [`Error::TableMissing`], and one set up by an earlier version "no such
//! function", reported as [`Error::TableOutdated`]: run [`setup`].)
//!
//! # Round trips
//!
//! The guard is one statement and, on tokio-postgres, one round trip: it
//! goes out typed (parse, bind and execute at once, no prepare first). It
//! is sent when its future is first polled, so a statement started with it
//! shares its round trip: pipeline it with the transaction's first read,
//! and a guarded transaction makes as many round trips as an unguarded
//! one.
//!
//! ```no_run
//! # async fn debit(tx: &leasehold_pg::tokio_postgres::Transaction<'_>, lease: &leasehold::Lease)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! let read = tx.prepare("SELECT balance FROM accounts WHERE id = $1").await?;
//! // The guard first, the read second, in one round trip: the server runs
//! // them in order, so the read is made after the guard locked the row.
//! let (guard, row) = tokio::try_join!(
//!     leasehold_pg::guard(tx, lease),
//!     async { Ok::<_, leasehold_pg::Error>(tx.query_one(&read, &[&42_i64]).await?) },
//! )?;
//! if !guard.is_accepted() {
//!     return Ok(()); // drop `row` and roll back: nothing is written
//! }
//! # let _ = row; Ok(()) }
//! ```
//!
//! This is safe because the read is executed by the server after the
//! guard, in the same transaction (point 2 below); only its answer is
//! waited for together. Do nothing with the read's answer before the
//! guard's: on a refusal, discard it and roll back. It holds for a lease
//! on one fenced lock (or one [`guard_token`]): [`guard`] guards several
//! locks one after the other, each once the previous one answered, so a
//! read pipelined with it would overtake the later ones; await it first
//! there. Neither `BEGIN` nor a
//! later statement is needed by the guard. [`guarded`](crate::guarded())
//! cannot pipeline the guard with `BEGIN` on tokio-postgres: a
//! `Transaction` is only made by `Client::transaction`, which sends
//! `BEGIN` and waits for its answer with the client borrowed, so there
//! the guard costs one round trip of its own (the work's first statement
//! must wait for the guard's answer: the work does not run when it is
//! refused). sqlx 0.8 waits for each statement's answer before it sends
//! the next, so it pipelines nothing: there too the guard is one round
//! trip of its own (one statement, prepared once per connection by sqlx's
//! cache).
//!
//! What it costs (`leasehold bench guard`, BENCHMARKS.md, a one-row
//! debit pipelined as above): as many round trips as unguarded; through
//! 1 ms of round trip a guarded debit runs at 0.94 to 0.97 of an unguarded
//! one (the guard adds 130 to 180 us to 4.9 ms), with the token unchanged
//! or new; on loopback, where the unguarded debit is 80 to 90 us, the
//! guard's server work adds 55 to 100 us (about 0.55).
//!
//! # On sqlx and other drivers
//!
//! With the crate feature `sqlx`, the module `leasehold_pg::sqlx` runs
//! this guard, [`setup`] and [`guarded`](crate::guarded()) on a sqlx 0.8
//! `PgConnection` or transaction: the same statements, the same answers
//! and errors, the same invariant, tested alike. With diesel-async (or
//! any other driver), run the statement above first in your
//! transaction, binding the resource (the fence key, `keys.fence()`), the
//! token as a `bigint` and the holder, e.g. with `diesel::sql_query(..)`
//! and `.bind::<Text, _>`, `.bind::<BigInt, _>`; `accepted` false is a
//! refusal: roll back, and call `lease.raise_fence(fence)` and
//! `lease.mark_superseded()` as [`guard`] does. Create the table and the
//! function with [`FENCES_DDL`] in a migration.
//!
//! # Why it is enough (the serialization argument)
//!
//! Rule for every writer of the protected data: **run the guard first in
//! the transaction, and make every read that a decision depends on after
//! it, in the same transaction.** Then, under PostgreSQL's default
//! `READ COMMITTED`:
//!
//! 1. The guard's row lock serializes every guarded transaction of one
//!    resource: a second one waits in its guard statement until the first
//!    commits or rolls back.
//! 2. Under `READ COMMITTED` each statement sees every transaction committed
//!    before it started, so the reads after the guard see everything the
//!    previous guarded transactions wrote: a read-modify-write cannot be
//!    lost, whatever the lock in Redis did. (This is what check-and-set
//!    gave the tutorial, without a version column.)
//! 3. Once a token has committed, every lower token is refused, and the
//!    same token is accepted only from the holder that committed it: a
//!    holder paused past its lease cannot write after its successor did,
//!    **even if Redis issued both the same token**. This rule needs no
//!    clock and no assumption about Redis: the stored fence and holder
//!    only move forward, under the row lock of point 1.
//!
//! Under `REPEATABLE READ` or `SERIALIZABLE`, a guard that waited for a
//! concurrent guarded transaction fails with a serialization failure
//! (`Error::is_retryable`): retry the whole transaction. Never a stale read.
//!
//! What it does **not** cover: writes that bypass the guard (another code
//! path, a migration, a manual `UPDATE`); reads made before the guard or in
//! another transaction; effects outside the database (an e-mail, a call to
//! another service) that the transaction cannot roll back.
//!
//! # A holder that freezes
//!
//! The guard's row lock lasts until the transaction ends, and a holder
//! frozen inside its transaction (a stop-the-world pause, `SIGSTOP`, a
//! suspended VM) ends it only when it thaws: unbounded, the next holder,
//! which takes the lock once the frozen one's lease runs out, waits in its
//! own guard for the whole freeze. So [`guard`] (and
//! [`guarded`](crate::guarded()), and both on sqlx) also sets, in the
//! same statement (no round trip of its own), the **transaction-local**
//! `idle_in_transaction_session_timeout` to the lease's TTL, at least
//! 1 s, less the time the statement has run (a wait for the row lock
//! included), rounded up to whole milliseconds. A holder frozen between
//! two statements then stalls the next one by about its lease at most
//! (the next holder takes the lock when the frozen lease runs out, at
//! most a TTL after the freeze, and the frozen session ends a TTL after
//! its last statement; 1 s for a shorter lease): the server ends its
//! session (SQLSTATE `25P03`), which rolls its transaction back and frees
//! the row; once thawed, its commit is [`Error::SessionEnded`] (did not
//! commit; retryable, on a new connection).
//!
//! Why the TTL and not what is left of the lease: the watchdog keeps a
//! lease alive while its work runs, and work that pauses between two
//! statements for less than a TTL (the "guard first, then the expensive
//! part" pattern) must not lose its session; the floor of 1 s keeps
//! sub-second leases from ending every transaction at its first pause.
//!
//! - It is `set_config(.., true)`, as `SET LOCAL`: it ends with the
//!   transaction, and the session's own setting is back after it, on a
//!   pooled connection as through PgBouncer in transaction mode. Nothing
//!   session-wide is set.
//! - A smaller setting already in force (not 0: the session's, or a
//!   `SET LOCAL` before the guard) is kept: the guard only lowers it. To
//!   allow longer idle periods than the lease, `SET LOCAL` a larger value
//!   after the guard.
//! - The server's timer restarts with every idle period: it bounds each
//!   pause between statements, not the transaction. A work that sits idle
//!   in its transaction longer than the lease's TTL (at least 1 s; a slow
//!   call to another service between two statements, while the watchdog
//!   keeps the lease alive) is ended the same way: make such calls before
//!   the transaction or after it, or `SET LOCAL` a larger value after the
//!   guard.
//! - [`guard_token`] has no lease, and sets nothing: set the timeout
//!   yourself.
//! - A holder frozen **during** a statement is not idle.
//!   `statement_timeout` bounds a statement, and is the caller's choice
//!   (opt in with `SET LOCAL statement_timeout` after the guard): it also
//!   cuts a long statement whose lease the watchdog keeps alive. And a
//!   backend stuck writing its answer to a frozen client's socket (a
//!   result larger than the socket's buffers) is neither idle nor
//!   checking its statement timeout: only termination ends it. For that,
//!   the next holder can **take over** (below).
//!
//! With another driver, send this statement in place of the one above,
//! with `$4` the lease's TTL in milliseconds, at least 1000 (`bigint`);
//! its fourth column is the value set:
//!
//! ```sql
//! WITH fences AS (SELECT FROM leasehold_fences)
//! SELECT accepted, fence, holder,
//!   set_config('idle_in_transaction_session_timeout', least(
//!     nullif(extract(epoch FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000, 0),
//!     greatest(ceil($4::bigint - extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000), 1)
//!   )::bigint::text, true)
//! FROM leasehold_guard($1, $2, $3);
//! ```
//!
//! # Taking over from a frozen holder
//!
//! With [`GuardOptions::take_over_after`] (`guard_with_options`,
//! `guarded_with_options`, and their sqlx forms; off by default), the
//! guard waits for the resource's row at most that long (`SET LOCAL
//! lock_timeout`, inside a savepoint); when the wait runs out and the
//! lease is still valid (not lost, its deadline not passed: the lock
//! service has given it to us, so the holder keeping the row has lost
//! its lease), it ends the session of the transaction that keeps the
//! row (`pg_terminate_backend`), provided that it is found and belongs
//! to an older holder:
//!
//! - a guard that may take over marks its transaction, once it has its
//!   answer, with two shared advisory locks: `(1818583411,
//!   hashtext(resource))` ("leas" in ASCII) and its token as a `bigint`
//!   key;
//! - the transaction ended is the row's locker (its `xmax`), or, while
//!   the resource has no committed row (its first writer), one marked as
//!   guarding the resource;
//! - it is marked (a transaction guarded without the option is never
//!   ended), and carries no token mark at or above ours: a transaction of
//!   our own lease (the same token: a term's two transactions on one
//!   resource wait for each other as before) or of a newer holder is
//!   left alone, even when our lease only believes itself valid (its
//!   lock expired under it unseen);
//! - the row as last committed would accept our token (no newer holder
//!   has written).
//!
//! Then it waits for the row as usual (the ended session's transaction
//! rolls back as its backend exits). If nothing qualifies, it waits as
//! without the option. The frozen holder, once thawed, finds its session
//! gone: [`Error::SessionEnded`] or [`Error::Unreachable`], before its
//! `COMMIT`, so nothing of it was written. A WARN (`ended the session of
//! an older holder ...`) says each take-over.
//!
//! - **Permission**: `pg_terminate_backend` may end a session of the same
//!   role, or any non-superuser's with the `pg_signal_backend` role
//!   (`GRANT pg_signal_backend TO app`). Without it the guard logs a WARN
//!   (`could not end the session holding the guarded row ...`) and waits
//!   for the frozen holder, as without the option: the stall is the
//!   freeze again, for a freeze mid-statement (between statements the
//!   idle bound above still ends it).
//! - **The rule**: take the guard this way in every transaction of a
//!   resource: a holder guarded without it is never taken over (it is
//!   not marked), so its freeze mid-statement stalls the next as before.
//!   An application `bigint` advisory lock above a holder's token, held
//!   in its transaction, would keep it from being taken over too.
//! - **Cost**: two statements more per guarded resource (one round trip
//!   each: the savepoint with the wait, and the marks with the wait
//!   undone); when the wait runs out, three more (back to the savepoint,
//!   the look for a holder to end, the guard again).
//! - **The wait**: longer than an older holder that is not frozen keeps
//!   the row once its lease has ended (its watchdog stops its work at
//!   the next `.await` once it finds the lease lost; a commit under way
//!   is short), and short enough for your bound on a stall: the next
//!   commit comes about a TTL plus the wait after a freeze. Measured
//!   (`examples/frozen_holder.rs`, TTL 2 s, wait 500 ms, a holder frozen
//!   in a 64 MB answer, two rounds of 10 runs per driver): the next
//!   holder committed 2248 to 2441 ms after the freeze on tokio-postgres,
//!   2397 to 2489 ms on sqlx; without the take-over it waits for the
//!   whole freeze. A freeze between statements (the idle bound, no
//!   take-over): 2001 to 2027 ms.
//! - Through PgBouncer in transaction mode: the session ended is the
//!   server connection the frozen client's transaction runs on, which is
//!   what keeps the row; PgBouncer ends the frozen client's connection
//!   with it, and the next holder commits on another server connection.
//!   The settings are `SET LOCAL`, the marks transaction-level, as
//!   everywhere in the guard: the next client on that server connection
//!   does not inherit the bound. Tested on both drivers through Debian's
//!   PgBouncer 1.18 (`through_pgbouncer_*` in `tests/guarded.rs` and
//!   `tests/sqlx.rs`). On sqlx the guard's own statements are unnamed
//!   (`persistent(false)`), as a statement prepared by name on one server
//!   connection is not on the next; give your own statements inside
//!   `guarded` the same through PgBouncer in transaction mode.
//!
//! # Several resources (a transfer)
//!
//! Guard every resource the transaction touches, always in one order, so
//! that two transfers in opposite directions wait for each other instead of
//! deadlocking: [`guard`] does that for a lease on several keys (sorted by
//! resource name); with [`guard_token`] sort them yourself.
//!
//! # When Redis loses the counter
//!
//! Redis issues a token as `max(counter + 1, its clock in microseconds)`
//! (see [`FencingToken`]): a counter lost to a restart without persistence,
//! `FLUSHALL`, eviction or expiry, or set back by a failover to a lagging
//! replica, restarts above every token issued before, so the guard has
//! nothing to refuse. That rests on one assumption: the server that issues
//! next does not read its clock earlier than the one that issued the lost
//! tokens (its clock is not behind by more than the time between the
//! two). Where it fails, tokens go backwards or repeat, and the guard is
//! what catches it: a lower token is refused; a repeated token is refused
//! from every holder but the first to write with it (point 3).
//!
//! [`guard`] also heals the counter: on a refusal it raises the Redis
//! counter to the fence it found ([`Lease::raise_fence`]), so the next
//! lease's token is newer and wins. At most one refused write per
//! resource, then writes succeed again.
//!
//! Run the guard **first**, before the expensive part of the work (a slow
//! query, a call to another service): then a caller holding a token below
//! what the table has seen learns it at once, for the price of one
//! statement, and the counter is healed at that point, before any work is
//! done and thrown away. The README's recommended example does this inside
//! `with_lock`.
//!
//! # Upgrading a fence table
//!
//! [`setup`] creates the table and the guard's function, or migrates what
//! an earlier version created in place: it adds the `holder` column if
//! missing, then installs `leasehold_guard` (`CREATE OR REPLACE FUNCTION`)
//! if it is missing or its body is not this version's, serialized by the
//! same advisory lock, and returns [`Setup::Migrated`] naming each change
//! (and logs them at INFO). Replacing the function does not wait for
//! guarded transactions; writers of the earlier version (which ran the
//! check as an `INSERT ... ON CONFLICT` statement) and of this one can run
//! side by side: both lock the same row and apply the same rule. `ADD COLUMN` of a nullable
//! column rewrites no rows, but it takes the table's `ACCESS EXCLUSIVE`
//! lock for a moment: it waits for running guarded transactions and
//! holds new ones until it commits. A row written before the migration
//! has no holder, so its fence is accepted again only from a newer token:
//! a lease that wrote before the upgrade and writes again after it is
//! refused once. Writers of an earlier version still accept an equal token
//! from anyone: upgrade every writer.

use std::time::Duration;

use leasehold::{FencingToken, HolderId, Lease};
use tokio_postgres::GenericClient;

use crate::client::OnClient;
use crate::error::{Error, Result};
use crate::options::GuardOptions;
use crate::statements::{Statements, TAKE_OVER_END, TAKE_OVER_RETRY, take_over_begin};

pub use crate::ddl::{FENCES_DDL, Setup};
pub use crate::tables::FENCES;

/// Creates [`FENCES`], the one table the guard needs, and its function
/// `leasehold_guard`, or brings what an earlier version made up to date (see [Upgrading a fence
/// table](self#upgrading-a-fence-table)); nothing else (the tutorial's
/// wallet tables are [`setup_wallets`](crate::setup_wallets)'). One
/// transaction serialized by an advisory lock, so concurrent callers
/// (every replica of a service at start-up) are safe. Says what it did,
/// and logs a creation or a migration at INFO. Users who manage their
/// schema with migrations can run [`FENCES_DDL`] instead.
///
/// Works on a client (its own transaction) or inside the caller's
/// transaction (a savepoint).
///
/// # Errors
/// [`Error::Unreachable`], [`Error::Auth`] or [`Error::Postgres`] (for
/// example, no permission to create or alter tables or functions).
///
/// # Cancel safety
/// Cancel safe: if dropped before the commit, the transaction is rolled
/// back and nothing is created or changed.
pub async fn setup<C: GenericClient>(client: &mut C) -> Result<Setup> {
    let done = crate::ddl::setup_fences(client).await?;
    logged(&done);
    Ok(done)
}

/// Logs what a `setup` did (any driver's), at INFO.
pub(crate) fn logged(done: &Setup) {
    match done {
        Setup::Created => tracing::info!(table = FENCES, "created the fence table"),
        Setup::Migrated(changes) => {
            for change in changes {
                tracing::info!(table = FENCES, change, "migrated the fence table");
            }
        }
        Setup::Unchanged => {}
    }
}

/// What the guard found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a refused guard means the transaction must be rolled back"]
pub enum Guard {
    /// Our token is newer than any the resource has seen, or the same
    /// token from the same holder: the resource's fence is now ours and its
    /// row is locked by this transaction until it ends. Go on, then commit.
    Accepted,
    /// A newer token, or the same token from another holder, has written
    /// `resource`: roll back. `healed` says whether the Redis counter was
    /// raised to `current` (by [`guard`]), so that the next lease gets a
    /// newer token. The lease no longer protects anything, and [`guard`]
    /// has ended it ([`Lease::mark_superseded`]): its watchdog stops, work
    /// under `lease.run` (or a leadership `Term`'s `run`) stops at its
    /// next `.await`, `lease.lost()` is `Superseded`, and a term's
    /// `lost()` resolves, so the process campaigns again with no call of
    /// yours. ([`guard_token`] has no lease and ends nothing.)
    Refused {
        /// The resource that refused.
        resource: String,
        /// Our token.
        token: FencingToken,
        /// The fence the resource has seen: above `token`, or equal to it
        /// when another holder wrote with the same token.
        current: FencingToken,
        /// The holder that wrote `current` (`None` for a row written
        /// before the table recorded holders).
        writer: Option<String>,
        /// Whether the Redis counter was raised past `current`.
        healed: bool,
    },
}

impl Guard {
    /// Whether the transaction may go on.
    pub fn is_accepted(&self) -> bool {
        matches!(self, Guard::Accepted)
    }
}

/// Guards `resource` with `token`, written by `holder`, in the caller's
/// transaction `tx` (see the [module docs](self)): the one statement
/// above, then, if refused, the fence and holder found. Does not touch
/// Redis, and sets no idle bound (it has no lease: see [A holder that
/// freezes](self#a-holder-that-freezes)); see [`guard`] for the healing
/// one, which takes both from a lease.
///
/// # Errors
/// [`Error::InvalidResource`] for an empty name, [`Error::InvalidToken`]
/// for token 0, [`Error::TokenOutOfRange`] beyond `i64`, all before any
/// statement; [`Error::TableMissing`] when [`FENCES`] does not exist
/// ([`setup`] creates it), or has no `holder` column ([`setup`] adds it);
/// [`Error::PermissionDenied`]; [`Error::Postgres`] (a serialization
/// failure under `REPEATABLE READ` is retryable).
///
/// # Cancel safety
/// If the future is dropped, the statement may or may not have run; roll
/// the transaction back.
pub async fn guard_token<C: GenericClient>(
    tx: &C,
    resource: &str,
    token: FencingToken,
    holder: &HolderId,
) -> Result<Guard> {
    guard_token_with(&mut OnClient(tx), resource, token, holder).await
}

/// [`guard_token`] on any driver's [`Statements`], traced.
pub(crate) async fn guard_token_with<S: Statements>(
    tx: &mut S,
    resource: &str,
    token: FencingToken,
    holder: &HolderId,
) -> Result<Guard> {
    traced(
        resource,
        token,
        guard_statement(tx, resource, token, holder, None),
    )
    .await
}

/// The guard statement (and, if refused, the read of what beat us),
/// untraced; with `valid_for`, it also bounds the transaction's idle
/// periods by it (see [A holder that freezes](self#a-holder-that-freezes)).
async fn guard_statement<S: Statements>(
    tx: &mut S,
    resource: &str,
    token: FencingToken,
    holder: &HolderId,
    valid_for: Option<Duration>,
) -> Result<Guard> {
    let fence = checked(resource, token)?;
    let verdict = tx
        .guard(resource, fence, holder.as_str(), valid_for.map(idle_ms))
        .await?;
    if verdict.accepted {
        return Ok(Guard::Accepted);
    }
    Ok(Guard::Refused {
        resource: resource.to_owned(),
        token,
        current: FencingToken::new(u64::try_from(verdict.fence).unwrap_or(0)),
        writer: verdict.holder,
        healed: false,
    })
}

/// `token` as the guard's `bigint`, once `resource` and `token` are
/// known to be usable.
fn checked(resource: &str, token: FencingToken) -> Result<i64> {
    if resource.is_empty() {
        return Err(Error::InvalidResource {
            reason: "resource name is empty",
        });
    }
    if token.get() == 0 {
        return Err(Error::InvalidToken { token });
    }
    i64::try_from(token).map_err(|_| Error::TokenOutOfRange { token })
}

/// The guard statement with a take-over (see [A holder that
/// freezes](self#a-holder-that-freezes)): waits `wait` for the row; then,
/// while `lease` is valid, ends the session of an older holder holding
/// it, and waits for the row as long as it takes. Either way the
/// transaction then says which holder it belongs to, and its
/// `lock_timeout` is back.
async fn taking_over<S: Statements>(
    tx: &mut S,
    lease: &Lease,
    (resource, token, holder): (&str, FencingToken, &HolderId),
    valid_for: Option<Duration>,
    wait: Duration,
) -> Result<Guard> {
    let fence = checked(resource, token)?;
    let wait_ms = i64::try_from(wait.as_millis().clamp(1, i32::MAX as u128)).unwrap_or(1);
    tx.batch(&take_over_begin(wait_ms)).await?;
    let found = match guard_statement(&mut *tx, resource, token, holder, valid_for).await {
        Err(Error::Postgres(err)) if err.code() == Some(LOCK_NOT_AVAILABLE) => {
            tx.batch(TAKE_OVER_RETRY).await?;
            // Ours is the lock now: the lease that holds the row has run
            // out, unless it is ours (which the statement leaves alone).
            if lease.lost().is_none() && !lease.remaining().is_zero() {
                match tx.take_over(resource, fence, holder.as_str()).await {
                    Ok(true) => tracing::warn!(
                        resource,
                        token = token.get(),
                        "ended the session of an older holder that held the guarded row"
                    ),
                    Ok(false) => {}
                    Err(err) => {
                        tx.batch(TAKE_OVER_RETRY).await?;
                        tracing::warn!(
                            resource,
                            error = %err,
                            "could not end the session holding the guarded row (pg_terminate_backend needs the pg_signal_backend role, or the holder's own role); waiting for it"
                        );
                    }
                }
            }
            guard_statement(&mut *tx, resource, token, holder, valid_for).await?
        }
        found => found?,
    };
    tx.flag(TAKE_OVER_END, &[resource, &fence.to_string()])
        .await?;
    Ok(found)
}

/// SQLSTATE `55P03` lock_not_available: `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The shortest idle period the guard allows a transaction: a lease
/// shorter than this bounds a frozen holder by this instead of its TTL.
const IDLE_FLOOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Guards every fenced lock of `lease` in the caller's transaction `tx`,
/// in one order (sorted by resource), with the lease's own tokens; the
/// resource of a lock is its fence key (`fence:{wallet:42}` for
/// `FencedKeys::for_resource("wallet:42")`). On a refusal, raises the Redis
/// counter to the fence found ([`Lease::raise_fence_for`]) so that the next
/// lease wins, ends the lease ([`Lease::mark_superseded`]: a leadership
/// term is over, its work stops at its next `.await`), and returns
/// [`Guard::Refused`] at once: roll back (a lock guarded before it in this
/// call is part of the transaction too).
///
/// Each guard statement also bounds the transaction's idle periods by the
/// lease's TTL, at least 1 s (`SET LOCAL
/// idle_in_transaction_session_timeout`, a smaller setting kept), so that
/// a holder frozen in its transaction does not stall the next one for
/// the whole freeze: see [A holder that
/// freezes](self#a-holder-that-freezes).
///
/// # Errors
/// As [`guard_token`]; [`Error::NotFenced`] when the lease holds no fenced
/// lock. A failure to raise the Redis counter is not an error (the refusal
/// is the outcome): `healed` is then false.
///
/// # Cancel safety
/// As [`guard_token`].
pub async fn guard<C: GenericClient>(tx: &C, lease: &Lease) -> Result<Guard> {
    guard_with(&mut OnClient(tx), lease, &GuardOptions::default()).await
}

/// [`guard`] with `options`: with
/// [`take_over_after`](GuardOptions::take_over_after), a resource whose
/// row an older holder keeps locked longer than that is taken over (see
/// [A holder that freezes](self#a-holder-that-freezes)).
///
/// # Errors
/// As [`guard`].
///
/// # Cancel safety
/// As [`guard_token`].
pub async fn guard_with_options<C: GenericClient>(
    tx: &C,
    lease: &Lease,
    options: &GuardOptions,
) -> Result<Guard> {
    guard_with(&mut OnClient(tx), lease, options).await
}

/// [`guard`] on any driver's [`Statements`].
pub(crate) async fn guard_with<S: Statements>(
    tx: &mut S,
    lease: &Lease,
    options: &GuardOptions,
) -> Result<Guard> {
    let mut fenced: Vec<(String, &str, FencingToken, HolderId)> = lease
        .keys()
        .filter_map(|key| {
            let fence = lease.fence_for(key)?;
            let resource = lease.fence_key_for(key)?;
            let holder = lease.holder_for(key)?;
            Some((resource.to_owned(), key, fence, holder))
        })
        .collect();
    if fenced.is_empty() {
        return Err(Error::NotFenced);
    }
    let lease_rows = match options.check_lease_row {
        true => Some(crate::lease_row::rows(lease)?),
        false => None,
    };
    fenced.sort();
    for (resource, key, token, holder) in fenced {
        let guarded = async {
            // A frozen holder's session ends after an idle period of the
            // lease's TTL (at least `IDLE_FLOOR`): see "A holder that
            // freezes".
            let valid_for = Some(lease.ttl().max(IDLE_FLOOR));
            let found = match options.take_over_after {
                None => guard_statement(&mut *tx, &resource, token, &holder, valid_for).await?,
                Some(wait) => {
                    let guarded = (resource.as_str(), token, &holder);
                    taking_over(&mut *tx, lease, guarded, valid_for, wait).await?
                }
            };
            let Guard::Refused {
                current, writer, ..
            } = found
            else {
                return Ok(found);
            };
            let healed = match lease.raise_fence_for(key, current).await {
                Ok(()) => true,
                Err(err) => {
                    tracing::warn!(resource, error = %err, "could not raise the fence counter; the next lease may be refused too");
                    false
                }
            };
            Ok(Guard::Refused {
                resource: resource.clone(),
                token,
                current,
                writer,
                healed,
            })
        };
        let found = traced(&resource, token, guarded).await?;
        if !found.is_accepted() {
            // The lease will never be accepted here again (its token is
            // below the fence, or equal from another holder): its term is
            // over, whatever the lock service says.
            lease.mark_superseded();
            return Ok(found);
        }
    }
    if let Some(rows) = &lease_rows
        && let Some(key) = crate::lease_row::first_ended(tx, rows).await?
    {
        return Err(crate::lease_row::ended(lease, key));
    }
    Ok(Guard::Accepted)
}

/// `valid_for` as `idle_in_transaction_session_timeout`'s milliseconds:
/// rounded up, at least 1 (0 would turn the timeout off) and at most the
/// setting's maximum (`i32::MAX`, about 24.8 days).
fn idle_ms(valid_for: Duration) -> i64 {
    let ms = valid_for.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms.clamp(1, i32::MAX as u128)).unwrap_or(i64::from(i32::MAX))
}

/// `guarded` (the guard of `resource` with `token`) inside a
/// `leasehold_pg.guard` span (resource, token; outcome, and the current
/// fence and whether it was healed when refused), ending with one event: a
/// WARN when refused (a stale holder: the money alarm), else DEBUG.
/// Metrics are recorded there too.
async fn traced(
    resource: &str,
    token: FencingToken,
    guarded: impl Future<Output = Result<Guard>>,
) -> Result<Guard> {
    use tracing::Instrument;
    use tracing::field::Empty;
    let span = tracing::debug_span!(
        "leasehold_pg.guard",
        resource,
        token = token.get(),
        outcome = Empty,
        current = Empty,
        healed = Empty,
    );
    let result = guarded.instrument(span.clone()).await;
    let token = token.get();
    let outcome = match &result {
        Ok(Guard::Accepted) => {
            tracing::debug!(parent: &span, resource, token, outcome = "accepted", "guard accepted");
            "accepted"
        }
        Ok(Guard::Refused {
            current, healed, ..
        }) => {
            let current = current.get();
            span.record("current", current);
            span.record("healed", healed);
            let why = if current == token {
                "another holder has written with the same fencing token"
            } else {
                "a newer fencing token has written"
            };
            tracing::warn!(
                parent: &span,
                resource,
                token,
                current,
                healed,
                outcome = "refused",
                "write refused: {why}"
            );
            "refused"
        }
        Err(err) => {
            tracing::debug!(parent: &span, resource, token, outcome = "error", error = %err, "guard failed");
            "error"
        }
    };
    span.record("outcome", outcome);
    crate::metrics::guarded_write(outcome);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_bound_is_whole_milliseconds_rounded_up_between_1_and_the_settings_maximum() {
        assert_eq!(idle_ms(Duration::ZERO), 1, "0 would turn the timeout off");
        assert_eq!(idle_ms(Duration::from_nanos(1)), 1);
        assert_eq!(idle_ms(Duration::from_millis(1)), 1);
        assert_eq!(idle_ms(Duration::from_nanos(1_000_001)), 2);
        assert_eq!(idle_ms(Duration::from_millis(2_000)), 2_000);
        assert_eq!(idle_ms(Duration::MAX), i64::from(i32::MAX));
    }
}
