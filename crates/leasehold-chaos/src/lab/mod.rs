//! The servers a run uses, and the nemesis that injects faults into them.
//!
//! A [`Lab`] starts throwaway servers through `leasehold-testkit`: a Redis
//! primary behind a TCP fault proxy (the callers connect through the
//! proxy, so the network can lag, be cut or be swallowed), optionally a
//! replica (for failover), extra independent Redis nodes (for Redlock), and
//! a PostgreSQL; or a Redis Cluster of three masters with a replica each
//! (for slot migration and cluster failover); or a Redis Sentinel setup of
//! a primary, a replica and three sentinels (for the Sentinel faults). It
//! can also stand in front
//! of your own Redis or Redis Cluster ([`LabOptions::redis_url`],
//! [`LabOptions::cluster_urls`]) for the faults that need no control of
//! the Redis processes, or of your own etcd cluster
//! ([`LabOptions::etcd_endpoints`], with TLS and a user) for the faults
//! that need no control of its members. A ZooKeeper lab
//! ([`LabOptions::zookeeper`]) is a throwaway ensemble of three servers
//! instead of any Redis. A pg lab ([`LabOptions::pg`]) is the lab's
//! PostgreSQL as the lock service (and a PgBouncer in front of it, with
//! [`LabOptions::pgbouncer`]), no Redis. The nemesis runs on its own
//! thread, so the
//! blocking server control never stalls the callers.
//!
//! The parts, by job: `options` (what a lab is asked for), `start` (the
//! servers started or reached, and the URLs the callers dial), `servers`
//! (what the lab holds, and how a command reaches its Redis), `acl` (the
//! lock user's rules), `etcd`, `zookeeper` and `pg` (those labs and
//! their faults), `inject` (how each fault starts, repeats and ends)
//! and `nemesis` (the schedule, run on its own thread); this file holds
//! the [`Lab`] a run is given.
//!
//! # Your own infrastructure
//!
//! - **TLS**: [`LabOptions::redis_url`] takes `rediss://`, with the CA and
//!   the client certificate of [`LabOptions::tls`] (the library's
//!   [`TlsFiles`]); the lab's own connection uses them as the callers do
//!   ([`Lab::client`]). The proxy passes TLS through untouched, so the
//!   certificate must name the host the callers dial:
//!   [`LabOptions::proxy_host`], or [`LabOptions::proxy`]`(false)` (the
//!   network faults are then refused, never skipped in silence).
//! - **ACL**: against your Redis, the lab sends only the harness's
//!   documented commands ([`HARNESS_ACL_RULES`](crate::HARNESS_ACL_RULES)
//!   on top of [`ACL_RULES`], per fault [`Fault::needs_commands`]) and
//!   checks them before a run ([`Lab::check_fault`]).
//! - **Your etcd**: [`LabOptions::etcd_endpoints`] (`https://` with
//!   [`LabOptions::etcd_tls`], a user with
//!   [`LabOptions::etcd_credentials`]); the lab checks the user's
//!   access to the lock keys before a run and injects only
//!   [`Fault::EtcdRevoke`] there (the other etcd faults need the
//!   members' processes: [`Fault::needs_etcd_process`]).
//! - **The proxy's port**: [`LabOptions::proxy_port`].
//! - **Throwaway servers configured like yours**, for the faults that
//!   need the process: [`LabOptions::redis_options`] (TLS with client
//!   certificates, a password, persistence), [`LabOptions::acl_user`]
//!   for the lock user's ACL, [`PostgresServer::start_tls`] for a TLS
//!   PostgreSQL.
//!
//! [`Fault::needs_commands`]: crate::fault::Fault::needs_commands
//! [`Fault::EtcdRevoke`]: crate::fault::Fault::EtcdRevoke
//! [`Fault::needs_etcd_process`]: crate::fault::Fault::needs_etcd_process
//! [`PostgresServer::start_tls`]: leasehold_testkit::PostgresServer::start_tls

mod acl;
mod error;
mod etcd;
mod inject;
mod nemesis;
mod options;
mod pg;
mod servers;
mod start;
mod zookeeper;

use std::sync::{Arc, Mutex, PoisonError};

use leasehold::tls::TlsFiles;
use leasehold_testkit::FaultProxy;

pub use acl::{ACL_RULES, ACL_USER};
pub use error::LabError;
pub use nemesis::run_nemesis;
pub use options::LabOptions;
use servers::{Primary, Servers};
use start::url;

/// Tells worker `n` to stop itself at its next pause point (`true`), or
/// not to any more (`false`). See [`Lab::set_pauser`].
pub type Pauser = Arc<dyn Fn(u32, bool) + Send + Sync>;

/// Throwaway servers and the fault proxy in front of the primary. Cheap to
/// clone (clones share the servers); everything stops when the last clone
/// is dropped.
#[derive(Clone)]
pub struct Lab {
    servers: Arc<Mutex<Servers>>,
    /// In front of the primary; none on a cluster.
    proxy: Option<Arc<FaultProxy>>,
    aof: bool,
    /// The callers' URL to an external primary (its credentials, the
    /// proxy's address); `None` for a throwaway one.
    caller_url: Option<String>,
    /// The password of [`ACL_USER`], whom the callers connect as (see
    /// [`LabOptions::acl_user`]).
    acl_password: Option<String>,
    /// The callers' `user:password@` (or `:password@`, or nothing) on the
    /// throwaway extra nodes.
    node_auth: String,
    /// The TLS files of the callers (and of the lab's own connection to a
    /// Redis given by URL).
    tls: Option<TlsFiles>,
    /// Why the primary runs on the machine's clock though a fake one was
    /// asked for.
    clock_note: Option<String>,
}

impl Lab {
    /// Whether the callers use a Redis Cluster ([`node_urls`](Self::node_urls)
    /// are then its seed nodes).
    pub fn is_cluster(&self) -> bool {
        matches!(
            self.servers().primary,
            Primary::Cluster { .. } | Primary::ExternalCluster { .. }
        )
    }

    fn servers(&self) -> std::sync::MutexGuard<'_, Servers> {
        self.servers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The URL callers use: the primary, through the fault proxy (or
    /// directly, with [`LabOptions::proxy`]`(false)`), with the user and
    /// password they connect as; `rediss://` over TLS. Build their client
    /// with [`client`](Self::client), which adds the TLS files.
    /// On a cluster, the first seed node's URL; on a Sentinel setup, its
    /// `redis+sentinel://` URL.
    pub fn redis_url(&self) -> String {
        match &self.caller_url {
            Some(url) => url.clone(),
            None => self.node_urls().into_iter().next().unwrap_or_default(),
        }
    }

    /// A client for [`redis_url`](Self::redis_url) with the TLS files of
    /// [`LabOptions::tls`] ([`leasehold::tls::client`]): give it to
    /// [`Locker::connect`](leasehold::Locker::connect) or a locker
    /// builder.
    ///
    /// # Errors
    /// [`LabError::Tls`] when the files cannot be read or do not go with
    /// the URL.
    pub fn client(&self) -> Result<redis::Client, LabError> {
        let files = self.tls.clone().unwrap_or_default();
        leasehold::tls::client(&self.redis_url(), &files).map_err(LabError::Tls)
    }

    /// The TLS files the callers use ([`LabOptions::tls`]), if any.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// The URLs of a Redlock quorum: [`redis_url`](Self::redis_url) first
    /// (the node faults hit), then the extra nodes. On a cluster, its
    /// masters' URLs, the seed list of a cluster client. On an etcd lab,
    /// its members' client endpoints (`http://127.0.0.1:PORT`, or those
    /// given to [`LabOptions::etcd_endpoints`]). On a ZooKeeper lab, its
    /// servers' client addresses (`127.0.0.1:PORT`: join them with `,`
    /// for a connect string). On a pg lab, the one URL its callers dial
    /// ([`pgbouncer_url`](Self::pgbouncer_url), else
    /// [`postgres_url`](Self::postgres_url)): it holds the server's
    /// password, do not log it.
    pub fn node_urls(&self) -> Vec<String> {
        match &self.servers().primary {
            Primary::Cluster { cluster, .. } => return cluster.urls(),
            Primary::ExternalCluster { urls, .. } => return urls.clone(),
            Primary::Etcd(etcd) => return etcd.endpoints.clone(),
            Primary::ZooKeeper(zk) => return zk.addresses(),
            Primary::Postgres(_) => {
                return self
                    .pgbouncer_url()
                    .or(self.postgres_url())
                    .into_iter()
                    .collect();
            }
            _ => {}
        }
        let mut urls = vec![self.redis_url()];
        urls.extend(
            self.servers()
                .nodes
                .iter()
                .map(|node| url(node.is_tls(), &self.node_auth, node.host(), node.port(), 0)),
        );
        urls
    }

    /// The throwaway PostgreSQL's URL (it holds a generated password: do
    /// not log it).
    pub fn postgres_url(&self) -> Option<String> {
        self.servers().postgres.as_ref().map(|pg| pg.url())
    }

    /// The worker processes a [`Fault::HolderPause`] may stop (in process,
    /// with none, it stalls a caller instead).
    ///
    /// [`Fault::HolderPause`]: crate::fault::Fault::HolderPause
    pub fn set_workers(&self, pids: Vec<u32>) {
        self.servers().workers = pids;
    }

    /// How [`Fault::HolderPause`] reaches into worker processes: instead of
    /// stopping every worker but one at a random moment (which often finds
    /// no holder between its read and its write), the window's worker is
    /// told to stop itself (SIGSTOP) at its next pause point, and every
    /// worker is continued (SIGCONT) when the window ends. Needs
    /// [`set_workers`](Self::set_workers) too.
    ///
    /// [`Fault::HolderPause`]: crate::fault::Fault::HolderPause
    pub fn set_pauser(&self, pauser: Pauser) {
        self.servers().pauser = Some(pauser);
    }

    /// The server logs, for a failure message.
    pub fn logs(&self) -> String {
        let servers = self.servers();
        let mut out = match &servers.primary {
            Primary::Own(primary) => format!("--- redis (primary) ---\n{}", primary.log()),
            Primary::External { .. } | Primary::ExternalCluster { .. } => {
                "--- redis: yours, no log here ---".to_owned()
            }
            Primary::Cluster { cluster, .. } => {
                let mut out = String::new();
                for (i, node) in cluster.nodes().iter().chain(cluster.replicas()).enumerate() {
                    out.push_str(&format!("--- redis cluster node {i} ---\n{}\n", node.log()));
                }
                out
            }
            Primary::Sentinel { setup, .. } => {
                let mut out = String::new();
                for (i, node) in setup.servers().iter().enumerate() {
                    out.push_str(&format!(
                        "--- redis sentinel data node {i} ---\n{}\n",
                        node.log()
                    ));
                }
                out
            }
            Primary::Etcd(etcd) => etcd.logs(),
            Primary::ZooKeeper(zk) => zk.logs(),
            Primary::Postgres(pg) => pg.logs(),
        };
        for (i, old) in servers.retired.iter().enumerate() {
            out.push_str(&format!("\n--- redis (retired {i}) ---\n{}", old.log()));
        }
        if let Some(note) = &self.clock_note {
            out.push_str(&format!("\n--- redis on the machine's clock ---\n{note}"));
        }
        if let Some(pg) = &servers.postgres {
            out.push_str(&format!("\n--- postgresql ---\n{}", pg.log()));
        }
        out
    }
}
