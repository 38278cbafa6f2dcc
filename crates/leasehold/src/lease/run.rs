//! Work under a lease: [`Lease::run`] races the work against the loss of
//! the lease, [`Lease::shield`] lets a section (a commit) finish whatever
//! the watchdog finds, and `with_lock`'s whole life of a lease
//! ([`hold_while`]) returns the work's output beside the release's outcome
//! ([`Finished`]).

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::lost::LostCause;

use super::{Lease, TARGET};

#[cfg(doc)]
use crate::error::Error;

/// How many [`shield`](Lease::shield)ed sections are running, and a signal
/// when one ends.
#[derive(Debug, Default)]
pub(super) struct Shields {
    running: std::sync::atomic::AtomicUsize,
    ended: tokio::sync::Notify,
}

/// One running shielded section; ends it when dropped (finished or
/// cancelled).
struct ShieldGuard<'a>(&'a Shields);

impl Drop for ShieldGuard<'_> {
    fn drop(&mut self) {
        self.0
            .running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

impl Lease {
    /// Runs `work` while the lease is held: starts the watchdog (as
    /// [`watch`](Self::watch) does) and races `work` against it. `work`
    /// may borrow the lease (its [`fence`](Self::fence), the `leasehold-pg`
    /// guard in the same transaction):
    ///
    /// ```no_run
    /// # async fn demo(lease: leasehold::Lease) -> leasehold::Result<()> {
    /// let fence = lease.run(async { lease.fence() }).await?;
    /// # let _ = fence;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// If the watchdog finds the lease lost before `work` finishes, `work` is
    /// dropped at its current `.await` and never resumed, and the result is
    /// [`Error::LeaseLost`]. Once `work` has finished, its output is always
    /// returned, even if the loss was found in the same instant: the work
    /// ran to its end and its effects happened, and hiding them from the
    /// caller would lose them. Whether the lease was still ours then is
    /// what [`lost`](Self::lost) and [`release`](Self::release) tell.
    ///
    /// The watchdog keeps running after `run` returns, until the lease is
    /// released or dropped, so several `run`s can share one lease.
    ///
    /// Being cancelled is only as good as `work`'s cancellation points: code
    /// between two `.await`s runs to the next one. And the watchdog notices
    /// a loss up to one refresh period late, so `Ok` does not prove the
    /// lease held throughout: a write inside `work` must still be fenced by
    /// the database (the `leasehold-pg` guard), which is what makes it
    /// correct. A transaction dropped before its commit is rolled back; one
    /// dropped while its `COMMIT` is in flight may have committed: the
    /// database knows, the caller does not.
    ///
    /// # Errors
    /// - [`Error::LeaseLost`] with the [`LostCause`] when the lease was lost
    ///   before `work` finished (or before it started);
    /// - [`Error::InvalidOptions`] as for [`watch`](Self::watch).
    ///
    /// # Cancel safety
    /// Dropping the returned future drops `work` at its current `.await`;
    /// the lease and its watchdog are unaffected.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output> {
        let lost = self.watch()?;
        if let Some(cause) = self.lost() {
            return Err(self.lost_error(cause));
        }
        self.race(&lost, work).await
    }

    /// Runs `section` to its end even if the watchdog finds the lease lost
    /// meanwhile: inside [`run`](Self::run) (and `with_lock`), the work is
    /// then stopped only once no shielded section is running. Made for the
    /// **commit** of a guarded transaction, so that the caller always learns
    /// whether it committed: `lease.shield(tx.commit()).await?` as the
    /// work's last step (the `leasehold-pg` docs show it in full).
    ///
    /// Without it, a loss found while the `COMMIT` is in flight drops the
    /// work there: the transaction may have committed, and the caller gets
    /// [`Error::LeaseLost`] instead of the work's output. Shielding does not
    /// make a write safer or less safe (a `COMMIT` already sent lands
    /// whether or not its future is dropped; the fence guard is what
    /// refuses a stale holder), it keeps the *answer*. Keep shielded
    /// sections short: the watchdog cannot stop them.
    ///
    /// Outside `run`, it is just `section.await`.
    ///
    /// # Cancel safety
    /// As `section`'s own; dropping the future ends the shield.
    pub async fn shield<F: Future>(&self, section: F) -> F::Output {
        self.shields
            .running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _guard = ShieldGuard(&self.shields);
        section.await
    }

    /// `work` raced against the loss of the lease (`lost` cancelled). The
    /// work is polled first: an output it produced is never dropped; and
    /// after a loss it goes on while a [`shield`](Self::shield)ed section
    /// runs.
    async fn race<F: Future>(&self, lost: &CancellationToken, work: F) -> Result<F::Output> {
        let mut work = std::pin::pin!(work);
        tokio::select! {
            biased;
            output = &mut work => return Ok(output),
            () = lost.cancelled() => {}
        }
        loop {
            let ended = self.shields.ended.notified();
            let mut ended = std::pin::pin!(ended);
            // Registered before the count is read, so an end between the
            // two is not missed.
            ended.as_mut().enable();
            if self
                .shields
                .running
                .load(std::sync::atomic::Ordering::SeqCst)
                == 0
            {
                return Err(self.lost_error(self.lost().unwrap_or(LostCause::Expired)));
            }
            tokio::select! {
                biased;
                output = &mut work => return Ok(output),
                () = &mut ended => {}
            }
        }
    }
}

/// Holds `lease` while `work` runs with it: starts the watchdog, races the
/// work against the loss of the lease, and releases it; the work's output
/// comes back with the release's outcome. The common case of every way of
/// taking a lease (`with_lock`).
pub(crate) async fn hold_while<T>(
    lease: Lease,
    work: impl AsyncFnOnce(&Lease) -> T,
) -> Result<Finished<T>> {
    let output = match lease.run(work(&lease)).await {
        Ok(output) => output,
        Err(err) => {
            // No output: the work was stopped (or never started). Give the
            // lock back all the same; the error says why the work stopped.
            if let Err(release) = lease.release().await {
                tracing::debug!(target: TARGET, error = %release, "release after a lost lease failed");
            }
            return Err(err);
        }
    };
    let release = lease.release().await;
    Ok(Finished { output, release })
}

/// What [`with_lock`](crate::Lessor::with_lock) returns when the work ran to
/// its end: the work's output **and** how giving the lease back went. The
/// output is never dropped because of the release: by the time the release
/// runs, the work's effects (a committed transaction) have happened.
///
/// What the two say about the data:
///
/// - The **database decided** what the work wrote: a write guarded by the
///   `leasehold-pg` fence guard (or a check-and-set) was committed or
///   refused by the database, whatever the lease did. Put that answer in
///   `output` (for example the guard's `Accepted` / `Refused`), and count
///   committed work from it.
/// - [`release`](Self::release) only says whether the lock was still ours
///   when we gave it back: `Ok(())` it was, and is now free (or handed to
///   the next waiter); [`Error::NotHeld`] or [`Error::LeaseLost`] it had
///   expired or changed hands while the work ran (the fence guard is what
///   kept the data right then); [`Error::Timeout`] / [`Error::Unreachable`]
///   Redis could not be asked, and the TTL ends the lease. None of these
///   undo or void what the work committed.
#[must_use = "the work's output is inside; `release` says whether the lease was still held"]
#[derive(Debug)]
#[non_exhaustive]
pub struct Finished<T> {
    /// What the work returned. It ran to its end.
    pub output: T,
    /// How giving the lease back went (see the type's docs).
    pub release: Result<()>,
}

impl<T> Finished<T> {
    /// The work's output, whatever the release said.
    pub fn into_output(self) -> T {
        self.output
    }

    /// Whether the lease was still ours when it was given back (the release
    /// found our token on every key). `false` does not mean the work's
    /// writes were lost or wrong: the database decided those.
    pub fn was_held_at_release(&self) -> bool {
        self.release.is_ok()
    }
}
