//! Step 1: reproduce the lost update with no lock at all.

use tokio::time::Instant;

use crate::cli::SpendArgs;
use crate::env::Env;
use crate::report::Report;
use crate::wallet::{Wallet, hammer};

pub(crate) async fn run(env: &Env, args: &SpendArgs) -> anyhow::Result<Report> {
    let wallet = Wallet::new(env.redis.clone());
    wallet.reset(args.initial).await?;
    let start = Instant::now();
    let (amount, work) = (args.amount, args.work);
    let spender = wallet.clone();
    let tally = hammer(args.callers, move |_| {
        let wallet = spender.clone();
        async move { wallet.spend(amount, work).await }
    })
    .await;
    let elapsed = start.elapsed();
    let balance = wallet.balance().await?;
    Ok(Report::check(
        "race",
        args.initial,
        args.amount,
        tally.accepted,
        balance,
        elapsed,
    )
    .errors(&tally))
}
