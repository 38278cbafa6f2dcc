//! Where `bench contention`'s rows run: the invocation's one server, or a
//! Redis Cluster (a throwaway one of three masters, or the user's own).
//!
//! A cluster row runs the same workloads with the same figures; what
//! differs is the lock key (it needs a hash tag, so that hand-off's queue
//! keys and shard channel share its slot), the connection (redis-rs's
//! cluster connection, RESP3 for sharded pub/sub) and the server CPU
//! figure (the sum over every master, the idle ones' housekeeping
//! included: what the deployment spends).

use std::time::Duration;

use anyhow::Context;
use leasehold::{Connection, HandoffClient};
use leasehold_testkit::RedisCluster;
use redis::Value;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};

use crate::cli::ContentionArgs;
use crate::env::Env;
use crate::exit::Usage;
use crate::progress::note;
use crate::redact::redact_url;
use crate::server;

/// The lock key of the single-server rows.
const NODE_KEY: &str = "lock:bench:contention";
/// The lock key of the cluster rows: its hash tag puts its hand-off keys
/// (`:waitq`, `:waiters`) and shard channel in its slot.
pub(crate) const CLUSTER_KEY: &str = "lock:{bench:contention}";

/// The cluster client's retry waits, in milliseconds (redis-rs's defaults
/// start at 1,280: many times a 2 ms hold).
const CLUSTER_RETRY_WAIT_MIN_MS: u64 = 1;
const CLUSTER_RETRY_WAIT_MAX_MS: u64 = 50;

/// Where a row runs, reached through connections of type `C`.
pub(crate) struct Site<C> {
    /// The workloads' own requests (clearing the key, the wallet).
    pub(crate) conn: C,
    /// Opens each hand-off locker's pub/sub connection.
    pub(crate) subscriber: HandoffClient,
    /// Bounds every request of the lockers.
    pub(crate) command_timeout: Duration,
    /// The one lock key every caller contends for.
    pub(crate) key: &'static str,
    cpu: Cpu,
}

/// How the server CPU of a site is read.
enum Cpu {
    Node(Connection),
    Cluster(ClusterConnection),
}

impl Site<Connection> {
    /// The invocation's one server.
    pub(crate) fn node(env: &Env) -> Site<Connection> {
        Site {
            conn: env.redis.clone(),
            subscriber: HandoffClient::from(env.client.clone()),
            command_timeout: env.locker.command_timeout(),
            key: NODE_KEY,
            cpu: Cpu::Node(env.redis.clone()),
        }
    }
}

impl<C> Site<C> {
    /// CPU time the site's servers have used so far (summed over the
    /// masters of a cluster); `None` when the user may not run `INFO`.
    pub(crate) async fn cpu(&self) -> anyhow::Result<Option<Duration>> {
        match &self.cpu {
            Cpu::Node(conn) => server::cpu(conn).await,
            Cpu::Cluster(conn) => cluster_cpu(conn).await,
        }
    }

    /// CPU time used since `before` (from [`cpu`](Self::cpu)), if known.
    pub(crate) async fn cpu_since(
        &self,
        before: Option<Duration>,
    ) -> anyhow::Result<Option<Duration>> {
        let after = self.cpu().await?;
        Ok(before
            .zip(after)
            .map(|(before, after)| after.saturating_sub(before)))
    }
}

/// The sum of every master's `INFO cpu`.
async fn cluster_cpu(conn: &ClusterConnection) -> anyhow::Result<Option<Duration>> {
    let mut conn = conn.clone();
    let mut info = redis::cmd("INFO");
    info.arg("cpu");
    let replies = conn
        .route_command(
            info,
            RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
        )
        .await
        .context("reading INFO cpu from the cluster's masters")?;
    let Value::Map(replies) = replies else {
        anyhow::bail!("INFO cpu to every master: not one reply per node");
    };
    let mut total = Duration::ZERO;
    for (_node, reply) in replies {
        if let Value::ServerError(err) = &reply {
            if err.code() == "NOPERM" {
                return Ok(None);
            }
            anyhow::bail!("INFO cpu refused by a master: {}", err.code());
        }
        let text: String =
            redis::from_redis_value(reply).context("INFO cpu from a master: not text")?;
        total += server::info_cpu(&text)?;
    }
    Ok(Some(total))
}

/// The cluster the cluster rows run on, with the throwaway one it started.
pub(crate) struct Cluster {
    pub(crate) site: Site<ClusterConnection>,
    /// Kept alive for the whole run; stopped on drop.
    _throwaway: Option<RedisCluster>,
}

/// Refuses `--cluster-url` seeds that are not plain `redis://` URLs
/// (before any server is started or connected to).
pub(crate) fn check(args: &ContentionArgs) -> anyhow::Result<()> {
    if let Some(seed) = args
        .cluster_url
        .iter()
        .find(|url| !url.starts_with("redis://"))
    {
        return Err(Usage(format!(
            "--cluster-url takes plain redis:// seed URLs, not {}",
            redact_url(seed)
        ))
        .into());
    }
    Ok(())
}

/// The cluster of `args`: `--cluster-url`'s, or a throwaway one unless
/// `--no-cluster` or `--redis-url` (a user's own single server) says
/// otherwise (then `None`, with a note).
pub(crate) async fn cluster(args: &ContentionArgs) -> anyhow::Result<Option<Cluster>> {
    if args.no_cluster {
        return Ok(None);
    }
    check(args)?;
    let (seeds, throwaway) = if !args.cluster_url.is_empty() {
        (args.cluster_url.clone(), None)
    } else if args.redis.redis_url.is_some() {
        note!(
            "bench contention: no cluster rows (--redis-url is a single server); pass --cluster-url for your own cluster's"
        );
        return Ok(None);
    } else {
        let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3))
            .await
            .context("starting a throwaway redis cluster")?
            .context("starting a throwaway redis cluster")?;
        note!(
            "leasehold: started a throwaway redis cluster of 3 masters at {}; pass --cluster-url to use your own",
            cluster.urls().join(",")
        );
        (cluster.urls(), Some(cluster))
    };
    let shown: Vec<String> = seeds.iter().map(|url| redact_url(url)).collect();
    let shown = shown.join(",");
    let timeout = crate::env::COMMAND_TIMEOUT;
    let client = ClusterClient::builder(seeds)
        .use_protocol(redis::ProtocolVersion::RESP3)
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .min_retry_wait(CLUSTER_RETRY_WAIT_MIN_MS)
        .max_retry_wait(CLUSTER_RETRY_WAIT_MAX_MS)
        .build()
        .map_err(|_| Usage(format!("--cluster-url {shown} does not parse")))?;
    let conn = client
        .get_async_connection()
        .await
        .with_context(|| format!("connecting to the redis cluster at {shown}"))?;
    Ok(Some(Cluster {
        site: Site {
            conn: conn.clone(),
            subscriber: HandoffClient::from(client),
            command_timeout: timeout,
            key: CLUSTER_KEY,
            cpu: Cpu::Cluster(conn),
        },
        _throwaway: throwaway,
    }))
}
