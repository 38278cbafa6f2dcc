//! PostgreSQL writes that stay correct when the Redis lock does not: a fence
//! guard for any transaction on any table, the tutorial's fenced and
//! check-and-set debits, and the two database-only alternatives.
//!
//! A Redis lease from [`leasehold`] is an *efficiency* lock: a holder that
//! is paused past its TTL keeps working after its lease has passed to
//! someone else, and nothing it checks before writing can rule that out.
//! This crate moves the final check to where the write happens.
//!
//! # The fence guard: any transaction, any table
//!
//! [`guard()`] is the way in for your own schema: run it first in your
//! transaction with the lease, then read and write whatever you like and
//! commit. It keeps one row per resource in [`FENCES`] (no version column
//! on your tables, any number of writes per lease), refuses a holder whose
//! token is older than one that has written, or equal to it from another
//! holder ([`Guard::Refused`]: roll back),
//! and, when Redis has lost the fence counter, raises it so that the next
//! lease wins again after at most one refused write. The [`guard`](mod@guard)
//! module states the serialization argument (what every writer must do, and
//! what it does not cover), the plain SQL for other drivers, and how
//! [`setup`] migrates a fence table of an earlier version.
//!
//! ```no_run
//! use std::time::Duration;
//! use leasehold::{AcquireOptions, FencedKeys, Lessor, Locker};
//! use leasehold_pg::Guard;
//!
//! # async fn run(locker: Locker) -> Result<(), Box<dyn std::error::Error>> {
//! let mut db = leasehold_pg::connect("postgres://app@127.0.0.1/app").await?;
//! leasehold_pg::setup(&mut db).await?; // creates leasehold_fences and its guard function
//!
//! let keys = FencedKeys::for_resource("account:alice")?;
//! let lease = locker.acquire(&keys, Duration::from_secs(2)).await?;
//! let tx = db.transaction().await?;
//! match leasehold_pg::guard(&tx, &lease).await? {
//!     Guard::Accepted => {
//!         // Reads after the guard see every earlier guarded write.
//!         let row = tx
//!             .query_one("SELECT balance FROM accounts WHERE name = 'alice'", &[])
//!             .await?;
//!         let balance: i64 = row.get(0);
//!         tx.execute(
//!             "UPDATE accounts SET balance = $1 WHERE name = 'alice'",
//!             &[&(balance - 10)],
//!         )
//!         .await?;
//!         tx.commit().await?;
//!     }
//!     // A newer holder has written (our lease failed us): nothing was
//!     // written; retry with a new lease.
//!     Guard::Refused { .. } => tx.rollback().await?,
//! }
//! let _ = lease.release().await;
//! # Ok(())
//! # }
//! ```
//!
//! # A holder that freezes
//!
//! A holder frozen inside its guarded transaction keeps the guard's row
//! locked, which would stall the next holder for the whole freeze. So
//! the guard also sets the transaction-local (`SET LOCAL`, safe through
//! PgBouncer) `idle_in_transaction_session_timeout` to the lease's TTL
//! (at least 1 s), a smaller setting kept: the server ends a session
//! frozen between two statements about a lease after the freeze, and the
//! thawed holder's commit is [`Error::SessionEnded`]. The timer restarts
//! with each idle period (it bounds a pause, not the transaction);
//! `statement_timeout` (it also cuts long statements the watchdog keeps
//! alive) is the caller's choice. A holder frozen mid-statement (a
//! backend blocked writing to a stopped client's socket) yields only to
//! termination: with [`GuardOptions::take_over_after`] (opt-in; it needs
//! the same role as the frozen holder, or `pg_signal_backend`, and
//! otherwise waits as before), the next holder's guard waits that long
//! for the row, then, its lease valid, ends the older holder's session
//! (`pg_terminate_backend`). See [A holder that
//! freezes](mod@guard#a-holder-that-freezes) and [Taking
//! over](mod@guard#taking-over-from-a-frozen-holder).
//!
//! # Why fencing orders writes but not reads
//!
//! [`debit_fenced`] carries the lease's [`FencingToken`] and writes only
//! `WHERE fence < $token`: once holder 34 has written, holder 33 (paused
//! through its lease) is refused, [`Outcome::StaleToken`]. But fencing says
//! nothing about what a writer *read*. With overlapping leases, 33 and 34
//! can both read balance 100; 33 writes 90 first (legal), then 34 writes 90
//! with a higher token (also legal). 34's new balance came from a stale
//! value and one debit is lost: under a 1 ms TTL the tutorial measured 17
//! to 20 accepted spends of 10 from 100 with fencing alone.
//!
//! # Why check-and-set fixes it
//!
//! Salvatore Sanfilippo, replying to Martin Kleppmann ("Is Redlock safe?"):
//!
//! > When starting to work with a shared resource, we set its state to
//! > "\<token\>", then we operate the read-modify-write only if the token is
//! > still the same when we write.
//!
//! [`debit_check_and_set`] also requires the fence it read to be unchanged
//! (`AND fence = $read_fence`), [`Outcome::StaleRead`] otherwise. Every
//! accepted write raises the fence, so a version never repeats and a value
//! that changed and changed back cannot fool the check. The database now
//! keeps the balance right on its own; a failing lock costs refused writes
//! (which the caller may retry), never a wrong balance.
//!
//! These helpers keep the fence in the wallet row. A fence counter that
//! Redis lost restarts at the server's clock, above the stored fence (see
//! [`FencingToken`]); if a counter is ever behind the stored fence all the
//! same, they refuse every write until it passes it: on
//! [`Outcome::StaleToken`] or [`Outcome::StaleRead`], call
//! `lease.raise_fence(FencingToken::new(fence))` with the fence it reports
//! (as [`guard()`] does by itself), and the next lease's writes land.
//!
//! # Without Redis at all
//!
//! If the balance lives in PostgreSQL, the database can serialize the
//! read-modify-write by itself: [`debit_for_update`] (or
//! [`lock_for_update`] for work between the read and the write) locks the
//! row with `SELECT ... FOR UPDATE` in a transaction, and
//! [`debit_conditional`] does it in one statement,
//! `balance = balance - $1 WHERE balance >= $1`. These two do not advance
//! the fence: use one style per wallet.
//!
//! # The ledger
//!
//! Every accepted debit inserts a row in [`LEDGER`] in the same statement or
//! transaction, so [`audit`] can compare the balance with the initial
//! balance minus the ledger's sum: a lost or duplicated debit cannot hide.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use leasehold::{FencedKeys, Lessor, Locker};
//! use leasehold_pg::Outcome;
//!
//! # async fn run(locker: Locker) -> Result<(), Box<dyn std::error::Error>> {
//! let mut db = leasehold_pg::connect("postgres://app@127.0.0.1/app").await?;
//! leasehold_pg::setup_wallets(&mut db).await?;
//!
//! let keys = FencedKeys::for_resource("wallet:42")?;
//! let lease = locker.acquire(&keys, Duration::from_secs(2)).await?;
//! let token = lease.fence().ok_or("a fenced lease has a fence")?;
//! let read = leasehold_pg::read_wallet(&db, 42).await?;
//! match leasehold_pg::debit_check_and_set(&db, &read, 10, token).await? {
//!     Outcome::Applied { balance } => println!("paid, {balance} left"),
//!     Outcome::InsufficientFunds { .. } => println!("declined"),
//!     // The lock failed us; the database did not. Retry from the read.
//!     refused => println!("refused: {refused:?}"),
//! }
//! let _ = lease.release().await;
//! # Ok(())
//! # }
//! ```
//!
//! All functions are generic over [`tokio_postgres::GenericClient`], so they
//! run on a client or inside the caller's transaction.
//!
//! # sqlx
//!
//! With the crate feature `sqlx` (off by default), the `sqlx` module is
//! the guard, [`setup`] and [`guarded()`] on sqlx 0.8:
//! `leasehold_pg::sqlx::guarded(&mut conn, &lease, async |tx| ...)` with
//! `tx` a `&mut PgConnection`, the same [`Guarded`] outcomes and [`Error`]s
//! (the driver's error is the source, a [`DriverError`]), and
//! [`FencingToken`] binds and reads as an `INT8` there. It adds sqlx with
//! no TLS, macros or migrations (about 45 crates, most of them sqlx's
//! own); users of diesel-async run the guard's one statement themselves
//! (see [On sqlx and other drivers](mod@guard#on-sqlx-and-other-drivers)).
//!
//! # The lease table as a lock service
//!
//! [`PgLocker`] takes leases in a table of the database you already run,
//! as a [`LockService`](leasehold::LockService): see the [`locker`]
//! module. It opens its own connection ([`PgLocker::connect`]) or, with
//! the crate feature `deadpool` (off by default), takes one per request
//! from your deadpool-postgres 0.14 pool ([`PgLocker::from_pool`], its
//! waiters polling; the crate re-exports `deadpool_postgres`). Either way
//! a request that does not end by its deadline cancels its statement and
//! gives up its connection, so one statement stuck on a lock holds up no
//! other request ([One stuck statement](locker#one-stuck-statement)).
//!
//! # Tracing
//!
//! Through the `tracing` facade (no subscriber is installed):
//!
//! | level | target | what | fields |
//! |---|---|---|---|
//! | DEBUG | `leasehold_pg::write` | span `leasehold_pg.debit`, one per [`debit_fenced`] / [`debit_check_and_set`] | `wallet`, `check` (`token` / `token_and_version`), `token`, `outcome` (`applied` / `stale_token` / `stale_read` / `insufficient_funds` / `error`), `current` (the fence that beat us, when refused) |
//! | DEBUG | `leasehold_pg::guard` | span `leasehold_pg.guard`, one per resource guarded ([`guard()`], [`guard_token`]) | `resource`, `token`, `outcome` (`accepted` / `refused` / `error`), `current` and `healed` (when refused; `current` equal to `token`: another holder wrote with it) |
//! | DEBUG | both | the event ending each span: `fenced write`, `fenced write failed`, `guard accepted`, `guard failed` | as the span, and `error` |
//! | **WARN** | both | **`write refused: ...`**: a write refused as stale. A lease failed (expired under a slow holder, lost in a failover) and the database caught it: the money alarm | `wallet` or `resource`, `token`, `current`, `outcome`; `healed` for the guard |
//! | WARN | `leasehold_pg::guard` | `could not raise the fence counter` | `resource`, `error` |
//! | WARN | `leasehold_pg::guard` | `ended the session of an older holder that held the guarded row` (a take-over) | `resource`, `token` |
//! | WARN | `leasehold_pg::guard` | `could not end the session holding the guarded row ...; waiting for it` (a take-over without the permission) | `resource`, `error` |
//! | INFO | `leasehold_pg::guard` | `created the fence table`, `migrated the fence table` (one per change) | `table`, `change` |
//!
//! Wallet ids, resources and fencing tokens are logged; connection URLs,
//! passwords and lease tokens never are.
//!
//! # Metrics
//!
//! With the crate feature `metrics` (off by default) fenced writes (by
//! check and outcome), guarded writes (by outcome) and writes refused as
//! stale are counted through the `metrics` facade; names, labels and their
//! values are in the [`metrics`] module.
//!
//! # TLS
//!
//! With the crate feature `tls` (off by default; it turns on `leasehold`'s
//! `tls` too, whose [`tls`](leasehold::tls) module reads the certificate
//! files and names the failures for both crates), [`connect()`] speaks TLS
//! as libpq does, from the URL's `sslmode`, `sslrootcert`, `sslcert` and
//! `sslkey`: `postgres://app@db/app?sslmode=verify-full&sslrootcert=/etc/ca.pem`
//! verifies the server against that CA and its host name. Each failure
//! has its own error: [`Error::TlsCertificate`] (with the
//! [`CertificateProblem`](leasehold::CertificateProblem)),
//! [`Error::TlsNotSupported`], [`Error::ClientCertRejected`],
//! [`Error::TlsFile`], [`Error::InvalidTls`].
//!
//! Without the feature, no rustls is built, and the crate behaves as libpq
//! built without SSL: `sslmode=prefer` (the default), `allow` and `disable`
//! connect in plain text, and a URL that needs TLS (`require`,
//! `verify-ca`, `verify-full`, or a `sslrootcert`, `sslcert` or `sslkey`
//! file) is [`Error::TlsNotEnabled`], before any connection. [`config()`]
//! returns the same [`Connector`] type either way, so turning the feature
//! on breaks no code that names it.

// The TLS docs link `leasehold::tls`, and the locker's docs
// `PgLockerBuilder::pool`, which a build without the `tls` or `deadpool`
// feature leaves out; checked where both are on (docs.rs, the tests'
// build).
#![cfg_attr(
    not(all(feature = "tls", feature = "deadpool")),
    allow(rustdoc::broken_intra_doc_links)
)]

mod client;
mod connect;
pub mod connector;
mod ddl;
mod error;
pub mod guard;
pub mod guarded;
pub mod lease_row;
pub mod locker;
pub mod metrics;
mod options;
mod params;
mod schema;
#[cfg(feature = "sqlx")]
pub mod sqlx;
mod statements;
mod tables;
#[cfg(feature = "tls")]
mod tls;
mod wakes;
mod write;

pub use connect::{config, connect};
pub use connector::Connector;
pub use error::{DriverError, Error, Result};
pub use guard::{FENCES_DDL, Guard, Setup, guard, guard_token, guard_with_options, setup};
pub use guarded::{Guarded, guarded, guarded_with_hook, guarded_with_options};
pub use leasehold::FencingToken;
pub use locker::{
    DEFAULT_LOCK_COMMAND_TIMEOUT, DEFAULT_POLL_EVERY, PgLocker, PgLockerBuilder, QueuePlace,
};
pub use options::GuardOptions;
pub use schema::{reset_wallet, setup_wallets};
pub use tables::{FENCES, LEDGER, WALLETS};
pub use write::{
    Audit, LockedWallet, Outcome, Snapshot, audit, debit_check_and_set, debit_conditional,
    debit_fenced, debit_for_update, lock_for_update, read_wallet,
};

/// Re-exported so callers can name the client types without adding a
/// matching version of the crate themselves.
pub use tokio_postgres;

/// Re-exported (crate feature `deadpool`) so callers can build the pool
/// [`PgLockerBuilder::pool`] takes without adding a matching version of
/// the crate themselves.
#[cfg(feature = "deadpool")]
pub use deadpool_postgres;

/// The README's example, compiled as a doctest (the crate docs above are
/// the reference; the README is the repository and crates.io page).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
