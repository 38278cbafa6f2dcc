//! A throwaway Redis Cluster: several `redis-server --cluster-enabled yes`
//! masters on free loopback ports, the 16384 slots split between them.

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::process;
use crate::redis::{RedisOptions, RedisServer};

/// The number of hash slots in a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;

/// After this long without a promotion, a failover is asked for again
/// (Redis gives up a manual failover after 5 s).
const MANUAL_FAILOVER_RETRY: Duration = Duration::from_secs(6);

/// How long the nodes get to agree that the cluster is up.
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A local Redis Cluster, every slot assigned: masters only
/// ([`start`](Self::start)), or with a replica per master
/// ([`start_with_replicas`](Self::start_with_replicas)), which
/// [`failover`](Self::failover) promotes.
///
/// Master `i` of `n` serves the slots `i * 16384 / n` up to (excluding)
/// `(i + 1) * 16384 / n`. Dropping the cluster kills every node.
///
/// ```no_run
/// let cluster = leasehold_testkit::RedisCluster::start(3)?;
/// let urls = cluster.urls(); // hand these to redis::cluster::ClusterClient
/// # Ok::<(), leasehold_testkit::Error>(())
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    /// The nodes that were started as masters, in slot order (after a
    /// failover, one of them may serve as a replica).
    nodes: Vec<RedisServer>,
    /// `replicas[i]` was started as the replica of `nodes[i]`.
    replicas: Vec<RedisServer>,
}

/// How [`RedisCluster::failover`] promotes a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failover {
    /// `CLUSTER FAILOVER`: the master stops taking writes, the replica
    /// catches up with it, wins the masters' vote, then takes the slots.
    /// Nothing written before is lost.
    Coordinated,
    /// `CLUSTER FAILOVER TAKEOVER`: the replica takes the slots at once,
    /// with no catch-up and no vote, as after a master that died with
    /// writes its replica never got: those writes are lost.
    Takeover,
}

/// A cluster node's options: cluster mode, its bus on a free port.
fn cluster_node() -> Result<(RedisServer, u16), Error> {
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
        "--repl-diskless-sync-delay".to_owned(),
        "0".to_owned(),
        // A replica may be promoted however stale its copy is: the chaos
        // tests want a failover, not a cluster that refuses one.
        "--cluster-replica-validity-factor".to_owned(),
        "0".to_owned(),
    ]);
    Ok((RedisServer::start_with(options)?, bus_port))
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
        Self::start_inner(masters, false)
    }

    /// As [`start`](Self::start), with one replica per master, each
    /// attached (`CLUSTER REPLICATE`) and in sync before this returns.
    ///
    /// # Errors
    /// As for [`start`](Self::start); [`Error::NotReady`] also when a
    /// replica does not sync within 20 s.
    pub fn start_with_replicas(masters: usize) -> Result<RedisCluster, Error> {
        Self::start_inner(masters, true)
    }

    fn start_inner(masters: usize, with_replicas: bool) -> Result<RedisCluster, Error> {
        let masters = masters.max(1);
        let mut nodes = Vec::with_capacity(masters);
        for _ in 0..masters {
            nodes.push(cluster_node()?);
        }
        let mut replicas = Vec::new();
        if with_replicas {
            for _ in 0..masters {
                replicas.push(cluster_node()?);
            }
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
            for (node, bus_port) in rest.iter().chain(&replicas) {
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
            replicas: replicas.into_iter().map(|(node, _)| node).collect(),
        };
        cluster.wait_known()?;
        for (master, replica) in cluster.nodes.iter().zip(&cluster.replicas) {
            let id = master.redis_cli(&["CLUSTER", "MYID"])?;
            replica.redis_cli(&["CLUSTER", "REPLICATE", id.trim()])?;
        }
        cluster.wait_ok()?;
        for replica in &cluster.replicas {
            wait_until(replica, "the replica to sync", |node| {
                let info = node.redis_cli(&["INFO", "replication"])?;
                Ok(info.contains("master_link_status:up").then_some(()))
            })?;
        }
        // A master ignores a manual failover request from a node it does
        // not yet know as its replica (the news travels by gossip).
        for master in cluster.nodes.iter().take(cluster.replicas.len()) {
            let id = master.redis_cli(&["CLUSTER", "MYID"])?;
            wait_until(master, "the master to know its replica", |node| {
                let replicas = node.redis_cli(&["CLUSTER", "REPLICAS", id.trim()])?;
                Ok((replicas.contains("slave") || replicas.contains("replica")).then_some(()))
            })?;
        }
        Ok(cluster)
    }

    /// Waits until every node knows every other one (a replica can only be
    /// attached to a master it knows).
    fn wait_known(&self) -> Result<(), Error> {
        let want = format!(
            "cluster_known_nodes:{}",
            self.nodes.len() + self.replicas.len()
        );
        for node in self.nodes.iter().chain(&self.replicas) {
            wait_until(node, "the nodes to meet", |node| {
                let info = node.redis_cli(&["CLUSTER", "INFO"])?;
                Ok(info.contains(&want).then_some(()))
            })?;
        }
        Ok(())
    }

    /// Promotes the replica of master `index` (or, after an earlier
    /// failover, whichever of the two is the replica now) and waits until
    /// it reports itself a master. Afterwards the old master is the new
    /// one's replica. Returns the promoted node's port.
    ///
    /// # Errors
    /// [`Error::RedisReply`] without a replica at `index` or when it
    /// refuses; [`Error::NotReady`] if it is not master within 20 s (the
    /// masters vote once per failover of the same slots within twice the
    /// node timeout, 4 s here: a [`Coordinated`](Failover::Coordinated)
    /// failover right after another one waits for that).
    pub fn failover(&self, index: usize, kind: Failover) -> Result<u16, Error> {
        let (master, replica) = (self.node(index)?, self.replica(index)?);
        let role = |node: &RedisServer| -> Result<bool, Error> {
            Ok(node.redis_cli(&["ROLE"])?.starts_with("master"))
        };
        let candidate = if role(replica)? { master } else { replica };
        let mut args = vec!["CLUSTER", "FAILOVER"];
        if kind == Failover::Takeover {
            args.push("TAKEOVER");
        }
        candidate.redis_cli(&args)?;
        // A coordinated failover the master did not answer in time (5 s, a
        // loaded machine) is abandoned by the replica: ask again.
        let mut asked = Instant::now();
        wait_until(candidate, "the promoted replica to be master", |node| {
            if role(node)? {
                return Ok(Some(()));
            }
            if asked.elapsed() > MANUAL_FAILOVER_RETRY {
                node.redis_cli(&args)?;
                asked = Instant::now();
            }
            Ok(None)
        })?;
        Ok(candidate.port())
    }

    /// The index `i` of the pair (`nodes()[i]` and, if any, `replicas()[i]`)
    /// whose current master serves `slot`, as `CLUSTER NODES` on the first
    /// node says (after slot migrations and failovers too).
    ///
    /// # Errors
    /// [`Error::RedisReply`] when no master of this cluster serves it.
    pub fn owner_of(&self, slot: u16) -> Result<usize, Error> {
        let nodes = self.first()?.redis_cli(&["CLUSTER", "NODES"])?;
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
                continue;
            };
            if !flags.contains("master") || flags.contains("fail") {
                continue;
            }
            let serves = fields.iter().skip(8).any(|range| {
                if range.starts_with('[') {
                    return false; // a migration in progress, not ownership
                }
                let mut ends = range.splitn(2, '-').map(str::parse::<u16>);
                match (ends.next(), ends.next()) {
                    (Some(Ok(first)), Some(Ok(last))) => (first..=last).contains(&slot),
                    (Some(Ok(only)), None) => only == slot,
                    _ => false,
                }
            });
            if !serves {
                continue;
            }
            let port = addr
                .split('@')
                .next()
                .and_then(|hostport| hostport.rsplit(':').next())
                .and_then(|port| port.parse::<u16>().ok());
            let pair = (0..self.nodes.len()).find(|&i| {
                Some(self.nodes[i].port()) == port
                    || self.replicas.get(i).map(RedisServer::port) == port
            });
            if let Some(pair) = pair {
                return Ok(pair);
            }
        }
        Err(Error::RedisReply {
            message: format!("no master of this cluster serves slot {slot}"),
        })
    }

    /// The replicas, `replicas()[i]` started as master `i`'s.
    pub fn replicas(&self) -> &[RedisServer] {
        &self.replicas
    }

    fn replica(&self, index: usize) -> Result<&RedisServer, Error> {
        self.replicas.get(index).ok_or_else(|| Error::RedisReply {
            message: format!("no replica of cluster node {index}"),
        })
    }

    fn wait_ok(&self) -> Result<(), Error> {
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        let want_known = format!(
            "cluster_known_nodes:{}",
            self.nodes.len() + self.replicas.len()
        );
        for node in self.nodes.iter().chain(&self.replicas) {
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

    /// The nodes started as masters, in slot order.
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
    /// `to` and assigns the slot to `to` on every node, in the order the
    /// `CLUSTER SETSLOT` docs give (the target, then the source, then the
    /// rest), so the source never points at a target that still points
    /// back. Later requests for its keys sent to `from` get a `MOVED`
    /// redirect.
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
        let order = [to, from]
            .into_iter()
            .chain((0..self.nodes.len()).filter(|&i| i != to && i != from));
        for index in order {
            self.node(index)?
                .redis_cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id])?;
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

/// Polls `check` on `node` every 20 ms until it gives `Some`, for at most
/// [`CLUSTER_READY_TIMEOUT`].
fn wait_until<T>(
    node: &RedisServer,
    what: &str,
    mut check: impl FnMut(&RedisServer) -> Result<Option<T>, Error>,
) -> Result<T, Error> {
    let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
    loop {
        if let Some(done) = check(node)? {
            return Ok(done);
        }
        if Instant::now() >= deadline {
            return Err(Error::NotReady {
                server: format!("redis cluster node 127.0.0.1:{} ({what})", node.port()),
                timeout: CLUSTER_READY_TIMEOUT,
                log_tail: node.log(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
