//! The etcd lab: a throwaway cluster of three members (the test kit's
//! [`EtcdCluster`]), and how each etcd fault starts, repeats and ends on
//! it.
//!
//! The callers dial the members' client endpoints ([`Lab::node_urls`],
//! each worker starting at another member). The faults hit the members
//! the etcd way of taking a lease must ride out: the leader killed, a
//! follower paused, the leader cut off from its peers (a minority), two
//! members cut off (no majority), the whole cluster restarted, and an
//! operator revoking the leases that hold lock keys.

use std::time::Duration;

use leasehold::etcd::{EtcdClient, Range};
use leasehold_testkit::EtcdCluster;

use super::error::server;
use super::servers::{Primary, Servers};
use super::{Lab, LabError, LabOptions};
use crate::fault::Fault;

/// How long the lab waits for a leader (after an election) before it
/// names a member to fault.
const LEADER_WAIT: Duration = Duration::from_secs(10);

/// How long one revoke round (a read of the lock keys, then one revoke
/// per lease) may take.
const REVOKE_TIMEOUT: Duration = Duration::from_secs(2);

/// The prefix [`Fault::EtcdRevoke`] looks under: the etcd way's keys
/// (`leasehold/`) and the Lock RPC control's (`leasehold-rpc/`).
pub(super) const ETCD_LOCK_PREFIX: &str = "leasehold";

/// The throwaway etcd cluster, and the members the fault in progress hit.
pub(super) struct EtcdLab {
    pub(super) cluster: EtcdCluster,
    /// The members the current window faulted, to undo at its end.
    pub(super) hit: Vec<usize>,
}

impl Lab {
    /// A lab on a throwaway etcd cluster of three members (and the
    /// options' PostgreSQL): no Redis at all.
    pub(super) fn start_etcd(options: &LabOptions) -> Result<Lab, LabError> {
        if options.replica
            || options.aof
            || options.nodes > 1
            || options.acl_user
            || options.cluster
            || options.sentinel
        {
            return Err(LabError::Options(
                "an etcd lab has no redis: no replica, AOF, extra nodes, acl user, cluster or sentinel setup",
            ));
        }
        options.check_single(
            "tls, proxy, redis options and a fake clock do not apply to an etcd lab",
        )?;
        let cluster = EtcdCluster::start(3).map_err(server("starting an etcd cluster"))?;
        let primary = Primary::Etcd(EtcdLab {
            cluster,
            hit: Vec::new(),
        });
        Ok(Lab::assemble(
            Servers::new(primary, options),
            None,
            false,
            None,
        ))
    }

    /// Whether the callers use an etcd cluster ([`node_urls`](Self::node_urls)
    /// are then its members' client endpoints).
    pub fn is_etcd(&self) -> bool {
        matches!(self.servers().primary, Primary::Etcd(_))
    }
}

/// The etcd lab of `primary`, or [`LabError::Unsupported`].
pub(super) fn etcd_lab(primary: &mut Primary, fault: Fault) -> Result<&mut EtcdLab, LabError> {
    match primary {
        Primary::Etcd(lab) => Ok(lab),
        _ => Err(LabError::Unsupported {
            fault,
            needs: "a throwaway etcd cluster (the etcd modes)",
        }),
    }
}

impl EtcdLab {
    /// The leader's index, once there is one.
    fn leader(&self) -> Result<usize, LabError> {
        self.cluster
            .wait_for_leader(LEADER_WAIT)
            .map_err(server("finding the etcd leader"))
    }

    /// Starts `fault` (an etcd fault); what it hit, for the history.
    pub(super) fn begin(&mut self, fault: Fault) -> Result<String, LabError> {
        let size = self.cluster.len();
        let target = match fault {
            Fault::EtcdLeaderKill => {
                let leader = self.leader()?;
                self.cluster
                    .member(leader)
                    .stop()
                    .map_err(server("killing the etcd leader"))?;
                self.hit = vec![leader];
                format!("etcd m{leader} (the leader, killed)")
            }
            Fault::EtcdMemberPause => {
                let leader = self.leader()?;
                let follower = (leader + 1) % size;
                self.cluster
                    .member(follower)
                    .pause()
                    .map_err(server("pausing an etcd follower"))?;
                self.hit = vec![follower];
                format!("etcd m{follower} (a follower, paused)")
            }
            Fault::EtcdMinorityCut => {
                let leader = self.leader()?;
                self.cluster.member(leader).cut_off();
                self.hit = vec![leader];
                format!("etcd m{leader} (the leader, cut off from its peers)")
            }
            Fault::EtcdMajorityCut => {
                let leader = self.leader()?;
                let cut = [leader, (leader + 1) % size];
                for &member in &cut {
                    self.cluster.member(member).cut_off();
                }
                self.hit = cut.to_vec();
                format!("etcd m{} and m{} (a majority, cut off)", cut[0], cut[1])
            }
            Fault::EtcdRestart => {
                for member in self.cluster.members() {
                    member.stop().map_err(server("killing an etcd member"))?;
                }
                self.hit = (0..size).collect();
                "etcd (every member, killed)".to_owned()
            }
            Fault::EtcdRevoke => {
                self.revoke()?;
                "etcd leases of the lock keys".to_owned()
            }
            Fault::EtcdNoSpace => {
                self.cluster
                    .member(0)
                    .set_no_space_alarm(true)
                    .map_err(server("raising etcd's NOSPACE alarm"))?;
                "etcd (out of space: its NOSPACE alarm raised)".to_owned()
            }
            _ => return Err(etcd_only(fault)),
        };
        Ok(target)
    }

    /// Ends `fault`: starts, resumes or heals what it hit.
    pub(super) fn end(&mut self, fault: Fault) -> Result<(), LabError> {
        let hit = std::mem::take(&mut self.hit);
        match fault {
            Fault::EtcdLeaderKill => {
                for member in hit {
                    self.cluster
                        .member(member)
                        .start()
                        .map_err(server("starting the old etcd leader again"))?;
                }
            }
            Fault::EtcdMemberPause => {
                for member in hit {
                    self.cluster
                        .member(member)
                        .resume()
                        .map_err(server("resuming an etcd member"))?;
                }
            }
            Fault::EtcdMinorityCut | Fault::EtcdMajorityCut => {
                for member in hit {
                    self.cluster.member(member).heal();
                }
            }
            Fault::EtcdRestart => self
                .cluster
                .restart()
                .map_err(server("starting the etcd cluster again"))?,
            Fault::EtcdRevoke => {}
            Fault::EtcdNoSpace => self
                .cluster
                .member(0)
                .set_no_space_alarm(false)
                .map_err(server("clearing etcd's NOSPACE alarm"))?,
            _ => return Err(etcd_only(fault)),
        }
        Ok(())
    }

    /// Revokes every etcd lease that holds a key under
    /// [`ETCD_LOCK_PREFIX`], as an operator would: the keys go with them.
    /// Blocking (a runtime of its own, on the nemesis's thread).
    pub(super) fn revoke(&self) -> Result<(), LabError> {
        let endpoints = self.cluster.endpoints();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|_| LabError::Options("could not start a runtime for etcd requests"))?;
        runtime.block_on(async move {
            let failed = |what: &str| {
                let what = what.to_owned();
                move |source| LabError::Etcd { what, source }
            };
            let client = EtcdClient::builder(endpoints)
                .build()
                .map_err(failed("opening an etcd client"))?;
            let deadline = tokio::time::Instant::now() + REVOKE_TIMEOUT;
            let held = client
                .range(&Range::prefix(ETCD_LOCK_PREFIX), deadline)
                .await
                .map_err(failed("reading the lock keys"))?;
            let mut leases: Vec<i64> = held.kvs.iter().map(|kv| kv.lease).collect();
            leases.sort_unstable();
            leases.dedup();
            for lease in leases.into_iter().filter(|&lease| lease != 0) {
                client
                    .revoke(lease, deadline)
                    .await
                    .map_err(failed("revoking a lock key's lease"))?;
            }
            Ok(())
        })
    }

    /// Leaves every member running, resumed and healed. Called when a run
    /// ends, whatever happened.
    pub(super) fn heal(&self) {
        let stopped = self.cluster.members().iter().any(|m| !m.is_running());
        for member in self.cluster.members() {
            member.heal();
            if member.is_paused() {
                let _ = member.resume();
            }
        }
        if stopped {
            let _ = self.cluster.restart();
        }
    }

    /// Every member's log, for a failure message.
    pub(super) fn logs(&self) -> String {
        let mut out = String::new();
        for member in self.cluster.members() {
            out.push_str(&format!(
                "--- etcd member {} ---\n{}\n",
                member.name(),
                member.log()
            ));
        }
        out
    }
}

fn etcd_only(fault: Fault) -> LabError {
    LabError::Unsupported {
        fault,
        needs: "a redis server (the etcd lab has only etcd)",
    }
}
