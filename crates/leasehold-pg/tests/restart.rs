//! PostgreSQL restarting under a service: every error a call meets while
//! the server stops, starts up and recovers is retryable, so a retry loop
//! built on `Error::is_retryable` rides out the restart, and nothing
//! committed is lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold::FencingToken;
use leasehold_pg::Guard;
use leasehold_testkit::PostgresServer;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(60);

/// One guarded write of `n` on a fresh connection (a service that
/// reconnects each time, so it also meets the server starting up).
async fn write(url: &str, n: i64) -> Result<(), leasehold_pg::Error> {
    let mut db = leasehold_pg::connect(url).await?;
    let holder = leasehold::HolderId::parse("abababababababababababababababab")
        .unwrap_or_else(|| unreachable!("a valid holder id"));
    let tx = db.transaction().await.map_err(leasehold_pg::Error::from)?;
    let token = FencingToken::new(u64::try_from(n).unwrap_or(1));
    if leasehold_pg::guard_token(&tx, "restart:r", token, &holder).await? != Guard::Accepted {
        return Ok(());
    }
    tx.execute(
        "INSERT INTO restart_log (n) VALUES ($1) ON CONFLICT DO NOTHING",
        &[&n],
    )
    .await
    .map_err(leasehold_pg::Error::from)?;
    tx.commit().await.map_err(leasehold_pg::Error::from)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_loop_on_is_retryable_rides_out_a_postgres_restart() -> TestResult {
    let pg = Arc::new(tokio::task::spawn_blocking(PostgresServer::start).await??);
    let url = pg.url();
    let mut db = leasehold_pg::connect(&url).await?;
    leasehold_pg::setup(&mut db).await?;
    db.batch_execute("CREATE TABLE restart_log (n bigint PRIMARY KEY)")
        .await?;
    drop(db);

    let restarted = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (url, restarted) = (url.clone(), restarted.clone());
        async move {
            let mut n = 1;
            let mut met = Vec::new();
            // Write until some writes failed during the restart and one
            // landed after it.
            loop {
                match write(&url, n).await {
                    Ok(()) => {
                        n += 1;
                        if restarted.load(Ordering::SeqCst) && !met.is_empty() {
                            return Ok::<_, String>((n - 1, met));
                        }
                    }
                    Err(err) if err.is_retryable() => {
                        met.push(err.to_string());
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(err) => return Err(format!("not retryable: {err:?}")),
                }
            }
        }
    });
    // Some writes land first, then the server restarts under the writer.
    let check = leasehold_pg::connect(&url).await?;
    while check
        .query_one("SELECT count(*) FROM restart_log", &[])
        .await?
        .get::<_, i64>(0)
        < 5
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(check);
    let server = pg.clone();
    tokio::task::spawn_blocking(move || {
        server.stop()?;
        server.start_again()
    })
    .await??;
    restarted.store(true, Ordering::SeqCst);
    let (written, met) = tokio::time::timeout(HUNG, writer).await???;
    assert!(!met.is_empty(), "the restart was never met");
    eprintln!("met during the restart: {met:?}");
    let check = leasehold_pg::connect(&url).await?;
    let logged: i64 = check
        .query_one("SELECT count(*) FROM restart_log", &[])
        .await?
        .get(0);
    assert_eq!(logged, written, "errors met: {met:?}");
    Ok(())
}
