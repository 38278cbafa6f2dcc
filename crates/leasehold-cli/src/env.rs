//! The servers an experiment runs against: given by URL, or throwaway.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use leasehold::{Connection, Endpoint, Locker, Sentinel};
use leasehold_testkit::{PostgresServer, RedisServer};
use tokio::sync::OnceCell;

use crate::exit::Usage;
use crate::progress::note;
use crate::redact::redact_url;

/// How long any single Redis request of the CLI may take.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// The most connections the CLI's PostgreSQL pool opens.
const PG_POOL_SIZE: usize = 64;

/// Connection flags for the Redis an experiment runs against, its TLS
/// files included.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Redis connection")]
pub(crate) struct RedisFlags {
    /// Redis to run against, e.g. redis://user:password@127.0.0.1:6379/, or
    /// a primary found through Redis Sentinel and followed across
    /// failovers:
    /// redis+sentinel://[user:password@]host:port[,host:port...]/MASTER[/DB]
    /// (the sentinels, port 26379 if left out; the credentials are the
    /// primary's) [default: a throwaway local redis-server]
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub(crate) redis_url: Option<String>,
    #[command(flatten)]
    pub(crate) tls: TlsFlags,
}

/// The TLS files for a `rediss://` server: `--tls-ca`, `--tls-cert`,
/// `--tls-key` (and their environment variables), shared by [`RedisFlags`]
/// and `chaos --redis-url` (whose worker processes get them in their spec).
#[derive(Debug, Clone, Default, Args, serde::Serialize, serde::Deserialize)]
pub(crate) struct TlsFlags {
    /// CA certificates (PEM) to verify a rediss:// server against
    /// [default: the system's trusted roots]
    #[arg(long, value_name = "FILE", env = "LEASEHOLD_TLS_CA")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a rediss:// server that asks for one;
    /// needs --tls-key
    #[arg(
        long,
        value_name = "FILE",
        env = "LEASEHOLD_TLS_CERT",
        requires = "tls_key"
    )]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM); needs --tls-cert
    #[arg(
        long,
        value_name = "FILE",
        env = "LEASEHOLD_TLS_KEY",
        requires = "tls_cert"
    )]
    pub(crate) tls_key: Option<PathBuf>,
}

impl TlsFlags {
    /// Whether any TLS file is given.
    pub(crate) fn is_set(&self) -> bool {
        self.tls_ca.is_some() || self.tls_cert.is_some()
    }

    /// The files, as the library reads them.
    pub(crate) fn files(&self) -> leasehold::tls::TlsFiles {
        let mut files = leasehold::tls::TlsFiles::new();
        if let Some(ca) = &self.tls_ca {
            files = files.ca(ca);
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            files = files.cert(cert).key(key);
        }
        files
    }

    /// TLS files given with a URL that is not `rediss://` are a usage
    /// error rather than silently unused.
    pub(crate) fn check(&self, url: &str) -> Result<(), Usage> {
        if self.is_set() && !url.starts_with("rediss://") {
            return Err(Usage(
                "--tls-ca, --tls-cert and --tls-key need a rediss:// URL".to_owned(),
            ));
        }
        Ok(())
    }
}

/// The environment variable `chaos --etcd-user`'s password is read
/// from (never a flag: a flag's value shows in `ps`).
pub(crate) const ETCD_PASSWORD_ENV: &str = "LEASEHOLD_ETCD_PASSWORD";

/// How `chaos` reaches the user's etcd cluster: `--etcd-endpoints`, its
/// TLS files and its user.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct EtcdFlags {
    /// Run the etcd modes against your own etcd cluster: its members'
    /// client endpoints, comma-separated (http://, or https:// with
    /// --etcd-tls-ca and, if it asks for a client certificate,
    /// --etcd-tls-cert and --etcd-tls-key; no user or password in them:
    /// --etcd-user), instead of a throwaway 3-member cluster. Only the
    /// faults that need no control of the members run there (none,
    /// holder-pause, the postgres faults, etcd-revoke); the ones that
    /// kill, pause, cut off or restart members, or raise the NOSPACE
    /// alarm, are skipped with a note naming them. Before any run it
    /// checks that the user may read and write under the prefix
    /// leasehold (exit 3 naming the endpoint, never the password).
    /// etcd-revoke revokes every lease holding a key under leasehold: use
    /// a test cluster
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    pub(crate) etcd_endpoints: Vec<String>,
    /// CA certificates (PEM) to verify https:// --etcd-endpoints against
    /// [default: the system's trusted roots]
    #[arg(long, value_name = "FILE", requires = "etcd_endpoints")]
    pub(crate) etcd_tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for an etcd that asks for one
    /// (--client-cert-auth); needs --etcd-tls-key
    #[arg(
        long,
        value_name = "FILE",
        requires_all = ["etcd_endpoints", "etcd_tls_key"]
    )]
    pub(crate) etcd_tls_cert: Option<PathBuf>,
    /// The etcd client certificate's private key (PEM); needs
    /// --etcd-tls-cert
    #[arg(long, value_name = "FILE", requires = "etcd_tls_cert")]
    pub(crate) etcd_tls_key: Option<PathBuf>,
    /// The etcd user the workers and the fault injector authenticate as
    /// on --etcd-endpoints; its password comes from the environment
    /// variable LEASEHOLD_ETCD_PASSWORD (no flag, on purpose: it would
    /// show in ps), and is never printed
    #[arg(long, value_name = "NAME", requires = "etcd_endpoints")]
    pub(crate) etcd_user: Option<String>,
}

impl EtcdFlags {
    /// How to reach the endpoints: the TLS files and the user, its
    /// password read from [`ETCD_PASSWORD_ENV`]. A user without a
    /// password there is a usage error.
    pub(crate) fn access(&self) -> Result<EtcdAccess, Usage> {
        let password = match &self.etcd_user {
            None => None,
            Some(_) => Some(std::env::var(ETCD_PASSWORD_ENV).map_err(|_| {
                Usage(format!(
                    "--etcd-user needs its password in the environment variable {ETCD_PASSWORD_ENV}"
                ))
            })?),
        };
        Ok(EtcdAccess {
            tls: TlsFlags {
                tls_ca: self.etcd_tls_ca.clone(),
                tls_cert: self.etcd_tls_cert.clone(),
                tls_key: self.etcd_tls_key.clone(),
            },
            user: self.etcd_user.clone(),
            password,
        })
    }
}

/// The TLS files and the user for the user's etcd cluster, as the
/// coordinator hands them to the workers (in their spec, on stdin).
/// `Debug` never shows the password.
#[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct EtcdAccess {
    /// The files for `https://` endpoints (in `TlsFlags`' shape).
    pub(crate) tls: TlsFlags,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
}

impl std::fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("tls", &self.tls)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl EtcdAccess {
    /// Whether the access needs more than plain gRPC: TLS files or a user.
    pub(crate) fn is_set(&self) -> bool {
        self.tls.is_set() || self.user.is_some()
    }

    /// The TLS files, if any.
    pub(crate) fn tls_files(&self) -> Option<leasehold::tls::TlsFiles> {
        self.tls.is_set().then(|| self.tls.files())
    }

    /// The user and its password, if a user is given.
    pub(crate) fn credentials(&self) -> Option<leasehold_etcd::client::Credentials> {
        self.user.as_ref().map(|user| {
            leasehold_etcd::client::Credentials::new(
                user,
                self.password.clone().unwrap_or_default(),
            )
        })
    }
}

impl RedisFlags {
    /// Where `url` leads: a `redis+sentinel://` URL's sentinels, or the
    /// redis-rs client for one server (see [`client`](Self::client)).
    pub(crate) fn endpoint(&self, url: &str) -> anyhow::Result<Endpoint> {
        if Sentinel::is_sentinel_url(url) {
            if self.tls.is_set() {
                return Err(Usage(
                    "--tls-ca, --tls-cert and --tls-key need a rediss:// URL (not redis+sentinel://: the sentinel form is plain TCP)".to_owned(),
                )
                .into());
            }
            return Ok(Sentinel::from_url(url)?.into());
        }
        Ok(self.client(url)?.into())
    }

    /// The redis-rs client for `url`, over TLS with the flags' files for a
    /// `rediss://` URL. TLS files given with a `redis://` URL are a usage
    /// error rather than silently unused.
    pub(crate) fn client(&self, url: &str) -> anyhow::Result<redis::Client> {
        self.tls.check(url)?;
        Ok(leasehold::tls::client(url, &self.tls.files())?)
    }
}

/// Connection flags for PostgreSQL.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "PostgreSQL connection")]
pub(crate) struct DatabaseFlags {
    /// PostgreSQL to run against, e.g.
    /// postgres://user:password@127.0.0.1:5432/db [default: a throwaway
    /// local postgres]
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,
}

/// The Redis connections shared by every experiment of one CLI invocation.
pub(crate) struct Env {
    /// The locker's connection, for the experiments' own commands.
    pub(crate) redis: Connection,
    pub(crate) locker: Locker,
    /// Opens further connections (the hand-off pub/sub connection): one
    /// server, or the primary the sentinels name.
    pub(crate) client: Endpoint,
    /// A bare redis-rs client for the one server (not through Sentinel):
    /// the floor loop of `bench uncontended`.
    pub(crate) server: Option<redis::Client>,
    /// Kept alive for the whole run; stopped on drop.
    _throwaway_redis: Option<RedisServer>,
}

/// PostgreSQL, for the experiments that need it.
pub(crate) struct Database {
    url: Option<String>,
    /// Opened by the first experiment that needs PostgreSQL, never before.
    postgres: OnceCell<Postgres>,
}

impl Database {
    pub(crate) fn new(flags: &DatabaseFlags) -> Database {
        Database {
            url: flags.database_url.clone(),
            postgres: OnceCell::new(),
        }
    }

    /// The PostgreSQL pool, with the wallet tables set up: connects (or
    /// starts a throwaway server) on first use only.
    pub(crate) async fn postgres(&self) -> anyhow::Result<&Pool> {
        let pg = self
            .postgres
            .get_or_try_init(|| open_postgres(self.url.clone()))
            .await?;
        Ok(&pg.pool)
    }

    /// The URL of the PostgreSQL [`postgres`](Self::postgres) connects
    /// to (a throwaway server's, if it started one).
    pub(crate) async fn postgres_url(&self) -> anyhow::Result<&str> {
        let pg = self
            .postgres
            .get_or_try_init(|| open_postgres(self.url.clone()))
            .await?;
        Ok(&pg.url)
    }
}

struct Postgres {
    pool: Pool,
    url: String,
    /// Declared after the pool, so it is stopped after the pool is gone.
    _throwaway: Option<PostgresServer>,
}

impl Env {
    pub(crate) async fn connect(flags: &RedisFlags) -> anyhow::Result<Env> {
        let (url, throwaway) = match &flags.redis_url {
            Some(url) => (url.clone(), None),
            None => {
                let server = tokio::task::spawn_blocking(RedisServer::start)
                    .await
                    .context("starting a throwaway redis-server")?
                    .context("starting a throwaway redis-server")?;
                note!(
                    "leasehold: started a throwaway redis-server at {} (pid {}); pass --redis-url to use your own",
                    redact_url(&server.url()),
                    server.pid()
                );
                (server.url(), Some(server))
            }
        };
        let shown = redact_url(&url);
        let client = flags
            .endpoint(&url)
            .with_context(|| format!("redis url {shown}"))?;
        let locker = Locker::builder()
            .command_timeout(COMMAND_TIMEOUT)
            .connect(client.clone())
            .await
            .with_context(|| format!("connecting to redis at {shown}"))?;
        let redis = locker.connection().clone();
        report_findings(&redis, &shown, throwaway.is_some()).await;
        let server = if Sentinel::is_sentinel_url(&url) {
            None
        } else {
            Some(flags.client(&url)?)
        };
        Ok(Env {
            redis,
            locker,
            client,
            server,
            _throwaway_redis: throwaway,
        })
    }
}

/// A pool of at most `size` connections to `url` (libpq's parameters, TLS
/// included, as [`leasehold_pg::config`] reads them); none is opened yet.
pub(crate) fn pg_pool(url: &str, size: usize) -> anyhow::Result<Pool> {
    let (config, connector) = leasehold_pg::config(url)?;
    let manager = Manager::from_connect(
        config,
        OffRuntimeConnect { tls: connector },
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        .build()
        .context("building the postgresql pool")
}

/// Opens the pool's connections as deadpool's own connector does, with two
/// differences.
///
/// - The handshake runs on a blocking thread: its SCRAM password proof
///   (4096 rounds of HMAC-SHA-256, unoptimised in a debug build) would
///   otherwise hold a runtime worker for a long while per connection, and
///   fifty connections opened at once stalled every task beside them (on
///   a busy 2-core machine, spenders' lock attempts took a second each,
///   and their waits ran out).
/// - A connection that ends with an error is logged with its whole cause,
///   the server's message and SQLSTATE (deadpool says `db error`).
struct OffRuntimeConnect {
    tls: leasehold_pg::Connector,
}

impl deadpool_postgres::Connect for OffRuntimeConnect {
    fn connect(
        &self,
        pg_config: &deadpool_postgres::tokio_postgres::Config,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<
            (
                deadpool_postgres::tokio_postgres::Client,
                tokio::task::JoinHandle<()>,
            ),
            deadpool_postgres::tokio_postgres::Error,
        >,
    > {
        let (config, tls) = (pg_config.clone(), self.tls.clone());
        Box::pin(async move {
            // The handshake's I/O stays on this runtime (the CLI's
            // multi-threaded one drives it); only its CPU work moves.
            let runtime = tokio::runtime::Handle::current();
            let (off, off_tls) = (config.clone(), tls.clone());
            let handshake =
                tokio::task::spawn_blocking(move || runtime.block_on(off.connect(off_tls)));
            let (client, connection) = match handshake.await {
                Ok(connected) => connected?,
                // No blocking thread to run it on (the runtime is shutting
                // down): here, then.
                Err(_) => config.connect(tls).await?,
            };
            let driver = tokio::spawn(async move {
                if let Err(err) = connection.await {
                    log_connection_end(err);
                }
            });
            Ok((client, driver))
        })
    }
}

/// Logs how a pooled connection ended, in the server's words. A session
/// the server ended for idling (25P03, 57P05: the fence guard's idle bound
/// at work) is what the experiments count as `ended`: at debug level.
fn log_connection_end(err: deadpool_postgres::tokio_postgres::Error) {
    let err = leasehold_pg::Error::from(err);
    let idle = matches!(&err, leasehold_pg::Error::SessionEnded(source)
        if matches!(source.code(), Some("25P03" | "57P05")));
    let cause = crate::cause::describe(&anyhow::Error::new(err));
    if idle {
        tracing::debug!("postgresql connection ended: {cause}");
    } else {
        tracing::warn!("postgresql connection ended: {cause}");
    }
}

/// A connection from `pool`; a connection that could not be opened says
/// what the server said ([`leasehold_pg::Error`]).
pub(crate) async fn pg_connection(pool: &Pool) -> anyhow::Result<deadpool_postgres::Object> {
    pool.get()
        .await
        .map_err(pool_error)
        .context("connecting to postgresql")
}

/// A pool's error, a backend's one as [`leasehold_pg::Error`] (its message
/// names the outcome, its source chain the server's words).
pub(crate) fn pool_error(err: deadpool_postgres::PoolError) -> anyhow::Error {
    match err {
        deadpool_postgres::PoolError::Backend(err) => {
            anyhow::Error::new(leasehold_pg::Error::from(err))
        }
        other => anyhow::Error::new(other),
    }
}

async fn open_postgres(url: Option<String>) -> anyhow::Result<Postgres> {
    let (url, throwaway) = match url {
        Some(url) => (url, None),
        None => {
            let server = tokio::task::spawn_blocking(PostgresServer::start)
                .await
                .context("starting a throwaway postgres")?
                .context("starting a throwaway postgres")?;
            note!(
                "leasehold: started a throwaway postgres at {} (pid {}); pass --database-url to use your own",
                redact_url(&server.url()),
                server.pid()
            );
            (server.url(), Some(server))
        }
    };
    let shown = redact_url(&url);
    let pool = pg_pool(&url, PG_POOL_SIZE).with_context(|| format!("postgresql url {shown}"))?;
    let mut client = pool
        .get()
        .await
        .map_err(pool_error)
        .with_context(|| format!("connecting to postgresql at {shown}"))?;
    let client: &mut deadpool_postgres::tokio_postgres::Client = &mut client;
    leasehold_pg::setup(client)
        .await
        .with_context(|| format!("setting up the fence table at {shown}"))?;
    leasehold_pg::setup_wallets(client)
        .await
        .with_context(|| format!("setting up the wallet tables at {shown}"))?;
    Ok(Postgres {
        pool,
        url,
        _throwaway: throwaway,
    })
}

/// Prints, once, the server settings that weaken what a lease promises.
async fn report_findings(redis: &Connection, shown: &str, throwaway: bool) {
    match leasehold::diagnostics::diagnose(redis, COMMAND_TIMEOUT).await {
        Ok(findings) => {
            for finding in findings {
                let expected = throwaway
                    && matches!(
                        finding,
                        leasehold::diagnostics::Finding::NoDurablePersistence { .. }
                    );
                if expected {
                    // A throwaway server has no persistence by design.
                    continue;
                }
                note!("leasehold: safety warning for {shown}: {finding}");
            }
        }
        Err(leasehold::Error::NoPermission { command, .. }) => note!(
            "leasehold: cannot check the safety settings of {shown}: this user may not run {command} (the experiments do not need it)"
        ),
        Err(err) => note!("leasehold: could not read safety settings of {shown}: {err}"),
    }
}
