//! The runner's `setup` from many processes at once, as every replica of a
//! service runs it at start-up.

use std::time::Duration;

use leasehold_testkit::PostgresServer;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_is_safe_from_many_processes_at_once() -> TestResult {
    let pg = tokio::task::spawn_blocking(PostgresServer::start).await??;
    for round in 0..5 {
        let admin = leasehold_pg::connect(&pg.url()).await?;
        let name = format!("fresh{round}");
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await?;
        let url = pg.url().replace("/postgres", &format!("/{name}"));
        // Connected first, so the setups start together.
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(leasehold_pg::connect(&url).await?);
        }
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(clients.len()));
        let mut tasks = Vec::new();
        for mut db in clients {
            let start = start.clone();
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                job_runner::setup(&mut db).await
            }));
        }
        for task in tasks {
            let done = tokio::time::timeout(HUNG, task).await??;
            assert!(done.is_ok(), "round {round}: {done:?}");
        }
    }
    Ok(())
}
