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

/// The fence table's DDL, as [`setup`](crate::setup) creates it (for schema migration
/// tools). A table created by an earlier version lacks `holder`:
/// `ALTER TABLE leasehold_fences ADD COLUMN holder text`.
pub const FENCES_DDL: &str = "CREATE TABLE IF NOT EXISTS leasehold_fences (
    resource text PRIMARY KEY CHECK (resource <> ''),
    fence    bigint NOT NULL CHECK (fence > 0),
    holder   text
)";

/// What [`setup`](crate::setup) did to the fence table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Setup {
    /// It did not exist; it was created.
    Created,
    /// It existed in an earlier version's shape; these changes were made
    /// (in order), and its rows kept.
    Migrated(Vec<&'static str>),
    /// It was already up to date; nothing was changed.
    Unchanged,
}

/// What an earlier version's fence table lacks, as (column, statement,
/// what the change means), in the order they are made.
const FENCE_MIGRATIONS: &[(&str, &str, &str)] = &[(
    "holder",
    "ALTER TABLE leasehold_fences ADD COLUMN holder text",
    "added column holder (text): the holder that wrote each fence; a fence written before has none and is accepted again only from a newer token",
)];

/// Creates the fence table, or migrates an earlier version's in place,
/// in one transaction serialized by the advisory lock.
pub(crate) async fn setup_fences<C: GenericClient>(client: &mut C) -> Result<Setup> {
    let tx = client.transaction().await.map_err(Error::from_pg)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SETUP_LOCK])
        .await
        .map_err(Error::from_pg)?;
    let exists: bool = tx
        .query_one("SELECT to_regclass('leasehold_fences') IS NOT NULL", &[])
        .await
        .map_err(Error::from_pg)?
        .try_get(0)
        .map_err(Error::from_pg)?;
    let done = if exists {
        let mut changes = Vec::new();
        for (column, statement, change) in FENCE_MIGRATIONS {
            let present: bool = tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_attribute
                       WHERE attrelid = 'leasehold_fences'::regclass
                         AND attname = $1 AND NOT attisdropped)",
                    &[column],
                )
                .await
                .map_err(Error::from_pg)?
                .try_get(0)
                .map_err(Error::from_pg)?;
            if !present {
                tx.batch_execute(statement).await.map_err(Error::from_pg)?;
                changes.push(*change);
            }
        }
        if changes.is_empty() {
            Setup::Unchanged
        } else {
            Setup::Migrated(changes)
        }
    } else {
        tx.batch_execute(FENCES_DDL).await.map_err(Error::from_pg)?;
        Setup::Created
    };
    tx.commit().await.map_err(Error::from_pg)?;
    Ok(done)
}
