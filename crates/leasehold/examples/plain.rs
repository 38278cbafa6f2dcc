//! A lock in ten lines: one process at a time runs the report.

use std::time::Duration;

use leasehold::{Lessor, Locker};

/// One process at a time runs the nightly report.
pub async fn report(redis_url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let locker = Locker::connect(&leasehold::client(redis_url)?).await?;
    let lease = locker
        .acquire("lock:nightly-report", Duration::from_secs(30))
        .await?;
    // ... the report: nobody else holds the lock while the lease lasts ...
    lease.release().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    report(&std::env::var("REDIS_URL").unwrap_or("redis://127.0.0.1/".into())).await
}
