//! Your own leader loop under the harness: [`Harness::run_leaders`](crate::Harness::run_leaders)
//! runs it on every caller, where a plain run ([`Harness::run`](crate::Harness::run)) runs the
//! harness's own caller loop around your write.
//!
//! A leader-elected service is more than its write path: it campaigns,
//! works under a term, resigns, campaigns again after a lost term or a
//! fault, and its guarded transaction ends the term on a refusal. A plain
//! run exercises none of that (it takes a lease per term itself and marks
//! it superseded on a refusal for you). Here each caller runs *your*
//! loop, typically [`Election::serve`](leasehold::Election::serve) with
//! your term's work, built on the lab's lock ([`Candidate::lessor`]),
//! until the run's end ([`Candidate::shutdown`]); the harness only
//! watches:
//!
//! - [`Candidate::term`] at the top of a term's work records the term as
//!   a lease of the history (won now; ended, and how, when the record is
//!   dropped: the work returned, or was stopped because the term was
//!   lost);
//! - [`TermRecord::write`] around each write records it (its resource and
//!   amount drawn as in a plain run, its fence the term's) and hands your
//!   write a [`Call`] whose [`pause_point`](Call::pause_point) is where
//!   the holder-pause fault freezes the candidate, its watchdog included
//!   (each candidate runs on its own thread and runtime, as in a plain
//!   run);
//! - an error your loop returns is recorded as an error returned to a
//!   caller (an acquire's: the campaign), judged against the run's wait
//!   as in the matrix.
//!
//! What the harness does *not* do here is what your loop must: it never
//! marks a term superseded on a refused write (the `leasehold-pg` guard
//! ends the term itself on a refusal; an in-memory check of your own calls
//! [`Term::mark_superseded`](leasehold::Term::mark_superseded)), never
//! resigns and never campaigns. A loop that forgets one of them shows it:
//! a term that writes on after a refusal keeps being refused, a loop that
//! stops campaigning writes nothing more.
//!
//! ```no_run
//! # async fn demo(lab: &leasehold_chaos::Lab, lock: &leasehold_chaos::Lock) -> Result<(), Box<dyn std::error::Error>> {
//! use leasehold::Election;
//! use leasehold_chaos::{Harness, Outcome, Writes};
//!
//! let harness = Harness::new("my-scheduler").callers(3);
//! let report = harness
//!     .run_leaders(
//!         lab,
//!         lock,
//!         async |_n| (),
//!         async |_state, candidate| {
//!             let election = Election::builder(candidate.lessor(), "scheduler")
//!                 .candidate(candidate.actor())
//!                 .ttl(candidate.ttl())
//!                 .build()?;
//!             election
//!                 .serve(candidate.shutdown(), async |term| {
//!                     let record = candidate.term(term);
//!                     loop {
//!                         record
//!                             .write(async |call| {
//!                                 call.pause_point().await;
//!                                 // your guarded transaction, with term.lease()
//!                                 Outcome::Committed
//!                             })
//!                             .await;
//!                     }
//!                 })
//!                 .await?;
//!             Ok(())
//!         },
//!         async |writes: &Writes| vec![writes.check_counter("account:1", 0, 0)],
//!     )
//!     .await?;
//! assert!(report.holds(), "{}", report.summary());
//! # Ok(())
//! # }
//! ```

use std::cell::{Cell, RefCell};
use std::time::Duration;

use leasehold::{CancellationToken, DynLessor, FencingToken, Term};
use rand::{RngExt, SeedableRng, rngs::StdRng};

use crate::callers::{Call, caller_error, label, record_lost};
use crate::history::Kind;
use crate::isolated::Seat;
use crate::outcome::{Outcome, Writes};

/// One candidate of a [`Harness::run_leaders`](crate::Harness::run_leaders)
/// run, as your leader loop sees it: the lab's lock to build your
/// election on, the run's settings, the shutdown at its end, and the
/// records of its terms and writes.
pub struct Candidate<'a> {
    seat: Seat<'a>,
    lessor: DynLessor,
    actor: String,
    rng: RefCell<StdRng>,
    op: Cell<u64>,
    writes: RefCell<Writes>,
}

impl std::fmt::Debug for Candidate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate")
            .field("actor", &self.actor)
            .finish_non_exhaustive()
    }
}

impl<'a> Candidate<'a> {
    /// The candidate of `seat`, campaigning through `lessor`.
    pub(crate) fn new(seat: Seat<'a>, lessor: DynLessor) -> Candidate<'a> {
        let settings = seat.settings;
        let rng = StdRng::seed_from_u64(
            settings.seed
                ^ (u64::from(settings.worker) << 32 | u64::from(seat.task))
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        Candidate {
            actor: format!("w{}.t{}", settings.worker, seat.task),
            seat,
            lessor,
            rng: RefCell::new(rng),
            op: Cell::new(0),
            writes: RefCell::new(Writes::default()),
        }
    }

    /// Who this candidate is in the history (`w0.t2`): a name to campaign
    /// as ([`ElectionBuilder::candidate`](leasehold::ElectionBuilder::candidate)).
    pub fn actor(&self) -> &str {
        &self.actor
    }

    /// The lab's lock, to build your election on: the way and the servers
    /// the run's faults hit.
    pub fn lessor(&self) -> DynLessor {
        self.lessor.clone()
    }

    /// The harness's TTL ([`Harness::ttl`](crate::Harness::ttl)), for your
    /// election's terms.
    pub fn ttl(&self) -> Duration {
        self.seat.settings.ttl
    }

    /// The harness's wait ([`Harness::wait`](crate::Harness::wait)): the
    /// errors your loop returns are judged against it.
    pub fn wait(&self) -> Duration {
        self.seat.settings.wait
    }

    /// Cancelled when the run ends: give it to
    /// [`Election::serve`](leasehold::Election::serve) (which then resigns
    /// and returns), or stop your loop on it.
    pub fn shutdown(&self) -> &CancellationToken {
        self.seat.stop
    }

    /// Records `term` as won now (a lease of the history, with its fence);
    /// dropping the record ends it there: lost (and why) if its lease is
    /// lost, otherwise let go. Call it first in a term's work and keep it
    /// for the term.
    pub fn term<'t>(&'t self, term: &'t Term) -> TermRecord<'t> {
        let lease = term.lease();
        let op = self.next_op();
        let key = lease.key().to_owned();
        let token = label(lease);
        self.seat.recorder.record(
            &self.actor,
            Kind::Acquired {
                op,
                key: key.clone(),
                token: token.clone(),
                fence: Some(term.fence().get()),
            },
        );
        TermRecord {
            candidate: self,
            term,
            key,
            token,
        }
    }

    /// What this candidate's writes reported, once its loop has returned.
    pub(crate) fn into_writes(self) -> Writes {
        self.writes.into_inner()
    }

    /// Records the error that ended your loop, as the campaign's.
    pub(crate) fn record_error(&self, err: &leasehold::Error) {
        let key = format!("election of {}", self.actor);
        self.seat
            .recorder
            .record(&self.actor, caller_error("acquire", &key, err));
    }

    fn next_op(&self) -> u64 {
        let op = self.op.get() + 1;
        self.op.set(op);
        op
    }
}

/// One term as the history records it: from [`Candidate::term`] until
/// dropped. Write under it with [`write`](Self::write).
pub struct TermRecord<'a> {
    candidate: &'a Candidate<'a>,
    term: &'a Term,
    key: String,
    token: String,
}

impl std::fmt::Debug for TermRecord<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TermRecord")
            .field("key", &self.key)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl TermRecord<'_> {
    /// Runs one write of the term: `write` gets a [`Call`] (a resource and
    /// an amount drawn from the harness's, the term's lease, a pause
    /// point) and answers what it did; the write is recorded with the
    /// term's fence and tallied, and its outcome returned to your loop.
    /// The harness does nothing on a refusal: your loop ends the term (the
    /// `leasehold-pg` guard does it itself).
    ///
    /// It yields to the runtime first: a loop of writes that return at
    /// once (an in-memory path stopped because the term is lost) still
    /// lets the term's own watch run and end the work.
    pub async fn write(&self, write: impl AsyncFnOnce(Call<'_>) -> Outcome) -> Outcome {
        tokio::task::yield_now().await;
        let candidate = self.candidate;
        let settings = candidate.seat.settings;
        let (resource, amount) = {
            let mut rng = candidate.rng.borrow_mut();
            let resource = match settings.resources.len() {
                0 => String::new(),
                n => settings.resources[rng.random_range(0..n)].clone(),
            };
            (resource, rng.random_range(settings.amounts.clone()))
        };
        let op = candidate.next_op();
        let started_us = candidate.seat.recorder.now_us();
        let call = Call::new(
            &candidate.actor,
            &resource,
            amount,
            Some(self.term.lease()),
            candidate.seat.stall,
        );
        // A write dropped mid-flight (the loop's term ended, or the run's
        // shutdown stopped `serve`, while its commit was out) may have
        // landed: recorded as unknown, never as nothing.
        let mut pending = Pending {
            record: self,
            op,
            started_us,
            resource: Some((resource.clone(), amount)),
        };
        let outcome = write(call).await;
        pending.resource = None;
        self.tally(op, started_us, resource, amount, &outcome);
        outcome
    }

    /// Tallies and records one write of the term.
    fn tally(&self, op: u64, started_us: u64, resource: String, amount: i64, outcome: &Outcome) {
        let candidate = self.candidate;
        candidate
            .writes
            .borrow_mut()
            .add(&resource, amount, outcome);
        let (recorded, detail) = outcome.recorded();
        candidate.seat.recorder.record(
            &candidate.actor,
            Kind::Write {
                op,
                started_us,
                key: self.key.clone(),
                resource,
                amount,
                fence: Some(self.term.fence().get()),
                outcome: recorded,
                detail,
            },
        );
    }

    /// The term's fencing token.
    pub fn fence(&self) -> FencingToken {
        self.term.fence()
    }
}

impl Drop for TermRecord<'_> {
    fn drop(&mut self) {
        let candidate = self.candidate;
        let (recorder, actor) = (candidate.seat.recorder, candidate.actor.as_str());
        let lost = self.term.lease().lost();
        if let Some(cause) = lost {
            record_lost(recorder, actor, &self.key, &self.token, cause);
        }
        recorder.record(
            actor,
            Kind::Released {
                key: self.key.clone(),
                token: self.token.clone(),
                outcome: if lost.is_some() {
                    "not_held"
                } else {
                    "released"
                }
                .to_owned(),
            },
        );
    }
}

/// The body of a candidate: your leader loop `lead` with the candidate's
/// state, once, until it returns (at the run's end, or early with an
/// error, which is recorded); what its terms wrote.
pub(crate) fn leader<S, L>(
    lead: std::sync::Arc<L>,
) -> impl AsyncFn(Seat<'_>, &mut S) -> Writes + Send + Sync + 'static
where
    S: 'static,
    L: AsyncFn(&mut S, &Candidate<'_>) -> leasehold::Result<()> + Send + Sync + 'static,
{
    async move |seat: Seat<'_>, state: &mut S| {
        let Some(lessor) = seat.lock.lessor().cloned() else {
            return Writes::default();
        };
        let candidate = Candidate::new(seat, lessor);
        if let Err(err) = lead(state, &candidate).await {
            candidate.record_error(&err);
        }
        candidate.into_writes()
    }
}

/// A write of a [`TermRecord`] under way: recorded as
/// [`Outcome::Unknown`] if its future is dropped before it answers.
struct Pending<'r, 'c> {
    record: &'r TermRecord<'c>,
    op: u64,
    started_us: u64,
    /// `None` once the write answered.
    resource: Option<(String, i64)>,
}

impl Drop for Pending<'_, '_> {
    fn drop(&mut self) {
        if let Some((resource, amount)) = self.resource.take() {
            let outcome =
                Outcome::Unknown("dropped while under way (its commit may have landed)".to_owned());
            self.record
                .tally(self.op, self.started_us, resource, amount, &outcome);
        }
    }
}
