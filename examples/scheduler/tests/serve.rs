//! The service loop itself: three schedulers serve one schedule; the one
//! that leads runs each due slot once; when its task is aborted (its
//! term dropped mid-slot) another takes over; when the others shut down
//! they resign and return, and no slot ran twice or was skipped.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::{Election, Locker};
use leasehold_testkit::{PostgresServer, RedisServer};
use scheduler::{Schedule, serve, setup};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(30);

/// `(runs, distinct slots, span, leaders)` of `schedule` so far.
async fn tally(
    db: &leasehold_pg::tokio_postgres::Client,
    schedule: &str,
) -> Result<(i64, i64, i64, i64), Box<dyn std::error::Error>> {
    let row = db
        .query_one(
            "SELECT count(*), count(DISTINCT slot), coalesce(max(slot) - min(slot) + 1, 0),
                    count(DISTINCT leader)
             FROM slot_runs WHERE schedule = $1",
            &[&schedule],
        )
        .await?;
    Ok((row.get(0), row.get(1), row.get(2), row.get(3)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_schedulers_run_each_slot_once_across_a_crash_and_a_shutdown() -> TestResult {
    let (redis, pg) = (RedisServer::start()?, PostgresServer::start()?);
    let client = leasehold::redis::Client::open(redis.url())?;
    let db = leasehold_pg::connect(&pg.url()).await?;
    setup(&mut leasehold_pg::connect(&pg.url()).await?).await?;
    let now_ms = i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
    let schedule = Schedule {
        name: "serve".to_owned(),
        epoch_ms: now_ms,
        period: Duration::from_millis(20),
    };
    let shutdown = leasehold::CancellationToken::new();
    let mut tasks = Vec::new();
    for name in ["a", "b", "c"] {
        // A short term, so a crashed leader is replaced quickly.
        let election = Election::builder(Locker::connect(&client).await?, &schedule.name)
            .candidate(name)
            .ttl(Duration::from_millis(300))
            .build()?;
        let (url, schedule, shutdown) = (pg.url(), schedule.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move {
            serve(&election, &url, &schedule, &shutdown).await
        }));
    }
    // Slots run; then the leader's task is aborted mid-term.
    let runs_before = tokio::time::timeout(HUNG, async {
        loop {
            let (runs, ..) = tally(&db, &schedule.name).await?;
            if runs >= 5 {
                return Ok::<_, Box<dyn std::error::Error>>(runs);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await??;
    let leader: String = db
        .query_one(
            "SELECT leader FROM slot_runs WHERE schedule = $1 ORDER BY slot DESC LIMIT 1",
            &[&schedule.name],
        )
        .await?
        .get(0);
    let index = ["a", "b", "c"]
        .iter()
        .position(|n| *n == leader)
        .ok_or("no leader")?;
    tasks.remove(index).abort();
    // Another leads and runs the next slots.
    tokio::time::timeout(HUNG, async {
        loop {
            let last: String = db
                .query_one(
                    "SELECT leader FROM slot_runs WHERE schedule = $1 ORDER BY slot DESC LIMIT 1",
                    &[&schedule.name],
                )
                .await?
                .get(0);
            let (runs, ..) = tally(&db, &schedule.name).await?;
            if last != leader && runs > runs_before + 5 {
                return Ok::<_, Box<dyn std::error::Error>>(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await??;
    // The others shut down: each resigns and returns.
    shutdown.cancel();
    for task in tasks {
        tokio::time::timeout(HUNG, task).await???;
    }
    let (runs, distinct, span, leaders) = tally(&db, &schedule.name).await?;
    assert_eq!(runs, distinct, "a slot ran twice");
    assert_eq!(distinct, span, "a slot was skipped");
    assert!(leaders >= 2, "{leaders} leaders");
    let payouts: i64 = db
        .query_one(
            "SELECT count(*) FROM payouts WHERE schedule = $1",
            &[&schedule.name],
        )
        .await?
        .get(0);
    assert_eq!(payouts, runs, "a slot without its payout");
    Ok(())
}
