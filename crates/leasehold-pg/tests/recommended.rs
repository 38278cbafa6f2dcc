//! The recommended path end to end: a fenced lease, the work under the
//! watchdog, the fence guard first in the work's transaction, the commit
//! shielded; against a real throwaway Redis and PostgreSQL, with Redis
//! killed or restarted under it. What the callers are told must match what
//! the database holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{AcquireOptions, Error as LockError, FencedKeys, Lease, Lessor, Locker};
use leasehold_pg::Guard;
use leasehold_pg::tokio_postgres::Client;
use leasehold_testkit::{PostgresServer, RedisServer};

mod common;
use common::server;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const MS: Duration = Duration::from_millis(1);
/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(60);

/// A database with the fence table and the user's own `job_state` table
/// (nothing of the tutorial's wallets).
async fn db(server: &PostgresServer) -> Result<Client, Box<dyn std::error::Error>> {
    let mut client = leasehold_pg::connect(&server.url()).await?;
    leasehold_pg::setup(&mut client).await?;
    client
        .batch_execute(
            "BEGIN;
             SELECT pg_advisory_xact_lock(4243);
             CREATE TABLE IF NOT EXISTS job_state (id text PRIMARY KEY, runs bigint NOT NULL);
             COMMIT;",
        )
        .await?;
    Ok(client)
}

async fn new_job(db: &Client, id: &str) -> TestResult {
    db.execute(
        "INSERT INTO job_state (id, runs) VALUES ($1, 0)
         ON CONFLICT (id) DO UPDATE SET runs = 0",
        &[&id],
    )
    .await?;
    Ok(())
}

async fn runs(db: &Client, id: &str) -> Result<i64, Box<dyn std::error::Error>> {
    Ok(db
        .query_one("SELECT runs FROM job_state WHERE id = $1", &[&id])
        .await?
        .get(0))
}

/// What one run of a job came to, as the work saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    /// The guard accepted, the work ran, the transaction committed.
    Committed,
    /// The guard refused (a newer token has written): nothing was done.
    Refused,
}

/// One run of job `id` the recommended way, inside the work: the guard
/// first in the transaction (so a stale token is refused before the
/// expensive part), then the work, then the write and a shielded commit.
async fn run_job(
    db: &mut Client,
    lease: &Lease,
    id: &str,
    work: Duration,
) -> Result<Job, leasehold_pg::Error> {
    let tx = db.transaction().await?;
    if let Guard::Refused { .. } = leasehold_pg::guard(&tx, lease).await? {
        tx.rollback().await?;
        return Ok(Job::Refused);
    }
    tokio::time::sleep(work).await; // the expensive part
    tx.execute("UPDATE job_state SET runs = runs + 1 WHERE id = $1", &[&id])
        .await?;
    lease.shield(tx.commit()).await?;
    Ok(Job::Committed)
}

/// `Lease::run` takes `&self`, so the work can hold the lease for the guard
/// while the watchdog keeps it past its TTL.
#[tokio::test]
async fn run_composes_with_the_guard_under_the_watchdog() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg).await?;
    new_job(&db, "job:run").await?;
    let redis = RedisServer::start()?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;

    let keys = FencedKeys::for_resource("job:run")?;
    let lease = locker.acquire(&keys, 100 * MS).await?;
    // Three TTLs of work: only the watchdog keeps the lease.
    let job = tokio::time::timeout(
        HUNG,
        lease.run(run_job(&mut db, &lease, "job:run", 300 * MS)),
    )
    .await???;
    assert_eq!(job, Job::Committed);
    assert_eq!(lease.lost(), None);
    lease.release().await?;
    assert_eq!(runs(&db, "job:run").await?, 1);
    Ok(())
}

/// Redis dies after the work committed and before the release: the caller
/// gets the work's output and the release error (`LeaseLost` once the
/// lease ran out with Redis still gone), and the row proves the commit.
#[tokio::test]
async fn a_release_that_fails_after_the_commit_keeps_the_output() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg).await?;
    new_job(&db, "job:killed").await?;
    let mut redis = RedisServer::start()?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;

    let keys = FencedKeys::for_resource("job:killed")?;
    let opts = AcquireOptions::new().wait(HUNG);
    let done = locker
        .with_lock(&keys, 2000 * MS, &opts, async |lease| {
            let job = run_job(&mut db, lease, "job:killed", MS).await;
            // After the commit, before the release.
            redis.kill().map(|()| job)
        })
        .await?;
    let job = done.output??;
    assert_eq!(job, Job::Committed);
    assert!(
        matches!(
            done.release,
            Err(LockError::Unreachable { .. }
                | LockError::Timeout { .. }
                | LockError::LeaseLost {
                    cause: leasehold::LostCause::Unreachable,
                    ..
                })
        ),
        "{:?}",
        done.release
    );
    assert_eq!(runs(&db, "job:killed").await?, 1);
    Ok(())
}

/// What the callers of the job runner were told, and when refusals came.
#[derive(Debug, Default)]
struct Tally {
    committed: AtomicU64,
    /// Per job: how many runs the guard refused (always before the work).
    refused: Mutex<HashMap<String, u64>>,
    /// Runs whose lease the watchdog found lost before they finished.
    lost: AtomicU64,
    /// Committed runs whose release then failed or found the lease gone.
    committed_release_failed: AtomicU64,
    /// Acquires that failed (Redis down), retried by the caller.
    acquire_errors: AtomicU64,
}

/// The job runner: 3 "processes" (a locker and a database connection
/// each) run 4 jobs over and over, TTL 200 ms, work 50 to 300 ms (often
/// longer than the TTL), watchdog on, the guard in the work's transaction.
/// Redis restarts empty mid-run (the locks and the fence counters are
/// lost). Every commit a caller was told of is in the database and no
/// other; no run did its work and was then refused; a job is refused at
/// most once (the guard heals the counter on the spot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_runner_loses_nothing_when_redis_restarts_empty() -> TestResult {
    const JOBS: [&str; 4] = ["job:a", "job:b", "job:c", "job:d"];
    const WORKERS: usize = 3;
    const RUNS_EACH: u64 = 8;
    let pg = server()?;
    {
        let db = db(&pg).await?;
        for job in JOBS {
            new_job(&db, job).await?;
        }
    }
    let mut redis = RedisServer::start()?;
    let client = leasehold::redis::Client::open(redis.url())?;
    let tally = Arc::new(Tally::default());
    // The database has seen high fences: the run before the restart
    // issued many tokens.
    {
        let db = db(&pg).await?;
        for job in JOBS {
            let resource = FencedKeys::for_resource(job)?;
            db.execute(
                "INSERT INTO leasehold_fences (resource, fence) VALUES ($1, 1000)
                 ON CONFLICT (resource) DO UPDATE SET fence = 1000",
                &[&resource.fence()],
            )
            .await?;
            let mut conn = leasehold_testkit::connection(&client, HUNG).await?;
            let () = leasehold::redis::cmd("SET")
                .arg(resource.fence())
                .arg(1000)
                .query_async(&mut conn)
                .await?;
        }
    }

    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let (pg_url, client, tally) = (pg.url(), client.clone(), tally.clone());
        workers.push(tokio::spawn(async move {
            let locker = Locker::connect(&client).await?;
            let mut db = leasehold_pg::connect(&pg_url).await?;
            let opts = AcquireOptions::new().wait(Duration::from_secs(5));
            let mut done_runs = 0;
            let mut i = worker;
            while done_runs < RUNS_EACH {
                i += 1;
                let job = JOBS[i % JOBS.len()];
                let work = Duration::from_millis(50 + (i as u64 * 37) % 250);
                let keys = FencedKeys::for_resource(job)?;
                let outcome = lock_job(&locker, &keys, &opts, &mut db, job, work).await;
                match outcome {
                    Ok(done) => {
                        match done.output? {
                            Job::Committed => {
                                tally.committed.fetch_add(1, Ordering::SeqCst);
                                if done.release.is_err() {
                                    tally
                                        .committed_release_failed
                                        .fetch_add(1, Ordering::SeqCst);
                                }
                            }
                            Job::Refused => {
                                *tally
                                    .refused
                                    .lock()
                                    .map_err(|_| "poisoned")?
                                    .entry(job.to_owned())
                                    .or_default() += 1;
                            }
                        }
                        done_runs += 1;
                    }
                    Err(LockError::LeaseLost { .. }) => {
                        tally.lost.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(err) if err.is_retryable() => {
                        tally.acquire_errors.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(20 * MS).await;
                    }
                    Err(err) => return Err(Box::<dyn std::error::Error + Send + Sync>::from(err)),
                }
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    // Restart, with work in flight, once a third of the runs committed.
    let third = u64::try_from(WORKERS)? * RUNS_EACH / 3;
    let halfway = tokio::time::timeout(HUNG, async {
        while tally.committed.load(Ordering::SeqCst) < third {
            if let Some(failed) = workers.iter_mut().find(|w| w.is_finished()) {
                return failed
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string());
            }
            tokio::time::sleep(10 * MS).await;
        }
        Ok(())
    })
    .await;
    assert!(matches!(halfway, Ok(Ok(()))), "{halfway:?}: {tally:?}");
    let _redis = tokio::task::spawn_blocking(move || {
        redis.restart_empty()?;
        Ok::<_, leasehold_testkit::Error>(redis)
    })
    .await??;
    for worker in workers {
        tokio::time::timeout(HUNG, worker)
            .await??
            .map_err(|e| e.to_string())?;
    }

    let db = db(&pg).await?;
    let mut in_db = 0;
    for job in JOBS {
        in_db += runs(&db, job).await?;
    }
    let committed = tally.committed.load(Ordering::SeqCst);
    assert_eq!(
        u64::try_from(in_db)?,
        committed,
        "callers were told {committed} commits, the database holds {in_db}: {tally:?}"
    );
    let refused = tally.refused.lock().map_err(|_| "poisoned")?.clone();
    // The restart lost every counter, and the next tokens come from the
    // server's clock, above every token issued before: a job is refused
    // only when a run in flight across the restart comes to write after
    // its successor did, at most once (a lost counter used to cost every
    // job one refusal).
    for (job, n) in &refused {
        assert!(*n <= 1, "{job} was refused {n} times: {tally:?}");
    }
    Ok(())
}

/// One run of `job` through `with_lock` (generic: any way of taking a
/// lease runs the same job).
async fn lock_job<L: Lessor>(
    lock: &L,
    keys: &FencedKeys,
    opts: &AcquireOptions,
    db: &mut Client,
    job: &str,
    work: Duration,
) -> leasehold::Result<leasehold::Finished<Result<Job, leasehold_pg::Error>>> {
    lock.with_lock(keys, 200 * MS, opts, async |lease| {
        run_job(db, lease, job, work).await
    })
    .await
}
