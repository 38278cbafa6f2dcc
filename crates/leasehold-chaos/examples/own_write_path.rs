//! Points the chaos harness at your own write path: here an in-memory
//! account with a check-and-set on the fencing token, with the watchdog
//! on, a 1 ms TTL (the tutorial's last advice), under holder pauses. The
//! harness first runs its negative control (the same path without the
//! check) and says whether this run could have caught a lost update. Run
//! it with `cargo run -p leasehold-chaos --example own_write_path`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::Locker;
use leasehold_chaos::{Call, Fault, Harness, Kind, Lab, LabOptions, Lock, Outcome, Writes};

/// Your storage: a balance, the highest fence that wrote it, a ledger.
#[derive(Default)]
struct Account {
    balance: i64,
    fence: u64,
    ledger: Vec<i64>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lab = tokio::task::spawn_blocking(|| Lab::start(&LabOptions::default())).await??;
    let client = lab.client()?;
    let locker = Locker::builder()
        .command_timeout(Duration::from_millis(500))
        .connect(&client)
        .await?;
    let lock = Lock::new(locker, true);

    let account = Arc::new(Mutex::new(Account {
        balance: 1_000_000,
        ..Account::default()
    }));
    let state = account.clone();
    // Your write: read, (pause point), write only if no newer holder wrote
    // and nothing changed since the read; under the watchdog (`call.run`),
    // as `with_lock` runs it in your service.
    let write = async move |call: Call<'_>| {
        let work = async {
            let (balance, seen) = {
                let a = state.lock().expect("account");
                (a.balance, a.fence)
            };
            tokio::time::sleep(Duration::from_millis(1)).await; // the read's round trip
            call.pause_point().await; // after the read, before the write
            let token = call.fence().map_or(0, |f| f.get());
            let mut a = state.lock().expect("account");
            if a.fence != seen || token <= a.fence || a.balance != balance {
                return Outcome::Refused;
            }
            a.balance = balance - call.amount;
            a.fence = token;
            a.ledger.push(call.amount);
            Outcome::Committed
        };
        match call.run(work).await {
            Ok(outcome) => outcome,
            // Stopped before the write: nothing written.
            Err(stopped) => stopped.into(),
        }
    };
    // Your invariant: a balance and its ledger, checked by the harness.
    let check = async |_: &Writes| {
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
        .ttl(Duration::from_millis(1))
        .watchdog(true)
        .duration(Duration::from_secs(3))
        .fault(Fault::HolderPause)
        .run(&lab, &lock, write, check)
        .await?;
    std::fs::write("own_write_path.html", report.timeline_html())?;
    println!("{}", report.summary());
    if !report.holds() {
        std::process::exit(1);
    }
    Ok(())
}
