//! Any invariant, not a balance: a job runner counts the jobs it ran per
//! queue, and the invariant is that the counter equals the jobs the runner
//! reported done. The check-and-set on the fence keeps it right under
//! early expiry of the lock keys; `Writes::check_counter` states the
//! invariant (committed jobs, give or take those whose outcome is
//! unknown). Run it with `cargo run -p leasehold-chaos --example job_counter`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::Locker;
use leasehold_chaos::{Call, Fault, Harness, Lab, LabOptions, Lock, Outcome, Writes};

/// Per queue: jobs done and the highest fence that counted one.
type Counters = HashMap<String, (i64, u64)>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lab = tokio::task::spawn_blocking(|| Lab::start(&LabOptions::default())).await??;
    let client = lab.client()?;
    let lock = Lock::new(Locker::connect(&client).await?, true);

    let queues = ["queue:mail", "queue:invoices"];
    let counters: Arc<Mutex<Counters>> = Arc::default();
    let state = counters.clone();
    let write = async move |call: Call<'_>| {
        let seen = state
            .lock()
            .expect("counters")
            .get(call.resource)
            .copied()
            .unwrap_or_default();
        tokio::time::sleep(Duration::from_millis(1)).await; // the job runs
        call.pause_point().await;
        let token = call.fence().map_or(0, |f| f.get());
        let mut counters = state.lock().expect("counters");
        let now = counters.entry(call.resource.to_owned()).or_default();
        if *now != seen || token <= now.1 {
            return Outcome::Refused; // a newer holder counted meanwhile
        }
        *now = (seen.0 + 1, token);
        Outcome::Committed
    };
    let check = async |writes: &Writes| {
        let counters = counters.lock().expect("counters");
        queues
            .iter()
            .map(|q| writes.check_counter(q, 0, counters.get(*q).map_or(0, |c| c.0)))
            .collect()
    };

    let report = Harness::new("job-counter")
        .callers(6)
        .ttl(Duration::from_millis(20))
        .duration(Duration::from_secs(3))
        .fault(Fault::EarlyExpiry)
        .resources(queues.iter().map(|q| ((*q).to_owned(), 0)).collect())
        .run(&lab, &lock, write, check)
        .await?;
    println!("{}", report.summary());
    if !report.holds() {
        std::process::exit(1);
    }
    Ok(())
}
