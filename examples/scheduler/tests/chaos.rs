//! The scheduler's chaos test: its real write path ([`run_due`]) run by
//! three callers in **terms** (one lease for many slots, as a leader
//! holds one), under a holder paused inside its term, the election's key
//! deleted, and a Redis restart that loses the lock and the fence counter.
//! Each run checks the scheduler's own invariants: no slot run twice
//! (duplicate), no payout without its job row or job row without its
//! payout (missing), the slots in order with no gap (out of order), and
//! every slot reported done in the table (lost).
//!
//! What to ask for in review: each fault is **held** with double holders
//! absorbed, and the same path without its guard is caught (the negative
//! control); a run whose control catches nothing proves nothing and fails.

use std::sync::Arc;
use std::time::Duration;

use leasehold::{Election, Locker};
use leasehold_chaos::{
    Call, Candidate, Fault, Harness, Kind, Lab, LabOptions, Lock, Outcome, RunReport, Verdict,
    Writes,
};
use leasehold_pg::tokio_postgres::Client;
use leasehold_testkit::PostgresServer;
use scheduler::{Error, Ran, Schedule, run_due, run_slot, setup};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A caller's own database connection (opened before the run; again if it
/// broke).
type Db = Option<Client>;

/// The harness resource of schedule `name`: `leader:<name>`, so its lock
/// keys are the election's (`lock:{leader:<name>}`).
fn resource(name: &str) -> String {
    format!("leader:{name}")
}

/// The schedule a harness resource stands for: every slot due at once.
fn schedule(resource: &str) -> Schedule {
    Schedule {
        name: resource.trim_start_matches("leader:").to_owned(),
        epoch_ms: 0,
        period: Duration::ZERO,
    }
}

fn connect(url: String) -> impl AsyncFn(u32) -> Db + Send + Sync + 'static {
    async move |_caller: u32| leasehold_pg::connect(&url).await.ok()
}

fn outcome(ran: &Result<Ran, Error>) -> Outcome {
    match ran {
        Ok(Ran::Done { .. }) => Outcome::Committed,
        Ok(Ran::Refused) => Outcome::Refused,
        Ok(Ran::NotDue { .. }) => Outcome::NotWritten("not due".into()),
        Err(err @ Error::Commit(_)) => Outcome::Unknown(err.to_string()),
        Err(err) => Outcome::NotWritten(err.to_string()),
    }
}

/// One slot under `lease`: the guarded [`run_due`], or with `guarded`
/// false the same slot without the guard; `pause` just before the
/// commit, where the watchdog cannot stop a paused leader.
async fn slot(
    lease: &leasehold::Lease,
    db: &mut Client,
    schedule: &Schedule,
    leader: &str,
    guarded: bool,
    pause: impl AsyncFnOnce(),
) -> Result<Ran, Error> {
    if guarded {
        return run_due(lease, db, schedule, leader, pause).await;
    }
    let tx = db.transaction().await?;
    let term = lease.fence().map_or(0, |f| i64::try_from(f).unwrap_or(0));
    let ran = run_slot(&tx, schedule, leader, term).await?;
    lease
        .shield(async {
            pause().await;
            tx.commit().await
        })
        .await
        .map_err(Error::Commit)?;
    Ok(ran)
}

/// One slot as the leader runs it ([`slot`]), under the watchdog.
fn leader(
    url: String,
    guarded: bool,
) -> impl AsyncFn(&mut Db, Call<'_>) -> Outcome + Send + Sync + 'static {
    async move |db: &mut Db, call: Call<'_>| {
        let Some(lease) = call.lease else {
            return Outcome::NotWritten("no lease".into());
        };
        if db.as_ref().is_none_or(Client::is_closed) {
            match leasehold_pg::connect(&url).await {
                Ok(client) => *db = Some(client),
                Err(err) => return Outcome::NotWritten(err.to_string()),
            }
        }
        let Some(db) = db.as_mut() else {
            return Outcome::NotWritten("no connection".into());
        };
        let schedule = schedule(call.resource);
        let pause = async || call.pause_point().await;
        match call
            .run(slot(lease, db, &schedule, call.actor, guarded, pause))
            .await
        {
            Ok(ran) => outcome(&ran),
            Err(stopped) => stopped.into(),
        }
    }
}

/// The scheduler's invariants, per schedule.
async fn invariants(url: &str, resources: &[String], writes: &Writes) -> Vec<Kind> {
    let Ok(db) = leasehold_pg::connect(url).await else {
        return Vec::new(); // every schedule is then reported unchecked
    };
    let mut checks = Vec::new();
    for resource in resources {
        let name = schedule(resource).name;
        let row = db
            .query_one(
                "SELECT count(*), count(DISTINCT slot), coalesce(max(slot) - min(slot) + 1, 0),
                        (SELECT count(*) FROM payouts p WHERE p.schedule = $1),
                        (SELECT count(*) FROM payouts p WHERE p.schedule = $1 AND NOT EXISTS
                            (SELECT 1 FROM slot_runs r WHERE r.schedule = $1 AND r.slot = p.slot))
                 FROM slot_runs WHERE schedule = $1",
                &[&name],
            )
            .await;
        let Ok(row) = row else {
            checks.push(writes.check(resource, false, "could not read the tables"));
            continue;
        };
        let (runs, distinct, span, payouts, orphans): (i64, i64, i64, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        checks.push(writes.check_counter(resource, 0, runs));
        checks.push(writes.check(
            resource,
            runs == distinct,
            format!("duplicate: {} slots run twice", runs - distinct),
        ));
        checks.push(writes.check(
            resource,
            payouts == runs && orphans == 0,
            format!("missing: {runs} job rows, {payouts} payouts, {orphans} payouts without a job"),
        ));
        checks.push(writes.check(
            resource,
            span == distinct,
            format!("out of order: {distinct} slots over a span of {span}"),
        ));
    }
    checks
}

struct Servers {
    lab: Lab,
    url: String,
}

async fn servers() -> Result<Servers, Box<dyn std::error::Error>> {
    let lab = tokio::task::spawn_blocking(
        || -> Result<Lab, Box<dyn std::error::Error + Send + Sync>> {
            let pg = Arc::new(PostgresServer::start()?);
            Ok(Lab::start(&LabOptions::default().postgres(pg))?)
        },
    )
    .await?
    .map_err(|err| err.to_string())?;
    let url = lab.postgres_url().ok_or("the lab has no postgresql")?;
    let mut db = leasehold_pg::connect(&url).await?;
    setup(&mut db).await?;
    Ok(Servers { lab, url })
}

/// One run of three leaders in terms on the schedule `name`.
async fn run(
    servers: &Servers,
    name: &str,
    harness: Harness,
    guarded: bool,
) -> Result<RunReport, Box<dyn std::error::Error>> {
    let resources = vec![resource(name)];
    let client = servers.lab.client()?;
    // Polling followers: they find a deleted or restarted key before the
    // leader's watchdog does, which is the window the faults must open (a
    // hand-off follower waits for a grant the fault never sends, and the
    // leader learns first).
    let lock = Lock::new(Locker::connect(&client).await?, true);
    let url = servers.url.clone();
    let check = async |writes: &Writes| invariants(&url, &resources, writes).await;
    Ok(harness
        .resources(resources.iter().map(|r| (r.clone(), 0)).collect())
        .callers(3)
        .run_with(
            &servers.lab,
            &lock,
            connect(servers.url.clone()),
            leader(servers.url.clone(), guarded),
            check,
        )
        .await?)
}

/// A term's work as the scheduler's own (its `lead`: due slots until the
/// term ends, a refusal ending it through the guard, a broken connection
/// opened again), with `step` running each slot: where the harness
/// records it and places its pause point. The connection is the
/// caller's, kept across terms.
async fn lead(
    url: &str,
    db: &mut Db,
    mut step: impl AsyncFnMut(&mut Client) -> Result<Ran, Error>,
) {
    loop {
        if db.as_ref().is_none_or(Client::is_closed) {
            *db = leasehold_pg::connect(url).await.ok();
        }
        let wait = match db.as_mut() {
            None => Duration::from_millis(100),
            Some(client) => match step(client).await {
                Ok(Ran::Done { .. }) => Duration::ZERO,
                Ok(Ran::NotDue { wait }) => wait,
                // The guard has ended the term: `serve` stops the work.
                Ok(Ran::Refused) => return std::future::pending().await,
                Err(_) => Duration::from_millis(100),
            },
        };
        tokio::time::sleep(wait).await;
    }
}

/// One run of three schedulers leading through their election
/// (`Election::serve`, the guard ending a term on a refusal with no call
/// of theirs) on the schedule `name`: each term and each slot recorded,
/// the pause point just before each slot's commit.
async fn run_leaders(
    servers: &Servers,
    name: &str,
    harness: Harness,
    guarded: bool,
) -> Result<RunReport, Box<dyn std::error::Error>> {
    let resources = vec![resource(name)];
    let client = servers.lab.client()?;
    let lock = Lock::new(Locker::connect(&client).await?, true);
    let (url, checked_url) = (servers.url.clone(), servers.url.clone());
    let schedule = schedule(&resources[0]);
    let check = async |writes: &Writes| invariants(&checked_url, &resources, writes).await;
    let serve = async move |db: &mut Db, candidate: &Candidate<'_>| {
        let election = Election::builder(candidate.lessor(), &schedule.name)
            .candidate(candidate.actor())
            .ttl(candidate.ttl())
            .budget(candidate.wait())
            .build()?;
        election
            .serve(candidate.shutdown(), async |term| {
                let record = candidate.term(term);
                let step = async |db: &mut Client| {
                    let mut ran = Ok(Ran::NotDue {
                        wait: Duration::ZERO,
                    });
                    record
                        .write(async |call| {
                            let pause = async || call.pause_point().await;
                            ran =
                                slot(term.lease(), db, &schedule, call.actor, guarded, pause).await;
                            outcome(&ran)
                        })
                        .await;
                    ran
                };
                lead(&url, db, step).await;
            })
            .await?;
        Ok(())
    };
    Ok(harness
        .resources(vec![(resource(name), 0)])
        .callers(3)
        .run_leaders(
            &servers.lab,
            &lock,
            connect(servers.url.clone()),
            serve,
            check,
        )
        .await?)
}

/// `fault` is held with double holders absorbed, and the path without its
/// guard is caught under it (the first of three seeds that catches it).
async fn held_and_exercised(fault: Fault, ttl: Duration, term: u32, watchdog: bool) -> TestResult {
    let servers = servers().await?;
    let harness = |seed: u64| {
        Harness::new("scheduler")
            .ttl(ttl)
            .wait(Duration::from_secs(5))
            .duration(Duration::from_secs(4))
            .watchdog(watchdog)
            .seed(seed)
            .fault(fault)
            .term(term)
    };
    let mut controls = Vec::new();
    for seed in [21, 22, 23] {
        let name = format!("{}-unguarded-{seed}", fault.name());
        let control = run(&servers, &name, harness(seed).control(true), false).await?;
        eprintln!("{fault} unguarded, seed {seed}: {}", control.summary());
        if control.caught() {
            let name = format!("{}-guarded-{seed}", fault.name());
            let report = run(&servers, &name, harness(seed), true)
                .await?
                .with_control(control);
            eprintln!("{fault} guarded, seed {seed}: {}", report.summary());
            assert!(
                matches!(report.verdict(), Verdict::Held { double_holders, control_caught: true } if double_holders > 0),
                "{}",
                report.summary()
            );
            assert!(report.check.counts.writes.accepted > 0);
            return Ok(());
        }
        controls.push(control.summary());
    }
    Err(
        format!("{fault}: the unguarded scheduler was caught in none of 3 seeds: {controls:#?}")
            .into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedulers_own_leader_loop_runs_each_slot_once_when_a_leader_pauses() -> TestResult {
    let servers = servers().await?;
    let harness = |seed: u64| {
        Harness::new("scheduler-serve")
            .ttl(Duration::from_millis(200))
            .wait(Duration::from_secs(5))
            .duration(Duration::from_secs(3))
            .seed(seed)
            .fault(Fault::HolderPause)
    };
    let mut controls = Vec::new();
    for seed in [31, 32, 33] {
        let name = format!("serve-unguarded-{seed}");

        let control = run_leaders(&servers, &name, harness(seed).control(true), false).await?;
        eprintln!("serve unguarded, seed {seed}: {}", control.summary());
        if !control.caught() {
            controls.push(control.summary());
            continue;
        }
        let name = format!("serve-guarded-{seed}");
        let report = run_leaders(&servers, &name, harness(seed), true)
            .await?
            .with_control(control);
        eprintln!("serve guarded, seed {seed}: {}", report.summary());
        assert!(report.holds(), "{}", report.summary());
        assert!(
            report.check.counts.writes.accepted > 0,
            "{}",
            report.summary()
        );
        // The terms of more than one leader are in the history.
        let mut leaders: Vec<&str> = report
            .events
            .iter()
            .filter(|e| matches!(e.kind, Kind::Acquired { .. }))
            .map(|e| e.actor.as_str())
            .collect();
        leaders.sort_unstable();
        leaders.dedup();
        assert!(leaders.len() > 1, "one leader only: {}", report.summary());
        return Ok(());
    }
    Err(format!("the unguarded scheduler loop was caught in none of 3 seeds: {controls:#?}").into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_slot_runs_once_when_a_leader_pauses_inside_its_term() -> TestResult {
    held_and_exercised(Fault::HolderPause, Duration::from_millis(100), 50, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_slot_runs_once_when_the_election_key_is_deleted() -> TestResult {
    held_and_exercised(Fault::KeyLoss, Duration::from_millis(100), 50, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_slot_runs_once_when_redis_restarts_and_loses_the_counter() -> TestResult {
    // The lab keeps Redis down for three TTLs, so a leader whose watchdog
    // runs learns it lost the term before anyone else can lead: the lock
    // never breaks. The worst case a restart makes is a leader that does
    // not learn it (no watchdog: a term of 2000 slots, about a second
    // here, goes on writing through the outage) while a follower takes
    // the empty server's lock with a token from the server's clock.
    held_and_exercised(Fault::RedisRestart, Duration::from_millis(300), 2000, false).await
}
