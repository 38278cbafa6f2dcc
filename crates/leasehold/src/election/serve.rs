//! The long-running form of an election: [`Election::serve`], a
//! candidate's whole life (campaign, lead, hand over, campaign again) in
//! one call, until the service shuts down.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Election, Term};
use crate::error::{Error, Result};
use crate::lessor::Lessor;

/// The first pause after a campaign that failed for a fault longer than
/// the election's budget; doubled after each such failure in a row, up to
/// [`FAULT_BACKOFF_MAX`].
const FAULT_BACKOFF_MIN: Duration = Duration::from_millis(100);

/// The longest pause between campaigns that keep failing.
const FAULT_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What [`Election::serve`] did until it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Served {
    /// Terms won.
    pub terms: u64,
    /// Terms whose work returned (each then resigned, handing leadership
    /// on at once).
    pub finished: u64,
    /// Terms lost before their work returned (expired, the service
    /// unreachable until the lease's deadline, superseded): the work was
    /// stopped at an `.await`.
    pub lost: u64,
    /// Campaigns that met a fault outlasting the election's
    /// [`budget`](crate::ElectionBuilder::budget), after which `serve`
    /// paused and campaigned again.
    pub faults: u64,
}

impl<L: Lessor> Election<L> {
    /// Leads whenever elected, until `shutdown` is cancelled: campaigns,
    /// runs `work` under the term ([`Term::run`]: stopped at its next
    /// `.await` if the term is lost), resigns when the work returns
    /// (leadership passes on at once; the candidate campaigns again), and
    /// campaigns again after a lost term. On shutdown it stops campaigning,
    /// stops the work at its next `.await`, resigns the term it holds (the
    /// next leader takes over at once), and returns what it did.
    ///
    /// `work` is the leader's job for one term, typically a loop that runs
    /// until the term ends: each write in a transaction guarded by
    /// `term.lease()` (the `leasehold-pg` guard, which ends the term on a
    /// refusal, as [`Term::mark_superseded`] does). It may also return to
    /// hand leadership on.
    ///
    /// While it runs it reports through the election's INFO events
    /// (`elected`, `term ended` with why) and metrics, and a WARN for a
    /// campaign that failed for a fault (it pauses, 100 ms doubling up to
    /// 5 s, and campaigns again).
    ///
    /// ```no_run
    /// # async fn demo(election: leasehold::Election<leasehold::HandoffLocker>) -> leasehold::Result<()> {
    /// use leasehold::CancellationToken;
    ///
    /// let shutdown = CancellationToken::new();
    /// // ... `shutdown.cancel()` on SIGTERM ...
    /// let served = election
    ///     .serve(&shutdown, async |term| {
    ///         // the leader's work, guarded with term.lease(), until the term ends
    ///         let _ = term.fence();
    ///         std::future::pending::<()>().await
    ///     })
    ///     .await?;
    /// println!("{} terms, {} lost", served.terms, served.lost);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Spawning it
    /// Give `work` what it needs by value (`async move |term| ...` over
    /// owned clones): today's rustc cannot prove the future `Send` for every
    /// lifetime of the `&Term` when an async closure *borrows* from its
    /// surroundings, and `tokio::spawn` then fails with "implementation of
    /// `Send` is not general enough".
    ///
    /// # Errors
    /// Only what cannot pass: a campaign's error that is not
    /// [retryable](Error::is_retryable) (a wrong password, a missing
    /// permission, a key of the wrong type), returned at once (a term it
    /// held is resigned first); also a term whose lease could not run the
    /// work (no tokio runtime). Faults that may pass are ridden out and
    /// counted in [`Served::faults`], for as long as they last.
    ///
    /// # Cancel safety
    /// Dropping the future drops the work at its current `.await` and the
    /// term (released in the background, the TTL as the fallback); prefer
    /// cancelling `shutdown`, which resigns.
    pub async fn serve(
        &self,
        shutdown: &CancellationToken,
        mut work: impl AsyncFnMut(&Term),
    ) -> Result<Served> {
        let mut served = Served::default();
        let mut backoff = FAULT_BACKOFF_MIN;
        loop {
            let campaign = tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(served),
                campaign = self.campaign() => campaign,
            };
            let term = match campaign {
                Ok(term) => {
                    backoff = FAULT_BACKOFF_MIN;
                    term
                }
                Err(err) if err.is_retryable() => {
                    served.faults += 1;
                    tracing::warn!(
                        target: "leasehold::election",
                        election = self.inner.name,
                        candidate = self.inner.candidate,
                        error = %err,
                        pause_ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX),
                        "campaign failed for a fault; campaigning again after a pause"
                    );
                    tokio::select! {
                        biased;
                        () = shutdown.cancelled() => return Ok(served),
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(FAULT_BACKOFF_MAX);
                    continue;
                }
                Err(err) => return Err(err),
            };
            served.terms += 1;
            let ran = term
                .run(async {
                    tokio::select! {
                        biased;
                        () = shutdown.cancelled() => true,
                        () = work(&term) => false,
                    }
                })
                .await;
            match ran {
                Ok(stopped) => {
                    if !stopped {
                        served.finished += 1;
                    }
                    if let Err(err) = term.resign().await {
                        tracing::debug!(
                            target: "leasehold::election",
                            election = self.inner.name,
                            error = %err,
                            "could not resign; the term's ttl ends it"
                        );
                    }
                    if stopped {
                        return Ok(served);
                    }
                }
                Err(Error::LeaseLost { .. }) => {
                    served.lost += 1;
                    // Already lost: a quiet end, whatever is left to give
                    // back given back.
                    let _ = term.resign().await;
                }
                Err(err) => {
                    let _ = term.resign().await;
                    return Err(err);
                }
            }
        }
    }
}
