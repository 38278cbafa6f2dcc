//! A throwaway Redis Cluster: several `redis-server --cluster-enabled yes`
//! masters on free loopback ports, the 16384 slots split between them.

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::process;
use crate::redis::{RedisOptions, RedisServer};

/// The number of hash slots in a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;

/// How long the nodes get to agree that the cluster is up.
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A local Redis Cluster of masters only (no replicas), every slot assigned.
///
/// Node `i` of `n` serves the slots `i * 16384 / n` up to (excluding)
/// `(i + 1) * 16384 / n`. Dropping the cluster kills every node.
///
/// ```no_run
/// let cluster = leasehold_testkit::RedisCluster::start(3)?;
/// let urls = cluster.urls(); // hand these to redis::cluster::ClusterClient
/// # Ok::<(), leasehold_testkit::Error>(())
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least 1), assigns the slots, introduces the
    /// nodes to each other, and waits until every node reports
    /// `cluster_state:ok`.
    ///
    /// # Errors
    /// As for [`RedisServer::start`], plus [`Error::NotReady`] if the nodes
    /// do not agree within 20 s, and [`Error::RedisReply`] if a cluster
    /// command is refused.
    pub fn start(masters: usize) -> Result<RedisCluster, Error> {
        let masters = masters.max(1);
        let mut nodes = Vec::with_capacity(masters);
        for _ in 0..masters {
            let bus_port = process::free_port()?;
            let options = RedisOptions::default().args([
                "--cluster-enabled".to_owned(),
                "yes".to_owned(),
                "--cluster-config-file".to_owned(),
                "nodes.conf".to_owned(),
                "--cluster-node-timeout".to_owned(),
                "2000".to_owned(),
                "--cluster-port".to_owned(),
                bus_port.to_string(),
            ]);
            nodes.push((RedisServer::start_with(options)?, bus_port));
        }
        let total = usize::from(CLUSTER_SLOTS);
        for (i, (node, _)) in nodes.iter().enumerate() {
            let first = i * total / masters;
            let last = (i + 1) * total / masters - 1;
            node.redis_cli(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &first.to_string(),
                &last.to_string(),
            ])?;
        }
        if let Some(((first, _), rest)) = nodes.split_first() {
            for (node, bus_port) in rest {
                first.redis_cli(&[
                    "CLUSTER",
                    "MEET",
                    node.host(),
                    &node.port().to_string(),
                    &bus_port.to_string(),
                ])?;
            }
        }
        let cluster = RedisCluster {
            nodes: nodes.into_iter().map(|(node, _)| node).collect(),
        };
        cluster.wait_ok()?;
        Ok(cluster)
    }

    fn wait_ok(&self) -> Result<(), Error> {
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        let want_known = format!("cluster_known_nodes:{}", self.nodes.len());
        for node in &self.nodes {
            loop {
                let info = node.redis_cli(&["CLUSTER", "INFO"])?;
                if info.contains("cluster_state:ok") && info.contains(&want_known) {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(Error::NotReady {
                        server: format!("redis cluster node 127.0.0.1:{}", node.port()),
                        timeout: CLUSTER_READY_TIMEOUT,
                        log_tail: info,
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// The nodes, in slot order.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes, for fault injection (pause, kill).
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// One `redis://` URL per node, for a cluster client's seed list.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The slot `key` hashes to, as the cluster computes it.
    ///
    /// # Errors
    /// As for [`RedisServer::redis_cli`].
    pub fn slot_of(&self, key: &str) -> Result<u16, Error> {
        let node = self.first()?;
        let reply = node.redis_cli(&["CLUSTER", "KEYSLOT", key])?;
        reply.trim().parse().map_err(|_| Error::RedisReply {
            message: format!("unexpected CLUSTER KEYSLOT reply {reply:?}"),
        })
    }

    /// Starts moving `slot` from node `from` to node `to`: marks it
    /// MIGRATING on `from` and IMPORTING on `to`. While migrating, requests
    /// for keys that `from` no longer has get an `ASK` redirect.
    ///
    /// # Errors
    /// [`Error::RedisReply`] if a node refuses, e.g. for a wrong index.
    pub fn begin_slot_migration(&self, slot: u16, from: usize, to: usize) -> Result<(), Error> {
        let (source, target) = (self.node(from)?, self.node(to)?);
        let (source_id, target_id) = (
            source.redis_cli(&["CLUSTER", "MYID"])?,
            target.redis_cli(&["CLUSTER", "MYID"])?,
        );
        let slot = slot.to_string();
        target.redis_cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id])?;
        source.redis_cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id])?;
        Ok(())
    }

    /// Finishes moving `slot`: migrates its remaining keys from `from` to
    /// `to` and assigns the slot to `to` on every node. Later requests for
    /// its keys sent to `from` get a `MOVED` redirect.
    ///
    /// # Errors
    /// [`Error::RedisReply`] if a node refuses.
    pub fn finish_slot_migration(&self, slot: u16, from: usize, to: usize) -> Result<(), Error> {
        let (source, target) = (self.node(from)?, self.node(to)?);
        let target_id = target.redis_cli(&["CLUSTER", "MYID"])?;
        let slot = slot.to_string();
        let keys = source.redis_cli(&["CLUSTER", "GETKEYSINSLOT", &slot, "1000"])?;
        let port = target.port().to_string();
        for key in keys
            .lines()
            .map(str::trim)
            .filter(|k| !k.is_empty() && *k != "(empty array)")
        {
            source.redis_cli(&["MIGRATE", target.host(), &port, key, "0", "5000"])?;
        }
        for node in &self.nodes {
            node.redis_cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id])?;
        }
        Ok(())
    }

    fn node(&self, index: usize) -> Result<&RedisServer, Error> {
        self.nodes.get(index).ok_or_else(|| Error::RedisReply {
            message: format!("no cluster node {index}"),
        })
    }

    fn first(&self) -> Result<&RedisServer, Error> {
        self.node(0)
    }

    /// The node that serves `slot`.
    pub fn node_for_slot(&self, slot: u16) -> Option<&RedisServer> {
        let n = self.nodes.len();
        let index = usize::from(slot % CLUSTER_SLOTS) * n / usize::from(CLUSTER_SLOTS);
        self.nodes.get(index)
    }
}
