//! The etcd lab: a throwaway cluster of three members (the test kit's
//! [`EtcdCluster`]), or the user's own cluster by its endpoints
//! ([`LabOptions::etcd_endpoints`]), and how each etcd fault starts,
//! repeats and ends on it.
//!
//! The callers dial the members' client endpoints ([`Lab::node_urls`],
//! each worker starting at another member). The faults hit the members
//! the etcd way of taking a lease must ride out: the leader killed, a
//! follower paused, the leader cut off from its peers (a minority), two
//! members cut off (no majority), the whole cluster restarted, and an
//! operator revoking the leases that hold lock keys. On the user's
//! cluster only the last runs: the others need the members' processes
//! ([`Fault::needs_etcd_process`]).

use std::time::Duration;

use leasehold::tls::TlsFiles;
use leasehold_etcd::client::{Cmp, Compare, Credentials, EtcdClient, EtcdError, Op, Range, Txn};
use leasehold_testkit::EtcdCluster;

use super::error::server;
use super::servers::{Primary, Servers};
use super::{Lab, LabError, LabOptions};
use crate::fault::Fault;

/// How long the lab waits for a leader (after an election) before it
/// names a member to fault.
const LEADER_WAIT: Duration = Duration::from_secs(10);

/// How long the access check of the user's cluster (a read, then a
/// transaction) may take.
const ACCESS_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one revoke round (a read of the lock keys, then one revoke
/// per lease) may take.
const REVOKE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one revoke round may take on the user's cluster, where each
/// round's new client also makes a TLS handshake and authenticates (a
/// password hash check in etcd) before its read: a slow handshake on a
/// loaded machine must not fail the run.
const EXTERNAL_REVOKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The prefix [`Fault::EtcdRevoke`] looks under: the etcd way's keys
/// (`leasehold/`) and the Lock RPC control's (`leasehold-rpc/`).
pub(super) const ETCD_LOCK_PREFIX: &str = "leasehold";

/// The etcd cluster the callers use, and the members the fault in
/// progress hit.
pub(super) struct EtcdLab {
    /// The throwaway cluster; `None` for the user's, which the lab
    /// reaches through its API only.
    pub(super) cluster: Option<EtcdCluster>,
    /// The members' client endpoints, as the callers dial them.
    pub(super) endpoints: Vec<String>,
    /// How the lab and the callers reach the user's cluster.
    pub(super) access: EtcdAccess,
    /// The members the current window faulted, to undo at its end.
    pub(super) hit: Vec<usize>,
}

/// The TLS files and the user for the user's etcd cluster (none for the
/// throwaway one).
#[derive(Clone, Default)]
pub(super) struct EtcdAccess {
    pub(super) tls: Option<TlsFiles>,
    pub(super) credentials: Option<Credentials>,
}

impl EtcdAccess {
    /// A client of `endpoints` with these TLS files and credentials.
    fn client(&self, endpoints: &[String]) -> Result<EtcdClient, LabError> {
        let mut builder = EtcdClient::builder(endpoints.to_vec());
        if self.tls.is_some() || self.credentials.is_some() {
            // A first attempt carries the handshake and the
            // authentication: give it the round's whole time.
            builder = builder.attempt_timeout(EXTERNAL_REVOKE_TIMEOUT);
        }
        if let Some(files) = &self.tls {
            let config = leasehold::tls::client_config(files).map_err(LabError::Tls)?;
            builder = builder.tls(leasehold_etcd::client::TlsSettings::new(config));
        }
        if let Some(credentials) = &self.credentials {
            builder = builder.credentials(credentials.clone());
        }
        builder.build().map_err(|source| LabError::Etcd {
            what: "opening an etcd client".to_owned(),
            source,
        })
    }

    /// The user name, if any (never the password).
    fn user(&self) -> Option<String> {
        self.credentials.as_ref().map(|c| c.user().to_owned())
    }
}

impl Lab {
    /// A lab on a throwaway etcd cluster of three members, or on the
    /// user's ([`LabOptions::etcd_endpoints`]), and the options'
    /// PostgreSQL: no Redis at all.
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
            "tls, proxy, redis options and a fake clock do not apply to an etcd lab (its tls files: LabOptions::etcd_tls)",
        )?;
        let etcd = if options.etcd_endpoints.is_empty() {
            if options.etcd_tls.is_some() || options.etcd_credentials.is_some() {
                return Err(LabError::Options(
                    "etcd tls files or credentials without LabOptions::etcd_endpoints: the throwaway etcd cluster is plain and has no users",
                ));
            }
            let cluster = EtcdCluster::start(3).map_err(server("starting an etcd cluster"))?;
            EtcdLab {
                endpoints: cluster.endpoints(),
                cluster: Some(cluster),
                access: EtcdAccess::default(),
                hit: Vec::new(),
            }
        } else {
            EtcdLab::reach(options)?
        };
        Ok(Lab::assemble(
            Servers::new(Primary::Etcd(etcd), options),
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

    /// Whether the callers use the user's etcd cluster
    /// ([`LabOptions::etcd_endpoints`]), whose members the lab does not
    /// control.
    pub fn is_external_etcd(&self) -> bool {
        matches!(&self.servers().primary, Primary::Etcd(etcd) if etcd.cluster.is_none())
    }

    /// The TLS files the callers use for the user's etcd cluster
    /// ([`LabOptions::etcd_tls`]), if any.
    pub fn etcd_tls_files(&self) -> Option<TlsFiles> {
        match &self.servers().primary {
            Primary::Etcd(etcd) => etcd.access.tls.clone(),
            _ => None,
        }
    }

    /// The user the callers authenticate as on the user's etcd cluster
    /// ([`LabOptions::etcd_credentials`]), if any.
    pub fn etcd_credentials(&self) -> Option<Credentials> {
        match &self.servers().primary {
            Primary::Etcd(etcd) => etcd.access.credentials.clone(),
            _ => None,
        }
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
    /// The user's cluster at the options' endpoints, its access checked:
    /// reachable, the credentials accepted, and `readwrite` on the lock
    /// keys' prefix.
    fn reach(options: &LabOptions) -> Result<EtcdLab, LabError> {
        let endpoints = options.etcd_endpoints.clone();
        let secure = endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        if endpoints
            .iter()
            .any(|e| !e.starts_with("https://") && !e.starts_with("http://"))
        {
            return Err(LabError::Options(
                "an etcd endpoint is not an http:// or https:// url",
            ));
        }
        if endpoints.iter().any(|e| has_userinfo(e)) {
            return Err(LabError::Options(
                "an etcd endpoint with a user or password: give them with LabOptions::etcd_credentials",
            ));
        }
        if secure != 0 && secure != endpoints.len() {
            return Err(LabError::Options("etcd endpoints mix http:// and https://"));
        }
        if secure == 0 && options.etcd_tls.is_some() {
            return Err(LabError::Options(
                "etcd tls files for http:// endpoints: use https://",
            ));
        }
        let access = EtcdAccess {
            // https:// with no files: the system's roots, as the library.
            tls: (secure > 0).then(|| options.etcd_tls.clone().unwrap_or_default()),
            credentials: options.etcd_credentials.clone(),
        };
        let client = access.client(&endpoints)?;
        block_on(check_access(&client, &access))?;
        Ok(EtcdLab {
            cluster: None,
            endpoints,
            access,
            hit: Vec::new(),
        })
    }

    /// Starts `fault` (an etcd fault); what it hit, for the history.
    pub(super) fn begin(&mut self, fault: Fault) -> Result<String, LabError> {
        if fault == Fault::EtcdRevoke {
            self.revoke()?;
            return Ok("etcd leases of the lock keys".to_owned());
        }
        let cluster = own(self.cluster.as_ref(), fault)?;
        let size = cluster.len();
        let target = match fault {
            Fault::EtcdLeaderKill => {
                let leader = leader(cluster)?;
                cluster
                    .member(leader)
                    .stop()
                    .map_err(server("killing the etcd leader"))?;
                self.hit = vec![leader];
                format!("etcd m{leader} (the leader, killed)")
            }
            Fault::EtcdMemberPause => {
                let leader = leader(cluster)?;
                let follower = (leader + 1) % size;
                cluster
                    .member(follower)
                    .pause()
                    .map_err(server("pausing an etcd follower"))?;
                self.hit = vec![follower];
                format!("etcd m{follower} (a follower, paused)")
            }
            Fault::EtcdMinorityCut => {
                let leader = leader(cluster)?;
                cluster.member(leader).cut_off();
                self.hit = vec![leader];
                format!("etcd m{leader} (the leader, cut off from its peers)")
            }
            Fault::EtcdMajorityCut => {
                let leader = leader(cluster)?;
                let cut = [leader, (leader + 1) % size];
                for &member in &cut {
                    cluster.member(member).cut_off();
                }
                self.hit = cut.to_vec();
                format!("etcd m{} and m{} (a majority, cut off)", cut[0], cut[1])
            }
            Fault::EtcdRestart => {
                for member in cluster.members() {
                    member.stop().map_err(server("killing an etcd member"))?;
                }
                self.hit = (0..size).collect();
                "etcd (every member, killed)".to_owned()
            }
            Fault::EtcdNoSpace => {
                cluster
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
        if fault == Fault::EtcdRevoke {
            return Ok(());
        }
        let cluster = own(self.cluster.as_ref(), fault)?;
        match fault {
            Fault::EtcdLeaderKill => {
                for member in hit {
                    cluster
                        .member(member)
                        .start()
                        .map_err(server("starting the old etcd leader again"))?;
                }
            }
            Fault::EtcdMemberPause => {
                for member in hit {
                    cluster
                        .member(member)
                        .resume()
                        .map_err(server("resuming an etcd member"))?;
                }
            }
            Fault::EtcdMinorityCut | Fault::EtcdMajorityCut => {
                for member in hit {
                    cluster.member(member).heal();
                }
            }
            Fault::EtcdRestart => cluster
                .restart()
                .map_err(server("starting the etcd cluster again"))?,
            Fault::EtcdNoSpace => cluster
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
        let client = self.access.client(&self.endpoints)?;
        block_on(async move {
            let failed = |what: &str| {
                let what = what.to_owned();
                move |source| LabError::Etcd { what, source }
            };
            let timeout = if self.cluster.is_some() {
                REVOKE_TIMEOUT
            } else {
                EXTERNAL_REVOKE_TIMEOUT
            };
            let deadline = tokio::time::Instant::now() + timeout;
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
        let Some(cluster) = &self.cluster else {
            return;
        };
        let stopped = cluster.members().iter().any(|m| !m.is_running());
        for member in cluster.members() {
            member.heal();
            if member.is_paused() {
                let _ = member.resume();
            }
        }
        if stopped {
            let _ = cluster.restart();
        }
    }

    /// Every member's log, for a failure message.
    pub(super) fn logs(&self) -> String {
        let Some(cluster) = &self.cluster else {
            return format!(
                "--- etcd: yours ({}), no log here ---\n",
                self.endpoints.join(", ")
            );
        };
        let mut out = String::new();
        for member in cluster.members() {
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

/// What the faults that need the etcd members' processes need, for
/// [`LabError::Unsupported`].
pub(super) const NEEDS_ETCD_PROCESS: &str = "a throwaway etcd cluster the lab started (it kills, pauses, cuts off or restarts its members, or raises its NOSPACE alarm), not the etcd given by LabOptions::etcd_endpoints";

/// The throwaway cluster `fault` needs to control.
fn own(cluster: Option<&EtcdCluster>, fault: Fault) -> Result<&EtcdCluster, LabError> {
    cluster.ok_or(LabError::Unsupported {
        fault,
        needs: NEEDS_ETCD_PROCESS,
    })
}

/// The leader's index, once there is one.
fn leader(cluster: &EtcdCluster) -> Result<usize, LabError> {
    cluster
        .wait_for_leader(LEADER_WAIT)
        .map_err(server("finding the etcd leader"))
}

/// Runs `future` on a runtime of its own: the lab's etcd requests come
/// from blocking code ([`Lab::start`], the nemesis's thread).
fn block_on<T>(future: impl Future<Output = Result<T, LabError>>) -> Result<T, LabError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|_| LabError::Options("could not start a runtime for etcd requests"))?
        .block_on(future)
}

/// Whether `endpoint` carries a `user[:password]@` before its host.
fn has_userinfo(endpoint: &str) -> bool {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    authority.contains('@')
}

/// The probe key the access check would write under `prefix` (in a
/// transaction whose condition never holds: nothing is written).
fn probe_key(prefix: &str) -> String {
    format!("{prefix}chaos-access-probe")
}

/// Checks, before any run, that the user's cluster answers, takes the
/// credentials, and lets this user read the lock keys' prefix and write
/// under both lock prefixes. Nothing is written: the transaction's
/// condition (a probe key created before revision 0) never holds, and
/// etcd checks the permissions of its puts all the same.
async fn check_access(client: &EtcdClient, access: &EtcdAccess) -> Result<(), LabError> {
    let deadline = tokio::time::Instant::now() + ACCESS_TIMEOUT;
    let refused = |needs: &'static str| {
        let user = access.user();
        move |source: EtcdError| access_error(client, user, needs, source)
    };
    client
        .range(&Range::prefix(ETCD_LOCK_PREFIX).limit(1), deadline)
        .await
        .map_err(refused("read"))?;
    let mut probe = Txn::new();
    for prefix in LOCK_PREFIXES {
        let key = probe_key(prefix);
        probe = probe
            .when(Compare::create_revision(key.as_str(), Cmp::Less, 0))
            .then(Op::put(key.as_str(), "", 0));
    }
    client
        .txn(&probe, deadline)
        .await
        .map_err(refused("readwrite"))?;
    Ok(())
}

/// The prefixes the etcd modes write under: the etcd way's and the Lock
/// RPC control's.
const LOCK_PREFIXES: [&str; 2] = ["leasehold/", "leasehold-rpc/"];

/// `source`, met checking access, as the lab's error: a refused user is
/// [`LabError::EtcdAuth`], a refused permission
/// [`LabError::EtcdPermission`], anything else [`LabError::Etcd`].
fn access_error(
    client: &EtcdClient,
    user: Option<String>,
    needs: &'static str,
    source: EtcdError,
) -> LabError {
    let endpoint = client.current_endpoint().to_owned();
    match &source {
        EtcdError::AuthFailed { .. } => LabError::EtcdAuth {
            endpoint,
            user,
            source: Box::new(source),
        },
        EtcdError::Rejected { source: status } => {
            if status.message().contains("user name is empty") {
                LabError::EtcdAuth {
                    endpoint,
                    user,
                    source: Box::new(source),
                }
            } else if status.message().contains("permission denied") {
                LabError::EtcdPermission {
                    endpoint,
                    user,
                    needs,
                    prefix: ETCD_LOCK_PREFIX,
                    source: Box::new(source),
                }
            } else {
                LabError::Etcd {
                    what: format!("checking access to the lock keys at {endpoint}"),
                    source,
                }
            }
        }
        _ => LabError::Etcd {
            what: format!("reaching {endpoint}"),
            source,
        },
    }
}
