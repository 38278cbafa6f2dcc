//! What a lab is asked to start: [`LabOptions`], its setters, and the
//! checks of which options go together.

use std::sync::Arc;

use leasehold::tls::TlsFiles;
use leasehold_etcd::client::Credentials;
use leasehold_testkit::{PostgresServer, RedisOptions};

use super::LabError;
use crate::fault::Fault;

/// Which servers a [`Lab`] starts.
///
/// [`Lab`]: super::Lab
#[derive(Clone, Default)]
#[must_use]
pub struct LabOptions {
    pub(super) replica: bool,
    pub(super) aof: bool,
    pub(super) acl_user: bool,
    pub(super) nodes: usize,
    pub(super) postgres: Option<Arc<PostgresServer>>,
    pub(super) redis_url: Option<String>,
    pub(super) cluster: bool,
    pub(super) cluster_urls: Vec<String>,
    pub(super) sentinel: bool,
    pub(super) tls: Option<TlsFiles>,
    pub(super) no_proxy: bool,
    pub(super) proxy_port: Option<u16>,
    pub(super) proxy_host: Option<String>,
    pub(super) redis_options: Option<RedisOptions>,
    pub(super) fake_clock: bool,
    pub(super) etcd: bool,
    pub(super) etcd_endpoints: Vec<String>,
    pub(super) etcd_tls: Option<TlsFiles>,
    pub(super) etcd_credentials: Option<Credentials>,
    pub(super) zookeeper: bool,
    pub(super) pg: bool,
    pub(super) pgbouncer: bool,
}

impl LabOptions {
    /// A replica of the primary, for [`Fault::Failover`]. Defaults to none.
    pub fn replica(mut self, on: bool) -> Self {
        self.replica = on;
        self
    }

    /// The primary persists every write to its append-only file, for
    /// [`Fault::RedisRestartAof`]. Defaults to off.
    pub fn aof(mut self, on: bool) -> Self {
        self.aof = on;
        self
    }

    /// The callers connect as an ACL user with the README's minimal rules
    /// ([`ACL_USER`], every mode's commands), made on every throwaway
    /// server with a random password, for [`Fault::AclReset`]. Defaults to
    /// off (the default user).
    ///
    /// [`ACL_USER`]: super::ACL_USER
    pub fn acl_user(mut self, on: bool) -> Self {
        self.acl_user = on;
        self
    }

    /// `n - 1` more independent Redis servers beside the primary, for a
    /// Redlock quorum of `n` (0 or 1: none). Defaults to 0.
    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self
    }

    /// A throwaway PostgreSQL the lab may pause ([`Fault::PostgresPause`])
    /// or restart ([`Fault::PostgresRestart`]);
    /// shared, since starting one takes seconds. For one with TLS (as
    /// your database has), start it with
    /// [`PostgresServer::start_tls`]; the lab only signals its process and
    /// never connects to it (your write closure does, with
    /// [`Lab::postgres_url`] and your TLS settings). Defaults to none.
    ///
    /// [`Lab::postgres_url`]: super::Lab::postgres_url
    pub fn postgres(mut self, server: Arc<PostgresServer>) -> Self {
        self.postgres = Some(server);
        self
    }

    /// Your own Redis (a `redis://` or `rediss://` URL, with its user,
    /// password and database if any; the TLS files with
    /// [`tls`](Self::tls)) instead of a throwaway one: the fault proxy goes
    /// in front of it (unless [`proxy`](Self::proxy)`(false)`). Only the
    /// faults that need no control of the Redis process can run then
    /// ([`Fault::needs_redis_process`] is false), and no replica, AOF,
    /// extra nodes or [`redis_options`](Self::redis_options) can be asked
    /// for. Defaults to none.
    ///
    /// The lab connects as the URL's user, with the same TLS material as
    /// the callers, and sends nothing outside the harness's documented ACL
    /// (the crate's `access` rules: the handshake and `TIME` when it
    /// starts, then only the fault's commands, [`Fault::needs_commands`],
    /// see [`HARNESS_ACL_RULES`](crate::HARNESS_ACL_RULES)); a user who
    /// may not run a fault's command is [`LabError::Permission`] before
    /// the run. It never connects to your PostgreSQL: your write closure
    /// does, with your own TLS settings.
    ///
    /// The lab changes that server: it deletes or expires the lock keys
    /// its callers use ([`Fault::KeyLoss`], [`Fault::EarlyExpiry`]), runs
    /// `SCRIPT FLUSH` ([`Fault::ScriptFlush`]), which drops every
    /// client's cached scripts, kills the other clients' connections
    /// ([`Fault::ConnKill`]) and pauses every client
    /// ([`Fault::RedisStall`]). Point it at a test server.
    pub fn redis_url(mut self, url: impl Into<String>) -> Self {
        self.redis_url = Some(url.into());
        self
    }

    /// A Redis Cluster of three masters with a replica each instead of a
    /// single primary, for [`Fault::SlotMigration`] and
    /// [`Fault::ClusterFailover`]. The callers connect to it directly (a
    /// cluster client follows the nodes' own addresses, so there is no
    /// fault proxy): the network faults and the single-server faults do not
    /// run on it. Defaults to off.
    pub fn cluster(mut self, on: bool) -> Self {
        self.cluster = on;
        self
    }

    /// Your own Redis Cluster (plain `redis://` seed URLs) instead of a
    /// throwaway one: the callers connect to it directly, and only the
    /// faults that need neither the Redis processes nor a proxy can run
    /// ([`Fault::KeyLoss`], [`Fault::EarlyExpiry`], [`Fault::ScriptFlush`]
    /// on every master, and the holder and PostgreSQL pauses). It changes
    /// that cluster as [`redis_url`](Self::redis_url) says. Defaults to
    /// none.
    pub fn cluster_urls(mut self, urls: Vec<String>) -> Self {
        self.cluster_urls = urls;
        self
    }

    /// A Redis Sentinel setup (a primary, a replica and three sentinels,
    /// quorum 2, see [`RedisSentinel`]) instead of a single primary, for
    /// [`Fault::SentinelFailover`] and [`Fault::SentinelKill`]. The callers
    /// connect with its `redis+sentinel://` URL ([`Lab::redis_url`]) and
    /// follow the primary the sentinels name; there is no fault proxy, so
    /// the network faults do not run on it. Defaults to off.
    ///
    /// [`RedisSentinel`]: leasehold_testkit::RedisSentinel
    /// [`Lab::redis_url`]: super::Lab::redis_url
    pub fn sentinel(mut self, on: bool) -> Self {
        self.sentinel = on;
        self
    }

    /// The TLS files (CA, client certificate and key; the library's own
    /// [`TlsFiles`], read as [`leasehold::tls::client`] reads them) for a
    /// `rediss://` [`redis_url`](Self::redis_url), or for a throwaway
    /// server started with TLS ([`redis_options`](Self::redis_options)
    /// with [`RedisOptions::tls`]). The lab's own connection (for the key,
    /// script, connection and stall faults) uses them as the callers do,
    /// as the same user; build the callers' client with
    /// [`Lab::client`]. Not for a cluster or a Sentinel setup
    /// ([`LabError::Options`]). Defaults to none.
    ///
    /// The fault proxy is plain TCP: TLS passes through it end to end, and
    /// the callers' URL names the proxy (`127.0.0.1`, or
    /// [`proxy_host`](Self::proxy_host)), so the server's certificate must
    /// name that host. A certificate made for the real host name only
    /// will be refused: give [`proxy_host`](Self::proxy_host) a name of
    /// the certificate that resolves to `127.0.0.1` here (e.g. through
    /// `/etc/hosts`), or go without the proxy
    /// ([`proxy`](Self::proxy)`(false)`).
    ///
    /// [`Lab::client`]: super::Lab::client
    pub fn tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Whether the callers reach the single Redis through the lab's fault
    /// proxy. Off, they connect to it directly ([`Lab::redis_url`] is then
    /// your URL as given, or the throwaway server's own), so that a TLS
    /// certificate for your server's host name verifies; the faults that
    /// need the proxy ([`Fault::needs_proxy`]: the network faults and a
    /// failover) then fail with [`LabError::Unsupported`] before the run,
    /// never run without it. Defaults to on.
    ///
    /// [`Lab::redis_url`]: super::Lab::redis_url
    pub fn proxy(mut self, on: bool) -> Self {
        self.no_proxy = !on;
        self
    }

    /// The port the fault proxy listens on (on `127.0.0.1`), e.g. one your
    /// firewall or your callers' configuration expects. A port that cannot
    /// be bound is [`LabError::ProxyPort`]. Not without the proxy (a
    /// cluster, a Sentinel setup, [`proxy`](Self::proxy)`(false)`:
    /// [`LabError::Options`]). Defaults to a free port.
    pub fn proxy_port(mut self, port: u16) -> Self {
        self.proxy_port = Some(port);
        self
    }

    /// The host name the callers' URL gives for the fault proxy, instead
    /// of `127.0.0.1`: a name that resolves to this machine's loopback and
    /// that the server's TLS certificate names (`localhost`, or your
    /// server's name mapped to `127.0.0.1` in `/etc/hosts`). The proxy
    /// still listens on `127.0.0.1` only. Not without the proxy
    /// ([`LabError::Options`]). Defaults to `127.0.0.1`.
    pub fn proxy_host(mut self, host: impl Into<String>) -> Self {
        self.proxy_host = Some(host.into());
        self
    }

    /// Starts the throwaway single Redis, and its replica and extra
    /// Redlock nodes, with your configuration: TLS with client
    /// certificates required ([`RedisOptions::tls`]; give the callers'
    /// files with [`tls`](Self::tls)), a password
    /// ([`RedisOptions::password`], which the callers' URL and the lab's
    /// own connection then carry), persistence
    /// ([`RedisOptions::appendonly`], which counts as [`aof`](Self::aof)),
    /// any `redis-server` arguments ([`RedisOptions::args`]). The lab adds
    /// its own on top (`--repl-diskless-sync-delay 0`, an ACL user with
    /// [`acl_user`](Self::acl_user)). What cannot apply is
    /// [`LabError::Options`], never ignored: options for a cluster, a
    /// Sentinel setup or a Redis given by URL; `replica_of`; TLS without
    /// [`tls`](Self::tls) files for the callers, or files without TLS. A
    /// replica of a TLS primary replicates over TLS, presenting the
    /// testkit's client certificate. Defaults to the testkit's defaults.
    pub fn redis_options(mut self, options: RedisOptions) -> Self {
        self.redis_options = Some(options);
        self
    }

    /// The throwaway primary runs on a clock the lab can move
    /// ([`RedisOptions::fake_clock`]: libfaketime), for
    /// [`Fault::ClockJump`] and [`Fault::ClockFast`]. When the server
    /// binary cannot be driven (Debian's `redis-server`, linked with
    /// jemalloc, hangs under libfaketime; select a libc-malloc build such
    /// as `scripts/valkey.sh`'s Valkey with `LEASEHOLD_REDIS_SERVER`), or
    /// libfaketime is not installed, the primary starts on the machine's
    /// clock and those faults are [`LabError::Unsupported`] before the
    /// run ([`Lab::check_fault`]), never injected into a clock that does
    /// not move; [`Lab::logs`] says why. Throwaway single servers only
    /// ([`LabError::Options`] with a Redis given by URL, a cluster or a
    /// Sentinel setup). Defaults to off.
    ///
    /// [`Lab::check_fault`]: super::Lab::check_fault
    /// [`Lab::logs`]: super::Lab::logs
    pub fn fake_clock(mut self, on: bool) -> Self {
        self.fake_clock = on;
        self
    }

    /// A throwaway etcd cluster of three members (the test kit's
    /// `EtcdCluster`: `etcd` from `PATH`, or the binary `LEASEHOLD_ETCD`
    /// names) instead of any Redis, for the etcd way of taking a lease
    /// and the etcd faults ([`Fault::needs_etcd`]); the callers dial its
    /// members' endpoints ([`Lab::node_urls`]). No proxy, replica, extra
    /// nodes, TLS or Redis options ([`LabError::Options`]). Defaults to
    /// off.
    ///
    /// [`Lab::node_urls`]: super::Lab::node_urls
    pub fn etcd(mut self, on: bool) -> Self {
        self.etcd = on;
        self
    }

    /// Your own etcd cluster (its members' client endpoints,
    /// `http://host:port` or `https://host:port`, all of one scheme; the
    /// TLS files with [`etcd_tls`](Self::etcd_tls), the user with
    /// [`etcd_credentials`](Self::etcd_credentials)) instead of a
    /// throwaway one: an etcd lab (as [`etcd`](Self::etcd)) whose callers
    /// dial these endpoints ([`Lab::node_urls`]). No user name or password
    /// in an endpoint ([`LabError::Options`]): endpoints are shown in
    /// errors and logs, credentials never are.
    ///
    /// Only the faults that need no control of the members can run then:
    /// [`Fault::EtcdRevoke`] (etcd's API only), the holder pause and the
    /// PostgreSQL faults. The others ([`Fault::needs_etcd_process`]: a
    /// member killed, paused or cut off, a restart, the `NOSPACE` alarm)
    /// are [`LabError::Unsupported`] from [`Lab::check_fault`], before the
    /// run, never injected into your cluster.
    ///
    /// [`Lab::start`] checks access before any run: it reads the lock
    /// keys' prefix (`leasehold`, which holds the etcd way's `leasehold/`
    /// and the Lock RPC control's `leasehold-rpc/`) and sends a
    /// transaction that writes a probe key under each but whose condition
    /// never holds (etcd checks the permission of its writes all the
    /// same; nothing is applied). A refused user or password is
    /// [`LabError::EtcdAuth`], a missing permission
    /// [`LabError::EtcdPermission`], each naming the endpoint and never a
    /// secret. The user needs `readwrite` on the prefix `leasehold`
    /// (`etcdctl role grant-permission ROLE readwrite leasehold
    /// --prefix`); granting and revoking leases needs no more.
    ///
    /// The lab changes that cluster: [`Fault::EtcdRevoke`] revokes every
    /// lease that holds a key under `leasehold` (yours too, if you keep
    /// keys there). Point it at a test cluster. Defaults to none.
    ///
    /// [`Lab::node_urls`]: super::Lab::node_urls
    /// [`Lab::check_fault`]: super::Lab::check_fault
    /// [`Lab::start`]: super::Lab::start
    pub fn etcd_endpoints<I, S>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.etcd_endpoints = endpoints.into_iter().map(Into::into).collect();
        self
    }

    /// The TLS files (CA, client certificate and key: the library's
    /// [`TlsFiles`], read as [`leasehold_etcd::EtcdLockerBuilder::tls`] reads
    /// them) for `https://` [`etcd_endpoints`](Self::etcd_endpoints): the
    /// lab's own client uses them, and so must your callers
    /// ([`Lab::etcd_tls_files`]). Files for `http://` endpoints, or
    /// without endpoints of yours (the throwaway cluster is plain), are
    /// [`LabError::Options`]. Defaults to none.
    ///
    /// [`Lab::etcd_tls_files`]: super::Lab::etcd_tls_files
    pub fn etcd_tls(mut self, files: TlsFiles) -> Self {
        self.etcd_tls = Some(files);
        self
    }

    /// The user and password the lab authenticates as on
    /// [`etcd_endpoints`](Self::etcd_endpoints) (etcd's authentication),
    /// as your callers must too ([`Lab::etcd_credentials`]). The password
    /// is never shown ([`Credentials`]' `Debug` hides it). Without
    /// endpoints of yours (the throwaway cluster has no users):
    /// [`LabError::Options`]. Defaults to none.
    ///
    /// [`Lab::etcd_credentials`]: super::Lab::etcd_credentials
    pub fn etcd_credentials(mut self, credentials: Credentials) -> Self {
        self.etcd_credentials = Some(credentials);
        self
    }

    /// A throwaway ZooKeeper ensemble of three servers (the test kit's
    /// `ZooKeeperEnsemble`: Debian's ZooKeeper jars on `java`, a tick of
    /// 200 ms, so sessions of 0.4 to 4 s) instead of any Redis, for the
    /// ZooKeeper way of taking a lease and the ZooKeeper faults
    /// ([`Fault::needs_zookeeper`]); the callers dial its servers
    /// ([`Lab::node_urls`]). No Redis or etcd options, proxy, replica,
    /// extra nodes or TLS ([`LabError::Options`]). Defaults to off.
    ///
    /// [`Lab::node_urls`]: super::Lab::node_urls
    pub fn zookeeper(mut self, on: bool) -> Self {
        self.zookeeper = on;
        self
    }

    /// A pg lab: the lab's PostgreSQL ([`postgres`](Self::postgres),
    /// needed) as the lock service (`leasehold_pg::PgLocker`'s lease
    /// table), no Redis, for the pg modes and the pg faults
    /// ([`Fault::needs_pg`]). It sets `synchronous_commit = on` for the
    /// whole server (`ALTER SYSTEM`, kept after the lab goes), so that a
    /// crash ([`Fault::PgCrash`]) loses no acknowledged commit. No Redis,
    /// etcd or ZooKeeper options, proxy, replica, extra nodes or TLS
    /// ([`LabError::Options`]). Defaults to off.
    pub fn pg(mut self, on: bool) -> Self {
        self.pg = on;
        self
    }

    /// A throwaway PgBouncer in transaction mode in front of a pg lab's
    /// PostgreSQL ([`Lab::pgbouncer_url`]), for the pg-pgbouncer mode and
    /// [`Fault::PgbouncerRestart`]. Only with [`pg`](Self::pg)
    /// ([`LabError::Options`]). Defaults to off.
    ///
    /// [`Lab::pgbouncer_url`]: super::Lab::pgbouncer_url
    pub fn pgbouncer(mut self, on: bool) -> Self {
        self.pgbouncer = on;
        self
    }

    /// The options a fault needs on top of these.
    pub fn for_fault(self, fault: Fault) -> Self {
        match fault {
            Fault::ClockJump | Fault::ClockFast => self.fake_clock(true),
            Fault::SentinelFailover | Fault::SentinelKill => self.sentinel(true),
            Fault::Failover => self.replica(true),
            Fault::SlotMigration | Fault::ClusterFailover => self.cluster(true),
            Fault::RedisRestartAof | Fault::Mixed => self.aof(true),
            Fault::AclReset => self.acl_user(true),
            fault if fault.needs_etcd() => self.etcd(true),
            fault if fault.needs_zookeeper() => self.zookeeper(true),
            fault if fault.needs_pgbouncer() => self.pg(true).pgbouncer(true),
            fault if fault.needs_pg() => self.pg(true),
            _ => self,
        }
    }
}

impl LabOptions {
    /// Whether any option sets up Redis (a URL, a replica, AOF, extra
    /// nodes, an ACL user, a cluster or Sentinel): refused by the labs
    /// with no Redis at all (ZooKeeper, pg).
    pub(super) fn names_redis(&self) -> bool {
        self.replica
            || self.aof
            || self.nodes > 1
            || self.acl_user
            || self.cluster
            || self.sentinel
            || self.redis_url.is_some()
            || !self.cluster_urls.is_empty()
    }

    /// Whether any option sets up etcd (a throwaway cluster, the user's
    /// endpoints, its TLS or credentials).
    pub(super) fn names_etcd(&self) -> bool {
        self.etcd
            || !self.etcd_endpoints.is_empty()
            || self.etcd_tls.is_some()
            || self.etcd_credentials.is_some()
    }

    /// The options that go with a single Redis only (throwaway or by URL),
    /// refused on a cluster or a Sentinel setup.
    pub(super) fn check_single(&self, lab: &'static str) -> Result<(), LabError> {
        if self.tls.is_some()
            || self.fake_clock
            || self.no_proxy
            || self.proxy_port.is_some()
            || self.proxy_host.is_some()
            || self.redis_options.is_some()
        {
            return Err(LabError::Options(lab));
        }
        Ok(())
    }

    /// The proxy options make sense: none of them without the proxy.
    pub(super) fn check_proxy(&self) -> Result<(), LabError> {
        if self.no_proxy && (self.proxy_port.is_some() || self.proxy_host.is_some()) {
            return Err(LabError::Options(
                "a proxy port or host name with LabOptions::proxy(false)",
            ));
        }
        Ok(())
    }

    /// The primary's options without the fake clock, for a server binary
    /// libfaketime cannot drive.
    pub(super) fn primary_options_on_real_clock(&self) -> Result<RedisOptions, LabError> {
        LabOptions {
            fake_clock: false,
            ..self.clone()
        }
        .primary_options()
    }

    /// The throwaway single primary's options: the user's, checked, with
    /// the lab's on top.
    pub(super) fn primary_options(&self) -> Result<RedisOptions, LabError> {
        let base = self.redis_options.clone().unwrap_or_default();
        if base.get_replica_of().is_some() {
            return Err(LabError::Options(
                "redis_options with replica_of: the lab starts its own primary (ask for a replica with LabOptions::replica)",
            ));
        }
        if base.get_tls().is_some() {
            if self.tls.is_none() {
                return Err(LabError::Options(
                    "a tls throwaway server needs LabOptions::tls: the ca (and the client certificate) the callers use",
                ));
            }
        } else if self.tls.is_some() {
            return Err(LabError::Options(
                "tls files for a plain throwaway server: give it RedisOptions::tls, or leave the files out",
            ));
        }
        let mut options = base.args(["--repl-diskless-sync-delay", "0"]);
        if self.aof {
            options = options.appendonly();
        }
        if self.fake_clock {
            options = options.fake_clock();
        }
        Ok(options)
    }
}
