//! The PostgreSQL wallet of Steps 5 and 6, and its check against the ledger.

use std::time::Duration;

use anyhow::Context;
use leasehold_pg::tokio_postgres::GenericClient;
use leasehold_pg::{Audit, Outcome, Snapshot};

use crate::report::Report;

/// The tutorial's wallet.
pub(crate) const WALLET_ID: i64 = 42;

/// The resource the fenced lock is named after: `lock:{wallet:42}` and
/// `fence:{wallet:42}`.
pub(crate) const RESOURCE: &str = "wallet:42";

/// The tutorial's check, plus the ledger's: OK only if
/// balance == initial - amount * accepted == initial - ledger sum,
/// the ledger holds one row per acknowledged debit, and balance >= 0.
pub(crate) fn check(
    experiment: &'static str,
    initial: i64,
    amount: i64,
    accepted: u64,
    audit: &Audit,
    elapsed: Duration,
) -> Report {
    Report::check(
        experiment,
        initial,
        amount,
        accepted,
        audit.balance,
        elapsed,
    )
    .extra("fence", audit.fence)
    .extra("ledger_sum", audit.ledger_sum)
    .extra("ledger_count", audit.ledger_count)
    .require(audit.balances(initial))
    .require(audit.ledger_count == accepted)
}

/// The negative control's write: `read.balance - amount` with no condition
/// at all (and `fence = token` when given), plus its ledger row. This is
/// the lost update the library's helpers exist to prevent.
pub(crate) async fn debit_unchecked<C: GenericClient>(
    client: &C,
    read: &Snapshot,
    amount: i64,
    token: Option<i64>,
) -> anyhow::Result<i64> {
    let balance = read.balance() - amount;
    client
        .execute(
            "WITH debit AS (
                 UPDATE wallets SET balance = $2, fence = COALESCE($3, fence)
                  WHERE id = $1 RETURNING id)
             INSERT INTO wallet_ledger (wallet_id, amount, fence)
             SELECT id, $4, $3 FROM debit",
            &[&read.id(), &balance, &token, &amount],
        )
        .await
        .map_err(leasehold_pg::Error::from)
        .context("writing the balance without a check")?;
    Ok(balance)
}

/// How a lease holder's debit is checked by the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteCheck {
    /// `fence < $token` (Step 5).
    Fenced,
    /// `fence < $token AND fence = $read` (Step 6's check-and-set).
    CheckAndSet,
    /// No check at all: the negative control.
    Unchecked,
}

/// A lease holder's debit of `amount` from what it `read`, carrying its
/// fencing token, checked as `check` says.
pub(crate) async fn debit<C: GenericClient>(
    client: &C,
    read: &Snapshot,
    amount: i64,
    fence: leasehold::FencingToken,
    check: WriteCheck,
) -> anyhow::Result<Outcome> {
    Ok(match check {
        WriteCheck::Fenced => leasehold_pg::debit_fenced(client, read, amount, fence).await?,
        WriteCheck::CheckAndSet => {
            leasehold_pg::debit_check_and_set(client, read, amount, fence).await?
        }
        WriteCheck::Unchecked => {
            let token = i64::try_from(fence.get()).context("token out of range")?;
            let balance = debit_unchecked(client, read, amount, Some(token)).await?;
            Outcome::Applied { balance }
        }
    })
}

/// True when the database refused the write because of its token or its
/// read (the lock failed and the check caught it), not for lack of funds.
pub(crate) fn refused(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::StaleToken { .. } | Outcome::StaleRead { .. }
    )
}

/// Step 6's write under a lease: read the wallet, stop if it cannot cover
/// `amount` (`None`), work for `work`, then debit with the lease's `fence`,
/// checked as `check` says.
pub(crate) async fn read_and_debit<C: GenericClient>(
    client: &C,
    amount: i64,
    work: Duration,
    fence: leasehold::FencingToken,
    check: WriteCheck,
) -> anyhow::Result<Option<Outcome>> {
    let read = leasehold_pg::read_wallet(client, WALLET_ID).await?;
    if read.balance() < amount {
        return Ok(None);
    }
    tokio::time::sleep(work).await;
    debit(client, &read, amount, fence, check).await.map(Some)
}
