//! The tutorial's wallet and ledger tables: creating them and resetting one
//! wallet. Only the wallet helpers use them; the fence guard needs none of
//! this ([`setup`](crate::setup) creates its one table).

use tokio_postgres::GenericClient;

use crate::error::{Error, Result};

/// The tables' DDL. `IF NOT EXISTS` makes [`setup_wallets`] idempotent.
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
";

/// Creates the tutorial's [`WALLETS`](crate::WALLETS) and [`LEDGER`](crate::LEDGER) tables (and the
/// ledger's index) if they do not exist, for the wallet helpers
/// ([`debit_fenced`](crate::debit_fenced) and friends, [`audit`](crate::audit)).
/// The fence guard does not need them: for it, [`setup`](crate::setup)
/// alone. One transaction serialized by an advisory lock, so concurrent
/// callers are safe.
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
pub async fn setup_wallets<C: GenericClient>(client: &mut C) -> Result<()> {
    crate::ddl::create(client, SCHEMA).await
}

/// Creates wallet `id` with `balance` and fence 0, or resets it to that,
/// deleting its ledger rows: one statement, so atomic.
///
/// # Errors
/// [`Error::InvalidBalance`] for a negative balance, before any I/O;
/// [`Error::TableMissing`] when [`setup_wallets`] has not run; connection errors.
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
