//! The fault injector: how each fault starts on the lab's servers, fires
//! again while its window lasts, and ends; and how a lab is healed when a
//! run ends.

use std::time::Duration;

use leasehold_testkit::{Direction, Failover, FaultProxy, RedisCluster, RedisServer};

use super::acl::{ACL_USER, set_acl_user};
use super::error::{EXTERNAL_TIMEOUT, external, server, server_err};
use super::etcd::etcd_lab;
use super::pg::pg_lab;
use super::servers::{Primary, Servers, own, query};
use super::zookeeper::zookeeper_lab;
use super::{Lab, LabError};
use crate::callers::Stall;
use crate::fault::{CLOCK_JUMP, CLOCK_RATE, Fault};
use crate::schedule::Window;

/// What the clock faults need, for [`LabError::Unsupported`].
pub(super) const NEEDS_FAKE_CLOCK: &str = "a throwaway redis server whose clock libfaketime can drive (a libc-malloc build such as scripts/valkey.sh's Valkey, selected with LEASEHOLD_REDIS_SERVER; Debian's jemalloc-linked redis-server hangs under libfaketime)";

impl Lab {
    /// Starts `window`'s fault (a repeated fault also fires once).
    pub(super) fn begin(
        &self,
        window: &Window,
        keys: &[String],
        stall: &Stall,
    ) -> Result<String, LabError> {
        let fault = window.fault;
        let mut servers = self.servers();
        let target = match fault {
            Fault::None | Fault::Mixed => "nothing".to_owned(),
            Fault::EtcdLeaderKill
            | Fault::EtcdMemberPause
            | Fault::EtcdMinorityCut
            | Fault::EtcdMajorityCut
            | Fault::EtcdRestart
            | Fault::EtcdRevoke
            | Fault::EtcdNoSpace => etcd_lab(&mut servers.primary, fault)?.begin(fault)?,
            Fault::ZookeeperLeaderKill
            | Fault::ZookeeperMemberPause
            | Fault::ZookeeperMinorityCut
            | Fault::ZookeeperMajorityCut
            | Fault::ZookeeperDiskFull
            | Fault::ZookeeperRestart
            | Fault::ZookeeperRebuild
            | Fault::ZookeeperNodeDelete => {
                zookeeper_lab(&mut servers.primary, fault)?.begin(fault)?
            }
            Fault::PgBackendKill
            | Fault::PgRowDelete
            | Fault::PgTableLock
            | Fault::PgClockStep
            | Fault::PgCrash
            | Fault::PgStatementTimeout
            | Fault::PgLockTimeout
            | Fault::PgbouncerRestart => {
                let pg = postgres(&servers, fault)?;
                pg_lab(&mut servers.primary, fault)?.begin(fault, &pg, keys, window.length)?
            }
            Fault::HolderPause => {
                if servers.workers.is_empty() {
                    stall.arm(window.length);
                    "a holder (stalled in process)".to_owned()
                } else if let Some(pauser) = &servers.pauser {
                    let worker = window.worker % u32::try_from(servers.workers.len()).unwrap_or(1);
                    pauser(worker, true);
                    format!("w{worker} (stops itself between a read and its write)")
                } else {
                    // Every worker but one: whoever holds a lease is then
                    // most likely paused, and the survivor takes over.
                    let survivor = window.worker as usize % servers.workers.len();
                    for (index, pid) in servers.workers.iter().enumerate() {
                        if index != survivor || servers.workers.len() == 1 {
                            leasehold_testkit::pause_process(*pid)
                                .map_err(server("pausing a worker"))?;
                        }
                    }
                    format!("every worker but w{survivor}")
                }
            }
            Fault::RedisPause => {
                own(&mut servers.primary, fault)?
                    .pause()
                    .map_err(server("pausing redis"))?;
                "redis".to_owned()
            }
            Fault::RedisRestart | Fault::RedisRestartAof => {
                if fault == Fault::RedisRestartAof && !self.aof {
                    return Err(LabError::Unsupported {
                        fault,
                        needs: "redis with an append-only file",
                    });
                }
                own(&mut servers.primary, fault)?
                    .kill()
                    .map_err(server("killing redis"))?;
                "redis".to_owned()
            }
            Fault::Failover => {
                self.proxy(fault)?;
                let Servers {
                    primary, replica, ..
                } = &mut *servers;
                let primary = own(primary, fault)?;
                let replica = replica.as_ref().ok_or(LabError::Unsupported {
                    fault,
                    needs: "a replica",
                })?;
                // A partition between primary and replica: nothing written
                // from now on reaches the replica.
                replica.pause().map_err(server("pausing the replica"))?;
                primary
                    .command(&["CLIENT", "KILL", "TYPE", "replica"])
                    .map_err(server("cutting the replication link"))?;
                "replica (partitioned)".to_owned()
            }
            Fault::NetLatency => {
                self.proxy(fault)?
                    .set_latency(Direction::Both, window.length / 6);
                "network".to_owned()
            }
            Fault::NetCut => {
                self.proxy(fault)?.cut();
                "network".to_owned()
            }
            Fault::NetBlackhole => {
                self.proxy(fault)?.blackhole(true);
                "network".to_owned()
            }
            Fault::SlotMigration => {
                let Primary::Cluster { cluster, owner } = &mut servers.primary else {
                    return Err(no_cluster(fault));
                };
                let slot = lock_slot(cluster, keys)?;
                let from = match *owner {
                    Some(from) => from,
                    None => owner_of(cluster, slot)?,
                };
                let to = (from + 1) % cluster.nodes().len();
                cluster
                    .begin_slot_migration(slot, from, to)
                    .map_err(server("starting a slot migration"))?;
                *owner = Some(from);
                format!("slot {slot}, node {from} to {to}")
            }
            Fault::ClusterFailover => {
                let Primary::Cluster { cluster, .. } = &servers.primary else {
                    return Err(no_cluster(fault));
                };
                let slot = lock_slot(cluster, keys)?;
                let index = owner_of(cluster, slot)?;
                cluster
                    .failover(index, Failover::Coordinated)
                    .map_err(server("a cluster failover"))?;
                format!("master {index} (slot {slot})")
            }
            Fault::PostgresPause => {
                let pg = servers.postgres.as_ref().ok_or(LabError::Unsupported {
                    fault,
                    needs: "a throwaway postgresql",
                })?;
                pg.pause().map_err(server("pausing postgresql"))?;
                "postgresql".to_owned()
            }
            Fault::PostgresRestart => {
                let pg = servers.postgres.as_ref().ok_or(LabError::Unsupported {
                    fault,
                    needs: "a throwaway postgresql",
                })?;
                pg.stop().map_err(server("stopping postgresql"))?;
                "postgresql".to_owned()
            }
            Fault::KeyLoss | Fault::EarlyExpiry | Fault::ScriptFlush => {
                drop(servers);
                self.repeat(fault, keys)?;
                "lock keys".to_owned()
            }
            Fault::ConnKill => {
                drop(servers);
                self.repeat(fault, keys)?;
                "redis connections".to_owned()
            }
            Fault::Eviction => {
                let primary = own(&mut servers.primary, fault)?;
                let info = primary
                    .command(&["INFO", "memory"])
                    .map_err(server("reading redis's memory use"))?
                    .to_string();
                let used: u64 = info
                    .lines()
                    .find_map(|line| line.strip_prefix("used_memory:"))
                    .and_then(|value| value.trim().parse().ok())
                    .ok_or(LabError::Options("redis did not report its memory use"))?;
                let limit = (used + EVICTION_HEADROOM).to_string();
                primary
                    .command(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
                    .map_err(server("setting an eviction policy"))?;
                primary
                    .command(&["CONFIG", "SET", "maxmemory", &limit])
                    .map_err(server("limiting redis's memory"))?;
                drop(servers);
                self.repeat(fault, keys)?;
                format!("redis memory ({limit} bytes, allkeys-lru)")
            }
            Fault::Oom => {
                let primary = own(&mut servers.primary, fault)?;
                for args in [
                    &["CONFIG", "SET", "maxmemory-policy", "noeviction"][..],
                    &["CONFIG", "SET", "maxmemory", "1"],
                ] {
                    primary
                        .command(args)
                        .map_err(server("filling redis's memory"))?;
                }
                "redis memory (1 byte, noeviction)".to_owned()
            }
            Fault::Flushall => {
                own(&mut servers.primary, fault)?
                    .command(&["FLUSHALL"])
                    .map_err(server("flushing redis"))?;
                "redis dataset".to_owned()
            }
            Fault::ClockJump => {
                drop(servers);
                self.repeat(fault, keys)?;
                format!("redis clock (+{} s a step)", CLOCK_JUMP.as_secs())
            }
            Fault::ClockFast => {
                own(&mut servers.primary, fault)?
                    .set_clock_rate(CLOCK_RATE)
                    .map_err(server("speeding redis's clock up"))?;
                format!("redis clock (x{CLOCK_RATE})")
            }
            Fault::Maxclients => {
                let url = own(&mut servers.primary, fault)?.url();
                // The lab's own connection stays (Redis closes none over
                // the limit) and lifts it at the end; every caller's is
                // cut and cannot come back meanwhile.
                let mut conn = redis::Client::open(url)
                    .and_then(|client| client.get_connection_with_timeout(LIMITER_TIMEOUT))
                    .map_err(limiter_err)?;
                for args in [
                    &["CONFIG", "SET", "maxclients", "1"][..],
                    &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
                    &["CLIENT", "KILL", "TYPE", "pubsub"],
                ] {
                    redis::cmd(args[0])
                        .arg(&args[1..])
                        .exec(&mut conn)
                        .map_err(limiter_err)?;
                }
                servers.limiter = Some(conn);
                "redis connections (maxclients 1)".to_owned()
            }
            Fault::Demotion => {
                if !self.node_auth.is_empty() || self.tls.is_some() {
                    return Err(LabError::Unsupported {
                        fault,
                        needs: "a throwaway redis without a password or tls (the demoted server replicates an empty one)",
                    });
                }
                let empty = RedisServer::start().map_err(server("starting an empty redis"))?;
                let port = empty.port().to_string();
                own(&mut servers.primary, fault)?
                    .command(&["REPLICAOF", empty.host(), &port])
                    .map_err(server("demoting redis"))?;
                servers.demoter = Some(empty);
                format!("redis (the replica of an empty redis :{port})")
            }
            Fault::AclReset => {
                let primary = own(&mut servers.primary, fault)?;
                if self.acl_password.is_none() {
                    return Err(LabError::Unsupported {
                        fault,
                        needs: "callers connected as an acl user (LabOptions::acl_user)",
                    });
                }
                // Deleting the user also closes every connection of it.
                primary
                    .command(&["ACL", "DELUSER", ACL_USER])
                    .map_err(server("deleting the lock's acl user"))?;
                format!("acl user {ACL_USER}")
            }
            Fault::SentinelFailover => {
                let Primary::Sentinel { setup, old } = &mut servers.primary else {
                    return Err(no_sentinel(fault));
                };
                let port = setup
                    .primary_port()
                    .map_err(server("finding the sentinels' primary"))?;
                // Asked without waiting: the window's end waits for the new
                // primary, so the window spans the failover.
                let sentinel = setup
                    .sentinel_urls()
                    .into_iter()
                    .next()
                    .ok_or(no_sentinel(fault))?;
                let client = redis::Client::open(sentinel)
                    .map_err(external("opening a sentinel connection"))?;
                let mut conn = client
                    .get_connection_with_timeout(EXTERNAL_TIMEOUT)
                    .map_err(external("connecting to a sentinel"))?;
                conn.set_read_timeout(Some(EXTERNAL_TIMEOUT))
                    .map_err(external("connecting to a sentinel"))?;
                let master = setup.master().to_owned();
                query(
                    &mut conn,
                    &["SENTINEL", "FAILOVER", &master],
                    "SENTINEL FAILOVER",
                )?;
                *old = Some(port);
                format!("primary :{port} (SENTINEL FAILOVER)")
            }
            Fault::SentinelKill => {
                let Primary::Sentinel { setup, old } = &mut servers.primary else {
                    return Err(no_sentinel(fault));
                };
                let port = setup
                    .kill_primary()
                    .map_err(server("killing the sentinels' primary"))?;
                *old = Some(port);
                format!("primary :{port} (killed)")
            }
            Fault::RedisStall | Fault::ClientPauseWrite => {
                // Redis ends the pause by itself at the window's end (no
                // command, `CLIENT UNPAUSE` included, gets through it).
                let ms = window.length.as_millis().max(1).to_string();
                let what = if fault == Fault::RedisStall {
                    "ALL"
                } else {
                    "WRITE"
                };
                servers
                    .primary
                    .command(&["CLIENT", "PAUSE", &ms, what], "stalling redis")?;
                "redis".to_owned()
            }
            Fault::PubsubKill => {
                drop(servers);
                self.repeat(fault, keys)?;
                "redis pub/sub connections".to_owned()
            }
        };
        Ok(target)
    }

    /// Fires a repeated fault once more.
    pub(super) fn repeat(&self, fault: Fault, keys: &[String]) -> Result<(), LabError> {
        let mut servers = self.servers();
        if fault.needs_pg() {
            return pg_lab(&mut servers.primary, fault)?.repeat(fault, keys);
        }
        let redis = &servers.primary;
        let what = format!("injecting {fault}");
        match fault {
            Fault::KeyLoss => {
                let mut args = vec!["DEL"];
                args.extend(keys.iter().map(String::as_str));
                redis.command(&args, &what)
            }
            Fault::EarlyExpiry => keys
                .iter()
                .try_for_each(|key| redis.command(&["PEXPIRE", key, "1"], &what)),
            Fault::ScriptFlush => redis.command(&["SCRIPT", "FLUSH"], &what),
            Fault::Eviction => redis.command(&["EVAL", FILL, "0", "500"], &what),
            // Every client but this one (`SKIPME yes` is the default) and
            // the replicas.
            Fault::ConnKill => redis.command(&["CLIENT", "KILL", "TYPE", "normal"], &what),
            Fault::PubsubKill => redis.command(&["CLIENT", "KILL", "TYPE", "pubsub"], &what),
            Fault::ClockJump => match redis {
                Primary::Own(primary) => primary.jump_clock(CLOCK_JUMP).map_err(server_err(&what)),
                _ => Err(LabError::Unsupported {
                    fault,
                    needs: NEEDS_FAKE_CLOCK,
                }),
            },
            Fault::NetCut => {
                self.proxy(fault)?.cut();
                Ok(())
            }
            Fault::EtcdRevoke => match redis {
                Primary::Etcd(etcd) => etcd.revoke(),
                _ => Err(LabError::Unsupported {
                    fault,
                    needs: "a throwaway etcd cluster (the etcd modes)",
                }),
            },
            Fault::ZookeeperNodeDelete => match redis {
                Primary::ZooKeeper(zk) => zk.delete_holders(),
                _ => Err(LabError::Unsupported {
                    fault,
                    needs: super::zookeeper::NEEDS_ZOOKEEPER,
                }),
            },
            _ => Ok(()),
        }
    }

    /// The fault proxy, which a cluster or sentinel lab, or one with
    /// [`LabOptions::proxy`]`(false)`, does not have.
    fn proxy(&self, fault: Fault) -> Result<&FaultProxy, LabError> {
        self.proxy.as_deref().ok_or(LabError::Unsupported {
            fault,
            needs: "a fault proxy (a cluster or sentinel lab has none, nor one with LabOptions::proxy(false))",
        })
    }

    /// Ends `window`'s fault: resumes, heals, restarts, promotes.
    pub(super) fn end(
        &self,
        window: &Window,
        keys: &[String],
        stall: &Stall,
    ) -> Result<(), LabError> {
        let fault = window.fault;
        let mut servers = self.servers();
        match fault {
            Fault::EtcdLeaderKill
            | Fault::EtcdMemberPause
            | Fault::EtcdMinorityCut
            | Fault::EtcdMajorityCut
            | Fault::EtcdRestart
            | Fault::EtcdRevoke
            | Fault::EtcdNoSpace => etcd_lab(&mut servers.primary, fault)?.end(fault)?,
            Fault::ZookeeperLeaderKill
            | Fault::ZookeeperMemberPause
            | Fault::ZookeeperMinorityCut
            | Fault::ZookeeperMajorityCut
            | Fault::ZookeeperDiskFull
            | Fault::ZookeeperRestart
            | Fault::ZookeeperRebuild
            | Fault::ZookeeperNodeDelete => {
                zookeeper_lab(&mut servers.primary, fault)?.end(fault)?
            }
            Fault::PgBackendKill
            | Fault::PgRowDelete
            | Fault::PgTableLock
            | Fault::PgClockStep
            | Fault::PgCrash
            | Fault::PgStatementTimeout
            | Fault::PgLockTimeout
            | Fault::PgbouncerRestart => {
                let pg = postgres(&servers, fault)?;
                pg_lab(&mut servers.primary, fault)?.end(fault, &pg)?
            }
            Fault::HolderPause => {
                stall.disarm();
                if let Some(pauser) = &servers.pauser
                    && !servers.workers.is_empty()
                {
                    let worker = window.worker % u32::try_from(servers.workers.len()).unwrap_or(1);
                    pauser(worker, false);
                }
                for pid in &servers.workers {
                    leasehold_testkit::resume_process(*pid).map_err(server("resuming a worker"))?;
                }
            }
            Fault::RedisPause => own(&mut servers.primary, fault)?
                .resume()
                .map_err(server("resuming redis"))?,
            Fault::RedisRestart | Fault::RedisRestartAof => {
                let primary = own(&mut servers.primary, fault)?;
                if fault == Fault::RedisRestart {
                    primary
                        .restart_empty()
                        .map_err(server("restarting redis empty"))?;
                } else {
                    primary
                        .restart()
                        .map_err(server("restarting redis from its append-only file"))?;
                }
                // An ACL user lives in memory only: the lab's comes back
                // with the server (a restarted production server would
                // load it from its ACL file).
                if let Some(password) = &self.acl_password {
                    set_acl_user(primary, password)?;
                }
            }
            Fault::Failover => {
                let Servers {
                    primary,
                    replica,
                    retired,
                    ..
                } = &mut *servers;
                let primary = own(primary, fault)?;
                let Some(promoted) = replica.take() else {
                    return Err(LabError::Unsupported {
                        fault,
                        needs: "a replica",
                    });
                };
                primary.kill().map_err(server("killing the old primary"))?;
                promoted.resume().map_err(server("resuming the replica"))?;
                promoted
                    .command(&["REPLICAOF", "NO", "ONE"])
                    .map_err(server("promoting the replica"))?;
                let proxy = self.proxy(fault)?;
                proxy.set_upstream(promoted.addr());
                proxy.cut();
                retired.push(std::mem::replace(primary, promoted));
            }
            Fault::NetLatency | Fault::NetCut | Fault::NetBlackhole => self.proxy(fault)?.heal(),
            Fault::SentinelFailover | Fault::SentinelKill => {
                let Primary::Sentinel { setup, old } = &mut servers.primary else {
                    return Err(no_sentinel(fault));
                };
                let port = old.take().ok_or(no_sentinel(fault))?;
                setup
                    .wait_for_new_primary(port, SENTINEL_FAILOVER_WAIT)
                    .map_err(server("waiting for the sentinels' new primary"))?;
            }
            Fault::SlotMigration => {
                let Primary::Cluster { cluster, owner } = &mut servers.primary else {
                    return Err(no_cluster(fault));
                };
                let slot = lock_slot(cluster, keys)?;
                let from = owner.ok_or(no_cluster(fault))?;
                let to = (from + 1) % cluster.nodes().len();
                cluster
                    .finish_slot_migration(slot, from, to)
                    .map_err(server("finishing a slot migration"))?;
                *owner = Some(to);
            }
            Fault::PostgresPause => {
                if let Some(pg) = &servers.postgres {
                    pg.resume().map_err(server("resuming postgresql"))?;
                }
            }
            Fault::PostgresRestart => {
                if let Some(pg) = &servers.postgres {
                    pg.start_again()
                        .map_err(server("starting postgresql again"))?;
                }
            }
            Fault::Eviction => {
                let primary = own(&mut servers.primary, fault)?;
                for args in [
                    &["CONFIG", "SET", "maxmemory", "0"][..],
                    &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
                    &["EVAL", EMPTY, "0"],
                ] {
                    primary
                        .command(args)
                        .map_err(server("ending the eviction"))?;
                }
            }
            Fault::Oom => {
                own(&mut servers.primary, fault)?
                    .command(&["CONFIG", "SET", "maxmemory", "0"])
                    .map_err(server("ending the memory limit"))?;
            }
            Fault::ClockFast => {
                own(&mut servers.primary, fault)?
                    .set_clock_rate(1.0)
                    .map_err(server("slowing redis's clock down"))?;
            }
            Fault::Maxclients => {
                let lifted = match servers.limiter.take() {
                    Some(mut conn) => redis::cmd("CONFIG")
                        .arg(&["SET", "maxclients", "10000"])
                        .exec(&mut conn)
                        .map_err(limiter_err),
                    None => Ok(()),
                };
                if lifted.is_err() {
                    // The held connection broke: a new one may get in now
                    // that the callers' attempts were refused.
                    own(&mut servers.primary, fault)?
                        .command(&["CONFIG", "SET", "maxclients", "10000"])
                        .map_err(server("ending the connection limit"))?;
                }
            }
            Fault::Demotion => {
                own(&mut servers.primary, fault)?
                    .command(&["REPLICAOF", "NO", "ONE"])
                    .map_err(server("promoting redis back"))?;
                if let Some(empty) = servers.demoter.take() {
                    servers.retired.push(empty);
                }
            }
            Fault::AclReset => {
                if let Some(password) = &self.acl_password {
                    set_acl_user(own(&mut servers.primary, fault)?, password)?;
                }
            }
            Fault::None
            | Fault::Mixed
            | Fault::ClusterFailover
            | Fault::KeyLoss
            | Fault::EarlyExpiry
            | Fault::ScriptFlush
            | Fault::ConnKill
            | Fault::PubsubKill
            | Fault::Flushall
            // The step stays (see Fault::ClockJump).
            | Fault::ClockJump
            | Fault::ClientPauseWrite
            | Fault::RedisStall => {}
        }
        Ok(())
    }

    /// Leaves every server running and reachable: resumes what is paused,
    /// heals the proxy. Called when a run ends, whatever happened.
    pub fn heal(&self) {
        if let Some(proxy) = &self.proxy {
            proxy.heal();
        }
        let mut servers = self.servers();
        for pid in &servers.workers {
            let _ = leasehold_testkit::resume_process(*pid);
        }
        if let Primary::Own(primary) = &servers.primary {
            if primary.is_paused() {
                let _ = primary.resume();
            }
            if primary.clock_rate().is_some_and(|rate| rate != 1.0) {
                let _ = primary.set_clock_rate(1.0);
            }
        }
        if let Primary::Etcd(etcd) = &servers.primary {
            etcd.heal();
        }
        if let Primary::ZooKeeper(zk) = &servers.primary {
            zk.heal();
        }
        if let Primary::Postgres(pg) = &mut servers.primary {
            pg.heal();
        }
        if let Some(replica) = &servers.replica
            && replica.is_paused()
        {
            let _ = replica.resume();
        }
        if let Some(pg) = &servers.postgres {
            if pg.is_paused() {
                let _ = pg.resume();
            }
            // A no-op when it runs.
            let _ = pg.start_again();
        }
    }
}

/// How long the lab waits to connect for a `maxclients` window.
const LIMITER_TIMEOUT: Duration = Duration::from_secs(5);

/// A failure of the lab's own connection for a `maxclients` window.
fn limiter_err(err: redis::RedisError) -> LabError {
    LabError::Options(if err.is_io_error() {
        "could not hold a connection to redis for the maxclients window"
    } else {
        "redis refused the maxclients window's commands"
    })
}

/// How long a Sentinel fault's window waits, at most, for every sentinel
/// to name the new primary.
const SENTINEL_FAILOVER_WAIT: Duration = Duration::from_secs(30);

/// The lab's PostgreSQL, which the pg faults hit.
fn postgres(
    servers: &Servers,
    fault: Fault,
) -> Result<std::sync::Arc<leasehold_testkit::PostgresServer>, LabError> {
    servers.postgres.clone().ok_or(LabError::Unsupported {
        fault,
        needs: "a throwaway postgresql",
    })
}

fn no_sentinel(fault: Fault) -> LabError {
    LabError::Unsupported {
        fault,
        needs: "a redis sentinel setup",
    }
}

fn no_cluster(fault: Fault) -> LabError {
    LabError::Unsupported {
        fault,
        needs: "a redis cluster",
    }
}

/// The slot of the lock keys (they share one: each names its resource in
/// a hash tag, and the nemesis moves the first one's).
fn lock_slot(cluster: &RedisCluster, keys: &[String]) -> Result<u16, LabError> {
    let key = keys
        .first()
        .ok_or(LabError::Options("no lock key to move"))?;
    cluster
        .slot_of(key)
        .map_err(server("finding the lock key's slot"))
}

/// The index of the master serving `slot` now (after failovers too).
fn owner_of(cluster: &RedisCluster, slot: u16) -> Result<usize, LabError> {
    cluster
        .owner_of(slot)
        .map_err(server("finding the master of the lock key's slot"))
}

/// [`Fault::Eviction`]'s memory limit above what Redis uses when it
/// starts: 1 MiB.
const EVICTION_HEADROOM: u64 = 1 << 20;

/// [`Fault::Eviction`]'s filler: `ARGV[1]` new 1 KiB keys `filler:R:I`, R
/// a round counter.
const FILL: &str = "local round = redis.call('INCR', 'filler:round') \
    local value = string.rep('x', 1024) \
    for i = 1, tonumber(ARGV[1]) do \
        redis.call('SET', 'filler:' .. round .. ':' .. i, value) \
    end \
    return round";

/// Deletes the filler's keys.
const EMPTY: &str = "local keys = redis.call('KEYS', 'filler:*') \
    for i = 1, #keys, 1000 do \
        redis.call('DEL', unpack(keys, i, math.min(i + 999, #keys))) \
    end \
    return #keys";
