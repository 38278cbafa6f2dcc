//! Reads and conditional debits, each with a typed outcome.

use leasehold::FencingToken;
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Transaction};

use crate::error::{Error, Result};

/// What a caller read from one wallet row: its balance and its fence (the
/// highest token that has written, which is also the row's version).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    id: i64,
    balance: i64,
    fence: i64,
}

impl Snapshot {
    /// The wallet id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The balance that was read.
    pub fn balance(&self) -> i64 {
        self.balance
    }

    /// The fence (version) that was read.
    pub fn fence(&self) -> i64 {
        self.fence
    }
}

/// What the database did with a debit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The debit was written, with its ledger row, in one atomic step.
    Applied {
        /// The balance after the debit.
        balance: i64,
    },
    /// Refused: a holder with this token or a newer one has already written,
    /// so our lease had passed to someone else. Nothing was written.
    StaleToken {
        /// The fence found in the row (at or above our token).
        fence: i64,
    },
    /// Refused: our token is newer, but the row changed since we read it,
    /// so the new balance was computed from a stale value. Nothing was
    /// written.
    StaleRead {
        /// The fence found in the row (not the one we read).
        fence: i64,
    },
    /// Refused: the balance does not cover the amount. Nothing was written.
    InsufficientFunds {
        /// The balance that was too low.
        balance: i64,
    },
}

impl Outcome {
    /// True for [`Outcome::Applied`].
    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied { .. })
    }
}

/// Reads wallet `id`'s balance and fence.
///
/// # Errors
/// [`Error::WalletNotFound`], [`Error::TableMissing`], connection errors.
///
/// # Cancel safety
/// Cancel safe (a read).
pub async fn read_wallet<C: GenericClient>(client: &C, id: i64) -> Result<Snapshot> {
    let row = client
        .query_opt("SELECT balance, fence FROM wallets WHERE id = $1", &[&id])
        .await
        .map_err(Error::from_pg)?
        .ok_or(Error::WalletNotFound { id })?;
    Ok(Snapshot {
        id,
        balance: row.try_get(0).map_err(Error::from_pg)?,
        fence: row.try_get(1).map_err(Error::from_pg)?,
    })
}

/// How a token-carrying write is conditioned.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    /// `fence < $token`.
    Token,
    /// `fence < $token AND fence = $read`.
    TokenAndVersion,
}

impl Check {
    /// Its value in traces and metrics.
    fn label(self) -> &'static str {
        match self {
            Check::Token => "token",
            Check::TokenAndVersion => "token_and_version",
        }
    }
}

impl Outcome {
    /// Its value in traces and metrics: `applied`, `stale_token`,
    /// `stale_read`, `insufficient_funds`.
    fn label(&self) -> &'static str {
        match self {
            Outcome::Applied { .. } => "applied",
            Outcome::StaleToken { .. } => "stale_token",
            Outcome::StaleRead { .. } => "stale_read",
            Outcome::InsufficientFunds { .. } => "insufficient_funds",
        }
    }
}

/// Fenced debit: writes `read.balance() - amount` and `fence = token` only
/// if no holder with this token or a newer one has written
/// (`WHERE id = $1 AND fence < $token`), and inserts the ledger row in the
/// same statement.
///
/// This refuses a holder whose lease has passed to a *newer* holder that
/// already wrote. It does **not** refuse a write computed from a stale read
/// by a holder with a newer token; use [`debit_check_and_set`] for that.
///
/// # Errors
/// [`Error::InvalidAmount`] / [`Error::TokenOutOfRange`] before any I/O;
/// [`Error::WalletNotFound`], [`Error::TableMissing`], connection errors.
///
/// # Cancel safety
/// Cancel safe: the debit and its ledger row are one statement, so they
/// are written together or not at all; if dropped mid-flight, whether it
/// committed is unknown (re-read to find out).
pub async fn debit_fenced<C: GenericClient>(
    client: &C,
    read: &Snapshot,
    amount: i64,
    token: FencingToken,
) -> Result<Outcome> {
    debit_with_token(client, read, amount, token, Check::Token).await
}

/// Check-and-set debit: like [`debit_fenced`], and also only if the row's
/// fence is still the one `read` saw (`AND fence = $read_fence`).
///
/// Every accepted write raises the fence, so a version never repeats and a
/// write computed from a stale read is always refused, however the leases
/// overlapped: the balance stays right even when the Redis lock fails.
///
/// # Errors
/// As [`debit_fenced`].
///
/// # Cancel safety
/// As [`debit_fenced`].
pub async fn debit_check_and_set<C: GenericClient>(
    client: &C,
    read: &Snapshot,
    amount: i64,
    token: FencingToken,
) -> Result<Outcome> {
    debit_with_token(client, read, amount, token, Check::TokenAndVersion).await
}

/// The write, inside a `leasehold_pg.debit` span (wallet, check, token;
/// outcome and the current fence once known), ending with one event: a
/// WARN when refused as stale, else DEBUG. Metrics are recorded there too.
async fn debit_with_token<C: GenericClient>(
    client: &C,
    read: &Snapshot,
    amount: i64,
    token: FencingToken,
    check: Check,
) -> Result<Outcome> {
    use tracing::Instrument;
    let span = tracing::debug_span!(
        "leasehold_pg.debit",
        wallet = read.id,
        check = check.label(),
        token = token.get(),
        outcome = tracing::field::Empty,
        current = tracing::field::Empty,
    );
    let written = write_with_token(client, read, amount, token, check)
        .instrument(span.clone())
        .await;
    let (wallet, token, check) = (read.id, token.get(), check.label());
    let outcome = written.as_ref().map_or("error", Outcome::label);
    span.record("outcome", outcome);
    let stale = match &written {
        Ok(Outcome::StaleToken { fence: current } | Outcome::StaleRead { fence: current }) => {
            span.record("current", current);
            tracing::warn!(
                parent: &span,
                wallet,
                token,
                current,
                check,
                outcome,
                "write refused: the lease was superseded or the read is stale"
            );
            true
        }
        Ok(_) => {
            tracing::debug!(parent: &span, wallet, token, check, outcome, "fenced write");
            false
        }
        Err(err) => {
            tracing::debug!(parent: &span, wallet, token, check, outcome, error = %err, "fenced write failed");
            false
        }
    };
    crate::metrics::fenced_write(check, outcome, stale);
    written
}

async fn write_with_token<C: GenericClient>(
    client: &C,
    read: &Snapshot,
    amount: i64,
    token: FencingToken,
    check: Check,
) -> Result<Outcome> {
    check_amount(amount)?;
    let token = i64::try_from(token.get()).map_err(|_| Error::TokenOutOfRange { token })?;
    if read.balance < amount {
        return Ok(Outcome::InsufficientFunds {
            balance: read.balance,
        });
    }
    let new_balance = read.balance - amount;
    let statement = match check {
        Check::Token => {
            "WITH debit AS (
                 UPDATE wallets SET balance = $2, fence = $3
                  WHERE id = $1 AND fence < $3
              RETURNING id),
             entry AS (
                 INSERT INTO wallet_ledger (wallet_id, amount, fence)
                 SELECT id, $4, $3 FROM debit)
             SELECT count(*) FROM debit"
        }
        Check::TokenAndVersion => {
            "WITH debit AS (
                 UPDATE wallets SET balance = $2, fence = $3
                  WHERE id = $1 AND fence < $3 AND fence = $5
              RETURNING id),
             entry AS (
                 INSERT INTO wallet_ledger (wallet_id, amount, fence)
                 SELECT id, $4, $3 FROM debit)
             SELECT count(*) FROM debit"
        }
    };
    let params: [&(dyn ToSql + Sync); 5] = [&read.id, &new_balance, &token, &amount, &read.fence];
    let params = match check {
        Check::Token => &params[..4],
        Check::TokenAndVersion => &params[..],
    };
    let written: i64 = client
        .query_one(statement, params)
        .await
        .map_err(Error::from_pg)?
        .try_get(0)
        .map_err(Error::from_pg)?;
    if written == 1 {
        return Ok(Outcome::Applied {
            balance: new_balance,
        });
    }
    // Refused: re-read (a new statement sees the latest committed row) to
    // say why. The reason is as of this re-read; the refusal itself was
    // decided by the UPDATE's own check.
    let now = read_wallet(client, read.id).await?;
    Ok(if now.fence >= token {
        Outcome::StaleToken { fence: now.fence }
    } else {
        Outcome::StaleRead { fence: now.fence }
    })
}

/// One conditional statement, no lock and no token:
/// `SET balance = balance - $amount WHERE id = $1 AND balance >= $amount`,
/// with the ledger row inserted by the same statement.
///
/// Under READ COMMITTED a concurrent debit of the same row waits for the
/// first and then re-checks the `WHERE` against the updated row, so this is
/// correct on its own, whatever happens to any Redis lock.
///
/// It does not advance the fence, so do not mix it with token-carrying
/// writes ([`debit_check_and_set`]) on the same wallet: those would not see
/// its debits as a change of version.
///
/// # Errors
/// [`Error::InvalidAmount`] before any I/O; [`Error::WalletNotFound`],
/// [`Error::TableMissing`], connection errors.
///
/// # Cancel safety
/// As [`debit_fenced`].
pub async fn debit_conditional<C: GenericClient>(
    client: &C,
    id: i64,
    amount: i64,
) -> Result<Outcome> {
    check_amount(amount)?;
    let row = client
        .query_opt(
            "WITH debit AS (
                 UPDATE wallets SET balance = balance - $2
                  WHERE id = $1 AND balance >= $2
              RETURNING id, balance),
             entry AS (
                 INSERT INTO wallet_ledger (wallet_id, amount)
                 SELECT id, $2 FROM debit)
             SELECT balance FROM debit",
            &[&id, &amount],
        )
        .await
        .map_err(Error::from_pg)?;
    match row {
        Some(row) => Ok(Outcome::Applied {
            balance: row.try_get(0).map_err(Error::from_pg)?,
        }),
        None => {
            let now = read_wallet(client, id).await?;
            Ok(Outcome::InsufficientFunds {
                balance: now.balance,
            })
        }
    }
}

/// A wallet row locked with `SELECT ... FOR UPDATE` inside the transaction
/// it borrows: until that transaction ends, every other writer of the row
/// waits, so the balance read here is still the balance when
/// [`debit`](Self::debit) writes.
pub struct LockedWallet<'t, 'c> {
    tx: &'t Transaction<'c>,
    snapshot: Snapshot,
}

/// Locks wallet `id` in `tx` (`SELECT balance, fence ... FOR UPDATE`) and
/// returns what it read. Do the work, then [`LockedWallet::debit`], then
/// commit `tx`. When one transaction locks several wallets, lock them in a
/// consistent order (by id) to avoid deadlocks.
///
/// # Errors
/// [`Error::WalletNotFound`], [`Error::TableMissing`], connection errors.
///
/// # Cancel safety
/// Cancel safe: the row lock belongs to `tx` and ends with it.
pub async fn lock_for_update<'t, 'c>(
    tx: &'t Transaction<'c>,
    id: i64,
) -> Result<LockedWallet<'t, 'c>> {
    let row = tx
        .query_opt(
            "SELECT balance, fence FROM wallets WHERE id = $1 FOR UPDATE",
            &[&id],
        )
        .await
        .map_err(Error::from_pg)?
        .ok_or(Error::WalletNotFound { id })?;
    Ok(LockedWallet {
        tx,
        snapshot: Snapshot {
            id,
            balance: row.try_get(0).map_err(Error::from_pg)?,
            fence: row.try_get(1).map_err(Error::from_pg)?,
        },
    })
}

impl std::fmt::Debug for LockedWallet<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockedWallet")
            .field("snapshot", &self.snapshot)
            .finish_non_exhaustive()
    }
}

impl LockedWallet<'_, '_> {
    /// What was read under the lock.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Debits `amount` if the locked balance covers it, and inserts the
    /// ledger row, in the locking transaction. Nothing is durable until the
    /// caller commits it.
    ///
    /// # Errors
    /// [`Error::InvalidAmount`] before any I/O; connection errors.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is committed until the caller commits.
    pub async fn debit(self, amount: i64) -> Result<Outcome> {
        check_amount(amount)?;
        let balance = self.snapshot.balance;
        if balance < amount {
            return Ok(Outcome::InsufficientFunds { balance });
        }
        self.tx
            .execute(
                "WITH debit AS (
                     UPDATE wallets SET balance = balance - $2 WHERE id = $1 RETURNING id)
                 INSERT INTO wallet_ledger (wallet_id, amount) SELECT id, $2 FROM debit",
                &[&self.snapshot.id, &amount],
            )
            .await
            .map_err(Error::from_pg)?;
        Ok(Outcome::Applied {
            balance: balance - amount,
        })
    }
}

/// Read-modify-write of wallet `id` under `SELECT ... FOR UPDATE` in one
/// transaction (a savepoint when `client` is already a transaction): lock,
/// check the balance, debit, insert the ledger row, commit.
///
/// Correct on its own, whatever happens to any Redis lock. Like
/// [`debit_conditional`] it does not advance the fence.
///
/// # Errors
/// As [`debit_conditional`].
///
/// # Cancel safety
/// Cancel safe: dropped before the commit, the transaction rolls back.
pub async fn debit_for_update<C: GenericClient>(
    client: &mut C,
    id: i64,
    amount: i64,
) -> Result<Outcome> {
    check_amount(amount)?;
    let tx = client.transaction().await.map_err(Error::from_pg)?;
    let outcome = lock_for_update(&tx, id).await?.debit(amount).await?;
    tx.commit().await.map_err(Error::from_pg)?;
    Ok(outcome)
}

/// The figures a balance check needs: the row and its ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Audit {
    /// The current balance.
    pub balance: i64,
    /// The current fence.
    pub fence: i64,
    /// The sum of the ledger's debits for this wallet.
    pub ledger_sum: i64,
    /// How many debits the ledger holds for this wallet.
    pub ledger_count: u64,
}

impl Audit {
    /// True when the balance is what `initial` minus the ledger says, and
    /// not negative: no debit was lost or duplicated between the two.
    pub fn balances(&self, initial: i64) -> bool {
        self.balance >= 0 && initial.checked_sub(self.ledger_sum) == Some(self.balance)
    }
}

/// Reads wallet `id`'s balance, fence and ledger totals in one statement
/// (one snapshot).
///
/// # Errors
/// [`Error::WalletNotFound`], [`Error::TableMissing`], connection errors.
///
/// # Cancel safety
/// Cancel safe (a read).
pub async fn audit<C: GenericClient>(client: &C, id: i64) -> Result<Audit> {
    let row = client
        .query_opt(
            "SELECT w.balance, w.fence,
                    COALESCE(sum(l.amount), 0)::bigint, count(l.id)
               FROM wallets w LEFT JOIN wallet_ledger l ON l.wallet_id = w.id
              WHERE w.id = $1
              GROUP BY w.id",
            &[&id],
        )
        .await
        .map_err(Error::from_pg)?
        .ok_or(Error::WalletNotFound { id })?;
    let count: i64 = row.try_get(3).map_err(Error::from_pg)?;
    Ok(Audit {
        balance: row.try_get(0).map_err(Error::from_pg)?,
        fence: row.try_get(1).map_err(Error::from_pg)?,
        ledger_sum: row.try_get(2).map_err(Error::from_pg)?,
        ledger_count: u64::try_from(count).unwrap_or_default(),
    })
}

fn check_amount(amount: i64) -> Result<()> {
    if amount <= 0 {
        return Err(Error::InvalidAmount { amount });
    }
    Ok(())
}
