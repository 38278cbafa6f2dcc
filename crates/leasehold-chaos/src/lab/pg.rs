//! The pg lab: PostgreSQL as the lock service (`leasehold_pg::PgLocker`'s
//! lease table in the lab's PostgreSQL, no Redis), optionally behind a
//! throwaway PgBouncer in transaction mode, and how each PostgreSQL fault
//! starts, repeats and ends on it.
//!
//! The faults hit what a lock on PostgreSQL must ride out: the callers'
//! backends ended by the server, the lease rows deleted by hand, the
//! lease table locked by a long migration, the database's clock stepped
//! forward, a crash (an immediate shutdown), `statement_timeout` and
//! `lock_timeout` hit, and PgBouncer restarted. The
//! lab's own statements go over connections of its own, straight to the
//! server (never through PgBouncer), each a [`Session`] on a thread of
//! its own: the nemesis's thread is blocking code, and a session must
//! live on between statements (the migration's open transaction).

use std::time::Duration;

use leasehold_pg::tokio_postgres::Client;
use leasehold_testkit::{PgBouncer, PostgresServer};

use super::error::server;
use super::servers::{Primary, Servers};
use super::{Lab, LabError, LabOptions};
use crate::fault::{Fault, PG_TINY_TIMEOUT};

/// `PgLocker`'s lease table (leasehold-pg's locker docs, "The tables").
const LEASE_TABLE: &str = "leasehold_leases";

/// How long one statement of the lab's own may take (a connect included).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the pg faults need, for [`LabError::Unsupported`].
pub(super) const NEEDS_PG: &str =
    "a pg lab (LabOptions::pg: the pg modes, the lease table in the lab's postgresql)";

/// What [`Fault::PgClockStep`] needs, for [`LabError::Unsupported`].
pub(super) const NEEDS_FAKE_PG_CLOCK: &str = "a throwaway postgresql whose clock libfaketime drives (PostgresServer::start_with_fake_clock; libfaketime installed)";

/// Every other client backend of the database ended, the lab's own
/// excepted.
const KILL_BACKENDS: &str = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
     WHERE backend_type = 'client backend' AND datname = current_database() \
     AND pid <> pg_backend_pid()";

/// The PostgreSQL the callers use (the options' own) and what the fault
/// in progress holds.
pub(super) struct PgLab {
    /// The lab's PostgreSQL, straight (the options' shared server).
    url: String,
    /// The role the callers connect as (the server's user), quoted.
    role: String,
    /// PgBouncer in front of it, when asked for
    /// ([`LabOptions::pgbouncer`]): the callers dial it.
    bouncer: Option<PgBouncer>,
    /// The lab's own session.
    admin: Session,
    /// The "migration" of [`Fault::PgTableLock`]: a session whose open
    /// transaction holds the lease table's lock, rolled back at the end
    /// (or closed, when the lab is healed).
    migration: Option<Session>,
}

impl Lab {
    /// A pg lab on the options' PostgreSQL (and a PgBouncer in front of
    /// it with [`LabOptions::pgbouncer`]): no Redis at all. It sets
    /// `synchronous_commit = on` for the whole server (`ALTER SYSTEM`),
    /// so that a crash ([`Fault::PgCrash`]) loses no commit it
    /// acknowledged.
    pub(super) fn start_pg(options: &LabOptions) -> Result<Lab, LabError> {
        if options.names_redis() || options.names_etcd() || options.zookeeper {
            return Err(LabError::Options(
                "a pg lab has no redis, etcd or zookeeper: no redis url, replica, AOF, extra nodes, acl user, cluster, sentinel, etcd or zookeeper setup",
            ));
        }
        options
            .check_single("tls, proxy, redis options and a fake clock do not apply to a pg lab")?;
        let pg = options.postgres.as_ref().ok_or(LabError::Options(
            "a pg lab needs a throwaway postgresql (LabOptions::postgres)",
        ))?;
        let bouncer = match options.pgbouncer {
            true => Some(PgBouncer::start(pg).map_err(server("starting pgbouncer"))?),
            false => None,
        };
        let lab = PgLab {
            url: pg.url(),
            role: format!("\"{}\"", pg.user().replace('"', "\"\"")),
            bouncer,
            admin: Session::open(pg.url())?,
            migration: None,
        };
        // Not in one batch: ALTER SYSTEM refuses a transaction block.
        lab.admin.execute(
            "ALTER SYSTEM SET synchronous_commit = on",
            "turning synchronous_commit on",
        )?;
        lab.admin
            .execute("SELECT pg_reload_conf()", "reloading the configuration")?;
        Ok(Lab::assemble(
            Servers::new(Primary::Postgres(lab), options),
            None,
            false,
            None,
        ))
    }

    /// Whether the callers take their leases in the lab's PostgreSQL (a
    /// pg lab, [`LabOptions::pg`]).
    pub fn is_pg(&self) -> bool {
        matches!(self.servers().primary, Primary::Postgres(_))
    }

    /// The URL of the pg lab's PgBouncer (in transaction mode, in front
    /// of [`postgres_url`](Self::postgres_url)'s server), if it has one:
    /// the callers of the pg-pgbouncer mode dial it for their leases and
    /// their writes. It holds the server's password: do not log it.
    pub fn pgbouncer_url(&self) -> Option<String> {
        self.pgbouncer_url_locked(&self.servers())
    }

    /// [`pgbouncer_url`](Self::pgbouncer_url) with the servers locked.
    pub(super) fn pgbouncer_url_locked(&self, servers: &Servers) -> Option<String> {
        match &servers.primary {
            Primary::Postgres(lab) => lab.bouncer.as_ref().map(PgBouncer::url),
            _ => None,
        }
    }
}

/// The pg lab of `primary`, or [`LabError::Unsupported`].
pub(super) fn pg_lab(primary: &mut Primary, fault: Fault) -> Result<&mut PgLab, LabError> {
    match primary {
        Primary::Postgres(lab) => Ok(lab),
        _ => Err(LabError::Unsupported {
            fault,
            needs: NEEDS_PG,
        }),
    }
}

impl PgLab {
    /// Starts `fault` (a pg fault) on the lab's PostgreSQL `pg`; what it
    /// hit, for the history. `length` is the window's.
    pub(super) fn begin(
        &mut self,
        fault: Fault,
        pg: &PostgresServer,
        keys: &[String],
        length: Duration,
    ) -> Result<String, LabError> {
        let target = match fault {
            Fault::PgBackendKill | Fault::PgRowDelete => {
                self.repeat(fault, keys)?;
                match fault {
                    Fault::PgBackendKill => "postgresql: every caller's backend".to_owned(),
                    _ => format!("postgresql: the lease rows of {}", keys.join(", ")),
                }
            }
            Fault::PgTableLock => {
                let migration = Session::open(self.url.clone())?;
                migration.execute(
                    &format!("BEGIN; LOCK TABLE {LEASE_TABLE} IN ACCESS EXCLUSIVE MODE"),
                    "locking the lease table",
                )?;
                self.migration = Some(migration);
                format!("postgresql: {LEASE_TABLE} (ACCESS EXCLUSIVE, a migration's)")
            }
            Fault::PgClockStep => {
                let by = length * 2;
                pg.jump_clock(by)
                    .map_err(server("stepping postgresql's clock"))?;
                format!("postgresql clock (+{} ms)", by.as_millis())
            }
            Fault::PgCrash => {
                pg.crash().map_err(server("crashing postgresql"))?;
                "postgresql (immediate shutdown)".to_owned()
            }
            Fault::PgStatementTimeout | Fault::PgLockTimeout => {
                let (setting, role) = (tiny_setting(fault), &self.role);
                let ms = PG_TINY_TIMEOUT.as_millis();
                self.admin.execute(
                    &format!("ALTER ROLE {role} SET {setting} = '{ms}ms'; {KILL_BACKENDS}"),
                    "setting a tiny timeout",
                )?;
                format!("postgresql: {setting} {ms} ms for the callers' new sessions")
            }
            Fault::PgbouncerRestart => {
                self.bouncer(fault)?
                    .kill()
                    .map_err(server("killing pgbouncer"))?;
                "pgbouncer (killed)".to_owned()
            }
            _ => return Err(pg_only(fault)),
        };
        Ok(target)
    }

    /// Fires a repeated pg fault once more.
    pub(super) fn repeat(&self, fault: Fault, keys: &[String]) -> Result<(), LabError> {
        match fault {
            Fault::PgBackendKill => self
                .admin
                .execute(KILL_BACKENDS, "ending the callers' backends"),
            Fault::PgRowDelete => {
                let keys: Vec<String> = keys.iter().map(|key| quote(key)).collect();
                let delete = format!(
                    "DELETE FROM {LEASE_TABLE} WHERE resource IN ({})",
                    keys.join(", ")
                );
                self.admin.execute(&delete, "deleting the lease rows")
            }
            _ => Ok(()),
        }
    }

    /// Ends `fault` on `pg`: starts again or lets go what it hit.
    pub(super) fn end(&mut self, fault: Fault, pg: &PostgresServer) -> Result<(), LabError> {
        match fault {
            Fault::PgTableLock => {
                if let Some(migration) = self.migration.take() {
                    migration.execute("ROLLBACK", "ending the migration")?;
                }
            }
            Fault::PgStatementTimeout | Fault::PgLockTimeout => {
                let (setting, role) = (tiny_setting(fault), &self.role);
                self.admin.execute(
                    &format!("ALTER ROLE {role} RESET {setting}; {KILL_BACKENDS}"),
                    "resetting the tiny timeout",
                )?;
            }
            Fault::PgCrash => pg
                .start_again()
                .map_err(server("starting postgresql again after its crash"))?,
            Fault::PgbouncerRestart => self
                .bouncer(fault)?
                .start_again()
                .map_err(server("starting pgbouncer again"))?,
            _ => {}
        }
        Ok(())
    }

    /// Leaves PgBouncer running and no table locked. Called when a run
    /// ends, whatever happened.
    pub(super) fn heal(&mut self) {
        self.migration = None;
        let role = &self.role;
        let _ = self.admin.execute(
            &format!(
                "ALTER ROLE {role} RESET statement_timeout; ALTER ROLE {role} RESET lock_timeout"
            ),
            "resetting the timeouts",
        );
        if let Some(bouncer) = &self.bouncer {
            let _ = bouncer.start_again();
        }
    }

    /// PgBouncer's log, for a failure message.
    pub(super) fn logs(&self) -> String {
        match &self.bouncer {
            Some(bouncer) => format!("--- pgbouncer ---\n{}\n", bouncer.log()),
            None => String::new(),
        }
    }

    fn bouncer(&self, fault: Fault) -> Result<&PgBouncer, LabError> {
        self.bouncer.as_ref().ok_or(LabError::Unsupported {
            fault,
            needs: "a pg lab with pgbouncer in front (LabOptions::pgbouncer: the pg-pgbouncer mode)",
        })
    }
}

/// What a [`Session`]'s thread is asked: a statement, and where its
/// outcome goes.
type Request = (
    String,
    String,
    std::sync::mpsc::Sender<Result<(), LabError>>,
);

/// A connection of the lab's own to its PostgreSQL, on a thread of its
/// own (with a runtime of its own) that lives as long as the session:
/// statements are sent to it and their outcome awaited, from blocking
/// code. The connection is opened at the first statement and again
/// after one failed; dropping the session closes it (rolling back an
/// open transaction).
struct Session {
    requests: tokio::sync::mpsc::UnboundedSender<Request>,
}

impl Session {
    /// A session on the database at `url`; nothing is connected yet.
    fn open(url: String) -> Result<Session, LabError> {
        let (requests, mut rx) = tokio::sync::mpsc::unbounded_channel::<Request>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|_| LabError::Options("could not start a runtime for postgresql requests"))?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let mut client: Option<Client> = None;
                while let Some((statement, what, reply)) = rx.recv().await {
                    let open = match client.take() {
                        Some(open) if !open.is_closed() => Ok(open),
                        _ => bounded(leasehold_pg::connect(&url), "connecting").await,
                    };
                    let result = match open {
                        Ok(open) => {
                            let result = bounded(open.batch_execute(&statement), &what).await;
                            if result.is_ok() {
                                client = Some(open);
                            }
                            result
                        }
                        Err(err) => Err(err),
                    };
                    let _ = reply.send(result);
                }
            });
        });
        Ok(Session { requests })
    }

    /// Runs `statement` (one or several, as a simple query) and waits
    /// for its outcome.
    fn execute(&self, statement: &str, what: &str) -> Result<(), LabError> {
        let (reply, outcome) = std::sync::mpsc::channel();
        let gone = || LabError::Options("the lab's postgresql session ended");
        self.requests
            .send((statement.to_owned(), what.to_owned(), reply))
            .map_err(|_| gone())?;
        outcome.recv().map_err(|_| gone())?
    }
}

/// `future` bounded by [`STATEMENT_TIMEOUT`], its error as the lab's.
async fn bounded<T, E: Into<leasehold_pg::Error>>(
    future: impl Future<Output = Result<T, E>>,
    what: &str,
) -> Result<T, LabError> {
    let failed = |source| LabError::Postgres {
        what: what.to_owned(),
        source,
    };
    match tokio::time::timeout(STATEMENT_TIMEOUT, future).await {
        Ok(result) => result.map_err(|err| failed(err.into())),
        Err(_) => Err(LabError::Options(
            "a statement of the lab's own postgresql connection took over 5 s",
        )),
    }
}

/// The setting a timeout fault makes tiny.
fn tiny_setting(fault: Fault) -> &'static str {
    match fault {
        Fault::PgLockTimeout => "lock_timeout",
        _ => "statement_timeout",
    }
}

/// `text` as an SQL string literal.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn pg_only(fault: Fault) -> LabError {
    LabError::Unsupported {
        fault,
        needs: "a redis server, an etcd cluster or a zookeeper ensemble (the pg lab has only postgresql)",
    }
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn a_key_is_quoted_as_a_literal() {
        assert_eq!(quote("lock:{wallet:1}"), "'lock:{wallet:1}'");
        assert_eq!(quote("it's"), "'it''s'");
    }
}
