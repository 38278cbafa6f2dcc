//! Starting a lab: throwaway servers (one Redis with its replica and
//! extra nodes, a cluster, or a Sentinel setup), or the user's Redis by
//! URL, with the fault proxy in front; and the URLs the callers dial.

use std::sync::{Arc, Mutex};

use rand::RngExt;

use leasehold_testkit::{FaultProxy, RedisCluster, RedisSentinel, RedisServer};

use super::acl::{ACL_USER, set_acl_user};
use super::error::{EXTERNAL_TIMEOUT, external, server};
use super::servers::{Primary, Servers, query};
use super::{Lab, LabError, LabOptions};

/// A URL: `redis[s]://AUTH HOST:PORT/DB`, `auth` empty or ending in `@`.
pub(super) fn url(tls: bool, auth: &str, host: &str, port: u16, db: i64) -> String {
    let scheme = if tls { "rediss" } else { "redis" };
    format!("{scheme}://{auth}{host}:{port}/{db}")
}

/// `user:password@` (percent-encoded), `:password@`, or nothing.
pub(super) fn auth(user: Option<&str>, password: Option<&str>) -> String {
    let mut out = String::new();
    if let Some(user) = user {
        out.push_str(&encode(user));
    }
    if let Some(password) = password {
        out.push(':');
        out.push_str(&encode(password));
    }
    if !out.is_empty() {
        out.push('@');
    }
    out
}

/// Starts the fault proxy in front of `upstream`, on the options' port.
fn start_proxy(
    upstream: std::net::SocketAddr,
    options: &LabOptions,
) -> Result<FaultProxy, LabError> {
    let port = options.proxy_port.unwrap_or(0);
    FaultProxy::start_on(upstream, port).map_err(|err| match err {
        leasehold_testkit::Error::FreePort(source) if port != 0 => {
            LabError::ProxyPort { port, source }
        }
        other => LabError::Server {
            what: "starting the fault proxy".to_owned(),
            source: other,
        },
    })
}

/// `text` percent-encoded for a URL's user or password.
fn encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl Lab {
    /// Starts the servers `options` asks for. Blocking (it waits for each
    /// server to answer): call it from `spawn_blocking` in async code.
    ///
    /// # Errors
    /// [`LabError::Server`] when a server does not start;
    /// [`LabError::Options`] for options that do not go together; for a
    /// server of yours, what reaching it met ([`LabError::External`],
    /// [`LabError::Tls`], and on etcd [`LabError::EtcdAuth`],
    /// [`LabError::EtcdPermission`], [`LabError::Etcd`]).
    pub fn start(options: &LabOptions) -> Result<Lab, LabError> {
        if options.zookeeper {
            return Self::start_zookeeper(options);
        }
        if options.pg {
            return Self::start_pg(options);
        }
        if options.pgbouncer {
            return Err(LabError::Options(
                "pgbouncer goes with a pg lab (LabOptions::pg)",
            ));
        }
        if options.etcd || !options.etcd_endpoints.is_empty() {
            if options.redis_url.is_some() || !options.cluster_urls.is_empty() {
                return Err(LabError::Options("an etcd lab has no redis: no redis url"));
            }
            return Self::start_etcd(options);
        }
        if options.etcd_tls.is_some() || options.etcd_credentials.is_some() {
            return Err(LabError::Options(
                "etcd tls files or credentials for a lab without etcd (LabOptions::etcd_endpoints)",
            ));
        }
        if let Some(url) = &options.redis_url {
            return Self::start_external(options, url);
        }
        if !options.cluster_urls.is_empty() {
            return Self::start_external_cluster(options);
        }
        if options.cluster && options.sentinel {
            return Err(LabError::Options(
                "a lab is a redis cluster or a sentinel setup, not both",
            ));
        }
        if options.cluster {
            options.check_single(
                "tls, proxy, redis options and a fake clock do not apply to a cluster lab (no proxy, the testkit's cluster)",
            )?;
            return Self::start_cluster(options);
        }
        if options.sentinel {
            options.check_single(
                "tls, proxy, redis options and a fake clock do not apply to a sentinel lab (no proxy, the testkit's sentinel setup)",
            )?;
            return Self::start_sentinel(options);
        }
        options.check_proxy()?;
        let redis = options.primary_options()?;
        let aof = redis.get_appendonly();
        let user_options = options.redis_options.clone().unwrap_or_default();
        let (primary, clock_note) = match RedisServer::start_with(redis.clone()) {
            Err(
                err @ (leasehold_testkit::Error::ClockNotDriven { .. }
                | leasehold_testkit::Error::LibraryNotFound { .. }),
            ) if redis.get_fake_clock() => {
                // The clock faults will say so before their run; the
                // others need no fake clock.
                let plain = RedisServer::start_with(options.primary_options_on_real_clock()?)
                    .map_err(server("starting redis"))?;
                (plain, Some(err.to_string()))
            }
            started => (started.map_err(server("starting redis"))?, None),
        };
        let replica = if options.replica {
            let replica = RedisServer::start_with(
                user_options
                    .clone()
                    .replica_of(primary.host(), primary.port()),
            )
            .map_err(server("starting the replica"))?;
            Some(replica)
        } else {
            None
        };
        let nodes = if options.nodes > 1 {
            RedisServer::start_many_with(options.nodes - 1, &user_options)
                .map_err(server("starting redlock nodes"))?
        } else {
            Vec::new()
        };
        let proxy = if options.no_proxy {
            None
        } else {
            Some(start_proxy(primary.addr(), options)?)
        };
        let acl_password = if options.acl_user {
            let password: String = {
                let mut rng = rand::rng();
                (0..24)
                    .map(|_| {
                        char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)])
                    })
                    .collect()
            };
            for server in std::iter::once(&primary).chain(&nodes) {
                set_acl_user(server, &password)?;
            }
            Some(password)
        } else {
            None
        };
        let node_auth = match &acl_password {
            Some(password) => auth(Some(ACL_USER), Some(password)),
            None => auth(None, user_options.get_password()),
        };
        let (host, port) = match &proxy {
            Some(proxy) => (
                options.proxy_host.as_deref().unwrap_or(primary.host()),
                proxy.port(),
            ),
            None => (primary.host(), primary.port()),
        };
        let caller_url = url(primary.is_tls(), &node_auth, host, port, 0);
        let servers = Servers {
            replica,
            nodes,
            ..Servers::new(Primary::Own(primary), options)
        };
        let mut lab = Lab::assemble(servers, proxy, aof, Some(caller_url));
        lab.acl_password = acl_password;
        lab.node_auth = node_auth;
        lab.tls = options.tls.clone();
        lab.clock_note = clock_note;
        Ok(lab)
    }

    /// A lab on a throwaway cluster.
    fn start_cluster(options: &LabOptions) -> Result<Lab, LabError> {
        if options.replica || options.aof || options.nodes > 1 || options.acl_user {
            return Err(LabError::Options(
                "a cluster lab has no single-server replica, AOF, extra nodes or acl user",
            ));
        }
        let cluster =
            RedisCluster::start_with_replicas(3).map_err(server("starting a redis cluster"))?;
        let primary = Primary::Cluster {
            cluster,
            owner: None,
        };
        Ok(Lab::assemble(
            Servers::new(primary, options),
            None,
            false,
            None,
        ))
    }

    /// A lab on a throwaway Sentinel setup: the callers use its
    /// `redis+sentinel://` URL.
    fn start_sentinel(options: &LabOptions) -> Result<Lab, LabError> {
        if options.replica || options.aof || options.nodes > 1 || options.acl_user {
            return Err(LabError::Options(
                "a sentinel lab has no extra replica, AOF, extra nodes or acl user",
            ));
        }
        let setup = RedisSentinel::start("leasehold").map_err(server("starting redis sentinel"))?;
        let url = setup.url();
        let primary = Primary::Sentinel { setup, old: None };
        Ok(Lab::assemble(
            Servers::new(primary, options),
            None,
            false,
            Some(url),
        ))
    }

    /// A lab in front of the user's Redis Cluster.
    fn start_external_cluster(options: &LabOptions) -> Result<Lab, LabError> {
        if options.replica
            || options.aof
            || options.nodes > 1
            || options.cluster
            || options.sentinel
            || options.acl_user
        {
            return Err(LabError::Options(
                "a replica, an append-only file, extra nodes, an acl user or a throwaway cluster need throwaway servers",
            ));
        }
        options.check_single(
            "tls, proxy, redis options and a fake clock do not apply to a redis cluster given by url (the lab has no tls cluster client, and no proxy there)",
        )?;
        let client = redis::cluster::ClusterClient::builder(options.cluster_urls.clone())
            .connection_timeout(EXTERNAL_TIMEOUT)
            .response_timeout(EXTERNAL_TIMEOUT)
            .build()
            .map_err(|_| LabError::RedisUrl("a cluster seed url does not parse"))?;
        let mut conn = client.get_connection().map_err(external("connecting"))?;
        // Not PING: the lock user's ACL grants TIME.
        redis::cmd("TIME")
            .query::<redis::Value>(&mut conn)
            .map_err(external("TIME"))?;
        let primary = Primary::ExternalCluster {
            client,
            urls: options.cluster_urls.clone(),
        };
        Ok(Lab::assemble(
            Servers::new(primary, options),
            None,
            false,
            None,
        ))
    }

    /// A lab in front of the user's Redis at `url`.
    fn start_external(options: &LabOptions, url_given: &str) -> Result<Lab, LabError> {
        if options.replica
            || options.aof
            || options.nodes > 1
            || options.acl_user
            || options.sentinel
            || options.redis_options.is_some()
            || options.fake_clock
        {
            return Err(LabError::Options(
                "a replica, an append-only file, extra nodes, an acl user, redis options, a fake clock or a sentinel setup need throwaway servers",
            ));
        }
        options.check_proxy()?;
        let files = options.tls.clone().unwrap_or_default();
        let client = leasehold::tls::client(url_given, &files).map_err(LabError::Tls)?;
        let info = client.get_connection_info().clone();
        let (tls, host, port) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => (false, host.clone(), *port),
            redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => {
                if *insecure {
                    return Err(LabError::RedisUrl(
                        "#insecure turns certificate verification off, which leasehold never does",
                    ));
                }
                (true, host.clone(), *port)
            }
            _ => {
                return Err(LabError::RedisUrl(
                    "only redis:// or rediss:// over TCP can be used (not a unix socket)",
                ));
            }
        };
        // The lab's own connection: the callers' URL, TLS and user, without
        // redis-rs's CLIENT SETINFO (outside the lock user's ACL).
        let settings = info.redis_settings().clone();
        let db = settings.db();
        let caller_auth = auth(settings.username(), settings.password());
        let admin = redis::Client::open(info.set_redis_settings(settings.set_skip_set_lib_name()))
            .map_err(|_| LabError::RedisUrl("it does not parse"))?;
        // Reachable, and the credentials work, before any run starts: the
        // handshake, then TIME (the lock user's ACL grants it; PING it
        // does not).
        let mut conn = admin
            .get_connection_with_timeout(EXTERNAL_TIMEOUT)
            .map_err(external("connecting"))?;
        conn.set_read_timeout(Some(EXTERNAL_TIMEOUT))
            .map_err(external("connecting"))?;
        query(&mut conn, &["TIME"], "TIME")?;
        let (proxy, caller_url) = if options.no_proxy {
            (None, url_given.to_owned())
        } else {
            let upstream = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
                .ok()
                .and_then(|mut addrs| addrs.next())
                .ok_or(LabError::RedisUrl("its host does not resolve"))?;
            let proxy = start_proxy(upstream, options)?;
            let host = options.proxy_host.as_deref().unwrap_or("127.0.0.1");
            let caller_url = url(tls, &caller_auth, host, proxy.port(), db);
            (Some(proxy), caller_url)
        };
        let servers = Servers::new(
            Primary::External {
                client: admin,
                conn: Mutex::new(Some(conn)),
            },
            options,
        );
        let mut lab = Lab::assemble(servers, proxy, false, Some(caller_url));
        lab.tls = options.tls.clone();
        Ok(lab)
    }

    pub(super) fn assemble(
        servers: Servers,
        proxy: Option<FaultProxy>,
        aof: bool,
        caller_url: Option<String>,
    ) -> Lab {
        Lab {
            servers: Arc::new(Mutex::new(servers)),
            proxy: proxy.map(Arc::new),
            aof,
            caller_url,
            acl_password: None,
            node_auth: String::new(),
            tls: None,
            clock_note: None,
        }
    }
}
