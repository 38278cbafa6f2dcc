//! The crate's one error type.

use std::path::PathBuf;

use leasehold::{CertificateProblem, FencingToken, TlsFileRole};
use tokio_postgres::error::SqlState;

/// Everything that can go wrong talking to PostgreSQL about a wallet.
///
/// A write the database *refused* (stale token, stale read, not enough
/// money) is not an error: it is an [`Outcome`](crate::Outcome). Messages are
/// lowercase, never repeat the PostgreSQL error's text (walk
/// [`std::error::Error::source`] for that) and never contain a password or
/// a connection URL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A table this crate needs does not exist (SQLSTATE 42P01).
    #[error("table {table} does not exist: create it with {}", setup_for(table))]
    TableMissing {
        /// The missing table: [`FENCES`](crate::FENCES) (created by
        /// [`setup`](crate::setup)), [`WALLETS`](crate::WALLETS) or
        /// [`LEDGER`](crate::LEDGER) (created by
        /// [`setup_wallets`](crate::setup_wallets)).
        table: &'static str,
        /// The server's error.
        #[source]
        source: tokio_postgres::Error,
    },

    /// A table this crate needs exists in an earlier version's shape (a
    /// column is missing, SQLSTATE 42703): [`FENCES`](crate::FENCES)
    /// before it recorded holders. [`setup`](crate::setup) migrates it in
    /// place.
    #[error(
        "table {table} predates this version: migrate it with {}",
        setup_for(table)
    )]
    TableOutdated {
        /// The table.
        table: &'static str,
        /// The server's error.
        #[source]
        source: tokio_postgres::Error,
    },

    /// PostgreSQL could not be reached, or the connection was lost (refused,
    /// reset, closed, timed out), or the server is not serving: starting
    /// up or shutting down (`57P03` "the database system is starting up",
    /// `57P01` admin shutdown, `57P02` crash shutdown) or a connection
    /// failure it reported (SQLSTATE class `08`). Retryable: a restart or a
    /// failover of PostgreSQL passes.
    #[error("postgresql unreachable")]
    Unreachable(#[source] tokio_postgres::Error),

    /// PostgreSQL refused our credentials.
    #[error("postgresql authentication failed")]
    Auth(#[source] tokio_postgres::Error),

    /// The connection URL could not be parsed. The parser's message is
    /// dropped because it can quote the URL, password included.
    #[error("invalid postgresql connection url")]
    InvalidUrl,

    /// A TLS parameter of the connection URL is unusable: an unknown
    /// `sslmode`, or `sslcert` without `sslkey` (or the other way round).
    #[error("invalid tls setting: {0}")]
    InvalidTls(&'static str),

    /// A TLS file named by the URL (`sslrootcert`, `sslcert`, `sslkey`)
    /// cannot be used: it cannot be read, holds no PEM certificate or key,
    /// holds one that does not parse, or the key does not match the
    /// certificate. Found before connecting. The message names the file,
    /// never its contents.
    #[error("tls {role} file {path:?} {problem}")]
    TlsFile {
        /// Which file.
        role: TlsFileRole,
        /// Its path.
        path: PathBuf,
        /// What is wrong with it.
        problem: &'static str,
        /// The read error, when it could not be read.
        #[source]
        source: Option<std::io::Error>,
    },

    /// We refused the server's TLS certificate (`sslmode=verify-ca` or
    /// `verify-full`): not signed by a CA in `sslrootcert`, expired, not
    /// for this host... Not retryable.
    #[error("postgresql tls certificate refused: {problem}")]
    TlsCertificate {
        /// Why it was refused.
        problem: CertificateProblem,
        /// The client's error.
        #[source]
        source: tokio_postgres::Error,
    },

    /// The URL requires TLS (`sslmode=require`, `verify-ca`,
    /// `verify-full`) but the server does not offer it (`ssl=off`).
    #[error("postgresql does not offer tls, which the url requires")]
    TlsNotSupported(#[source] tokio_postgres::Error),

    /// The server refused our TLS client certificate (`sslcert`) during
    /// the handshake: not signed by a CA it trusts, or expired.
    #[error("postgresql refused our tls client certificate")]
    ClientCertRejected(#[source] tokio_postgres::Error),

    /// No wallet row with this id.
    #[error("wallet {id} does not exist")]
    WalletNotFound {
        /// The wallet id.
        id: i64,
    },

    /// A debit amount of zero or less. Rejected before any I/O.
    #[error("invalid amount {amount}: must be positive")]
    InvalidAmount {
        /// The rejected amount.
        amount: i64,
    },

    /// A negative starting balance. Rejected before any I/O.
    #[error("invalid balance {balance}: must not be negative")]
    InvalidBalance {
        /// The rejected balance.
        balance: i64,
    },

    /// A fencing token above `i64::MAX` cannot be stored in a `bigint`.
    /// Redis counters never get there; rejected before any I/O.
    #[error("fencing token {token} does not fit a bigint column")]
    TokenOutOfRange {
        /// The rejected token.
        token: FencingToken,
    },

    /// A fence guard was given an unusable resource name.
    #[error("invalid resource: {reason}")]
    InvalidResource {
        /// Why.
        reason: &'static str,
    },

    /// A fence guard was given token 0, which no fenced lease carries.
    #[error("fencing token {token} is not positive")]
    InvalidToken {
        /// The token.
        token: FencingToken,
    },

    /// [`guard()`](crate::guard()) was given a lease with no fenced lock.
    #[error("the lease holds no fenced lock: take it with FencedKeys")]
    NotFenced,

    /// The database user may not read or write a table it needs.
    #[error("permission denied")]
    PermissionDenied(#[source] tokio_postgres::Error),

    /// The transaction was aborted by an earlier statement's error (one
    /// the work did not pass on), so PostgreSQL would have rolled it back
    /// at `COMMIT` and called that a success: rolled back, nothing written
    /// ([`guarded`](crate::guarded())).
    #[error("the transaction was aborted by an earlier error: rolled back, nothing written")]
    Aborted(#[source] tokio_postgres::Error),

    /// The lease could not run the work ([`guarded`](crate::guarded())):
    /// it was not taken on a tokio runtime, so no watchdog can keep it.
    /// Nothing ran.
    #[error("the lease could not run the work")]
    Lease(#[source] leasehold::Error),

    /// The `COMMIT` got no answer (the connection broke while it was out):
    /// whether it landed is not known. Read the state back before acting
    /// on it ([`guarded`](crate::guarded())).
    #[error("the commit got no answer: whether it landed is unknown")]
    CommitUnknown(#[source] tokio_postgres::Error),

    /// Any other error from PostgreSQL or the client.
    #[error("postgresql error")]
    Postgres(#[source] tokio_postgres::Error),
}

impl Error {
    /// True when the same call may succeed later: the server was
    /// unreachable, starting up or shutting down ([`Error::Unreachable`]),
    /// had no connection slot left (`53300`), or aborted the transaction
    /// for a serialization failure or a deadlock.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Unreachable(_) => true,
            Error::Postgres(err) => matches!(
                err.code(),
                Some(
                    &SqlState::T_R_SERIALIZATION_FAILURE
                        | &SqlState::T_R_DEADLOCK_DETECTED
                        | &SqlState::TOO_MANY_CONNECTIONS
                )
            ),
            _ => false,
        }
    }

    /// Maps a client error to the variant that names its outcome.
    pub(crate) fn from_pg(err: tokio_postgres::Error) -> Error {
        if let Some(db) = err.as_db_error() {
            let code = db.code();
            if *code == SqlState::UNDEFINED_TABLE {
                use crate::tables::{FENCES, LEDGER, WALLETS};
                let table = if db.message().contains(FENCES) {
                    FENCES
                } else if db.message().contains(LEDGER) {
                    LEDGER
                } else {
                    WALLETS
                };
                return Error::TableMissing { table, source: err };
            }
            if is_not_serving(code) {
                return Error::Unreachable(err);
            }
            if *code == SqlState::UNDEFINED_COLUMN && db.message().contains("holder") {
                return Error::TableOutdated {
                    table: crate::tables::FENCES,
                    source: err,
                };
            }
            if *code == SqlState::INSUFFICIENT_PRIVILEGE {
                return Error::PermissionDenied(err);
            }
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            {
                return Error::Auth(err);
            }
            return Error::Postgres(err);
        }
        if let Some(failure) = crate::tls_failure::classify(&err) {
            use crate::tls_failure::Failure;
            return match failure {
                Failure::Certificate(problem) => Error::TlsCertificate {
                    problem,
                    source: err,
                },
                Failure::ClientCertRejected => Error::ClientCertRejected(err),
                Failure::NotSupported => Error::TlsNotSupported(err),
            };
        }
        if err.is_closed() || is_connection_failure(&err) {
            return Error::Unreachable(err);
        }
        Error::Postgres(err)
    }
}

impl From<tokio_postgres::Error> for Error {
    /// Names the outcome: [`Error::TableMissing`], [`Error::Auth`],
    /// [`Error::Unreachable`], or [`Error::Postgres`].
    fn from(err: tokio_postgres::Error) -> Self {
        Error::from_pg(err)
    }
}

/// Whether the server said it is not serving: starting up, shutting down,
/// or a connection failure (SQLSTATE class `08`).
fn is_not_serving(code: &SqlState) -> bool {
    *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || code.code().starts_with("08")
}

/// True for errors of the client's connect, I/O and timeout kinds, which
/// tokio-postgres exposes only through their messages.
fn is_connection_failure(err: &tokio_postgres::Error) -> bool {
    let text = err.to_string();
    matches!(
        text.as_str(),
        "error connecting to server"
            | "error communicating with the server"
            | "timeout waiting for server"
    )
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The call that creates `table`, for the [`Error::TableMissing`] message.
fn setup_for(table: &str) -> &'static str {
    if table == crate::tables::FENCES {
        "leasehold_pg::setup"
    } else {
        "leasehold_pg::setup_wallets"
    }
}
