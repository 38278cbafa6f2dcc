//! One leader at a time: the scheduler runs wherever this process leads.

use std::time::Duration;

use leasehold::{Election, HandoffLocker, TermOutcome};

/// Runs the scheduler's work whenever this process leads.
pub async fn scheduler(redis: &leasehold::redis::Client) -> leasehold::Result<()> {
    let locker = HandoffLocker::connect(redis).await?;
    let election = Election::builder(locker, "scheduler")
        .candidate("worker-1")
        .ttl(Duration::from_secs(5))
        .build()?;
    loop {
        // Campaigns, runs the work under the term (stopped if the term is
        // lost), then resigns. Each write of the work: a transaction with
        // `leasehold_pg::guard(&tx, term.lease())` first; on
        // `Guard::Refused`, `term.mark_superseded()` ends the term.
        let outcome = election.lead(async |term| term.fence()).await?;
        if let TermOutcome::Lost { cause, fence } = outcome {
            eprintln!("term {} lost: {cause}", fence.get());
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or("redis://127.0.0.1/".into());
    scheduler(&leasehold::client(&url)?).await?;
    Ok(())
}
