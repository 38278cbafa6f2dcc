//! A service's lock logic, tested in milliseconds with no server.

use std::time::Duration;

use leasehold::{AcquireOptions, Error, Lessor, MemoryLocker};

/// What one run of the nightly job did.
#[derive(Debug, PartialEq)]
pub enum Run {
    /// The job ran to its end under the lease.
    Done,
    /// Another instance holds the job.
    Skipped,
    /// The lease was lost mid-run, so the work was stopped.
    Stopped,
}

/// The service's function: runs the job unless another instance does.
pub async fn nightly(lock: &impl Lessor, work: impl AsyncFnOnce()) -> leasehold::Result<Run> {
    let opts = AcquireOptions::new().wait(Duration::from_millis(200));
    let ttl = Duration::from_secs(10);
    match lock
        .with_lock("job:nightly", ttl, &opts, async |_| work().await)
        .await
    {
        Ok(_) => Ok(Run::Done),
        Err(Error::NotAcquired { .. }) => Ok(Run::Skipped),
        Err(Error::LeaseLost { .. }) => Ok(Run::Stopped),
        Err(err) => Err(err),
    }
}

#[tokio::main]
async fn main() -> leasehold::Result<()> {
    let run = nightly(&MemoryLocker::new(), async || println!("working")).await?;
    println!("{run:?}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn skips_when_held_and_stops_when_the_lease_is_lost() -> leasehold::Result<()> {
        let lock = MemoryLocker::new();
        assert_eq!(nightly(&lock, async || {}).await?, Run::Done);

        // Another instance holds the job: this one skips it.
        let other = lock.acquire("job:nightly", Duration::from_secs(60)).await?;
        assert_eq!(nightly(&lock, async || {}).await?, Run::Skipped);
        other.release().await?;

        // The lease ends mid-run (a paused process, a failover): the work
        // is stopped at its next await.
        let work = async || {
            lock.expire("job:nightly");
            std::future::pending::<()>().await
        };
        assert_eq!(nightly(&lock, work).await?, Run::Stopped);
        Ok(())
    }
}
