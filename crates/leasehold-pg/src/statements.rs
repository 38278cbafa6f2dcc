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
/// `$1` resource, `$2` token (`bigint`), `$3` holder. A row back:
/// accepted; none: refused.
pub(crate) const GUARD: &str =
    "INSERT INTO leasehold_fences (resource, fence, holder) VALUES ($1, $2, $3)
 ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence, holder = EXCLUDED.holder
   WHERE leasehold_fences.fence < EXCLUDED.fence
      OR (leasehold_fences.fence = EXCLUDED.fence
          AND leasehold_fences.holder = EXCLUDED.holder)
 RETURNING fence";

/// After a refusal, who beat us: `$1` resource; `fence bigint, holder
/// text` (NULL for a row written before the table recorded holders).
pub(crate) const FENCE_OF: &str = "SELECT fence, holder FROM leasehold_fences WHERE resource = $1";

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

/// Runs this crate's statements in the caller's transaction: what a
/// driver implements (a few lines each) so that the guard and `setup`
/// run on it unchanged. Every method maps the driver's errors to
/// [`Error`](crate::Error) with the shared classification.
pub(crate) trait Statements {
    /// [`GUARD`] with its three parameters: whether a row came back.
    async fn guard(&mut self, resource: &str, fence: i64, holder: &str) -> Result<bool>;

    /// [`FENCE_OF`]: the fence and holder stored for `resource`.
    async fn fence_of(&mut self, resource: &str) -> Result<(i64, Option<String>)>;

    /// A statement that returns one `bool`, with no parameter or one text
    /// parameter (`$1`).
    async fn flag(&mut self, sql: &'static str, arg: Option<&str>) -> Result<bool>;

    /// Statements with no parameters and no rows (DDL, the advisory lock).
    async fn batch(&mut self, sql: &'static str) -> Result<()>;
}
