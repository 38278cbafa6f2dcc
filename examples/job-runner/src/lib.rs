//! An example service: a job runner that takes the next pending job of a
//! queue and runs it exactly once, under a fenced `leasehold` lease, with
//! the fence guard first in the job's transaction.
//!
//! Its chaos test (`tests/chaos.rs`) is the tutorial's last advice as a
//! template to copy: point the load test at your own write path with a
//! 1 ms TTL, and ask for it in code review.
//!
//! The write path is [`run_next`]: in one transaction, the guard, then the
//! claim (the oldest pending job of the queue), then the job's effect (a
//! row in `job_log`) and the job marked done. The claim is a plain read
//! followed by a blind `UPDATE`: two runners that read the same pending job
//! would both run it. The lock makes that rare; the guard makes it
//! impossible (a paused runner's stale token is refused, and the guard's
//! row lock holds a newer runner off until the older one's transaction
//! ends).

use std::time::Duration;

use leasehold::{AcquireOptions, FencedKeys, Lease, Lessor};
use leasehold_pg::Guard;
use leasehold_pg::tokio_postgres::{Client, GenericClient};

/// Why a job could not be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock: not taken, or lost while the job ran (then nothing was
    /// written: its transaction was rolled back).
    #[error("the queue's lock failed")]
    Lock(#[from] leasehold::Error),
    /// The fence guard (or the connection).
    #[error("the fence guard failed")]
    Guard(#[from] leasehold_pg::Error),
    /// A statement of the runner's own failed before the commit: the
    /// transaction was rolled back, nothing written.
    #[error("a statement failed")]
    Sql(#[from] leasehold_pg::tokio_postgres::Error),
    /// The `COMMIT` failed: whether it landed is not known (the connection
    /// may have died after the server committed).
    #[error("the commit failed; its outcome is unknown")]
    Commit(#[source] leasehold_pg::tokio_postgres::Error),
}

/// What one step of the runner did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// Job `job` ran and its transaction committed.
    Done {
        /// The job's id.
        job: i64,
    },
    /// The queue had no pending job; nothing written.
    Empty,
    /// The fence guard refused: a runner with a newer lease has written
    /// this queue. Nothing written.
    Refused,
}

/// Creates the runner's tables (`jobs`, `job_log`) and the guard's
/// (`leasehold_fences`). Safe from many processes at once: one transaction
/// serialized by an advisory lock (two concurrent `CREATE TABLE IF NOT
/// EXISTS` of one table can otherwise fail with a unique violation in the
/// catalog).
///
/// # Errors
/// When a statement fails.
pub async fn setup(db: &mut Client) -> Result<(), Error> {
    leasehold_pg::setup(db).await?;
    let tx = db.transaction().await?;
    // Any constant of the service's own; this one spells "jobrun".
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&0x6a6f_6272_756e_i64])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS jobs (
             id bigserial PRIMARY KEY,
             queue text NOT NULL,
             done_by text
         );
         CREATE INDEX IF NOT EXISTS jobs_pending ON jobs (queue, id) WHERE done_by IS NULL;
         CREATE TABLE IF NOT EXISTS job_log (
             job_id bigint NOT NULL REFERENCES jobs (id),
             queue text NOT NULL,
             runner text NOT NULL
         );",
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Adds `n` pending jobs to `queue`.
///
/// # Errors
/// When the statement fails.
pub async fn enqueue(db: &Client, queue: &str, n: i64) -> Result<(), Error> {
    db.execute(
        "INSERT INTO jobs (queue) SELECT $1 FROM generate_series(1::bigint, $2)",
        &[&queue, &n],
    )
    .await?;
    Ok(())
}

/// The lock keys of `queue`: `lock:{queue:NAME}` and its fence counter.
///
/// # Errors
/// When the name cannot be a key.
pub fn keys(queue: &str) -> Result<FencedKeys, Error> {
    Ok(FencedKeys::for_resource(queue)?)
}

/// Runs the next job of `queue` under `lease` (fenced on [`keys`]), in one
/// transaction on `db`: the guard first, the claim and the job
/// ([`claim_and_run`]), the commit. `before_commit` runs just before the
/// commit, inside its shielded section (the watchdog cannot stop it there):
/// nothing in production (`async || {}`), the chaos harness's pause point
/// in a test, a pause the watchdog cannot save, so the guard must.
///
/// # Errors
/// [`Error::Sql`] or [`Error::Guard`] when a statement fails (the
/// transaction is rolled back), [`Error::Commit`] when the commit does
/// (its outcome unknown).
pub async fn run_next(
    lease: &Lease,
    db: &mut Client,
    queue: &str,
    runner: &str,
    before_commit: impl AsyncFnOnce(),
) -> Result<Ran, Error> {
    let tx = db.transaction().await?;
    if let Guard::Refused { .. } = leasehold_pg::guard(&tx, lease).await? {
        return Ok(Ran::Refused); // dropping `tx` rolls it back
    }
    let ran = claim_and_run(&tx, queue, runner).await?;
    // Never stopped inside the commit: we always learn whether it landed.
    lease
        .shield(async {
            before_commit().await;
            tx.commit().await
        })
        .await
        .map_err(Error::Commit)?;
    Ok(ran)
}

/// The claim and the job, in the caller's transaction: the oldest pending
/// job of `queue` (a plain read), marked done by `runner` (a blind write),
/// and its effect logged.
///
/// # Errors
/// When a statement fails.
pub async fn claim_and_run<C: GenericClient>(
    tx: &C,
    queue: &str,
    runner: &str,
) -> Result<Ran, Error> {
    let row = tx
        .query_opt(
            "SELECT id FROM jobs WHERE queue = $1 AND done_by IS NULL ORDER BY id LIMIT 1",
            &[&queue],
        )
        .await?;
    let Some(row) = row else {
        return Ok(Ran::Empty);
    };
    let job: i64 = row.try_get(0)?;
    tx.execute(
        "UPDATE jobs SET done_by = $2 WHERE id = $1",
        &[&job, &runner],
    )
    .await?;
    tx.execute(
        "INSERT INTO job_log (job_id, queue, runner) VALUES ($1, $2, $3)",
        &[&job, &queue, &runner],
    )
    .await?;
    Ok(Ran::Done { job })
}

/// One step of the runner in production: takes the queue's lease (waiting
/// up to 5 s, watchdog on) and runs the next job under it.
///
/// # Errors
/// [`Error::Lock`] when the lease was not taken or was lost while the job
/// ran (nothing written), [`Error::Sql`] or [`Error::Guard`] as [`run_next`].
pub async fn step(
    lessor: &impl Lessor,
    db: &mut Client,
    queue: &str,
    runner: &str,
) -> Result<Ran, Error> {
    let opts = AcquireOptions::new().wait(Duration::from_secs(5));
    let done = lessor
        .with_lock(
            &keys(queue)?,
            Duration::from_secs(2),
            &opts,
            async |lease| run_next(lease, db, queue, runner, async || {}).await,
        )
        .await?;
    done.output
}
