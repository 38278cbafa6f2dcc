//! The demo's application: one wallet balance and a crowd of spenders.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use leasehold::{Connection, RedisConnection};
use redis::AsyncCommands;
use tokio::sync::Barrier;

/// The tutorial's balance key.
pub(crate) const BALANCE_KEY: &str = "wallet:42:balance";

/// A balance kept in Redis (one server's, or a cluster's), spent the naive
/// way.
#[derive(Clone)]
pub(crate) struct Wallet<C = Connection> {
    conn: C,
    key: &'static str,
}

impl<C: RedisConnection> Wallet<C> {
    pub(crate) fn new(conn: C) -> Wallet<C> {
        Wallet {
            conn,
            key: BALANCE_KEY,
        }
    }

    pub(crate) async fn reset(&self, initial: i64) -> anyhow::Result<()> {
        let mut conn = self.conn.clone();
        let () = conn
            .set(self.key, initial)
            .await
            .with_context(|| format!("setting the balance {}", self.key))?;
        Ok(())
    }

    pub(crate) async fn balance(&self) -> anyhow::Result<i64> {
        let mut conn = self.conn.clone();
        let balance: Option<i64> = conn
            .get(self.key)
            .await
            .with_context(|| format!("reading the balance {}", self.key))?;
        balance.with_context(|| format!("the balance key {} is missing", self.key))
    }

    /// A read-modify-write: read the balance, check it, wait `work`, write it
    /// back. Its decision rests on a value that can change before the write.
    pub(crate) async fn spend(&self, amount: i64, work: Duration) -> anyhow::Result<bool> {
        self.spend_under(None, amount, work).await
    }

    /// [`spend`](Self::spend) inside `lease.run`: its write is shielded
    /// (`Lease::shield`), so a loss the watchdog finds while the write is
    /// in flight does not drop a write that lands: the spend is counted
    /// whenever it wrote, and stopped only before its write.
    pub(crate) async fn spend_under(
        &self,
        lease: Option<&leasehold::Lease>,
        amount: i64,
        work: Duration,
    ) -> anyhow::Result<bool> {
        let balance = self.balance().await?;
        if balance < amount {
            return Ok(false);
        }
        tokio::time::sleep(work).await;
        let mut conn = self.conn.clone();
        let write = conn.set::<_, _, ()>(self.key, balance - amount);
        match lease {
            Some(lease) => lease.shield(write).await,
            None => write.await,
        }
        .with_context(|| format!("writing the balance {}", self.key))?;
        Ok(true)
    }
}

/// What a crowd of callers did.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) accepted: u64,
    pub(crate) errors: u64,
    /// The first few error messages, for the operator.
    pub(crate) first_errors: Vec<String>,
}

/// Starts `n` tasks, releases them at the same moment, and counts how many
/// calls of `spend` reported success.
pub(crate) async fn hammer<F, Fut>(n: u32, spend: F) -> Tally
where
    F: Fn(u32) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<bool>> + Send,
{
    let spend = Arc::new(spend);
    let start = Arc::new(Barrier::new(usize::try_from(n).unwrap_or(usize::MAX)));
    let accepted = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..n {
        let (spend, start, accepted) = (spend.clone(), start.clone(), accepted.clone());
        tasks.spawn(async move {
            start.wait().await;
            let outcome = spend(caller).await;
            if matches!(outcome, Ok(true)) {
                accepted.fetch_add(1, Ordering::Relaxed);
            }
            outcome.map(|_| ())
        });
    }
    let mut tally = Tally::default();
    while let Some(joined) = tasks.join_next().await {
        let failure = match joined {
            Ok(Ok(())) => None,
            Ok(Err(err)) => Some(crate::redact::redact_text(&crate::cause::describe(&err))),
            Err(err) => Some(format!("caller task failed: {err}")),
        };
        if let Some(message) = failure {
            tally.errors += 1;
            if tally.first_errors.len() < 3 {
                tally.first_errors.push(message);
            }
        }
    }
    tally.accepted = accepted.load(Ordering::Relaxed);
    tally
}
