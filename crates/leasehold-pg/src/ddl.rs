//! Creating tables safely from many processes at once.

use tokio_postgres::GenericClient;

use crate::client::OnClient;
use crate::error::{Error, Result};
use crate::statements::{
    FENCES_EXIST, FENCES_HAVE_COLUMN, GUARD_FUNCTION_CURRENT, SETUP_LOCK, Statements, guard_body,
    guard_function,
};

/// Runs `ddl` (idempotent `CREATE ... IF NOT EXISTS` statements) in one
/// transaction serialized by the setup's advisory lock, on a client (its
/// own transaction) or inside the caller's transaction (a savepoint).
pub(crate) async fn create<C: GenericClient>(client: &mut C, ddl: &str) -> Result<()> {
    let tx = client.transaction().await.map_err(Error::from_pg)?;
    tx.batch_execute(SETUP_LOCK).await.map_err(Error::from_pg)?;
    tx.batch_execute(ddl).await.map_err(Error::from_pg)?;
    tx.commit().await.map_err(Error::from_pg)
}

/// The fence table and the guard's function, as [`setup`](crate::setup)
/// creates them (for schema migration tools): `CREATE TABLE IF NOT EXISTS
/// leasehold_fences (resource, fence, holder)`, then `CREATE OR REPLACE
/// FUNCTION leasehold_guard(text, bigint, text)` (PL/pgSQL, run by the
/// guard's one statement; see the [`guard`](mod@crate::guard) module
/// docs), two statements in one string. Both are idempotent. A table
/// created by an earlier version may lack `holder`: `ALTER TABLE
/// leasehold_fences ADD COLUMN holder text` first.
pub const FENCES_DDL: &str = concat!(
    "CREATE TABLE IF NOT EXISTS leasehold_fences (
    resource text PRIMARY KEY CHECK (resource <> ''),
    fence    bigint NOT NULL CHECK (fence > 0),
    holder   text
);
",
    guard_function!()
);

/// What [`setup`](crate::setup) did to the fence table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Setup {
    /// It did not exist; it was created, with the guard's function.
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

/// What installing (or replacing) the guard's function means, as
/// [`Setup::Migrated`] names it.
const GUARD_FUNCTION_CHANGE: &str = "installed function leasehold_guard(text, bigint, text): the guard in one statement, which locks the row of a token its holder already wrote instead of rewriting it";

/// Creates the fence table, or migrates an earlier version's in place, in
/// the transaction `tx` the driver began (the caller's, or a savepoint of
/// it), serialized by the advisory lock; the driver commits.
pub(crate) async fn setup_in<S: Statements>(tx: &mut S) -> Result<Setup> {
    tx.batch(SETUP_LOCK).await?;
    if !tx.flag(FENCES_EXIST, &[]).await? {
        tx.batch(FENCES_DDL).await?;
        return Ok(Setup::Created);
    }
    let mut changes = Vec::new();
    for (column, statement, change) in FENCE_MIGRATIONS {
        if !tx.flag(FENCES_HAVE_COLUMN, &[column]).await? {
            tx.batch(statement).await?;
            changes.push(*change);
        }
    }
    // After the columns: the function reads and writes `holder`.
    if !tx.flag(GUARD_FUNCTION_CURRENT, &[guard_body!()]).await? {
        tx.batch(guard_function!()).await?;
        changes.push(GUARD_FUNCTION_CHANGE);
    }
    Ok(if changes.is_empty() {
        Setup::Unchanged
    } else {
        Setup::Migrated(changes)
    })
}

/// [`setup_in`] on tokio-postgres: its own transaction on a client, a
/// savepoint in a transaction.
pub(crate) async fn setup_fences<C: GenericClient>(client: &mut C) -> Result<Setup> {
    let tx = client.transaction().await.map_err(Error::from_pg)?;
    let done = setup_in(&mut OnClient(&tx)).await?;
    tx.commit().await.map_err(Error::from_pg)?;
    Ok(done)
}
