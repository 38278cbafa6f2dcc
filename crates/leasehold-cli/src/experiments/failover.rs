//! The tutorial's safety section: replication is asynchronous, so a failover
//! can hand the same lock to two holders. The database check keeps the
//! balance right anyway; `WAIT` refuses the lock that would have been lost.
//!
//! Always runs on its own throwaway primary and replica: it kills the
//! primary.

use leasehold::Lessor;
use std::time::Duration;

use anyhow::Context;
use leasehold::{AcquireOptions, Error, FencedKeys, FencingToken, Lease, Locker};
use leasehold_pg::Snapshot;
use leasehold_testkit::{RedisOptions, RedisServer};
use redis::AsyncCommands;
use serde_json::Value;
use tokio::time::Instant;

use crate::cli::FailoverArgs;
use crate::env::Database;
use crate::ledger::{self, RESOURCE, WALLET_ID, WriteCheck};
use crate::progress::note;
use crate::report::Report;

const INITIAL: i64 = 100;
const AMOUNT: i64 = 10;
/// Long enough that A's lease is plainly still valid when B takes the lock:
/// the double grant is the failover's doing, not an expiry.
const TTL: Duration = Duration::from_secs(10);
/// How long A's acquire waits for its replica with --wait-replicas.
const REPLICA_WAIT: Duration = Duration::from_millis(100);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The first full sync; the primary skips the diskless-sync delay.
const SYNC_TIMEOUT: Duration = Duration::from_secs(8);

/// A primary and its replica, both throwaway.
fn start_pair() -> anyhow::Result<(RedisServer, RedisServer)> {
    let primary =
        RedisServer::start_with(RedisOptions::default().args(["--repl-diskless-sync-delay", "0"]))
            .context("starting the throwaway primary")?;
    let replica =
        RedisServer::start_with(RedisOptions::default().replica_of(primary.host(), primary.port()))
            .context("starting the throwaway replica")?;
    Ok((primary, replica))
}

/// A locker on `server`. Its connection sends the experiment's own
/// commands too, so the locker's `WAIT` covers them.
async fn locker(server: &RedisServer, what: &str) -> anyhow::Result<Locker> {
    let client = redis::Client::open(server.url())?;
    Locker::builder()
        .command_timeout(COMMAND_TIMEOUT)
        .connect(&client)
        .await
        .with_context(|| format!("connecting to the {what}"))
}

/// A holder that got the lock and read the wallet.
struct Holder {
    lease: Lease,
    fence: FencingToken,
    read: Snapshot,
}

pub(crate) async fn run(db: &Database, args: &FailoverArgs) -> anyhow::Result<Report> {
    let pool = db.postgres().await?;
    let db = crate::env::pg_connection(pool).await?;
    leasehold_pg::reset_wallet(&**db, WALLET_ID, INITIAL).await?;
    let check = if args.unfenced {
        WriteCheck::Unchecked
    } else {
        WriteCheck::CheckAndSet
    };
    let (mut primary, replica) = tokio::task::spawn_blocking(start_pair)
        .await
        .context("starting the throwaway servers")??;
    note!(
        "leasehold: started a throwaway primary (pid {}) and replica (pid {}) for the failover",
        primary.pid(),
        replica.pid()
    );
    let keys = FencedKeys::for_resource(RESOURCE)?;
    let a_locker = locker(&primary, "throwaway primary").await?;
    let mut conn = a_locker.connection().clone();
    let () = conn.del(keys.lock()).await.context("clearing the lock")?;
    let acked: u64 = redis::cmd("WAIT")
        .arg(1)
        .arg(u64::try_from(SYNC_TIMEOUT.as_millis()).unwrap_or(u64::MAX))
        .query_async(&mut conn)
        .await
        .context("waiting for the replica to sync")?;
    anyhow::ensure!(
        acked == 1,
        "the throwaway replica did not sync within {SYNC_TIMEOUT:?}"
    );

    let start = Instant::now();
    let mut notes = vec![format!(
        "primary :{} and replica :{}; replica in sync (WAIT: 1 replica acked)",
        primary.port(),
        replica.port()
    )];
    // A partition between primary and replica: the replica is stopped and
    // its replication link cut, so nothing written from now on reaches it
    // (a stopped replica alone would still find A's writes in its socket
    // buffer when it resumes).
    replica.pause()?;
    let cut: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut conn)
        .await
        .context("cutting the replication link")?;
    anyhow::ensure!(cut == 1, "expected one replica link to cut, found {cut}");
    notes.push("replica partitioned from the primary (paused, link cut)".to_owned());

    let mut opts = AcquireOptions::new().wait(COMMAND_TIMEOUT);
    if args.wait_replicas > 0 {
        opts = opts.wait_replicas(args.wait_replicas, REPLICA_WAIT);
    }
    let mut not_replicated = false;
    let a = match a_locker.acquire_with(&keys, TTL, &opts).await {
        Ok(lease) => {
            let fence = lease.fence().context("a fenced lease has a fence")?;
            let read = leasehold_pg::read_wallet(&**db, WALLET_ID).await?;
            notes.push(format!(
                "A: got {} on the primary, fence {fence}, read balance {} (row fence {}); the lock never reached the replica",
                keys.lock(),
                read.balance(),
                read.fence()
            ));
            Some(Holder { lease, fence, read })
        }
        Err(err @ Error::NotReplicated { .. }) => {
            not_replicated = true;
            notes.push(format!(
                "A: acquire REFUSED: {err}; the lock was given back, A holds nothing and writes nothing"
            ));
            None
        }
        Err(err) => return Err(err).context("A acquiring the lock on the primary"),
    };

    tokio::task::spawn_blocking(move || primary.kill())
        .await
        .context("killing the primary")??;
    notes.push("primary killed".to_owned());
    replica.resume()?;
    let b_locker = locker(&replica, "promoted replica").await?;
    let mut promoted = b_locker.connection().clone();
    let () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut promoted)
        .await
        .context("promoting the replica")?;
    notes.push("replica promoted (REPLICAOF NO ONE)".to_owned());

    let b_lease = b_locker
        .acquire_with(&keys, TTL, &AcquireOptions::new().wait(COMMAND_TIMEOUT))
        .await
        .context("B acquiring the lock on the promoted replica")?;
    let b_fence = b_lease.fence().context("a fenced lease has a fence")?;
    let b_read = leasehold_pg::read_wallet(&**db, WALLET_ID).await?;
    notes.push(format!(
        "B: got {} on the promoted replica, fence {b_fence}, read balance {}",
        keys.lock(),
        b_read.balance()
    ));
    let a_holds = a.as_ref().is_some_and(|a| !a.lease.remaining().is_zero());
    let holders = 1 + u64::from(a_holds);
    if let Some(a) = a.as_ref().filter(|_| a_holds) {
        notes.push(format!(
            "two holders of {}: A (fence {}, on the dead primary) and B (fence {b_fence}, on the promoted replica): the Redis docs' SAFETY VIOLATION",
            keys.lock(),
            a.fence
        ));
        if b_fence > a.fence {
            notes.push(
                "B's fence is above A's although the replica never saw A's: its counter restarted at its clock"
                    .to_owned(),
            );
        }
    }

    let (mut accepted, mut refused) = (0u64, 0u64);
    let mut spend = async |name: &str, read: &Snapshot, fence: FencingToken| {
        let outcome = ledger::debit(&**db, read, AMOUNT, fence, check).await?;
        anyhow::Ok(
            if let leasehold_pg::Outcome::Applied { balance } = outcome {
                accepted += 1;
                format!("{name}: wrote balance {balance} with fence {fence}")
            } else if ledger::refused(&outcome) {
                refused += 1;
                format!("{name}: write with fence {fence} REJECTED by the database")
            } else {
                format!("{name}: write with fence {fence} refused: {outcome:?}")
            },
        )
    };
    notes.push(spend("B", &b_read, b_fence).await?);
    let fence_a = a.as_ref().map(|a| a.fence.get());
    if let Some(a) = a {
        notes.push("A: wakes up and carries on with its debit".to_owned());
        notes.push(spend("A", &a.read, a.fence).await?);
        if let Err(err) = a.lease.release().await {
            notes.push(format!("A: release failed ({err}): its primary is dead"));
        }
    }
    // B finished well inside its lease; a failed release is only noise here.
    let _ = b_lease.release().await;
    drop(replica);
    let elapsed = start.elapsed();

    let audit = leasehold_pg::audit(&**db, WALLET_ID).await?;
    let lost_update = args.unfenced && accepted > 1;
    notes.push(format!(
        "final: balance={} ledger rows={} ({})",
        audit.balance,
        audit.ledger_count,
        if lost_update {
            "both debits landed on balance 100: a lost update"
        } else if refused > 0 {
            "the database check kept the balance right despite two holders"
        } else {
            "one holder, one debit"
        }
    ));
    let mut report = ledger::check("failover", INITIAL, AMOUNT, accepted, &audit, elapsed)
        .extra("holders", holders)
        .extra("refused_by_database", refused)
        .extra("not_replicated", not_replicated)
        .extra("fence_a", fence_a.map_or(Value::Null, Value::from))
        .extra("fence_b", b_fence.get())
        .extra("fenced", !args.unfenced)
        .extra("wait_replicas", args.wait_replicas);
    for line in notes {
        report = report.note(line);
    }
    Ok(report)
}
