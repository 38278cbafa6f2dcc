//! What leases cost the database, read from its own counters on a
//! connection of the bench's (whose statements carry the tag
//! `bench-pg-admin` and are left out):
//!
//! - **statements**: `pg_stat_statements`' calls, every statement the
//!   server ran for a client (a take, a release, its notification, a
//!   `LISTEN`); counted as each ends, so exact;
//! - **WAL bytes**: `pg_current_wal_lsn()` moved by (anything the server
//!   wrote meanwhile included: a checkpoint's full-page images, an
//!   autovacuum's records);
//! - **dead tuples**: `pg_stat_user_tables.n_dead_tup` of the lease table,
//!   which grows with every deleted or updated row version and shrinks
//!   when (auto)vacuum or page pruning removes them. A backend sends its
//!   table counts to the statistics only now and then (and when it exits),
//!   so a reading first waits until every other client's backend has
//!   gone: the ways close their connections at the end of each run.

use std::time::Duration;

use anyhow::Context as _;
use sqlx::postgres::PgConnection;
use sqlx::{Connection as _, Executor as _, Row as _};
use tokio::time::Instant;

/// The lease table `PgLocker` writes.
const TABLE: &str = "leasehold_leases";

/// How long a reading waits for the other clients' backends to exit.
const QUIET: Duration = Duration::from_secs(10);

/// The bench's own connection to the database it measures.
pub(crate) struct Counters {
    conn: PgConnection,
}

/// The database's counters at one moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    statements: i64,
    wal_bytes: i64,
    dead_tuples: i64,
}

/// The lease table at one moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Table {
    /// `pg_total_relation_size`: the heap, its index and TOAST.
    pub(crate) size_bytes: i64,
    pub(crate) live_tuples: i64,
    pub(crate) dead_tuples: i64,
    pub(crate) autovacuums: i64,
    /// WAL position, in bytes from the start.
    pub(crate) wal_bytes: i64,
}

impl Counters {
    /// Connects to `url` and makes sure `pg_stat_statements` is there (the
    /// server must preload it).
    pub(crate) async fn connect(url: &str) -> anyhow::Result<Counters> {
        let mut conn = PgConnection::connect(url)
            .await
            .context("connecting to the throwaway postgres")?;
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements /* bench-pg-admin */")
            .await
            .context("creating the extension pg_stat_statements")?;
        Ok(Counters { conn })
    }

    /// The server's version (`server_version`).
    pub(crate) async fn version(&mut self) -> anyhow::Result<String> {
        let row = sqlx::query("SELECT current_setting('server_version') /* bench-pg-admin */")
            .fetch_one(&mut self.conn)
            .await?;
        Ok(row.try_get(0)?)
    }

    /// Waits (at most [`QUIET`]) until no other client is connected, so
    /// their statistics have been sent.
    async fn quiet(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + QUIET;
        loop {
            let row = sqlx::query(
                "SELECT count(*) /* bench-pg-admin */ FROM pg_stat_activity
                 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
            )
            .fetch_one(&mut self.conn)
            .await?;
            let others: i64 = row.try_get(0)?;
            if others == 0 || Instant::now() >= deadline {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The counters now, once the other clients are gone.
    pub(crate) async fn read(&mut self) -> anyhow::Result<Reading> {
        self.quiet().await?;
        let row = sqlx::query(
            "SELECT /* bench-pg-admin */
                 (SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements
                  WHERE query NOT LIKE '%bench-pg-admin%'),
                 pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8,
                 coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = $1), 0)",
        )
        .bind(TABLE)
        .fetch_one(&mut self.conn)
        .await
        .context("reading the database's counters")?;
        Ok(Reading {
            statements: row.try_get(0)?,
            wal_bytes: row.try_get(1)?,
            dead_tuples: row.try_get(2)?,
        })
    }

    /// The lease table now, once the other clients are gone.
    pub(crate) async fn table(&mut self) -> anyhow::Result<Table> {
        self.quiet().await?;
        let row = sqlx::query(
            "SELECT /* bench-pg-admin */ pg_total_relation_size(relid), n_live_tup, n_dead_tup,
                 autovacuum_count, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8
             FROM pg_stat_user_tables WHERE relname = $1",
        )
        .bind(TABLE)
        .fetch_one(&mut self.conn)
        .await
        .with_context(|| format!("reading {TABLE}'s statistics"))?;
        Ok(Table {
            size_bytes: row.try_get(0)?,
            live_tuples: row.try_get(1)?,
            dead_tuples: row.try_get(2)?,
            autovacuums: row.try_get(3)?,
            wal_bytes: row.try_get(4)?,
        })
    }
}

impl Reading {
    /// What each of `leases` cost between `self` and `after`: statements,
    /// WAL bytes and dead tuples per lease.
    pub(crate) fn per_lease(&self, after: &Reading, leases: u64) -> [(&'static str, f64); 3] {
        let per = |before: i64, after: i64| {
            if leases == 0 {
                f64::NAN
            } else {
                (after - before) as f64 / leases as f64
            }
        };
        [
            (
                "statements_per_lease",
                per(self.statements, after.statements),
            ),
            ("wal_bytes_per_lease", per(self.wal_bytes, after.wal_bytes)),
            (
                "dead_tuples_per_lease",
                per(self.dead_tuples, after.dead_tuples),
            ),
        ]
    }
}
