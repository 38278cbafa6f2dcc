//! One leader at a time: the scheduler runs wherever this process leads.

use std::time::Duration;

use leasehold::{CancellationToken, Election, HandoffLocker};

/// Runs the scheduler's work whenever this process leads, until `shutdown`.
pub async fn scheduler(
    redis: &leasehold::redis::Client,
    shutdown: &CancellationToken,
) -> leasehold::Result<()> {
    let locker = HandoffLocker::connect(redis).await?;
    let election = Election::builder(locker, "scheduler")
        .candidate("worker-1")
        .ttl(Duration::from_secs(5))
        .build()?;
    // Campaigns, runs the work under each term (stopped if the term is
    // lost), campaigns again; on shutdown it resigns, and the next leader
    // takes over at once. Each write of the work: a transaction with
    // `leasehold_pg::guard(&tx, term.lease())` first.
    let served = election
        .serve(shutdown, async |term| {
            println!("leading, term {}", term.fence().get());
            std::future::pending::<()>().await
        })
        .await?;
    println!("{} terms, {} lost", served.terms, served.lost);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or("redis://127.0.0.1/".into());
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    scheduler(&leasehold::client(&url)?, &shutdown).await?;
    Ok(())
}
