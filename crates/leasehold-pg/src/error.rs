//! The crate's one error type.

use std::path::PathBuf;

use leasehold::{CertificateProblem, FencingToken, TlsFileRole};

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
        source: DriverError,
    },

    /// A table this crate needs exists in an earlier version's shape (a
    /// column is missing, SQLSTATE 42703): [`FENCES`](crate::FENCES)
    /// before it recorded holders, or without the guard's function
    /// (`leasehold_guard`, SQLSTATE 42883). [`setup`](crate::setup)
    /// migrates it in place.
    #[error(
        "table {table} predates this version: migrate it with {}",
        setup_for(table)
    )]
    TableOutdated {
        /// The table.
        table: &'static str,
        /// The server's error.
        #[source]
        source: DriverError,
    },

    /// PostgreSQL could not be reached, or the connection was lost (refused,
    /// reset, closed, timed out), or the server is not serving: starting
    /// up or shutting down (`57P03` "the database system is starting up",
    /// `57P01` admin shutdown, `57P02` crash shutdown) or a connection
    /// failure it reported (SQLSTATE class `08`). Retryable: a restart or a
    /// failover of PostgreSQL passes.
    #[error("postgresql unreachable")]
    Unreachable(#[source] DriverError),

    /// PostgreSQL refused our credentials.
    #[error("postgresql authentication failed")]
    Auth(#[source] DriverError),

    /// The connection URL could not be parsed. The parser's message is
    /// dropped because it can quote the URL, password included.
    #[error("invalid postgresql connection url")]
    InvalidUrl,

    /// A TLS parameter of the connection URL is unusable: an unknown
    /// `sslmode`, or `sslcert` without `sslkey` (or the other way round).
    #[error("invalid tls setting: {0}")]
    InvalidTls(&'static str),

    /// The connection URL asks for TLS (`sslmode=require`, `verify-ca`,
    /// `verify-full`, or a `sslrootcert`, `sslcert` or `sslkey` file) and
    /// this build leaves it out: turn on the crate feature `tls`
    /// (`leasehold-pg = { version = "...", features = ["tls"] }`).
    /// Found before connecting. Without the feature, `sslmode=disable`,
    /// `allow` and `prefer` (the default) connect in plain text, as libpq
    /// built without SSL does.
    #[error(
        "the url asks for tls ({setting}), which this build leaves out: enable leasehold-pg's tls feature"
    )]
    TlsNotEnabled {
        /// The setting that asks for it: `sslmode=require`,
        /// `sslmode=verify-ca`, `sslmode=verify-full`, `sslrootcert`,
        /// `sslcert` or `sslkey` (never its value).
        setting: &'static str,
    },

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
        source: DriverError,
    },

    /// The URL requires TLS (`sslmode=require`, `verify-ca`,
    /// `verify-full`) but the server does not offer it (`ssl=off`).
    #[error("postgresql does not offer tls, which the url requires")]
    TlsNotSupported(#[source] DriverError),

    /// The server refused our TLS client certificate (`sslcert`) during
    /// the handshake: not signed by a CA it trusts, or expired.
    #[error("postgresql refused our tls client certificate")]
    ClientCertRejected(#[source] DriverError),

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
    PermissionDenied(#[source] DriverError),

    /// The transaction was aborted by an earlier statement's error
    /// (SQLSTATE `25P02`): nothing in it can be written. From
    /// [`guarded`](crate::guarded()), an error the work did not pass on
    /// (PostgreSQL would have rolled the transaction back at `COMMIT` and
    /// called that a success): rolled back, nothing written. From a guard
    /// run in such a transaction: roll it back.
    #[error("the transaction was aborted by an earlier error: nothing written")]
    Aborted(#[source] DriverError),

    /// `leasehold_pg::sqlx::guarded` was given a connection already in a
    /// transaction (`&mut *tx`): its `COMMIT` would only release a
    /// savepoint, and the outer transaction would decide what is written.
    /// Nothing ran; pass a connection that is not in a transaction.
    #[error("the connection is already in a transaction: guarded needs its own")]
    InTransaction,

    /// The lease could not run the work ([`guarded`](crate::guarded())):
    /// it was not taken on a tokio runtime, so no watchdog can keep it.
    /// Nothing ran.
    #[error("the lease could not run the work")]
    Lease(#[source] leasehold::Error),

    /// The `COMMIT` got no answer (the connection broke while it was out):
    /// whether it landed is not known. Read the state back before acting
    /// on it ([`guarded`](crate::guarded())).
    #[error("the commit got no answer: whether it landed is unknown")]
    CommitUnknown(#[source] DriverError),

    /// Any other error from PostgreSQL or the client.
    #[error("postgresql error")]
    Postgres(#[source] DriverError),
}

impl Error {
    /// True when the same call may succeed later: the server was
    /// unreachable, starting up or shutting down ([`Error::Unreachable`]),
    /// had no connection slot left (`53300`), or aborted the transaction
    /// for a serialization failure (`40001`) or a deadlock (`40P01`).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Unreachable(_) => true,
            Error::Postgres(err) => matches!(err.code(), Some("40001" | "40P01" | "53300")),
            _ => false,
        }
    }

    /// Maps a tokio-postgres error to the variant that names its outcome.
    pub(crate) fn from_pg(err: tokio_postgres::Error) -> Error {
        if let Some(db) = err.as_db_error() {
            let (code, message) = (db.code().code().to_owned(), db.message().to_owned());
            return Error::from_server(&code, &message, DriverError::from(err));
        }
        let err = match Error::from_tls(err) {
            Ok(error) => return error,
            Err(err) => err,
        };
        if err.is_closed() || is_connection_failure(&err) {
            return Error::Unreachable(err.into());
        }
        Error::Postgres(err.into())
    }

    /// Maps a TLS failure inside a tokio-postgres error, if that is what
    /// it is; gives the error back otherwise. The failures are read as
    /// `leasehold`'s [`tls::classify`](leasehold::tls::classify) reads them
    /// (feature `tls`), except the server's refusal of TLS, which
    /// tokio-postgres reports in its message only.
    fn from_tls(err: tokio_postgres::Error) -> Result<Error, tokio_postgres::Error> {
        let source = std::error::Error::source(&err);
        if source.is_some_and(|source| source.to_string() == NOT_SUPPORTED) {
            return Ok(Error::TlsNotSupported(err.into()));
        }
        // A handshake asked of a build without TLS: an explicit
        // `Config::ssl_mode` beside `config`'s connector.
        if source.is_some_and(|source| source.is::<tokio_postgres::tls::NoTlsError>()) {
            return Ok(Error::TlsNotEnabled { setting: "sslmode" });
        }
        #[cfg(feature = "tls")]
        {
            use leasehold::tls::TlsFailure;
            match leasehold::tls::classify(&err) {
                Some(TlsFailure::Certificate(problem)) => {
                    return Ok(Error::TlsCertificate {
                        problem,
                        source: err.into(),
                    });
                }
                Some(TlsFailure::ClientCertRejected) => {
                    return Ok(Error::ClientCertRejected(err.into()));
                }
                _ => {}
            }
        }
        Err(err)
    }

    /// The [`Error::TlsFile`] of `leasehold`'s TLS loading as this crate's
    /// (any other error it gives, which it does not, as a bad setting).
    #[cfg(feature = "tls")]
    pub(crate) fn from_tls_file(err: leasehold::Error) -> Error {
        match err {
            leasehold::Error::TlsFile {
                role,
                path,
                problem,
                source,
            } => Error::TlsFile {
                role,
                path,
                problem,
                source,
            },
            _ => Error::InvalidTls("a tls file cannot be used"),
        }
    }

    /// Maps an error the server answered with (its SQLSTATE `code` and
    /// `message`), from either driver, to the variant that names its
    /// outcome: one classification for every driver.
    pub(crate) fn from_server(code: &str, message: &str, source: DriverError) -> Error {
        use crate::tables::{FENCES, LEDGER, WALLETS};
        match code {
            // undefined_table
            "42P01" => {
                let table = if message.contains(FENCES) {
                    FENCES
                } else if message.contains(LEDGER) {
                    LEDGER
                } else {
                    WALLETS
                };
                Error::TableMissing { table, source }
            }
            code if is_not_serving(code) => Error::Unreachable(source),
            // undefined_column: the fence table before it recorded holders;
            // undefined_function: before the guard ran as one function
            "42703" if message.contains("holder") => Error::TableOutdated {
                table: FENCES,
                source,
            },
            "42883" if message.contains("leasehold_guard") => Error::TableOutdated {
                table: FENCES,
                source,
            },
            // in_failed_sql_transaction
            "25P02" => Error::Aborted(source),
            // insufficient_privilege
            "42501" => Error::PermissionDenied(source),
            // invalid_password, invalid_authorization_specification
            "28P01" | "28000" => Error::Auth(source),
            _ => Error::Postgres(source),
        }
    }
}

impl From<tokio_postgres::Error> for Error {
    /// Names the outcome: [`Error::TableMissing`], [`Error::Auth`],
    /// [`Error::Unreachable`], or [`Error::Postgres`].
    fn from(err: tokio_postgres::Error) -> Self {
        Error::from_pg(err)
    }
}

/// The message tokio-postgres gives when the server answers `N` to the
/// TLS request and TLS is required (it has no error kind for it).
const NOT_SUPPORTED: &str = "server does not support TLS";

/// Whether the server said it is not serving: starting up (`57P03`),
/// shutting down (`57P01`, `57P02`), or a connection failure (SQLSTATE
/// class `08`).
fn is_not_serving(code: &str) -> bool {
    matches!(code, "57P03" | "57P01" | "57P02") || code.starts_with("08")
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

/// The error of the PostgreSQL driver a call ran on: tokio-postgres's, or
/// sqlx's (feature `sqlx`). The source of this crate's [`Error`]s that come
/// from the driver; it shows as the driver's error does (its message and
/// its source), so walking [`std::error::Error::source`] reads the same
/// whichever driver ran.
#[derive(Debug)]
pub struct DriverError(Driver);

#[derive(Debug)]
enum Driver {
    TokioPostgres(tokio_postgres::Error),
    #[cfg(feature = "sqlx")]
    Sqlx(sqlx::Error),
}

impl DriverError {
    /// The SQLSTATE code when the server answered with an error (`"40001"`
    /// for a serialization failure); `None` when it did not answer (the
    /// connection failed, the client gave up).
    pub fn code(&self) -> Option<&str> {
        match &self.0 {
            Driver::TokioPostgres(err) => err.code().map(tokio_postgres::error::SqlState::code),
            #[cfg(feature = "sqlx")]
            Driver::Sqlx(err) => err
                .as_database_error()
                .and_then(|db| db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>())
                .map(sqlx::postgres::PgDatabaseError::code),
        }
    }

    /// The tokio-postgres error, when the call ran on tokio-postgres.
    pub fn as_tokio_postgres(&self) -> Option<&tokio_postgres::Error> {
        match &self.0 {
            Driver::TokioPostgres(err) => Some(err),
            #[cfg(feature = "sqlx")]
            Driver::Sqlx(_) => None,
        }
    }

    /// The sqlx error, when the call ran on sqlx.
    #[cfg(feature = "sqlx")]
    pub fn as_sqlx(&self) -> Option<&sqlx::Error> {
        match &self.0 {
            Driver::Sqlx(err) => Some(err),
            Driver::TokioPostgres(_) => None,
        }
    }
}

impl From<tokio_postgres::Error> for DriverError {
    fn from(err: tokio_postgres::Error) -> Self {
        DriverError(Driver::TokioPostgres(err))
    }
}

#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for DriverError {
    fn from(err: sqlx::Error) -> Self {
        DriverError(Driver::Sqlx(err))
    }
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Driver::TokioPostgres(err) => err.fmt(f),
            #[cfg(feature = "sqlx")]
            Driver::Sqlx(err) => err.fmt(f),
        }
    }
}

impl std::error::Error for DriverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            Driver::TokioPostgres(err) => std::error::Error::source(err),
            #[cfg(feature = "sqlx")]
            Driver::Sqlx(err) => std::error::Error::source(err),
        }
    }
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
