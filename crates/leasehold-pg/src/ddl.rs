//! Creating tables safely from many processes at once.

use tokio_postgres::GenericClient;

use crate::error::{Error, Result};

/// An arbitrary constant naming this crate's advisory lock: concurrent
/// `CREATE TABLE IF NOT EXISTS` of the same table can otherwise fail with a
/// unique violation in the catalog.
const SETUP_LOCK: i64 = 0x6c65_6173_6568_6f6c; // "leasehol"

/// Runs `ddl` (idempotent `CREATE ... IF NOT EXISTS` statements) in one
/// transaction serialized by an advisory lock, on a client (its own
/// transaction) or inside the caller's transaction (a savepoint).
pub(crate) async fn create<C: GenericClient>(client: &mut C, ddl: &str) -> Result<()> {
    let tx = client.transaction().await.map_err(Error::from_pg)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SETUP_LOCK])
        .await
        .map_err(Error::from_pg)?;
    tx.batch_execute(ddl).await.map_err(Error::from_pg)?;
    tx.commit().await.map_err(Error::from_pg)
}
