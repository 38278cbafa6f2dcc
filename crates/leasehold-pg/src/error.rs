//! The crate's one error type.

use std::path::PathBuf;

use leasehold::{CertificateProblem, FencingToken, TlsFileRole};

/// Everything that can go wrong talking to PostgreSQL about a wallet.
///
/// A write the database *refused* (stale token, stale read, not enough
/// money) is not an error: it is an [`Outcome`](crate::Outcome). Messages are
/// lowercase and never contain a password or a connection URL. Each text
/// appears once in the chain of [`std::error::Error::source`]: a variant
/// named after its outcome leaves the server's reason to its source (a
/// [`DriverError`]), and [`Error::Postgres`], which has no other name for
/// it, says the server's SQLSTATE and message itself, its source then
/// leaving them out.
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
    /// up, shutting down or in recovery when we connect (`57P03`
    /// cannot_connect_now, "the database system is starting up") or a
    /// connection failure it reported (SQLSTATE class `08`). Retryable: a
    /// restart or a failover of PostgreSQL passes. A session the server
    /// ended is [`Error::SessionEnded`].
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

    /// The session ended before its transaction could commit: nothing in
    /// it was written. Retryable, on a new connection (this one is gone).
    ///
    /// Either the server ended the session, answering with one of
    /// - `25P03` idle_in_transaction_session_timeout (the transaction sat
    ///   idle past `idle_in_transaction_session_timeout`),
    /// - `57P05` idle_session_timeout (idle outside a transaction past
    ///   `idle_session_timeout`),
    /// - `57P01` admin_shutdown (a smart or fast shutdown,
    ///   `pg_terminate_backend`),
    /// - `57P02` crash_shutdown (another server process crashed; the
    ///   server restarts through crash recovery),
    /// - `57P04` database_dropped (on a standby, a conflict with recovery),
    ///
    /// in place of the answer to a statement before the `COMMIT`
    /// (PostgreSQL rolls back the open transaction of a session it ends);
    /// or the connection had closed
    /// before [`guarded`](crate::guarded()) sent the `COMMIT` (no SQLSTATE
    /// then). A `COMMIT` sent and then met by a lost connection is
    /// [`Error::CommitUnknown`] instead. The SQLSTATE is the source's
    /// [`code`](DriverError::code); the server's message is in the source
    /// chain.
    #[error("{}: the transaction did not commit", ended(.0))]
    SessionEnded(#[source] DriverError),

    /// The `COMMIT` got no answer (the connection broke while it was out):
    /// whether it landed is not known. Read the state back before acting
    /// on it ([`guarded`](crate::guarded())).
    #[error("the commit got no answer: whether it landed is unknown")]
    CommitUnknown(#[source] DriverError),

    /// Any other error from PostgreSQL or the client. An error the server
    /// answered with says its SQLSTATE and message
    /// (`postgresql error 23505: duplicate key value violates unique
    /// constraint "accounts_pkey"`); the source then leaves both out (it
    /// keeps the server's detail and hint).
    #[error("postgresql error{}", said_by_server(.0))]
    Postgres(#[source] DriverError),
}

impl Error {
    /// True when the same call may succeed later: the server was
    /// unreachable or starting up ([`Error::Unreachable`]), ended the
    /// session before the transaction committed ([`Error::SessionEnded`]),
    /// had no connection slot left (`53300`), or aborted the transaction
    /// for a serialization failure (`40001`) or a deadlock (`40P01`).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Unreachable(_) | Error::SessionEnded(_) => true,
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
        Error::Postgres(DriverError::from(err).told())
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
            code if ends_session(code) => Error::SessionEnded(source),
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
            _ => Error::Postgres(source.told()),
        }
    }
}

impl From<tokio_postgres::Error> for Error {
    /// Names the outcome: [`Error::TableMissing`], [`Error::Auth`],
    /// [`Error::Unreachable`], [`Error::SessionEnded`], ..., or
    /// [`Error::Postgres`].
    fn from(err: tokio_postgres::Error) -> Self {
        Error::from_pg(err)
    }
}

/// The message tokio-postgres gives when the server answers `N` to the
/// TLS request and TLS is required (it has no error kind for it).
const NOT_SUPPORTED: &str = "server does not support TLS";

/// The SQLSTATEs with which the server ends a session in place of
/// answering a statement (PostgreSQL 15's `errcodes.txt`), and their
/// condition names: [`Error::SessionEnded`].
const SESSION_ENDED: [(&str, &str); 5] = [
    ("25P03", "idle_in_transaction_session_timeout"),
    ("57P01", "admin_shutdown"),
    ("57P02", "crash_shutdown"),
    ("57P04", "database_dropped"),
    ("57P05", "idle_session_timeout"),
];

/// Whether a `COMMIT` the server answered with this error may have
/// committed all the same: a session ended by termination (`57P01`,
/// `57P02`, `57P04`) can end after the commit is durable locally (a
/// backend terminated while it waits for a synchronous standby says "the
/// transaction has already committed locally"), so at a `COMMIT` it is
/// [`Error::CommitUnknown`], never "did not commit". The idle timeouts
/// (`25P03`, `57P05`) never interrupt a statement.
pub(crate) fn commit_outcome_unknown(code: Option<&str>) -> bool {
    matches!(code, Some("57P01" | "57P02" | "57P04"))
}

/// Whether the server ended the session with this SQLSTATE.
fn ends_session(code: &str) -> bool {
    SESSION_ENDED.iter().any(|(ended, _)| *ended == code)
}

/// The start of [`Error::SessionEnded`]'s message: who ended the session,
/// and why when the server said.
fn ended(source: &DriverError) -> String {
    match source.code() {
        Some(code) => match SESSION_ENDED.iter().find(|(ended, _)| *ended == code) {
            Some((_, name)) => format!("postgresql ended the session ({code} {name})"),
            None => format!("postgresql ended the session ({code})"),
        },
        None => "the connection ended before the commit was sent".to_owned(),
    }
}

/// The server's SQLSTATE and message, for [`Error::Postgres`]'s message
/// (` 23505: duplicate key ...`), when its source leaves them out (an
/// error the server answered with); empty otherwise.
fn said_by_server(source: &DriverError) -> String {
    match source.server() {
        Some(server) if source.told => format!(" {}: {}", server.code, server.message),
        _ => String::new(),
    }
}

/// Whether the server said it is not serving when we connected: starting
/// up, shutting down or in recovery (`57P03`), or a connection failure
/// (SQLSTATE class `08`).
fn is_not_serving(code: &str) -> bool {
    code == "57P03" || code.starts_with("08")
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
/// sqlx's (feature `sqlx`); the source of this crate's [`Error`]s that
/// come from the driver. It shows the driver's message, and its source is
/// the driver's (the server's error, an I/O error), whose text it leaves
/// out where the driver repeats it (sqlx does): walking
/// [`std::error::Error::source`] reads each text once, the same whichever
/// driver ran. Under [`Error::Postgres`], whose message already says the
/// server's SQLSTATE and message, it has no source and shows the driver's
/// word for a server error (`db error` on tokio-postgres) with the
/// server's detail and hint; [`code`](Self::code) and
/// [`message`](Self::message) still give both.
#[derive(Debug)]
pub struct DriverError {
    driver: Driver,
    /// The error holding this one says the server's code and message.
    told: bool,
}

#[derive(Debug)]
enum Driver {
    TokioPostgres(tokio_postgres::Error),
    #[cfg(feature = "sqlx")]
    Sqlx(sqlx::Error),
}

/// What the server said, when it answered with an error.
struct Server<'a> {
    code: &'a str,
    message: &'a str,
    detail: Option<&'a str>,
    hint: Option<&'a str>,
}

impl DriverError {
    /// The SQLSTATE code when the server answered with an error (`"40001"`
    /// for a serialization failure); `None` when it did not answer (the
    /// connection failed, the client gave up).
    pub fn code(&self) -> Option<&str> {
        self.server().map(|server| server.code)
    }

    /// The server's message when it answered with an error (`duplicate
    /// key value violates unique constraint "accounts_pkey"`); `None` when
    /// it did not answer.
    pub fn message(&self) -> Option<&str> {
        self.server().map(|server| server.message)
    }

    /// The tokio-postgres error, when the call ran on tokio-postgres.
    pub fn as_tokio_postgres(&self) -> Option<&tokio_postgres::Error> {
        match &self.driver {
            Driver::TokioPostgres(err) => Some(err),
            #[cfg(feature = "sqlx")]
            Driver::Sqlx(_) => None,
        }
    }

    /// The sqlx error, when the call ran on sqlx.
    #[cfg(feature = "sqlx")]
    pub fn as_sqlx(&self) -> Option<&sqlx::Error> {
        match &self.driver {
            Driver::Sqlx(err) => Some(err),
            Driver::TokioPostgres(_) => None,
        }
    }

    /// Marks this source as one whose holder says the server's code and
    /// message ([`Error::Postgres`]).
    pub(crate) fn told(mut self) -> Self {
        self.told = true;
        self
    }

    /// The server's error, when it answered with one.
    fn server(&self) -> Option<Server<'_>> {
        match &self.driver {
            Driver::TokioPostgres(err) => err.as_db_error().map(|db| Server {
                code: db.code().code(),
                message: db.message(),
                detail: db.detail(),
                hint: db.hint(),
            }),
            #[cfg(feature = "sqlx")]
            Driver::Sqlx(err) => err
                .as_database_error()
                .and_then(|db| db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>())
                .map(|db| Server {
                    code: db.code(),
                    message: db.message(),
                    detail: db.detail(),
                    hint: db.hint(),
                }),
        }
    }

    /// The driver's error.
    fn inner(&self) -> &(dyn std::error::Error + 'static) {
        match &self.driver {
            Driver::TokioPostgres(err) => err,
            #[cfg(feature = "sqlx")]
            Driver::Sqlx(err) => err,
        }
    }
}

impl From<tokio_postgres::Error> for DriverError {
    fn from(err: tokio_postgres::Error) -> Self {
        DriverError {
            driver: Driver::TokioPostgres(err),
            told: false,
        }
    }
}

#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for DriverError {
    fn from(err: sqlx::Error) -> Self {
        DriverError {
            driver: Driver::Sqlx(err),
            told: false,
        }
    }
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner();
        let text = inner.to_string();
        // The driver's message without its source's text, which sqlx
        // appends (`error returned from database: <the server's message>`)
        // and which the chain shows next.
        let own = match inner.source().map(|source| format!(": {source}")) {
            Some(tail) => text.strip_suffix(&tail).unwrap_or(&text),
            None => &text,
        };
        f.write_str(own)?;
        if self.told
            && let Some(server) = self.server()
        {
            if let Some(detail) = server.detail {
                write!(f, "; detail: {detail}")?;
            }
            if let Some(hint) = server.hint {
                write!(f, "; hint: {hint}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for DriverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        if self.told && self.server().is_some() {
            // Its holder says the server's code and message.
            return None;
        }
        self.inner().source()
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
