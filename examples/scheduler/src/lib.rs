//! An example service: a slot scheduler run by whichever of its processes
//! leads, on [`leasehold::Election`].
//!
//! Every `period` a new slot is due (slot `n` at `epoch + n * period`).
//! The leader runs each due slot once: one transaction that records the
//! slot's job row (which leader ran it, with which term) and its payout.
//! Three processes run [`serve`]; one leads at a time, a stopped leader is
//! replaced within the term's TTL, and one that shuts down resigns so the
//! next leads at once.
//!
//! The write path is [`run_due`]: in one transaction, the fence guard
//! with the term's lease, then the next slot (a plain read of the last
//! slot run, plus one), then the job row and the payout. Two leaders that
//! read the same last slot would both run the next one, and pay it twice:
//! the election makes that rare, the guard makes it impossible (a paused
//! leader's stale term is refused, and the guard's row lock holds a newer
//! leader off until the older one's transaction ends). A refusal means a
//! newer leader exists: the guard ends the term itself and the process
//! campaigns again.
//!
//! The payout is a row in the guarded database, so it is fenced. A payout
//! sent to a provider would not be: send it with the slot as its
//! idempotency key, or from an outbox row written in this transaction.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::CancellationToken;
use leasehold::{Election, Lease, Lessor, Term};
use leasehold_pg::Guard;
use leasehold_pg::tokio_postgres::{Client, GenericClient};

/// Why a slot could not be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The election: a campaign that met a fault longer than its budget,
    /// or an error that cannot pass (a wrong password, a missing
    /// permission).
    #[error("the election failed")]
    Election(#[from] leasehold::Error),
    /// The fence guard (or the connection).
    #[error("the fence guard failed")]
    Guard(#[from] leasehold_pg::Error),
    /// A statement failed before the commit: rolled back, nothing written.
    #[error("a statement failed")]
    Sql(#[from] leasehold_pg::tokio_postgres::Error),
    /// The `COMMIT` failed: whether it landed is not known.
    #[error("the commit failed; its outcome is unknown")]
    Commit(#[source] leasehold_pg::tokio_postgres::Error),
}

/// A schedule: its name (the election's and the rows'), when slot 0 was
/// due, and how often a slot is due.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The schedule's name.
    pub name: String,
    /// When slot 0 was due, in ms since the Unix epoch.
    pub epoch_ms: i64,
    /// How often a slot is due; zero: every slot is due at once (a test
    /// that runs slots as fast as it can).
    pub period: Duration,
}

impl Schedule {
    fn period_ms(&self) -> i64 {
        i64::try_from(self.period.as_millis()).unwrap_or(i64::MAX)
    }

    fn now_ms() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    /// The slot due last (0 with no period): where a schedule that has
    /// never run starts.
    fn current_slot(&self) -> i64 {
        match self.period_ms() {
            0 => 0,
            period => (Schedule::now_ms() - self.epoch_ms).max(0) / period,
        }
    }

    /// How long until `slot` is due; zero once it is.
    fn until_due(&self, slot: i64) -> Duration {
        let due = self
            .epoch_ms
            .saturating_add(slot.saturating_mul(self.period_ms()));
        Duration::from_millis(u64::try_from(due - Schedule::now_ms()).unwrap_or(0))
    }
}

/// What one step of the leader did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// Slot `slot` ran: its job row and payout committed.
    Done {
        /// The slot.
        slot: i64,
    },
    /// The next slot is not due yet (in `wait`); nothing written.
    NotDue {
        /// How long until it is.
        wait: Duration,
    },
    /// The fence guard refused: a newer leader has written. Nothing
    /// written.
    Refused,
}

/// Creates the scheduler's tables (`slot_runs`, `payouts`) and the
/// guard's. Safe from many processes at once (serialized by an advisory
/// lock).
///
/// There is deliberately no unique constraint on `(schedule, slot)`: the
/// chaos test shows that the guard alone keeps each slot to one run. In
/// production add one too, as a second line.
///
/// # Errors
/// When a statement fails.
pub async fn setup(db: &mut Client) -> Result<(), Error> {
    leasehold_pg::setup(db).await?;
    let tx = db.transaction().await?;
    // Any constant of the service's own; this one spells "sched".
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&0x73_6368_6564_i64])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS slot_runs (
             schedule text NOT NULL,
             slot bigint NOT NULL,
             leader text NOT NULL,
             term bigint NOT NULL
         );
         CREATE INDEX IF NOT EXISTS slot_runs_last ON slot_runs (schedule, slot);
         CREATE TABLE IF NOT EXISTS payouts (
             schedule text NOT NULL,
             slot bigint NOT NULL,
             amount bigint NOT NULL
         );",
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The election of `schedule` over `lessor`, campaigning as `candidate`,
/// with a 2 s term.
///
/// # Errors
/// When the name or candidate cannot be used ([`leasehold::Error`]).
pub fn election<L: Lessor>(
    lessor: L,
    schedule: &str,
    candidate: &str,
) -> Result<Election<L>, Error> {
    Ok(Election::builder(lessor, schedule)
        .candidate(candidate)
        .ttl(Duration::from_secs(2))
        .build()?)
}

/// Runs the next due slot of `schedule` under the term's `lease`, in one
/// transaction on `db`: the guard first, then [`run_slot`], then the
/// commit. `before_commit` runs just before the commit, inside its
/// shielded section: nothing in production (`async || {}`), the chaos
/// harness's pause point in a test.
///
/// # Errors
/// [`Error::Sql`] or [`Error::Guard`] when a statement fails (rolled back),
/// [`Error::Commit`] when the commit does (its outcome unknown).
pub async fn run_due(
    lease: &Lease,
    db: &mut Client,
    schedule: &Schedule,
    leader: &str,
    before_commit: impl AsyncFnOnce(),
) -> Result<Ran, Error> {
    let tx = db.transaction().await?;
    if let Guard::Refused { .. } = leasehold_pg::guard(&tx, lease).await? {
        return Ok(Ran::Refused); // dropping `tx` rolls it back
    }
    let term = lease
        .fence()
        .map_or(0, |f| i64::try_from(f).unwrap_or(i64::MAX));
    let ran = run_slot(&tx, schedule, leader, term).await?;
    if !matches!(ran, Ran::Done { .. }) {
        return Ok(ran);
    }
    lease
        .shield(async {
            before_commit().await;
            tx.commit().await
        })
        .await
        .map_err(Error::Commit)?;
    Ok(ran)
}

/// The slot itself, in the caller's transaction: the next slot after the
/// last one run (a plain read; the slot due now when none has run), if
/// due, recorded with its payout (blind
/// inserts).
///
/// # Errors
/// When a statement fails.
pub async fn run_slot<C: GenericClient>(
    tx: &C,
    schedule: &Schedule,
    leader: &str,
    term: i64,
) -> Result<Ran, Error> {
    let row = tx
        .query_one(
            "SELECT max(slot) + 1 FROM slot_runs WHERE schedule = $1",
            &[&schedule.name],
        )
        .await?;
    let next: Option<i64> = row.try_get(0)?;
    let slot = next.unwrap_or_else(|| schedule.current_slot());
    let wait = schedule.until_due(slot);
    if !wait.is_zero() {
        return Ok(Ran::NotDue { wait });
    }
    tx.execute(
        "INSERT INTO slot_runs (schedule, slot, leader, term) VALUES ($1, $2, $3, $4)",
        &[&schedule.name, &slot, &leader, &term],
    )
    .await?;
    tx.execute(
        "INSERT INTO payouts (schedule, slot, amount) VALUES ($1, $2, 10)",
        &[&schedule.name, &slot],
    )
    .await?;
    Ok(Ran::Done { slot })
}

/// One term's work: runs due slots until the term ends (lost, or ended
/// by a guard refusal). A broken database connection is opened again (a
/// PostgreSQL restart is ridden out).
async fn lead(term: &Term, db_url: &str, schedule: &Schedule) {
    let mut db: Option<Client> = None;
    loop {
        if db.as_ref().is_none_or(Client::is_closed) {
            db = leasehold_pg::connect(db_url).await.ok();
        }
        let wait = match db.as_mut() {
            None => Duration::from_millis(100),
            Some(client) => {
                let candidate = term.candidate();
                match run_due(term.lease(), client, schedule, candidate, async || {}).await {
                    Ok(Ran::Done { .. }) => Duration::ZERO,
                    Ok(Ran::NotDue { wait }) => wait,
                    // A newer leader exists: the guard has ended the term,
                    // and the work is stopped at this await.
                    Ok(Ran::Refused) => return std::future::pending().await,
                    // Rolled back, or its outcome unknown: the next step
                    // reads what landed.
                    Err(_) => Duration::from_millis(100),
                }
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// The service: leads whenever elected ([`Election::serve`]), running due
/// slots ([`run_due`]) under each term, until `shutdown` is cancelled; then
/// it resigns (the next leader takes over at once).
///
/// # Errors
/// [`Error::Election`] for an election error that cannot pass (a wrong
/// password, a missing permission); faults are ridden out.
pub async fn serve<L: Lessor>(
    election: &Election<L>,
    db_url: &str,
    schedule: &Schedule,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    // Owned by the closure (`async move`): see `Election::serve` on spawning.
    let (db_url, schedule) = (db_url.to_owned(), schedule.clone());
    election
        .serve(shutdown, async move |term| {
            lead(term, &db_url, &schedule).await
        })
        .await?;
    Ok(())
}
