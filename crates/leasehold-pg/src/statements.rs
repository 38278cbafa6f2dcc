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

    /// A statement that returns one `bool`, with no parameter or one text
    /// parameter (`$1`).
    async fn flag(&mut self, sql: &'static str, arg: Option<&str>) -> Result<bool>;

    /// Statements with no parameters and no rows (DDL, the advisory lock).
    async fn batch(&mut self, sql: &'static str) -> Result<()>;
}
