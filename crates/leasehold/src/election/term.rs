//! A leader's term: its lease under the watchdog and its fencing token,
//! until it is lost or resigned, and how a term that [`Election::lead`]
//! ran ended.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::fencing::FencingToken;
use crate::lease::Lease;
use crate::lost::LostCause;
use crate::metrics;
use crate::token::HolderId;
use crate::watchdog::Shared;

#[cfg(doc)]
use super::{Election, ElectionBuilder};

/// How a term that [`Election::lead`] ran ended.
#[derive(Debug)]
#[non_exhaustive]
#[must_use]
pub enum TermOutcome<T> {
    /// The work ran to its end, then the term was resigned.
    Finished {
        /// What the work returned.
        output: T,
        /// How resigning went ([`Term::resign`]); an error here does not
        /// undo what the work did.
        resign: Result<()>,
    },
    /// The term was lost before the work finished: the work was stopped at
    /// an `.await` (a transaction not committed was rolled back).
    Lost {
        /// Why.
        cause: LostCause,
        /// The lost term's fencing token.
        fence: FencingToken,
    },
}

/// One candidate's term as leader: its lease (under the watchdog) and its
/// fencing token. See the [module docs](super).
///
/// Give it back with [`resign`](Self::resign) to hand leadership on at
/// once. Dropping it releases the lease in the background (the TTL as the
/// fallback).
#[must_use = "a term should end with `resign().await`; dropping it releases in the background"]
#[derive(Debug)]
pub struct Term {
    lease: Lease,
    fence: FencingToken,
    candidate: String,
    tally: Tally,
    resigned_at: Arc<Mutex<Option<Instant>>>,
}

impl Term {
    /// The term that starts with `lease` (named in the leader record
    /// already), its end counted and traced once.
    pub(super) fn new(
        lease: Lease,
        fence: FencingToken,
        candidate: String,
        election: String,
        resigned_at: Arc<Mutex<Option<Instant>>>,
    ) -> Term {
        Term {
            tally: Tally {
                shared: lease.shared().clone(),
                election,
                fence,
                started: Instant::now(),
                ended: false,
            },
            lease,
            fence,
            candidate,
            resigned_at,
        }
    }
    /// The term's fencing token: greater than every earlier term's of the
    /// election (see [`FencingToken`] for what that rests on).
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    /// The term's lease: give it to the `leasehold-pg` guard in each
    /// transaction of the term.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The term's holder, as the guard records it.
    pub fn holder(&self) -> HolderId {
        self.lease.holder()
    }

    /// The name this term's candidate campaigned under.
    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// Whether the term is believed to last: not lost, and its lease's
    /// confirmed deadline not passed. A `true` is no proof (a pause can
    /// fall right after it); the guard is what refuses a stale leader.
    pub fn is_leader(&self) -> bool {
        self.lease.lost().is_none() && !self.lease.remaining().is_zero()
    }

    /// Resolves when the term is lost, with why: the lease expired or
    /// changed hands, Redis could not confirm it before its deadline, or
    /// the term was [marked superseded](Self::mark_superseded).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) -> LostCause {
        if let Ok(token) = self.lease.watch() {
            token.cancelled().await;
        }
        self.lease.lost().unwrap_or(LostCause::Expired)
    }

    /// Runs `work` while the term lasts ([`Lease::run`]): stopped at its
    /// next `.await` when the term is lost, with [`Error::LeaseLost`].
    ///
    /// # Errors
    /// [`Error::LeaseLost`] with the [`LostCause`] when the term was lost
    /// before `work` finished.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work`; the term goes on.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output> {
        self.lease.run(work).await
    }

    /// Ends the term at once because a newer leader exists: the database
    /// refused one of its writes. The `leasehold-pg` guard does this
    /// itself on a refusal (`Guard::Refused`); call it when a check of your
    /// own refuses the term. Work under [`run`](Self::run) stops at its next
    /// `.await` and [`lost`](Self::lost) resolves with
    /// [`LostCause::Superseded`] ([`Lease::mark_superseded`]). Then
    /// [`resign`](Self::resign) (which finds the lock already gone, or
    /// gives it back) and campaign again.
    pub fn mark_superseded(&self) {
        self.lease.mark_superseded();
    }

    /// Steps down: gives the lease back at once (token-checked), so the
    /// next candidate leads without waiting for the TTL. A hand-off
    /// election hands the lock to the first waiting candidate in the same
    /// atomic step; on a polling way this election's next campaign first
    /// waits its [`step_down`](ElectionBuilder::step_down), so a waiting
    /// follower takes over.
    ///
    /// # Errors
    /// As [`Lease::release`]: [`Error::NotHeld`] when the term was lost in
    /// the lock service without the term knowing it yet; a fault's error
    /// when the service could not be asked (the TTL ends the term). A term
    /// whose loss was already reported ([`lost`](Self::lost) resolved, the
    /// work under [`run`](Self::run) stopped) ends quietly: `Ok`, as
    /// nothing is left to give back that the caller does not know of.
    ///
    /// # Cancel safety
    /// As [`Lease::release`].
    pub async fn resign(self) -> Result<()> {
        let Term {
            lease,
            mut tally,
            resigned_at,
            ..
        } = self;
        let lost = lease.lost();
        let released = match lease.release().await {
            // Its loss was already reported (the work stopped, `lost`
            // resolved): finding the lock gone tells the caller nothing new.
            Err(Error::NotHeld { .. } | Error::LeaseLost { .. }) if lost.is_some() => Ok(()),
            released => released,
        };
        *resigned_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        tally.end(lost.map_or("resigned", LostCause::label));
        released
    }
}

/// Counts and traces the end of a term, once: at resign, or when dropped.
#[derive(Debug)]
struct Tally {
    shared: Arc<Shared>,
    election: String,
    fence: FencingToken,
    started: Instant,
    ended: bool,
}

impl Tally {
    fn end(&mut self, end: &'static str) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let held = self.started.elapsed();
        tracing::info!(
            target: "leasehold::election",
            election = self.election,
            fence = self.fence.get(),
            end,
            held_ms = u64::try_from(held.as_millis()).unwrap_or(u64::MAX),
            "term ended"
        );
        metrics::term_ended(end, held);
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        let end = self.shared.lost().map_or("dropped", LostCause::label);
        self.end(end);
    }
}
