//! The scheduler as a process: `REDIS_URL`, `DATABASE_URL`, `CANDIDATE`
//! (this process's name) and `SCHEDULE` (the schedule's name; slots every
//! 200 ms from the Unix epoch) from the environment. Run three; stop one
//! with Ctrl-C and the next leads at once.

use std::time::Duration;

use leasehold::HandoffLocker;
use scheduler::{Schedule, election, serve, setup};

fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (redis_url, db_url) = (var("REDIS_URL")?, var("DATABASE_URL")?);
    let candidate = var("CANDIDATE").unwrap_or_else(|_| format!("pid {}", std::process::id()));
    let schedule = Schedule {
        name: var("SCHEDULE").unwrap_or_else(|_| "payouts".to_owned()),
        epoch_ms: 0,
        period: Duration::from_millis(200),
    };
    setup(&mut leasehold_pg::connect(&db_url).await?).await?;
    let locker = HandoffLocker::connect(&leasehold::client(&redis_url)?).await?;
    let election = election(locker, &schedule.name, &candidate)?;
    let shutdown = leasehold::CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    serve(&election, &db_url, &schedule, &shutdown).await?;
    Ok(())
}
