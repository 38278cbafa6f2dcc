//! Waiting for replicas after an acquire: `WAIT numreplicas timeout`.
//!
//! # What WAIT buys, and what it does not
//!
//! Redis replicates asynchronously: a primary acknowledges `SET NX` before
//! any replica has it. If the primary dies in that window and a replica is
//! promoted, the lock is gone and a second client can take it: two holders
//! at once (the Redis docs' "SAFETY VIOLATION"). With
//! [`AcquireOptions::wait_replicas`], the acquire sends `WAIT` after it wins
//! and gives the lock back unless enough replicas acknowledged it.
//!
//! That **narrows the window, it does not make Redis strongly consistent**:
//!
//! - a replica that acknowledged the write holds it in memory only; if it
//!   restarts without `appendfsync always`, the write is gone;
//! - a failover (Sentinel, Cluster, or an operator) may promote a replica
//!   that did *not* acknowledge (WAIT counts acknowledgements, it does not
//!   steer the election);
//! - the write has already been applied on the primary when WAIT reports a
//!   shortfall, and other clients may have seen it.
//!
//! So a lock taken with WAIT is still an efficiency lock. What keeps the
//! balance right across a failover is the database's check (fencing token
//! and check-and-set, see `leasehold-pg`).
//!
//! `WAIT` runs on the locker's connection, so it waits for every write that
//! connection sent before it, the acquire included. Redis blocks the
//! connection while WAIT waits: on a shared multiplexed connection, other
//! requests queue behind it for up to the WAIT timeout. On Redis Cluster,
//! redis-rs sends `WAIT` to every primary and keeps the smallest count.

use tokio::time::Instant;

use std::time::Duration;

use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::options::AcquireOptions;

/// After an acquire won: the lease, once `opts`' replicas acknowledged it;
/// otherwise the lease is released (token-checked) and the result is
/// [`Error::NotReplicated`]. WAIT's timeout is capped by `deadline`, and the
/// request by `deadline` plus the command timeout.
///
/// Called with the lease already built, so that dropping the future mid-WAIT
/// releases the lock (the lease's `Drop`).
///
/// `wait(key, replicas, timeout)` is the service's `WAIT`: how many
/// replicas acknowledged.
pub(crate) async fn confirm<W, Fut>(
    lease: Lease,
    opts: &AcquireOptions,
    deadline: Instant,
    wait_for: W,
) -> Result<Lease>
where
    W: FnOnce(String, u32, Duration) -> Fut,
    Fut: Future<Output = Result<u64>>,
{
    let Some(wait) = opts.wait_replicas else {
        return Ok(lease);
    };
    let timeout = wait
        .timeout
        .min(deadline.saturating_duration_since(Instant::now()));
    let acked = match wait_for(lease.key().to_owned(), wait.replicas, timeout).await {
        Ok(acked) if acked >= u64::from(wait.replicas) => return Ok(lease),
        Ok(acked) => acked,
        Err(err) => {
            give_back(lease).await;
            return Err(err);
        }
    };
    let key = lease.key().to_owned();
    give_back(lease).await;
    Err(Error::NotReplicated {
        key,
        acked: u32::try_from(acked).unwrap_or(u32::MAX),
        wanted: wait.replicas,
    })
}

async fn give_back(lease: Lease) {
    let key = lease.key().to_owned();
    if let Err(err) = lease.release().await {
        tracing::warn!(key, error = %err, "could not release an unreplicated lease; the ttl will end it");
    }
}
