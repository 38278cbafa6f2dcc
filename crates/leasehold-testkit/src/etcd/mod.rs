//! Throwaway etcd clusters: [`EtcdCluster`] starts real `etcd` members on
//! free loopback ports and injects the faults a consensus store must ride
//! out: a member (or the leader) stopped, restarted, paused, or cut off
//! from its peers.
//!
//! # Why a real cluster, and why these settings
//!
//! What a lock on etcd promises rests on raft: a write commits only on a
//! majority, a leader that loses its majority steps down (etcd runs raft
//! with check-quorum), and a linearizable read asks the leader. None of
//! that shows on one member, so the cluster has three (one is allowed, for
//! tests that need no faults). Each member keeps its data in a temporary
//! directory that outlives a [stop](EtcdMember::stop), so a
//! [restart](EtcdMember::restart) comes back with its data, as a crashed
//! machine would.
//!
//! The raft timers are small so that tests are fast: a heartbeat every
//! [`ETCD_HEARTBEAT_INTERVAL`] (50 ms, etcd's default is 100 ms) and an
//! election after [`ETCD_ELECTION_TIMEOUT`] (500 ms, default 1 s) without
//! one, so a lost leader is replaced within about a second. etcd 3.4 has
//! no switch to skip `fsync` (3.5 added `--unsafe-no-fsync`, passed when
//! the binary is 3.5 or later); on 3.4 every commit is synced to the
//! temporary directory's disk. Each member preallocates a 64 MB WAL file.
//!
//! # Cutting a member off
//!
//! Members talk raft over HTTP, each dialling the others (stream
//! connections both ways, and pipeline `POST`s). A member's peer URL is
//! therefore a gate of the cluster's, a small proxy that knows which
//! member dialled (from `/proc`), and [`EtcdMember::cut_off`] closes and
//! refuses the member's connections in both directions; client endpoints
//! have gates too ([`EtcdMember::cut_off_with_clients`]).
//!
//! # The binary
//!
//! `etcd` is looked up on `PATH` (Debian's `etcd-server` package, which
//! `scripts/install-deps.sh` installs: etcd 3.4.23); [`ETCD_ENV`],
//! `LEASEHOLD_ETCD`, names another binary, such as a 3.5 release. 3.4 or
//! later: the gateway's `/v3/` paths are 3.4's.
//!
//! A test's own reads and writes ([`EtcdMember::put`], [`EtcdMember::get`])
//! and the status probes use etcd's HTTP/JSON gateway, so the test kit
//! needs no gRPC client.

mod gateway;
mod member;
mod partition;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use member::START_TIMEOUT;
pub use member::{EtcdMember, EtcdMemberStatus};
use partition::Partition;

use crate::Error;
use crate::certs::{ClientAuth, ServerTls};
use crate::process::{self, POLL_INTERVAL, PORT_ATTEMPTS};

/// The environment variable naming the `etcd` binary to start instead of
/// the one on `PATH`, e.g. a 3.5 release's.
pub const ETCD_ENV: &str = "LEASEHOLD_ETCD";

/// The raft heartbeat interval of every member (`--heartbeat-interval`).
pub const ETCD_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(50);

/// The raft election timeout of every member (`--election-timeout`): a
/// follower that hears no leader for this long starts an election, and a
/// leader that hears from no majority for this long steps down.
pub const ETCD_ELECTION_TIMEOUT: Duration = Duration::from_millis(500);

/// The binary this module starts, found on `PATH`.
const ETCD: &str = "etcd";

/// The binary to start: [`ETCD_ENV`]'s path if set, else `etcd` from
/// `PATH`.
fn etcd_binary() -> Result<PathBuf, Error> {
    match std::env::var_os(ETCD_ENV) {
        Some(path) if !path.is_empty() => {
            let path = PathBuf::from(path);
            if process::is_executable(&path) {
                Ok(path)
            } else {
                Err(Error::BinaryNotFound {
                    name: path.display().to_string(),
                    install_hint: format!(
                        "scripts/install-deps.sh, or unset {ETCD_ENV} to use etcd from PATH"
                    ),
                })
            }
        }
        _ => process::find_binary(ETCD, "etcd-server", &[]),
    }
}

/// The version `binary --version` reports, e.g. `3.4.23`.
fn etcd_version(binary: &Path) -> Result<String, Error> {
    let output = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|source| Error::Spawn {
            program: binary.to_owned(),
            source,
        })?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .find_map(|line| line.strip_prefix("etcd Version:"))
        .map_or_else(|| "unknown".to_owned(), |version| version.trim().to_owned()))
}

/// Whether `version` (`3.5.17`) is 3.5 or later.
fn is_3_5_or_later(version: &str) -> bool {
    let mut parts = version
        .split('.')
        .map(|part| part.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (3, 5)
}

/// A cluster of `etcd` members on free loopback ports, each with a
/// temporary data directory that outlives a [stop](EtcdMember::stop).
///
/// The raft timers are small so that tests are fast: a heartbeat every
/// [`ETCD_HEARTBEAT_INTERVAL`] (50 ms; etcd's default is 100 ms) and an
/// election after [`ETCD_ELECTION_TIMEOUT`] (500 ms; default 1 s), so a
/// lost leader is replaced within about a second. etcd 3.4 cannot skip
/// `fsync`; with a 3.5 or later binary `--unsafe-no-fsync` is passed. Each
/// member preallocates a 64 MB WAL file in its directory.
///
/// Every member's peer and client ports sit behind gates (small TCP
/// proxies) that know which member dialled (from `/proc`), so
/// [`EtcdMember::cut_off`] cuts a member's raft traffic in both
/// directions: what it sends as well as what it receives.
///
/// ```no_run
/// use leasehold_testkit::EtcdCluster;
/// use std::time::Duration;
///
/// let cluster = EtcdCluster::start(3)?;
/// let endpoints = cluster.endpoints(); // for the etcd client under test
/// let leader = cluster.wait_for_leader(Duration::from_secs(10))?;
/// cluster.member(leader).cut_off();
/// // ... the others elect a new leader; the old one commits nothing
/// cluster.member(leader).heal();
/// # Ok::<(), leasehold_testkit::Error>(())
/// ```
///
/// Dropping it kills every member and removes their directories; if the
/// thread is panicking, every member's log is printed to stderr first.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdMember>,
    partition: Arc<Partition>,
    version: String,
}

impl EtcdCluster {
    /// Starts a cluster of `members` members (3 for fault tests; 1 is
    /// allowed) and waits until every member reports itself healthy and
    /// one leads.
    ///
    /// A port taken by another process in the meantime makes it start
    /// again on new ports, up to five times in all.
    ///
    /// # Errors
    ///
    /// [`Error::BinaryNotFound`] if there is no `etcd`,
    /// [`Error::EtcdClusterSize`] for 0 members, [`Error::ExitedEarly`] or
    /// [`Error::NotReady`] (with the member's log tail) if a member does
    /// not come up within 30 s, [`Error::PortsExhausted`].
    pub fn start(members: usize) -> Result<EtcdCluster, Error> {
        Self::start_with(members, None)
    }

    /// [`start`](Self::start), with every member's client port speaking
    /// TLS: it presents `tls`'s server certificate (signed for `127.0.0.1`
    /// and `localhost`) and, with [`ClientAuth::Required`], asks every
    /// client for a certificate signed by `tls`'s client CA (etcd's
    /// `--client-cert-auth`). The [endpoints](Self::endpoints) are
    /// `https://` URLs. Raft traffic between members stays plain, and the
    /// test kit's own requests ([`EtcdMember::put`], [`EtcdMember::status`],
    /// ...) go to a second, plain client listener of each member.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); [`Error::Unsupported`] for
    /// [`ClientAuth::Optional`], which etcd has no setting for.
    pub fn start_tls(members: usize, tls: &ServerTls) -> Result<EtcdCluster, Error> {
        if tls.client_auth == ClientAuth::Optional {
            return Err(Error::Unsupported {
                what: "etcd cannot ask for a client certificate without requiring one",
            });
        }
        crate::certs::install_provider();
        Self::start_with(members, Some(tls))
    }

    fn start_with(members: usize, tls: Option<&ServerTls>) -> Result<EtcdCluster, Error> {
        if members == 0 {
            return Err(Error::EtcdClusterSize { members });
        }
        let binary = etcd_binary()?;
        let version = etcd_version(&binary)?;
        for _ in 0..PORT_ATTEMPTS {
            let cluster = Self::spawn(members, &binary, version.clone(), tls)?;
            match cluster.wait_healthy(START_TIMEOUT) {
                Ok(()) => {}
                Err(_) if cluster.members.iter().any(EtcdMember::lost_port) => continue,
                Err(err) => return Err(err),
            }
            for member in &cluster.members {
                member.set_id(member.status()?.id);
            }
            cluster.wait_for_leader(START_TIMEOUT)?;
            return Ok(cluster);
        }
        Err(Error::PortsExhausted {
            program: ETCD.to_owned(),
            attempts: PORT_ATTEMPTS,
        })
    }

    /// Prepares the members and their gates and spawns them.
    fn spawn(
        members: usize,
        binary: &Path,
        version: String,
        tls: Option<&ServerTls>,
    ) -> Result<Self, Error> {
        let partition = Partition::new(members);
        let mut taken = HashSet::new();
        let mut free_port = || loop {
            let port = process::free_port()?;
            if taken.insert(port) {
                return Ok::<u16, Error>(port);
            }
        };
        let mut prepared = (0..members)
            .map(|index| {
                let operator = match tls {
                    Some(_) => Some(free_port()?),
                    None => None,
                };
                let ports = (free_port()?, free_port()?, operator);
                EtcdMember::prepare(index, binary, ports, &partition)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let initial_cluster = prepared
            .iter()
            .map(EtcdMember::initial_cluster_entry)
            .collect::<Vec<_>>()
            .join(",");
        let mut shared = vec![
            format!("--initial-cluster={initial_cluster}"),
            "--initial-cluster-state=new".to_owned(),
            // Unique, so that members of two clusters never take each
            // other for their own.
            format!(
                "--initial-cluster-token=leasehold-{}-{}",
                std::process::id(),
                prepared[0]
                    .endpoint()
                    .rsplit(':')
                    .next()
                    .unwrap_or_default()
            ),
            format!(
                "--heartbeat-interval={}",
                ETCD_HEARTBEAT_INTERVAL.as_millis()
            ),
            format!("--election-timeout={}", ETCD_ELECTION_TIMEOUT.as_millis()),
            "--logger=zap".to_owned(),
            "--log-outputs=stderr".to_owned(),
        ];
        if is_3_5_or_later(&version) {
            shared.push("--unsafe-no-fsync".to_owned());
        }
        for member in &mut prepared {
            member.configure(&shared);
            if let Some(tls) = tls {
                member.use_tls(tls, is_3_5_or_later(&version))?;
            }
        }
        let cluster = Self {
            members: prepared,
            partition,
            version,
        };
        for member in &cluster.members {
            member.spawn()?;
        }
        Ok(cluster)
    }

    /// Waits until every running member reports itself healthy.
    fn wait_healthy(&self, timeout: Duration) -> Result<(), Error> {
        for member in self.members.iter().filter(|member| member.is_running()) {
            member.wait_until(timeout, "healthy", EtcdMember::is_healthy)?;
        }
        Ok(())
    }

    /// The etcd version the members run, e.g. `3.4.23`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// How many members the cluster has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always `false`: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `index` (from 0).
    ///
    /// # Panics
    ///
    /// If there is no member `index`.
    pub fn member(&self, index: usize) -> &EtcdMember {
        &self.members[index]
    }

    /// Every member, in index order.
    pub fn members(&self) -> &[EtcdMember] {
        &self.members
    }

    /// The client endpoints to give an etcd client, one per member in
    /// index order (`http://127.0.0.1:PORT`; see
    /// [`EtcdMember::endpoint`]).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::endpoint).collect()
    }

    /// The index of the member that leads now, as the running, unpaused
    /// members report it (each asked for its status, 500 ms at most): the
    /// leader named in the highest term reported. `None` if none names a
    /// leader (an election is on, or no majority is up).
    ///
    /// Right after a leader is cut off or paused, the others still name it
    /// until they time out (an [`ETCD_ELECTION_TIMEOUT`]); poll for the
    /// change.
    pub fn leader(&self) -> Option<usize> {
        let leader = self
            .members
            .iter()
            .filter(|member| member.is_running() && !member.is_paused())
            .filter_map(|member| member.status_within(member::PROBE_TIMEOUT).ok())
            .filter_map(|status| Some((status.raft_term, status.leader?)))
            .max()?
            .1;
        self.members.iter().position(|member| member.id() == leader)
    }

    /// Polls [`leader`](Self::leader) until there is one.
    ///
    /// # Errors
    ///
    /// [`Error::NoLeader`] after `timeout`.
    pub fn wait_for_leader(&self, timeout: Duration) -> Result<usize, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.leader() {
                return Ok(leader);
            }
            if Instant::now() >= deadline {
                return Err(Error::NoLeader { timeout });
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Restarts the whole cluster: kills every member, starts them all
    /// again on their data and ports, and waits until every one is healthy
    /// and one leads (30 s at most). A cut stays in place; a cut-off
    /// member will not become healthy, so heal first.
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start).
    pub fn restart(&self) -> Result<(), Error> {
        for member in &self.members {
            member.stop()?;
        }
        for member in &self.members {
            member.spawn()?;
        }
        self.wait_healthy(START_TIMEOUT)?;
        self.wait_for_leader(START_TIMEOUT).map(drop)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &self.members {
            // Nothing sensible can be done about a failure here.
            let _ = member.stop();
        }
        self.partition.close_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_compared_by_number() {
        assert!(!is_3_5_or_later("3.4.23"));
        assert!(is_3_5_or_later("3.5.0"));
        assert!(is_3_5_or_later("3.10.1"));
        assert!(is_3_5_or_later("4.0.0"));
        assert!(!is_3_5_or_later("unknown"));
    }
}
