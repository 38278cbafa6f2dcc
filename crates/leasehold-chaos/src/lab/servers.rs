//! The servers a lab holds, and how a command reaches its Redis: the
//! primary (a throwaway server, the user's by URL, a cluster or a Sentinel
//! setup), the replica, the extra nodes, PostgreSQL and the workers.

use std::sync::{Arc, Mutex, PoisonError};

use leasehold_testkit::{PostgresServer, RedisCluster, RedisSentinel, RedisServer};

use super::error::{EXTERNAL_TIMEOUT, external, server_err};
use super::etcd::EtcdLab;
use super::pg::PgLab;
use super::zookeeper::ZkLab;
use super::{LabError, LabOptions, Pauser};
use crate::fault::Fault;

/// The Redis the callers use, behind the fault proxy.
pub(super) enum Primary {
    /// A throwaway redis-server the lab started and controls.
    Own(RedisServer),
    /// The user's server, reached by URL: commands only, on one
    /// connection kept between them (opened again after an error).
    External {
        client: redis::Client,
        conn: Mutex<Option<redis::Connection>>,
    },
    /// The user's Redis Cluster, reached by its seed URLs: commands only.
    ExternalCluster {
        client: redis::cluster::ClusterClient,
        /// The seed URLs, as given (for the workers).
        urls: Vec<String>,
    },
    /// A throwaway Redis Cluster; `owner` is the index of the master
    /// pair serving the lock keys' slot while a slot migration moves it.
    Cluster {
        cluster: RedisCluster,
        owner: Option<usize>,
    },
    /// A throwaway Redis Sentinel setup; `old` is the primary's port
    /// while a Sentinel fault's failover runs.
    Sentinel {
        setup: RedisSentinel,
        old: Option<u16>,
    },
    /// An etcd cluster (a throwaway one of three members, or the user's),
    /// for the etcd modes: no Redis at all.
    Etcd(EtcdLab),
    /// A throwaway ZooKeeper ensemble of three servers, for the ZooKeeper
    /// modes: no Redis at all.
    ZooKeeper(ZkLab),
    /// The lab's PostgreSQL as the lock service (and a PgBouncer in front
    /// of it), for the pg modes: no Redis at all.
    Postgres(PgLab),
}

pub(super) struct Servers {
    pub(super) primary: Primary,
    pub(super) replica: Option<RedisServer>,
    /// Servers killed by a failover, kept for their logs until the lab goes.
    pub(super) retired: Vec<RedisServer>,
    /// The empty server the primary replicates during a demotion.
    pub(super) demoter: Option<RedisServer>,
    /// The lab's own connection through a `maxclients` window: the only
    /// one Redis lets in, kept to lift the limit at the window's end.
    pub(super) limiter: Option<redis::Connection>,
    pub(super) nodes: Vec<RedisServer>,
    pub(super) postgres: Option<Arc<PostgresServer>>,
    pub(super) workers: Vec<u32>,
    pub(super) pauser: Option<Pauser>,
}

impl Servers {
    /// `primary` and the options' PostgreSQL; no replica, nodes or
    /// workers yet.
    pub(super) fn new(primary: Primary, options: &LabOptions) -> Servers {
        Servers {
            primary,
            replica: None,
            retired: Vec::new(),
            demoter: None,
            limiter: None,
            nodes: Vec::new(),
            postgres: options.postgres.clone(),
            workers: Vec::new(),
            pauser: None,
        }
    }
}

/// The throwaway primary `fault` needs to control.
pub(super) fn own(primary: &mut Primary, fault: Fault) -> Result<&mut RedisServer, LabError> {
    match primary {
        Primary::Own(server) => Ok(server),
        Primary::External { .. }
        | Primary::ExternalCluster { .. }
        | Primary::Cluster { .. }
        | Primary::Sentinel { .. }
        | Primary::Etcd(_)
        | Primary::ZooKeeper(_)
        | Primary::Postgres(_) => Err(LabError::Unsupported {
            fault,
            needs: "a single redis-server the lab started (it controls the process)",
        }),
    }
}

impl Primary {
    /// Runs one command, its reply dropped.
    pub(super) fn command(&self, args: &[&str], what: &str) -> Result<(), LabError> {
        match self {
            Primary::Own(server) => server.command(args).map(drop).map_err(server_err(what)),
            Primary::Cluster { .. } => Err(LabError::Options(
                "key and script faults are not sent to a throwaway cluster lab",
            )),
            Primary::Etcd(_) => Err(LabError::Options(
                "redis commands are not sent to an etcd lab (its key loss is etcd-revoke)",
            )),
            Primary::ZooKeeper(_) => Err(LabError::Options(
                "redis commands are not sent to a zookeeper lab (its key loss is zookeeper-node-delete)",
            )),
            Primary::Postgres(_) => Err(LabError::Options(
                "redis commands are not sent to a pg lab (its key loss is pg-row-delete)",
            )),
            // The primary the sentinels name now.
            Primary::Sentinel { setup, .. } => setup
                .primary()
                .and_then(|primary| primary.command(args))
                .map(drop)
                .map_err(server_err(what)),
            Primary::ExternalCluster { client, .. } => {
                let mut conn = client.get_connection().map_err(external(what))?;
                match args {
                    // The cluster client sends each key to its master.
                    ["DEL", keys @ ..] => keys
                        .iter()
                        .try_for_each(|key| query(&mut conn, &["DEL", key], what)),
                    ["SCRIPT", "FLUSH"] => {
                        // Every master caches scripts: flush each one.
                        let pipe = redis::cmd("SCRIPT").arg("FLUSH").to_owned();
                        conn.route_command(
                            &pipe,
                            redis::cluster_routing::RoutingInfo::MultiNode((
                                redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                                Some(redis::cluster_routing::ResponsePolicy::AllSucceeded),
                            )),
                        )
                        .map(drop)
                        .map_err(external(what))
                    }
                    _ => query(&mut conn, args, what),
                }
            }
            Primary::External { client, conn } => {
                let mut cached = conn.lock().unwrap_or_else(PoisonError::into_inner);
                let mut open = match cached.take() {
                    Some(open) => open,
                    None => {
                        let open = client
                            .get_connection_with_timeout(EXTERNAL_TIMEOUT)
                            .map_err(external(what))?;
                        open.set_read_timeout(Some(EXTERNAL_TIMEOUT))
                            .map_err(external(what))?;
                        open
                    }
                };
                let result = query(&mut open, args, what);
                // A refusal leaves the connection usable; anything else
                // (a timeout, a reset) may not.
                if matches!(&result, Err(LabError::External { source, .. }) if source.code().is_none())
                {
                    drop(open);
                } else {
                    *cached = Some(open);
                }
                result
            }
        }
    }
}

/// Sends `args` (a command and its arguments), its reply dropped.
pub(super) fn query(
    conn: &mut impl redis::ConnectionLike,
    args: &[&str],
    what: &str,
) -> Result<(), LabError> {
    let Some((name, rest)) = args.split_first() else {
        return Err(LabError::Options("an empty redis command"));
    };
    redis::cmd(name)
        .arg(rest)
        .query::<redis::Value>(conn)
        .map(drop)
        .map_err(external(what))
}
