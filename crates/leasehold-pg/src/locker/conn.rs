//! A `PgLocker`'s connections: where a request's connection comes from
//! (the locker's own, shared by its clones, or the caller's pool), one
//! statement per request bounded by its deadline, and what happens to a
//! statement that does not end by then: its connection retired and the
//! statement cancelled in the background (the locker's docs, "One stuck
//! statement"), so no later request queues behind it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold::Service;
use leasehold::backend::ServiceFault;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, Row};

use crate::connector::Connector;

/// How errors name PostgreSQL as a lock service.
pub(super) const POSTGRESQL: Service = Service::named("postgresql");

/// A locker's connections and the bound on one request.
pub(super) struct Connections {
    pub(super) source: Source,
    pub(super) command_timeout: Duration,
}

/// Where a request's connection comes from. One per locker, behind its
/// `Arc`: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Source {
    /// One connection of the locker's own, shared by its clones; the
    /// listener is opened with the same settings.
    Own {
        config: Config,
        connector: Connector,
        client: Mutex<Option<Arc<Shared>>>,
    },
    /// The caller's pool: a connection per request (and no listener).
    #[cfg(feature = "deadpool")]
    Pool(deadpool_postgres::Pool),
}

impl Source {
    /// The settings of the locker's own connections (none on a pool).
    pub(super) fn own(&self) -> Option<(&Config, &Connector)> {
        match self {
            Source::Own {
                config, connector, ..
            } => Some((config, connector)),
            #[cfg(feature = "deadpool")]
            Source::Pool(_) => None,
        }
    }
}

/// The locker's own connection, and whether it was retired: a request on
/// it did not end, so no new request is sent on it (those under way on it
/// end as they will, and it closes after the last).
pub(super) struct Shared {
    client: Client,
    retired: AtomicBool,
}

/// One request's connection, held for one statement: the size of the
/// pooled variant costs nothing next to the statement.
#[allow(clippy::large_enum_variant)]
enum Conn {
    Shared(Arc<Shared>),
    #[cfg(feature = "deadpool")]
    Pooled(deadpool_postgres::Object),
}

impl Conn {
    fn client(&self) -> &Client {
        match self {
            Conn::Shared(shared) => &shared.client,
            #[cfg(feature = "deadpool")]
            Conn::Pooled(object) => object,
        }
    }
}

/// A connection with a statement of ours under way. Dropped before
/// [`done`](Request::done) (its deadline passed, or the caller dropped
/// the request), the statement's connection is retired (the shared one
/// marked, a pooled one taken out of its pool and closed) and the
/// statement cancelled, in the background: the next request never queues
/// behind it.
struct Request<'a> {
    inner: &'a Connections,
    /// Always `Some` until `done` or the drop.
    conn: Option<Conn>,
}

impl Request<'_> {
    fn client(&self) -> Option<&Client> {
        self.conn.as_ref().map(Conn::client)
    }

    /// The statement ended: the connection is given back as it is.
    fn done(mut self) {
        self.conn = None;
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.inner.retire(conn);
        }
    }
}

impl Connections {
    /// Retires `conn`, whose statement did not end, and cancels that
    /// statement in the background (best effort, bounded by the command
    /// timeout; needs a tokio runtime, else only the retirement).
    fn retire(&self, conn: Conn) {
        let token = conn.client().cancel_token();
        let within = self.command_timeout;
        let runtime = tokio::runtime::Handle::try_current().ok();
        match conn {
            Conn::Shared(shared) => {
                shared.retired.store(true, Ordering::Release);
                if let (Some(runtime), Source::Own { connector, .. }) = (runtime, &self.source) {
                    let connector = connector.clone();
                    runtime.spawn(async move {
                        cancelled(
                            tokio::time::timeout(within, token.cancel_query(connector)).await,
                        );
                    });
                }
            }
            #[cfg(feature = "deadpool")]
            Conn::Pooled(object) => {
                // Out of the pool for good, and closed: never handed out
                // again with the statement still running.
                drop(deadpool_postgres::Object::take(object));
                if let Some(runtime) = runtime {
                    runtime.spawn(async move {
                        let cancel = token.cancel_query(tokio_postgres::NoTls);
                        cancelled(tokio::time::timeout(within, cancel).await);
                    });
                }
            }
        }
    }
}

/// Logs a cancel that did not go through (the statement then ends on its
/// own: see [One stuck statement](super#one-stuck-statement)).
fn cancelled(
    outcome: std::result::Result<
        std::result::Result<(), tokio_postgres::Error>,
        tokio::time::error::Elapsed,
    >,
) {
    match outcome {
        Ok(Ok(())) => tracing::debug!("cancelled a statement that did not end by its deadline"),
        Ok(Err(err)) => {
            tracing::debug!(error = %err, "could not cancel a statement that did not end by its deadline");
        }
        Err(_elapsed) => {
            tracing::debug!(
                "could not cancel a statement that did not end by its deadline: no answer"
            );
        }
    }
}

impl Connections {
    /// What the connections are, for `Debug`.
    pub(super) fn kind(&self) -> &'static str {
        match &self.source {
            Source::Own { .. } => "own connection",
            #[cfg(feature = "deadpool")]
            Source::Pool(_) => "deadpool",
        }
    }

    /// Runs `setup` (a transaction of several statements) on a connection
    /// of the locker's (its own, opened if needed, or a pooled one),
    /// rolled back if it fails inside, with no deadline (the setup's own).
    pub(super) async fn batch(&self, setup: &str) -> crate::Result<()> {
        let conn = match &self.source {
            Source::Own {
                config,
                connector,
                client,
            } => {
                let mut slot = client.lock().await;
                match slot.as_ref().filter(|c| usable(c)) {
                    Some(shared) => Conn::Shared(shared.clone()),
                    None => {
                        let shared = open(config, connector)
                            .await
                            .map_err(crate::Error::from_pg)?;
                        *slot = Some(shared.clone());
                        Conn::Shared(shared)
                    }
                }
            }
            #[cfg(feature = "deadpool")]
            Source::Pool(pool) => Conn::Pooled(pool.get().await.map_err(|err| match err {
                deadpool_postgres::PoolError::Backend(err) => crate::Error::from_pg(err),
                other => crate::Error::Lease(pool_fault("setup", other)),
            })?),
        };
        let request = Request {
            inner: self,
            conn: Some(conn),
        };
        let Some(client) = request.client() else {
            return Err(crate::Error::Lease(given_back("setup")));
        };
        let outcome = match client.batch_execute(setup).await {
            Ok(()) => Ok(()),
            Err(err) => {
                // Failed inside the transaction: end it, so the
                // connection is usable again.
                let _ = client.batch_execute("ROLLBACK").await;
                Err(crate::Error::from_pg(err))
            }
        };
        request.done();
        outcome
    }

    /// A connection for one request, by `deadline`: the locker's own
    /// (opened again if it was found closed or was retired), or a pooled
    /// one.
    async fn conn(&self, deadline: Instant) -> leasehold::Result<Conn> {
        let no_connection = || {
            fault(
                "connect",
                ServiceFault::Transient,
                "no connection before the deadline",
            )
        };
        match &self.source {
            Source::Own {
                config,
                connector,
                client,
            } => {
                let mut slot = tokio::time::timeout_at(deadline, client.lock())
                    .await
                    .map_err(|_| no_connection())?;
                if let Some(shared) = slot.as_ref().filter(|c| usable(c)) {
                    return Ok(Conn::Shared(shared.clone()));
                }
                *slot = None;
                match tokio::time::timeout_at(deadline, open(config, connector)).await {
                    Err(_elapsed) => Err(no_connection()),
                    Ok(Err(err)) => Err(pg_fault("connect", err, false)),
                    Ok(Ok(shared)) => {
                        *slot = Some(shared.clone());
                        Ok(Conn::Shared(shared))
                    }
                }
            }
            #[cfg(feature = "deadpool")]
            Source::Pool(pool) => match tokio::time::timeout_at(deadline, pool.get()).await {
                Err(_elapsed) => Err(no_connection()),
                Ok(Err(deadpool_postgres::PoolError::Backend(err))) => {
                    Err(pg_fault("connect", err, false))
                }
                Ok(Err(err)) => Err(pool_fault("connect", err)),
                Ok(Ok(object)) => Ok(Conn::Pooled(object)),
            },
        }
    }

    /// One statement, bounded by `deadline`: its rows.
    pub(super) async fn query(
        &self,
        op: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        deadline: Instant,
    ) -> leasehold::Result<Vec<Row>> {
        let start = Instant::now();
        let request = Request {
            inner: self,
            conn: Some(self.conn(deadline).await?),
        };
        let Some(client) = request.client() else {
            return Err(given_back(op));
        };
        let outcome = tokio::time::timeout_at(deadline, client.query_typed(sql, params)).await;
        finish(op, start, request, outcome)
    }

    /// One statement, bounded by `deadline`: how many rows it changed.
    pub(super) async fn execute(
        &self,
        op: &'static str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        deadline: Instant,
    ) -> leasehold::Result<u64> {
        let start = Instant::now();
        let request = Request {
            inner: self,
            conn: Some(self.conn(deadline).await?),
        };
        let Some(client) = request.client() else {
            return Err(given_back(op));
        };
        let outcome = tokio::time::timeout_at(deadline, client.execute_typed(sql, params)).await;
        finish(op, start, request, outcome)
    }
}

/// Opens a connection of the locker's own and drives it on a task.
pub(super) async fn open(
    config: &Config,
    connector: &Connector,
) -> std::result::Result<Arc<Shared>, tokio_postgres::Error> {
    let (client, connection) = config.connect(connector.clone()).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Arc::new(Shared {
        client,
        retired: AtomicBool::new(false),
    }))
}

/// Whether a new request may be sent on the locker's own connection.
fn usable(shared: &Arc<Shared>) -> bool {
    !shared.client.is_closed() && !shared.retired.load(Ordering::Acquire)
}

/// A request's end: a statement that did not end by its deadline is a
/// timeout (its connection retired as `request` drops), else the
/// statement's outcome, its connection given back.
fn finish<T>(
    op: &'static str,
    start: Instant,
    request: Request<'_>,
    outcome: std::result::Result<
        std::result::Result<T, tokio_postgres::Error>,
        tokio::time::error::Elapsed,
    >,
) -> leasehold::Result<T> {
    match outcome {
        Err(_elapsed) => {
            drop(request);
            Err(leasehold::Error::Timeout {
                service: POSTGRESQL,
                op,
                after: start.elapsed(),
            })
        }
        Ok(Err(err)) => {
            request.done();
            Err(pg_fault(op, err, true))
        }
        Ok(Ok(value)) => {
            request.done();
            Ok(value)
        }
    }
}

/// A request whose connection was already given back: never made (a
/// [`Request`] holds its connection until it ends).
fn given_back(op: &'static str) -> leasehold::Error {
    fault(
        op,
        ServiceFault::Transient,
        "the request's connection was given back",
    )
}

/// A pool that gives no connection, for another reason than the server's
/// (closed, its own wait timed out, its hook failed, no runtime for its
/// timeouts): nothing was sent.
#[cfg(feature = "deadpool")]
fn pool_fault(op: &'static str, err: deadpool_postgres::PoolError) -> leasehold::Error {
    let kind = match err {
        deadpool_postgres::PoolError::Timeout(_) | deadpool_postgres::PoolError::Backend(_) => {
            ServiceFault::Transient
        }
        _ => ServiceFault::Refused,
    };
    leasehold::Error::service(POSTGRESQL, op, kind, err)
}

/// SQLSTATE `55P03` lock_not_available: a lock wait ended by
/// `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

fn fault(op: &'static str, kind: ServiceFault, why: &'static str) -> leasehold::Error {
    leasehold::Error::service(POSTGRESQL, op, kind, why)
}

/// A driver error as a lock service's: the server's refusal (retryable
/// for a connection, shutdown, resource or serialization class, and for
/// a lock wait cut short by `lock_timeout`, `55P03`: the statement was
/// rolled back, as one `statement_timeout` cancels, class `57`), or a
/// connection that failed (`sent`: with the request out, its outcome is
/// unknown).
fn pg_fault(op: &'static str, err: tokio_postgres::Error, sent: bool) -> leasehold::Error {
    let kind = match err.as_db_error().map(|db| db.code().code().to_owned()) {
        Some(code)
            if code == LOCK_NOT_AVAILABLE
                || ["08", "40", "53", "57"]
                    .iter()
                    .any(|class| code.starts_with(class)) =>
        {
            ServiceFault::Transient
        }
        Some(_) => ServiceFault::Refused,
        None if sent => ServiceFault::Unknown,
        None => ServiceFault::Transient,
    };
    leasehold::Error::service(POSTGRESQL, op, kind, crate::Error::from_pg(err))
}
