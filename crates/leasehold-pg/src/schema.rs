//! The wallet and ledger tables: creating them and resetting one wallet.

use tokio_postgres::GenericClient;

use crate::error::{Error, Result};

/// The wallet table: `id bigint PRIMARY KEY`, `balance bigint NOT NULL
/// CHECK (balance >= 0)`, `fence bigint NOT NULL DEFAULT 0` (the highest
/// fencing token that has written, which doubles as the row's version).
pub const WALLETS: &str = "wallets";

/// The ledger table: one row per accepted debit (`wallet_id`, `amount`,
/// `fence`: the token it was written with, NULL for database-only writes),
/// inserted in the same statement or transaction as the debit.
pub const LEDGER: &str = "wallet_ledger";

/// The tables' DDL. `IF NOT EXISTS` makes [`setup`] idempotent.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS wallets (
    id      bigint PRIMARY KEY,
    balance bigint NOT NULL CHECK (balance >= 0),
    fence   bigint NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS wallet_ledger (
    id         bigserial PRIMARY KEY,
    wallet_id  bigint NOT NULL REFERENCES wallets (id),
    amount     bigint NOT NULL CHECK (amount > 0),
    fence      bigint,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS wallet_ledger_wallet_id ON wallet_ledger (wallet_id);
CREATE TABLE IF NOT EXISTS leasehold_fences (
    resource text PRIMARY KEY CHECK (resource <> ''),
    fence    bigint NOT NULL CHECK (fence > 0)
);
";

/// An arbitrary constant naming this crate's advisory lock: concurrent
/// `CREATE TABLE IF NOT EXISTS` of the same table can otherwise fail with a
/// unique violation in the catalog.
const SETUP_LOCK: i64 = 0x6c65_6173_6568_6f6c; // "leasehol"

/// Creates the [`WALLETS`] and [`LEDGER`] tables (and the ledger's index) if
/// they do not exist, in one transaction serialized by an advisory lock, so
/// concurrent callers are safe.
///
/// Works on a client (its own transaction) or inside the caller's
/// transaction (a savepoint).
///
/// # Errors
/// [`Error::Unreachable`], [`Error::Auth`] or [`Error::Postgres`] (for
/// example, no permission to create tables).
///
/// # Cancel safety
/// Cancel safe: if dropped before the commit, the transaction is rolled
/// back and nothing is created.
pub async fn setup<C: GenericClient>(client: &mut C) -> Result<()> {
    let tx = client.transaction().await.map_err(Error::from_pg)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SETUP_LOCK])
        .await
        .map_err(Error::from_pg)?;
    tx.batch_execute(SCHEMA).await.map_err(Error::from_pg)?;
    tx.commit().await.map_err(Error::from_pg)
}

/// Creates wallet `id` with `balance` and fence 0, or resets it to that,
/// deleting its ledger rows: one statement, so atomic.
///
/// # Errors
/// [`Error::InvalidBalance`] for a negative balance, before any I/O;
/// [`Error::TableMissing`] when [`setup`] has not run; connection errors.
///
/// # Cancel safety
/// Cancel safe: the statement either committed or did not.
pub async fn reset_wallet<C: GenericClient>(client: &C, id: i64, balance: i64) -> Result<()> {
    if balance < 0 {
        return Err(Error::InvalidBalance { balance });
    }
    client
        .execute(
            "WITH cleared AS (DELETE FROM wallet_ledger WHERE wallet_id = $1)
             INSERT INTO wallets (id, balance, fence) VALUES ($1, $2, 0)
             ON CONFLICT (id) DO UPDATE SET balance = EXCLUDED.balance, fence = 0",
            &[&id, &balance],
        )
        .await
        .map_err(Error::from_pg)?;
    Ok(())
}
