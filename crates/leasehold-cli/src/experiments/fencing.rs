//! Step 5: a holder paused past its lease writes late; the fencing token
//! lets PostgreSQL refuse it.

use leasehold::Lessor;
use std::time::Duration;

use anyhow::Context;
use leasehold::{FencedKeys, FencingToken, Lease};
use leasehold_pg::{Outcome, Snapshot};
use redis::AsyncCommands;
use tokio::time::Instant;

use crate::cli::FencingArgs;
use crate::env::{Database, Env};
use crate::ledger::{self, RESOURCE, WALLET_ID, WriteCheck};
use crate::report::Report;

/// The tutorial's figures: a 100 ms lease, a 250 ms pause. (Its tokens,
/// 33 and 34, are this server's clock in microseconds here: a token is
/// `max(counter + 1, clock)`, see `leasehold::FencingToken`.)
const TTL: Duration = Duration::from_millis(100);
const PAUSE: Duration = Duration::from_millis(250);
const INITIAL: i64 = 100;
const AMOUNT: i64 = 10;

pub(crate) async fn run(env: &Env, db: &Database, args: &FencingArgs) -> anyhow::Result<Report> {
    let pool = db.postgres().await?;
    let db = crate::env::pg_connection(pool).await?;
    leasehold_pg::reset_wallet(&**db, WALLET_ID, INITIAL).await?;
    let keys = FencedKeys::for_resource(RESOURCE)?;
    let mut conn = env.redis.clone();
    let () = conn
        .del(keys.lock())
        .await
        .context("clearing the lock key")?;

    let start = Instant::now();
    let mut lines = Vec::new();
    let mut accepted = 0u64;
    let mut rejected = 0u64;
    let mut spend = async |name: &str, lease: &Lease, read: &Snapshot| -> anyhow::Result<()> {
        let fence = lease.fence().context("a fenced lease has a fence")?;
        let check = if args.unfenced {
            WriteCheck::Unchecked
        } else {
            WriteCheck::Fenced
        };
        let landed = match ledger::debit(&**db, read, AMOUNT, fence, check).await? {
            Outcome::Applied { balance } => Some(balance),
            _ => None,
        };
        match landed {
            Some(balance) => {
                accepted += 1;
                lines.push(format!(
                    "{name}: wrote balance {balance} with fence {fence}"
                ));
            }
            None => {
                rejected += 1;
                lines.push(format!("{name}: write with fence {fence} REJECTED"));
            }
        }
        Ok(())
    };

    let a = env.locker.acquire(&keys, TTL).await?;
    let a_read = leasehold_pg::read_wallet(&**db, WALLET_ID).await?;
    let a_fence = a.fence().unwrap_or(FencingToken::new(0));
    let mut intro = vec![
        format!(
            "A: got the lock, fence {a_fence}, read balance {}",
            a_read.balance()
        ),
        format!(
            "A: paused for {} (GC pause, slow network, stopped VM)",
            humantime::format_duration(PAUSE)
        ),
    ];
    // The pause is the experiment: A's lease runs out while it sleeps.
    tokio::time::sleep(PAUSE).await;

    let b = env.locker.acquire(&keys, TTL).await?;
    let b_read = leasehold_pg::read_wallet(&**db, WALLET_ID).await?;
    let b_fence = b.fence().unwrap_or(FencingToken::new(0));
    intro.push(format!(
        "B: got the lock, fence {b_fence}, read balance {}",
        b_read.balance()
    ));
    spend("B", &b, &b_read).await?;
    // B finished well inside its lease; a failed release is only noise here.
    let _ = b.release().await;

    let mut wake = vec!["A: wakes up and carries on".to_owned()];
    spend("A", &a, &a_read).await?;
    let mut release = Vec::new();
    if let Err(err) = a.release().await {
        release.push(format!("A: release: {err}"));
    }
    let elapsed = start.elapsed();

    let audit = leasehold_pg::audit(&**db, WALLET_ID).await?;
    let mut notes = intro;
    let (b_line, a_line) = (lines.remove(0), lines.remove(0));
    notes.push(b_line);
    notes.append(&mut wake);
    notes.push(a_line);
    notes.append(&mut release);
    notes.push(format!(
        "final: balance={} fence={} (two spends of {AMOUNT} were attempted)",
        audit.balance, audit.fence
    ));
    let mut report = ledger::check("fencing", INITIAL, AMOUNT, accepted, &audit, elapsed)
        .extra("fenced", !args.unfenced)
        .extra("rejected", rejected);
    for line in notes {
        report = report.note(line);
    }
    Ok(report)
}
