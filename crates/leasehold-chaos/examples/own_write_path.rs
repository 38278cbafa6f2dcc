//! Points the chaos harness at your own write path: here an in-memory
//! account with a check-and-set on the fencing token, under DEL of the lock
//! key every 5 ms through its fault windows. Run it with
//! `cargo run -p leasehold-chaos --example own_write_path`.

use std::sync::Mutex;
use std::time::Duration;

use leasehold::{Locker, redis};
use leasehold_chaos::{Call, Fault, Harness, Kind, Lab, LabOptions, Lock, WriteOutcome, Written};

/// Your storage: a balance, the highest fence that wrote it, a ledger.
struct Account {
    balance: i64,
    fence: u64,
    ledger: Vec<i64>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lab = tokio::task::spawn_blocking(|| Lab::start(&LabOptions::default())).await??;
    let client = redis::Client::open(lab.redis_url())?;
    let locker = Locker::builder()
        .command_timeout(Duration::from_millis(500))
        .connect(&client)
        .await?;
    let lock = Lock::new(locker, true);

    let account = Mutex::new(Account {
        balance: 1_000_000,
        fence: 0,
        ledger: Vec::new(),
    });
    // Your write: read, (pause point), write only if no newer holder wrote
    // and nothing changed since the read.
    let write = async |call: Call<'_>| {
        let (balance, seen) = {
            let a = account.lock().expect("account");
            (a.balance, a.fence)
        };
        call.pause_point().await;
        let token = call.fence().map_or(0, |f| f.get());
        let mut a = account.lock().expect("account");
        if a.fence != seen || token <= a.fence {
            return Written::from(WriteOutcome::RefusedStale);
        }
        a.balance = balance - call.amount;
        a.fence = token;
        a.ledger.push(call.amount);
        Written::from(WriteOutcome::Accepted)
    };
    // Your invariant: the final state, as the checker reads it.
    let check = async || {
        let a = account.lock().expect("account");
        vec![Kind::Final {
            resource: "account:1".to_owned(),
            balance: a.balance,
            ledger_sum: a.ledger.iter().sum(),
            ledger_rows: a.ledger.len() as u64,
        }]
    };

    let report = Harness::new("my-account")
        .callers(8)
        // The tutorial's last advice: a 1 ms TTL, so leases fail all the time.
        .ttl(Duration::from_millis(1))
        .duration(Duration::from_secs(3))
        .fault(Fault::KeyLoss)
        .run(&lab, &lock, write, check)
        .await?;
    std::fs::write("own_write_path.html", report.timeline_html())?;
    println!(
        "{} writes accepted, {} refused as stale, {} double holders: {}",
        report.check.counts.writes.accepted,
        report.check.counts.writes.refused_stale,
        report.check.overlaps.len(),
        if report.holds() { "OK" } else { "BROKEN" }
    );
    Ok(())
}
