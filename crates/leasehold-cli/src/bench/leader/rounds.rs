//! The measured rounds: a leader that resigns, one that is stopped, and
//! the faults on a way's servers; each change of leader they see.

use std::time::Duration;

use anyhow::Context;
use leasehold_testkit::RedisServer;
use rand::RngExt;
use serde_json::json;
use tokio::time::Instant;

use super::candidate::{Event, now_us};
use super::team::{Team, connect};
use crate::bench::round3;

/// How many times, and how far apart, the connections fault kills the
/// clients.
const KILLS: u32 = 4;
const KILL_EVERY: Duration = Duration::from_millis(300);

/// How long after a fault's end a leader still leading has kept its term.
const KEPT_MARGIN: Duration = Duration::from_millis(500);

/// A fault, injected on a way's servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    Restart,
    Connections,
}

impl Fault {
    pub(super) const ALL: [Fault; 2] = [Fault::Restart, Fault::Connections];

    pub(super) fn name(self) -> &'static str {
        match self {
            Fault::Restart => "restart",
            Fault::Connections => "connections",
        }
    }

    /// Injects the fault on `servers` (a way's); returns when it ended, in
    /// microseconds since the epoch.
    async fn inject(self, servers: &mut [RedisServer], round: u32) -> anyhow::Result<u64> {
        match self {
            Fault::Restart => {
                let at = round as usize % servers.len();
                tokio::task::block_in_place(|| servers[at].restart())
                    .context("restarting a redis-server")?;
            }
            Fault::Connections => {
                for kill in 0..KILLS {
                    if kill > 0 {
                        tokio::time::sleep(KILL_EVERY).await;
                    }
                    for server in servers.iter() {
                        tokio::task::block_in_place(|| {
                            server.command(&["CLIENT", "KILL", "TYPE", "normal"])
                        })
                        .context("killing a redis-server's connections")?;
                    }
                }
            }
        }
        Ok(now_us())
    }
}

/// One fault round's outcome.
pub(super) struct FaultRound {
    pub(super) round: u32,
    pub(super) fault: Fault,
    /// Errors returned to the candidates during the round.
    pub(super) errors: usize,
    /// The terms lost during the round, with their causes.
    pub(super) lost: Vec<String>,
    /// From the fault's end to the next election; `None`: the leader kept
    /// its term.
    pub(super) to_elected_ms: Option<f64>,
}

impl FaultRound {
    pub(super) fn json(&self) -> serde_json::Value {
        json!({
            "round": self.round,
            "fault": self.fault.name(),
            "errors": self.errors,
            "lost_terms": self.lost.len(),
            "lost": self.lost,
            "fault_end_to_elected_ms": self.to_elected_ms.map(round3),
        })
    }
}

/// One measured change of leader.
pub(super) struct Handover {
    pub(super) round: u32,
    pub(super) kind: &'static str,
    pub(super) from: u32,
    pub(super) to: u32,
    pub(super) from_fence: u64,
    pub(super) to_fence: u64,
}

impl Handover {
    pub(super) fn json(&self) -> serde_json::Value {
        json!({
            "round": self.round,
            "kind": self.kind,
            "from": format!("c{}", self.from),
            "to": format!("c{}", self.to),
            "from_fence": self.from_fence,
            "to_fence": self.to_fence,
        })
    }
}

impl Team {
    /// The leader resigns; another takes over.
    pub(super) async fn resign_round(&mut self, round: u32) -> anyhow::Result<()> {
        let mut spoiled = 0;
        loop {
            let (leader, fence) = self.settle(Duration::ZERO).await?;
            self.send(leader, &format!("resign {fence}")).await?;
            let deadline = Instant::now() + self.hang();
            let (mut resigned, mut elected, mut lost) = (None, None, false);
            while !lost && (resigned.is_none() || elected.is_none()) {
                match self.next_event(deadline).await? {
                    (id, Event::Resigned { before_us, .. }) if id == leader => {
                        resigned = Some(before_us);
                    }
                    (id, Event::Lost { .. } | Event::Error { .. }) if id == leader => lost = true,
                    (id, Event::Elected { fence, at_us }) if id != leader && elected.is_none() => {
                        elected = Some((id, fence, at_us));
                    }
                    _ => {}
                }
            }
            // A candidate still campaigning ignores it.
            self.send(leader, "campaign").await?;
            let (Some(before_us), Some((to, to_fence, at_us)), false) = (resigned, elected, lost)
            else {
                self.redo(&mut spoiled)?;
                continue;
            };
            self.resign_ms.push(micros_between(before_us, at_us));
            self.handovers.push(Handover {
                round,
                kind: "resign",
                from: leader,
                to,
                from_fence: fence,
                to_fence,
            });
            return Ok(());
        }
    }

    /// The leader is stopped at a random moment of its watchdog's period;
    /// another takes over when its lease runs out. Then the stopped one is
    /// killed and a fresh candidate joins.
    pub(super) async fn stop_round(&mut self, round: u32) -> anyhow::Result<()> {
        let mut spoiled = 0;
        loop {
            let phase = rand::rng().random_range(Duration::ZERO..self.ttl / 3);
            let (leader, fence) = self.settle(phase).await?;
            let pid = self
                .members
                .iter()
                .find(|m| m.id == leader)
                .and_then(|m| m.child.id())
                .context("the leader's process id")?;
            let stopped_us = now_us();
            tokio::task::spawn_blocking(move || leasehold_testkit::pause_process(pid))
                .await
                .context("stopping the leader")?
                .context("stopping the leader")?;
            let expiry_us = self.lock_expiry().await?;
            let deadline = Instant::now() + self.hang();
            let (mut elected, mut lost) = (None, false);
            while elected.is_none() {
                match self.next_event(deadline).await? {
                    // Printed before the stop: the term was over already.
                    (id, Event::Lost { .. }) if id == leader => lost = true,
                    (id, Event::Elected { fence, at_us }) if id != leader => {
                        elected = Some((id, fence, at_us));
                    }
                    _ => {}
                }
            }
            self.replace(leader).await?;
            let Some((to, to_fence, at_us)) = elected.filter(|_| !lost) else {
                self.redo(&mut spoiled)?;
                continue;
            };
            self.stop_ms.push(micros_between(stopped_us, at_us));
            self.expiry_ms.push(micros_between(expiry_us, at_us));
            self.handovers.push(Handover {
                round,
                kind: "stop",
                from: leader,
                to,
                from_fence: fence,
                to_fence,
            });
            return Ok(());
        }
    }

    /// A fault on the way's `servers` while the leader leads and the others
    /// campaign; then waits for the next election, or for the leader to
    /// have kept its term.
    pub(super) async fn fault_round(
        &mut self,
        round: u32,
        fault: Fault,
        servers: &mut [RedisServer],
    ) -> anyhow::Result<()> {
        let (leader, fence) = self.settle(Duration::ZERO).await?;
        let (errors, lost) = (self.errors.len(), self.lost.len());
        let ended_us = fault.inject(servers, round).await?;
        let kept_by = Instant::now() + self.ttl + KEPT_MARGIN;
        let hang = Instant::now() + self.hang();
        let elected_us = loop {
            let leading = self.leader == Some((leader, fence));
            if leading && Instant::now() >= kept_by {
                break None;
            }
            match self.pump(if leading { kept_by } else { hang }).await? {
                Some((_, Event::Elected { at_us, .. })) => break Some(at_us),
                Some(_) => {}
                None => anyhow::ensure!(
                    leading,
                    "{}: no leader elected within {:?} of a {} fault",
                    self.way.name(),
                    self.hang(),
                    fault.name()
                ),
            }
        };
        // The old leader may find its term lost after another's election.
        while self.pump(kept_by).await?.is_some() {}
        // The fault ended the bench's own connections too.
        self.nodes = connect(&self.spec.urls).await?;
        self.faults.push(FaultRound {
            round,
            fault,
            errors: self.errors.len() - errors,
            lost: self.lost[lost..].to_vec(),
            to_elected_ms: elected_us.map(|at_us| micros_between(ended_us, at_us)),
        });
        Ok(())
    }
}

/// Milliseconds from `from` to `to`, both in microseconds since the epoch.
fn micros_between(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / 1e3
}
