//! The fence guard's and `setup`'s SQL, said once for every driver, and
//! the one seam a driver implements: [`Statements`], "run these statements
//! in this transaction". The guard's logic ([`guard`](mod@crate::guard)) and
//! the fence table's creation and migration
//! ([`setup`](crate::guard::setup)) are written once over it; a driver
//! module (tokio-postgres in `client.rs`, sqlx in `sqlx.rs`) only runs the
//! statements and maps its errors to [`Error`](crate::error::Error) (through
//! `Error::from_server`, one SQLSTATE classification for all).

use crate::error::Result;

/// The guard statement (see the [`guard`](mod@crate::guard) module docs):
/// `$1` resource, `$2` token (`bigint`), `$3` holder; one row: whether it
/// was accepted, and the resource's fence and holder as they stand (the
/// holder `NULL` for a row written before the table recorded holders).
/// The unused `WITH` names the table before the function, so that a
/// database without the table answers "no such table" (`42P01`), and one
/// whose table predates the function "no such function" (`42883`).
pub(crate) const GUARD: &str = "WITH fences AS (SELECT FROM leasehold_fences)
SELECT accepted, fence, holder FROM leasehold_guard($1, $2, $3)";

/// [`GUARD`] that also bounds how long the transaction may sit idle (see
/// [A holder that freezes](mod@crate::guard#a-holder-that-freezes)): `$4`
/// is the lease's TTL in milliseconds, at least 1000 (`bigint`). After the guard's function has returned (a row lock it waited for
/// included), it sets the transaction-local (`is_local`, as `SET LOCAL`)
/// `idle_in_transaction_session_timeout` to `$4` less the time the
/// statement has run so far, at least 1 ms, unless the setting in force is
/// already smaller and not 0 (the caller's stricter choice is kept). The
/// setting in force is read through `interval`, which takes every unit
/// `SHOW` prints (`500ms`, `5s`, `1min`, `2h`, `1d`). Its fourth column
/// is the value set, unused.
pub(crate) const GUARD_BOUNDED: &str = "WITH fences AS (SELECT FROM leasehold_fences)
SELECT accepted, fence, holder,
  set_config('idle_in_transaction_session_timeout', least(
    nullif(extract(epoch FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000, 0),
    greatest(ceil($4::bigint - extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000), 1)
  )::bigint::text, true)
FROM leasehold_guard($1, $2, $3)";

/// Starts a guard that may take over (see [A holder that
/// freezes](mod@crate::guard#a-holder-that-freezes)): a savepoint to come
/// back to when the row lock is not had within the wait, the
/// `lock_timeout` in force kept in `leasehold.lock_timeout`, and the
/// wait, in milliseconds, as the transaction's `lock_timeout`.
pub(crate) fn take_over_begin(wait_ms: i64) -> String {
    format!(
        "SAVEPOINT leasehold_guard;
SELECT set_config('leasehold.lock_timeout', current_setting('lock_timeout'), true);
SET LOCAL lock_timeout = {wait_ms}"
    )
}

/// Goes back to the savepoint of [`take_over_begin`] after the guard
/// statement failed (its wait ran out): the transaction is usable again,
/// and its `lock_timeout` is back.
pub(crate) const TAKE_OVER_RETRY: &str = "ROLLBACK TO SAVEPOINT leasehold_guard";

/// Ends a guard that may take over, once it has its answer: marks the
/// transaction as guarding resource `$1` with token `$2` (as text; shared advisory
/// locks: `(1818583411, hashtext(resource))`, the first key "leas" in
/// ASCII, and the token as a `bigint` key), so that a take-over can find
/// it and tell whether it is older, and puts back the `lock_timeout` that
/// was in force. One `bool`, true.
pub(crate) const TAKE_OVER_END: &str = "SELECT set_config('lock_timeout',
    coalesce(nullif(current_setting('leasehold.lock_timeout', true), ''), current_setting('lock_timeout')),
    true) IS NOT NULL
  FROM (SELECT pg_advisory_xact_lock_shared(1818583411, hashtext($1)),
               pg_advisory_xact_lock_shared($2::text::bigint)) AS marks";

/// Ends the sessions of older holders that keep the guard's row of
/// resource `$1` from us (token `$2`, holder `$3`): the transaction that
/// locks the row (its `xmax`; a row locked by several at once has a
/// multixact there, and is left alone), or, while the resource has no
/// committed row, the transactions marked as guarding it. Only one marked
/// by [`TAKE_OVER_END`] (a guard that may take over), with no token mark
/// at or above ours (ours, or a newer holder's: left alone; a `bigint`
/// advisory lock of the application's above our token also keeps it),
/// never our own session, and only while the row as last committed
/// would accept our token from our holder (no newer holder has written).
/// One `bool`: whether a session was ended. `pg_terminate_backend` needs
/// the `pg_signal_backend` role, or the blocker's own role; without it
/// this fails with `42501`.
pub(crate) const TAKE_OVER: &str = "WITH marked AS (
  SELECT a.pid FROM pg_locks a
   WHERE a.locktype = 'advisory' AND a.objsubid = 2 AND a.granted
     AND a.classid = 1818583411::oid
     AND a.objid = (hashtext($1)::bigint & 4294967295)::oid
), blockers AS (
  SELECT l.pid
    FROM leasehold_fences f
    JOIN pg_locks l
      ON l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
     AND l.transactionid = f.xmax
   WHERE f.resource = $1
  UNION
  SELECT m.pid FROM marked m
   WHERE NOT EXISTS (SELECT FROM leasehold_fences f WHERE f.resource = $1)
)
SELECT coalesce(bool_or(pg_terminate_backend(b.pid)), false)
  FROM blockers b
 WHERE b.pid <> pg_backend_pid()
   AND b.pid IN (SELECT pid FROM marked)
   AND NOT EXISTS (
     SELECT FROM pg_locks a
      WHERE a.pid = b.pid AND a.locktype = 'advisory' AND a.objsubid = 1
        AND ((a.classid::bigint << 32) | a.objid::bigint) >= $2)
   AND NOT EXISTS (
     SELECT FROM leasehold_fences f
      WHERE f.resource = $1 AND NOT (f.fence < $2 OR (f.fence = $2 AND f.holder = $3)))";

/// The body of [`GUARD`]'s function (see `guard_function!`): what
/// `setup` compares with the installed one's (`pg_proc.prosrc`) to know
/// whether to replace it.
macro_rules! guard_body {
    () => {
        "
BEGIN
  LOOP
    -- Locks the row; under READ COMMITTED, after waiting for a concurrent
    -- writer, this reads the version it committed, not the snapshot's.
    SELECT f.fence, f.holder INTO fence, holder
      FROM leasehold_fences f WHERE f.resource = p_resource FOR UPDATE;
    IF FOUND THEN
      IF fence < p_fence THEN
        UPDATE leasehold_fences f SET fence = p_fence, holder = p_holder
          WHERE f.resource = p_resource;
        accepted := true;
        fence := p_fence;
        holder := p_holder;
      ELSE
        -- The same token is accepted only from the holder that wrote it;
        -- the row is kept as it is, locked, not rewritten.
        accepted := fence = p_fence AND coalesce(holder = p_holder, false);
      END IF;
      RETURN;
    END IF;
    INSERT INTO leasehold_fences (resource, fence, holder)
      VALUES (p_resource, p_fence, p_holder)
      ON CONFLICT (resource) DO NOTHING;
    IF FOUND THEN
      accepted := true;
      fence := p_fence;
      holder := p_holder;
      RETURN;
    END IF;
    -- Another transaction inserted the row first: lock and judge it.
  END LOOP;
END
"
    };
}

/// The guard's function, as `setup` creates it: `CREATE OR REPLACE
/// FUNCTION leasehold_guard(text, bigint, text)` in PL/pgSQL, security
/// invoker, resolving `leasehold_fences` through the caller's
/// `search_path`.
macro_rules! guard_function {
    () => {
        concat!(
            "CREATE OR REPLACE FUNCTION leasehold_guard(
    p_resource text, p_fence bigint, p_holder text,
    OUT accepted boolean, OUT fence bigint, OUT holder text)
LANGUAGE plpgsql VOLATILE AS $leasehold$",
            guard_body!(),
            "$leasehold$"
        )
    };
}
pub(crate) use {guard_body, guard_function};

/// Whether [`GUARD`]'s function exists with this version's body (one
/// `bool`); `$1` is the body.
pub(crate) const GUARD_FUNCTION_CURRENT: &str = "SELECT EXISTS (SELECT 1 FROM pg_proc
   WHERE oid = to_regprocedure('leasehold_guard(text, bigint, text)')
     AND prosrc = $1)";

/// Serializes `setup`s (concurrent `CREATE TABLE IF NOT EXISTS` of one
/// table can otherwise fail with a unique violation in the catalog): the
/// transaction-scoped advisory lock `0x6c65_6173_6568_6f6c` ("leasehol").
pub(crate) const SETUP_LOCK: &str = "SELECT pg_advisory_xact_lock(7810756276994469740)";

/// Whether the fence table exists (one `bool`).
pub(crate) const FENCES_EXIST: &str = "SELECT to_regclass('leasehold_fences') IS NOT NULL";

/// Whether the fence table has the column `$1` (one `bool`).
pub(crate) const FENCES_HAVE_COLUMN: &str = "SELECT EXISTS (SELECT 1 FROM pg_attribute
   WHERE attrelid = 'leasehold_fences'::regclass
     AND attname = $1 AND NOT attisdropped)";

/// [`GUARD`]'s row: whether the guard accepted, and the resource's fence
/// and holder as they stand after it.
#[derive(Debug)]
pub(crate) struct Verdict {
    /// Accepted.
    pub(crate) accepted: bool,
    /// The resource's fence.
    pub(crate) fence: i64,
    /// The holder that wrote it (`None`: written before the table
    /// recorded holders).
    pub(crate) holder: Option<String>,
}

/// Runs this crate's statements in the caller's transaction: what a
/// driver implements (a few lines each) so that the guard and `setup`
/// run on it unchanged. Every method maps the driver's errors to
/// [`Error`](crate::Error) with the shared classification.
pub(crate) trait Statements {
    /// [`GUARD`] with its three parameters, or [`GUARD_BOUNDED`] when
    /// `idle_ms` (its `$4`) is given, in one round trip (no separate
    /// prepare): its one row.
    async fn guard(
        &mut self,
        resource: &str,
        fence: i64,
        holder: &str,
        idle_ms: Option<i64>,
    ) -> Result<Verdict>;

    /// A statement that returns one `bool`, with text parameters (`$1`,
    /// `$2`, ...).
    async fn flag(&mut self, sql: &'static str, args: &[&str]) -> Result<bool>;

    /// Statements with no parameters (DDL, the advisory lock, a
    /// savepoint); their rows, if any, are dropped.
    async fn batch(&mut self, sql: &str) -> Result<()>;

    /// [`TAKE_OVER`] with its three parameters: its one `bool`.
    async fn take_over(&mut self, resource: &str, fence: i64, holder: &str) -> Result<bool>;
}
