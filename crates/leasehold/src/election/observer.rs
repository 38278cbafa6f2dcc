//! Who leads: the [`Leader`] a leader record names, and an [`Observer`]
//! that reports each change.

use std::time::Duration;

use crate::budget::Budget;
use crate::error::{Error, Result};
use crate::fencing::FencingToken;
use crate::lessor::Lessor;
use crate::service::Service;
use crate::token::HolderId;

use super::Election;
#[cfg(doc)]
use super::ElectionBuilder;

impl<L: Lessor> Election<L> {
    /// An observer of this election's leader: its first
    /// [`changed`](Observer::changed) says who leads now, each later one
    /// waits for the next change.
    pub fn observe(&self) -> Observer<L> {
        Observer {
            election: self.clone(),
            last: None,
            started: false,
        }
    }
}

/// Who leads an election, from its leader record.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Leader {
    /// The name the leader campaigned under.
    pub candidate: String,
    /// Its term's fencing token.
    pub fence: FencingToken,
    /// Its holder, as the `leasehold-pg` guard records it.
    pub holder: HolderId,
    /// The lock's time to live when read: the term ends within it unless
    /// the leader's watchdog refreshes it.
    pub expires_within: Duration,
}

impl Leader {
    pub(super) fn parse(body: &str, pttl: i64, service: Service) -> Result<Leader> {
        let bad = || Error::UnexpectedReply {
            service,
            op: "read leader",
        };
        let mut fields = body.splitn(3, '\n');
        let fence = fields
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .filter(|f| *f > 0)
            .ok_or_else(bad)?;
        let holder = fields.next().and_then(HolderId::parse).ok_or_else(bad)?;
        let candidate = fields.next().ok_or_else(bad)?.to_owned();
        Ok(Leader {
            candidate,
            fence: FencingToken::new(fence),
            holder,
            expires_within: Duration::from_millis(u64::try_from(pttl).unwrap_or(0)),
        })
    }
}

/// Reports each change of an election's leader ([`Election::observe`]).
///
/// It asks Redis every [`observe_every`](ElectionBuilder::observe_every),
/// so a change is seen within that period plus a round trip; a leader
/// that stops without resigning is seen gone when its lease runs out.
#[derive(Debug)]
pub struct Observer<L: Lessor> {
    election: Election<L>,
    last: Option<(HolderId, FencingToken)>,
    started: bool,
}

impl<L: Lessor> Observer<L> {
    /// The first call: who leads now (`None`: nobody, or nobody named).
    /// Each later call: waits until that changes (another term, or no
    /// leader) and returns the new state.
    ///
    /// Faults are ridden out for the election's budget.
    ///
    /// # Errors
    /// A fault's error once every read failed for the budget; at once,
    /// what cannot pass (as [`Election::leader`]).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call changes nothing, and the next one
    /// compares with the last state returned.
    pub async fn changed(&mut self) -> Result<Option<Leader>> {
        let inner = &*self.election.inner;
        let mut faults: Option<Budget> = None;
        loop {
            match self.election.leader().await {
                Ok(leader) => {
                    faults = None;
                    let now = leader.as_ref().map(|l| (l.holder, l.fence));
                    if !self.started || now != self.last {
                        self.started = true;
                        self.last = now;
                        return Ok(leader);
                    }
                }
                Err(err) if crate::call::fault_may_pass(&err) => {
                    if inner.fault_budget(&mut faults).is_spent() {
                        return Err(err);
                    }
                }
                Err(err) => return Err(err),
            }
            tokio::time::sleep(inner.observe_every).await;
        }
    }
}
