//! The harness's guard row through sqlx: a read-modify-write of a counter
//! in a transaction that `leasehold_pg::sqlx::guard` guards first, each
//! caller on its own sqlx connection, under holder pauses. The same path
//! without the guard is the negative control, and must be caught: a pause
//! between the read and the write loses an increment there.

use std::sync::Arc;
use std::time::Duration;

use leasehold::Locker;
use leasehold_chaos::{
    Call, ControlVerdict, Fault, Harness, Kind, Lab, LabOptions, Lock, Outcome, RunReport, Verdict,
    Writes,
};
use leasehold_pg::{Error, Guard};
use leasehold_testkit::PostgresServer;
use sqlx::{Connection, PgConnection};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A caller's own connection: opened by the harness's setup, on the
/// caller's own runtime, before the run (a paused caller freezes it too);
/// opened again after an error that may have broken it.
type Db = Option<PgConnection>;

/// Reads the counter, stalls where the harness pauses a holder, writes it
/// plus one.
async fn increment(tx: &mut PgConnection, call: &Call<'_>) -> Result<(), Error> {
    let n: i64 = sqlx::query_scalar("SELECT n FROM sqlx_counters WHERE resource = $1")
        .bind(call.resource)
        .fetch_one(&mut *tx)
        .await?;
    call.pause_point().await;
    sqlx::query("UPDATE sqlx_counters SET n = $2 WHERE resource = $1")
        .bind(call.resource)
        .bind(n + 1)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The write path, as the harness's guard row runs it on tokio-postgres:
/// a transaction, the fence guard first (`guarded` false: none), the
/// increment, the commit. No watchdog: a holder that does not watch its
/// lease, which is what the guard is for.
fn writer(url: String, guarded: bool) -> impl AsyncFn(&mut Db, Call<'_>) -> Outcome + Send + Sync {
    async move |db: &mut Db, call: Call<'_>| {
        let Some(lease) = call.lease else {
            return Outcome::NotWritten("no lease".into());
        };
        if db.is_none() {
            match PgConnection::connect(&url).await {
                Ok(conn) => *db = Some(conn),
                Err(err) => return Outcome::NotWritten(err.to_string()),
            }
        }
        let Some(conn) = db.as_mut() else {
            return Outcome::NotWritten("no connection".into());
        };
        let written = async {
            let mut tx = conn.begin().await?;
            if guarded
                && let Guard::Refused { .. } = leasehold_pg::sqlx::guard(&mut tx, lease).await?
            {
                return Ok(Outcome::Refused); // dropping `tx` rolls back
            }
            increment(&mut tx, &call).await?;
            Ok::<_, Error>(match tx.commit().await {
                Ok(()) => Outcome::Committed,
                // The server refused the commit: rolled back.
                Err(err @ sqlx::Error::Database(_)) => Outcome::NotWritten(err.to_string()),
                Err(err) => Outcome::Unknown(err.to_string()),
            })
        };
        match written.await {
            Ok(outcome) => outcome,
            Err(err) => {
                *db = None; // it may be broken: open another for the next call
                Outcome::NotWritten(err.to_string())
            }
        }
    }
}

/// The counters' check: each committed increment is in the final value.
async fn counted(url: &str, resources: &[String], writes: &Writes) -> Vec<Kind> {
    let Ok(mut db) = PgConnection::connect(url).await else {
        return Vec::new(); // every counter is then reported as unchecked
    };
    let mut checks = Vec::new();
    for resource in resources {
        let n = sqlx::query_scalar::<_, i64>("SELECT n FROM sqlx_counters WHERE resource = $1")
            .bind(resource)
            .fetch_one(&mut db)
            .await;
        checks.push(match n {
            Ok(n) => writes.check_counter(resource, 0, n),
            Err(err) => writes.check(resource, false, format!("could not read: {err}")),
        });
    }
    checks
}

async fn lab() -> Result<(Lab, String), Box<dyn std::error::Error>> {
    let lab = tokio::task::spawn_blocking(
        || -> Result<Lab, Box<dyn std::error::Error + Send + Sync>> {
            let pg = Arc::new(PostgresServer::start()?);
            Ok(Lab::start(&LabOptions::default().postgres(pg))?)
        },
    )
    .await?
    .map_err(|err| err.to_string())?;
    let url = lab.postgres_url().ok_or("the lab has no postgresql")?;
    let mut db = PgConnection::connect(&url).await?;
    leasehold_pg::sqlx::setup(&mut db).await?;
    sqlx::raw_sql("CREATE TABLE sqlx_counters (resource text PRIMARY KEY, n bigint NOT NULL)")
        .execute(&mut db)
        .await?;
    Ok((lab, url))
}

/// One run on fresh counters named `name:*`.
async fn run(
    lab: &Lab,
    url: &str,
    name: &str,
    harness: Harness,
    guarded: bool,
) -> Result<RunReport, Box<dyn std::error::Error>> {
    let resources: Vec<String> = ["a", "b"].iter().map(|r| format!("{name}:{r}")).collect();
    let mut db = PgConnection::connect(url).await?;
    for resource in &resources {
        sqlx::query("INSERT INTO sqlx_counters VALUES ($1, 0)")
            .bind(resource)
            .execute(&mut db)
            .await?;
    }
    let lock = Lock::new(Locker::connect(&lab.client()?).await?, guarded);
    let setup_url = url.to_owned();
    let setup = async move |_caller: u32| PgConnection::connect(&setup_url).await.ok();
    let check = async |writes: &Writes| counted(url, &resources, writes).await;
    Ok(harness
        .resources(resources.iter().map(|r| (r.clone(), 0)).collect())
        .callers(6)
        .run_with(lab, &lock, setup, writer(url.to_owned(), guarded), check)
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlx_guard_holds_under_holder_pauses_and_its_control_is_caught() -> TestResult {
    let (lab, url) = lab().await?;
    // 5 s: two pause windows (one per 1.3 s after a quarter of the run),
    // as in the job runner's chaos test, so the control has more than one
    // chance to be caught.
    let harness = Harness::new("sqlx-guard")
        .ttl(Duration::from_millis(50))
        .duration(Duration::from_secs(5))
        .seed(7)
        .fault(Fault::HolderPause);
    let unguarded = run(
        &lab,
        &url,
        "unguarded",
        harness.clone().control(true),
        false,
    )
    .await?;
    eprintln!("unguarded: {}", unguarded.summary());
    assert!(unguarded.caught(), "{}", unguarded.summary());
    let report = run(&lab, &url, "guarded", harness, true)
        .await?
        .with_control(unguarded);
    eprintln!("guarded: {}", report.summary());
    assert!(matches!(report.control, ControlVerdict::Caught { .. }));
    assert!(
        matches!(
            report.verdict(),
            Verdict::Held {
                control_caught: true,
                double_holders,
            } if double_holders > 0
        ),
        "{}",
        report.summary()
    );
    assert!(report.check.counts.writes.accepted > 0);
    Ok(())
}
