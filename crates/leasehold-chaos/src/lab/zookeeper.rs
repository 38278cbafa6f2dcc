//! The ZooKeeper lab: a throwaway ensemble of three servers (the test
//! kit's [`ZooKeeperEnsemble`]), and how each ZooKeeper fault starts,
//! repeats and ends on it.
//!
//! The callers dial every member through the test kit's proxy in front
//! of it ([`Lab::node_urls`], each worker's list starting at another
//! member), so that a member cut off is cut off from them too. The
//! faults hit what a lock on ZooKeeper must ride out: the leader killed,
//! a follower paused, the leader (a minority) or two members (a
//! majority) cut off from everyone, a full disk on the leader, the whole
//! ensemble restarted or rebuilt empty, and an operator deleting the
//! lock's node by hand.

use std::time::Duration;

use leasehold_testkit::ZooKeeperEnsemble;
use zookeeper_client::{Client, Error as ZkError};

use super::error::server;
use super::servers::{Primary, Servers};
use super::{Lab, LabError, LabOptions};
use crate::fault::Fault;

/// How long the lab waits for a leader (after an election) before it
/// names a member to fault.
const LEADER_WAIT: Duration = Duration::from_secs(10);

/// How long one round of [`Fault::ZookeeperNodeDelete`] (a session, a
/// listing of the lock directories, one delete per lock) may take.
const DELETE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the members healed at a cut's end may take to serve again
/// (an election, then catching up).
const HEAL_WAIT: Duration = Duration::from_secs(30);

/// How long a member whose disk was freed may take to serve again by
/// itself before the lab restarts it.
const DISK_RECOVERY: Duration = Duration::from_secs(5);

/// The session timeout the lab's own client asks for (the servers grant
/// at most 20 ticks).
const LAB_SESSION: Duration = Duration::from_secs(2);

/// The node under which the ZooKeeper modes' locks live (the locker's
/// default root): each lock key is a directory of contender nodes there.
const ZOOKEEPER_LOCK_ROOT: &str = leasehold_zookeeper::DEFAULT_ROOT;

/// The ensemble the callers use, and the members the fault in progress
/// hit.
pub(super) struct ZkLab {
    pub(super) ensemble: ZooKeeperEnsemble,
    /// The members the current window faulted, to undo at its end.
    hit: Vec<usize>,
}

impl Lab {
    /// A lab on a throwaway ZooKeeper ensemble of three servers and the
    /// options' PostgreSQL: no Redis at all.
    pub(super) fn start_zookeeper(options: &LabOptions) -> Result<Lab, LabError> {
        if options.names_redis() || options.names_etcd() {
            return Err(LabError::Options(
                "a zookeeper lab has no redis or etcd: no redis url, replica, AOF, extra nodes, acl user, cluster, sentinel or etcd setup",
            ));
        }
        options.check_single(
            "tls, proxy, redis options and a fake clock do not apply to a zookeeper lab",
        )?;
        let ensemble =
            ZooKeeperEnsemble::start(3).map_err(server("starting a zookeeper ensemble"))?;
        let lab = ZkLab {
            ensemble,
            hit: Vec::new(),
        };
        Ok(Lab::assemble(
            Servers::new(Primary::ZooKeeper(lab), options),
            None,
            false,
            None,
        ))
    }

    /// Whether the callers use a ZooKeeper ensemble
    /// ([`node_urls`](Self::node_urls) are then its members' client
    /// addresses, `127.0.0.1:PORT`, to join with `,` into a connect
    /// string).
    pub fn is_zookeeper(&self) -> bool {
        matches!(self.servers().primary, Primary::ZooKeeper(_))
    }
}

/// The ZooKeeper lab of `primary`, or [`LabError::Unsupported`].
pub(super) fn zookeeper_lab(primary: &mut Primary, fault: Fault) -> Result<&mut ZkLab, LabError> {
    match primary {
        Primary::ZooKeeper(lab) => Ok(lab),
        _ => Err(LabError::Unsupported {
            fault,
            needs: NEEDS_ZOOKEEPER,
        }),
    }
}

/// What the ZooKeeper faults need, for [`LabError::Unsupported`].
pub(super) const NEEDS_ZOOKEEPER: &str =
    "a throwaway zookeeper ensemble (LabOptions::zookeeper, the zookeeper modes)";

impl ZkLab {
    /// The addresses of the proxies in front of the members' client
    /// ports, in index order.
    pub(super) fn addresses(&self) -> Vec<String> {
        (0..self.ensemble.len())
            .map(|index| self.ensemble.proxied_client_addr(index).to_string())
            .collect()
    }

    /// Starts `fault` (a ZooKeeper fault); what it hit, for the history.
    pub(super) fn begin(&mut self, fault: Fault) -> Result<String, LabError> {
        let size = self.ensemble.len();
        let target = match fault {
            Fault::ZookeeperLeaderKill => {
                let leader = self.leader()?;
                self.member(leader, fault)?
                    .stop()
                    .map_err(server("killing the zookeeper leader"))?;
                self.hit = vec![leader];
                format!("zookeeper s{leader} (the leader, killed)")
            }
            Fault::ZookeeperMemberPause => {
                let leader = self.leader()?;
                let follower = (leader + 1) % size;
                self.member(follower, fault)?
                    .pause()
                    .map_err(server("pausing a zookeeper follower"))?;
                self.hit = vec![follower];
                format!("zookeeper s{follower} (a follower, paused)")
            }
            Fault::ZookeeperMinorityCut => {
                let leader = self.cut_off(&[0], fault)?;
                format!("zookeeper s{leader} (the leader, cut off)")
            }
            Fault::ZookeeperMajorityCut => {
                let leader = self.cut_off(&[0, 1], fault)?;
                let follower = (leader + 1) % size;
                format!("zookeeper s{leader} (the leader) and s{follower}, cut off")
            }
            Fault::ZookeeperDiskFull => {
                let leader = self.leader()?;
                self.member(leader, fault)?
                    .fill_disk()
                    .map_err(server("filling the zookeeper leader's disk"))?;
                self.hit = vec![leader];
                format!("zookeeper s{leader} (the leader, its disk full)")
            }
            Fault::ZookeeperRestart | Fault::ZookeeperRebuild => {
                for member in self.ensemble.members() {
                    member
                        .stop()
                        .map_err(server("killing a zookeeper server"))?;
                }
                self.hit = (0..size).collect();
                if fault == Fault::ZookeeperRestart {
                    return Ok("zookeeper (every server, killed)".to_owned());
                }
                for member in self.ensemble.members() {
                    member
                        .wipe()
                        .map_err(server("wiping a zookeeper server's data"))?;
                }
                "zookeeper (every server, killed and its data wiped)".to_owned()
            }
            Fault::ZookeeperNodeDelete => {
                self.delete_holders()?;
                format!("zookeeper: the holder's node of every lock under {ZOOKEEPER_LOCK_ROOT}")
            }
            _ => return Err(zookeeper_only(fault)),
        };
        Ok(target)
    }

    /// Ends `fault`: starts or resumes what it hit.
    pub(super) fn end(&mut self, fault: Fault) -> Result<(), LabError> {
        let hit = std::mem::take(&mut self.hit);
        match fault {
            Fault::ZookeeperLeaderKill => {
                for member in hit {
                    self.member(member, fault)?
                        .start()
                        .map_err(server("starting the old zookeeper leader again"))?;
                }
            }
            Fault::ZookeeperMemberPause => {
                for member in hit {
                    self.member(member, fault)?
                        .resume()
                        .map_err(server("resuming a zookeeper server"))?;
                }
            }
            Fault::ZookeeperMinorityCut | Fault::ZookeeperMajorityCut => {
                for member in hit {
                    self.ensemble.heal(member);
                }
                self.ensemble
                    .wait_healthy(HEAL_WAIT)
                    .map_err(server("waiting for the healed zookeeper servers"))?;
            }
            Fault::ZookeeperDiskFull => {
                for member in hit {
                    self.free_disk(member, fault)?;
                }
                self.ensemble
                    .wait_healthy(HEAL_WAIT)
                    .map_err(server("waiting for the zookeeper servers"))?;
            }
            Fault::ZookeeperRestart | Fault::ZookeeperRebuild => self
                .ensemble
                .restart()
                .map_err(server("starting the zookeeper ensemble again"))?,
            Fault::ZookeeperNodeDelete => {}
            _ => return Err(zookeeper_only(fault)),
        }
        Ok(())
    }

    /// Deletes the holder's node (the lowest contender) of every lock
    /// directory under [`ZOOKEEPER_LOCK_ROOT`], as an operator's
    /// `delete` would. Blocking: a session of its own on a runtime of its
    /// own (the nemesis's thread), closed when the round ends.
    pub(super) fn delete_holders(&self) -> Result<(), LabError> {
        let connect_string = self.ensemble.connect_string();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|_| LabError::Options("could not start a runtime for zookeeper requests"))?;
        let round = async move {
            let client = Client::connector()
                .with_session_timeout(LAB_SESSION)
                .connect(&connect_string)
                .await
                .map_err(failed("opening a zookeeper session"))?;
            let locks = match client.list_children(ZOOKEEPER_LOCK_ROOT).await {
                Ok(locks) => locks,
                // No lock taken yet.
                Err(ZkError::NoNode) => Vec::new(),
                Err(err) => return Err(failed("listing the lock directories")(err)),
            };
            for lock in locks {
                let dir = format!("{ZOOKEEPER_LOCK_ROOT}/{lock}");
                let children = match client.list_children(&dir).await {
                    Ok(children) => children,
                    // Removed by the server once empty (a container).
                    Err(ZkError::NoNode) => continue,
                    Err(err) => return Err(failed("listing a lock's contenders")(err)),
                };
                let Some(holder) = children
                    .iter()
                    .filter_map(|name| sequence_of(name).map(|seq| (seq, name)))
                    .min()
                    .map(|(_, name)| name)
                else {
                    continue;
                };
                match client.delete(&format!("{dir}/{holder}"), None).await {
                    // Released or expired meanwhile: nothing to delete.
                    Ok(()) | Err(ZkError::NoNode) => {}
                    Err(err) => return Err(failed("deleting a lock's node")(err)),
                }
            }
            Ok(())
        };
        runtime.block_on(async move {
            tokio::time::timeout(DELETE_TIMEOUT, round)
                .await
                .unwrap_or(Err(LabError::ZooKeeper {
                    what: "deleting the lock nodes".to_owned(),
                    source: ZkError::Timeout,
                }))
        })
    }

    /// Cuts off the members `offsets` away from the leader (0: the
    /// leader), to heal at the window's end; the leader's index.
    fn cut_off(&mut self, offsets: &[usize], fault: Fault) -> Result<usize, LabError> {
        let leader = self.leader()?;
        let size = self.ensemble.len();
        self.hit = offsets
            .iter()
            .map(|offset| (leader + offset) % size)
            .collect();
        for &member in &self.hit {
            self.member(member, fault)?;
            self.ensemble.cut_off(member);
        }
        Ok(leader)
    }

    /// Lifts member `index`'s full disk, and restarts it on its data
    /// unless it serves again within [`DISK_RECOVERY`] (ZooKeeper stops a
    /// member whose log write failed; its JVM may be gone, or hang on
    /// its way out).
    fn free_disk(&self, index: usize, fault: Fault) -> Result<(), LabError> {
        let member = self.member(index, fault)?;
        if member.is_running() {
            member
                .free_disk()
                .map_err(server("lifting the zookeeper member's file size limit"))?;
        }
        let deadline = std::time::Instant::now() + DISK_RECOVERY;
        while member.is_running() && std::time::Instant::now() < deadline {
            if member.is_serving() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        member.restart().map_err(server(
            "restarting the zookeeper member after its full disk",
        ))
    }

    /// Leaves every member running, resumed and healed. Called when a run
    /// ends, whatever happened.
    pub(super) fn heal(&self) {
        let stopped = self.ensemble.members().iter().any(|m| !m.is_running());
        for member in self.ensemble.members() {
            self.ensemble.heal(member.index());
            if member.is_disk_full() {
                let _ = member.free_disk();
            }
            if member.is_paused() {
                let _ = member.resume();
            }
        }
        if stopped {
            let _ = self.ensemble.restart();
        }
    }

    /// Every member's log, for a failure message.
    pub(super) fn logs(&self) -> String {
        let mut out = String::new();
        for member in self.ensemble.members() {
            out.push_str(&format!(
                "--- zookeeper server {} ---\n{}\n",
                member.index(),
                member.log()
            ));
        }
        out
    }

    /// The leader's index, once there is one.
    fn leader(&self) -> Result<usize, LabError> {
        self.ensemble
            .wait_for_leader(LEADER_WAIT)
            .map_err(server("finding the zookeeper leader"))
    }

    /// Member `index`, or an error (never a panic) if there is none.
    fn member(
        &self,
        index: usize,
        fault: Fault,
    ) -> Result<&leasehold_testkit::ZooKeeperMember, LabError> {
        self.ensemble
            .members()
            .get(index)
            .ok_or(LabError::Unsupported {
                fault,
                needs: "a zookeeper ensemble of three servers",
            })
    }
}

/// The sequence number of contender node `name` (the ten digits
/// ZooKeeper appends, whatever the recipe's prefix), if it is one.
fn sequence_of(name: &str) -> Option<u64> {
    let digits = name.get(name.len().checked_sub(10)?..)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn failed(what: &str) -> impl FnOnce(ZkError) -> LabError {
    let what = what.to_owned();
    move |source| LabError::ZooKeeper { what, source }
}

fn zookeeper_only(fault: Fault) -> LabError {
    LabError::Unsupported {
        fault,
        needs: "a redis server or an etcd cluster (the zookeeper lab has only zookeeper)",
    }
}

#[cfg(test)]
mod tests {
    use super::sequence_of;

    #[test]
    fn contenders_are_told_by_their_ten_digit_suffix() {
        assert_eq!(
            sequence_of("_c_0123-lock-0000000012"),
            Some(12),
            "a leasehold or Curator node"
        );
        assert_eq!(sequence_of("__lock__0000000003"), Some(3), "kazoo's");
        assert_eq!(sequence_of("lock-00000001x"), None);
        assert_eq!(sequence_of("short"), None);
        assert_eq!(sequence_of("é0000000001"), Some(1));
    }
}
