//! `bench guard`: what the fence guard costs a debit in PostgreSQL.
//!
//! Three ways to run the same read-modify-write debit of one account row in
//! a transaction (`SELECT balance`, `UPDATE balance`), side by side:
//!
//! - **unguarded**: nothing else (what a lock alone would protect);
//! - **guarded**: `leasehold_pg::guard_token` first (one upsert of the
//!   account's `leasehold_fences` row);
//! - **for-update**: `SELECT ... FOR UPDATE` instead of the plain read (the
//!   database-only way).
//!
//! Sequentially (one task, one account: latency) and with `--tasks`
//! concurrent tasks, each on its own account (throughput). No Redis: the
//! guard's token is fixed per account (one lease, many writes), so only the
//! database's work is measured.

use std::time::Duration;

use anyhow::Context;
use deadpool_postgres::Object;
use hdrhistogram::Histogram;
use leasehold::{FencingToken, HolderId};
use leasehold_pg::tokio_postgres::Client;
use serde_json::json;
use tokio::time::Instant;

use super::{Measurements, median, round3};
use crate::cli::GuardArgs;
use crate::env::Database;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Unguarded,
    Guarded,
    ForUpdate,
}

const MODES: [Mode; 3] = [Mode::Unguarded, Mode::Guarded, Mode::ForUpdate];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Unguarded => "unguarded",
            Mode::Guarded => "guarded",
            Mode::ForUpdate => "for-update",
        }
    }
}

pub(crate) async fn run(db: &Database, args: &GuardArgs, json: bool) -> anyhow::Result<()> {
    let pool = db.postgres().await?;
    let mut setup = pool.get().await.context("connecting to postgresql")?;
    leasehold_pg::setup(&mut **setup).await?;
    setup
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS bench_accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)",
        )
        .await
        .context("creating bench_accounts")?;
    let mut clients = Vec::new();
    for _ in 0..args.tasks.max(1) {
        clients.push(pool.get().await.context("connecting to postgresql")?);
    }
    let mut seq: Vec<Vec<(f64, u64, u64)>> = vec![Vec::new(); MODES.len()];
    let mut many: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    let len = u64::from(args.rounds) * MODES.len() as u64 * 2;
    let progress = Measurements::new("bench guard", len, json);
    for round in 1..=args.rounds {
        for (i, mode) in MODES.into_iter().enumerate() {
            let base = 1_000_000 * (i as i64 + 1);
            let start = |what: &str| {
                progress.start(format!(
                    "round {round}/{}: {}, {what}",
                    args.rounds,
                    mode.name()
                ));
            };
            start("sequential");
            seq[i].push(sequential(&mut clients[0], mode, base, args.duration).await?);
            start(&format!("{} tasks", args.tasks));
            let (rate, back) = concurrent(clients, mode, base, args.duration).await?;
            clients = back;
            many[i].push(rate);
        }
    }
    let unguarded_seq = median(&seq[0].iter().map(|s| s.0).collect::<Vec<_>>());
    let unguarded_many = median(&many[0]);
    if !json {
        println!(
            "bench guard: {} rounds of {:?}, {} tasks (medians)",
            args.rounds, args.duration, args.tasks
        );
        println!(
            "{:<11} {:>10} {:>8} {:>8} {:>8} {:>12} {:>8}",
            "mode", "seq deb/s", "ratio", "p50 us", "p99 us", "tasks deb/s", "ratio"
        );
    }
    for (i, mode) in MODES.into_iter().enumerate() {
        let rate = median(&seq[i].iter().map(|s| s.0).collect::<Vec<_>>());
        let p50 = median(&seq[i].iter().map(|s| s.1 as f64).collect::<Vec<_>>());
        let p99 = median(&seq[i].iter().map(|s| s.2 as f64).collect::<Vec<_>>());
        let tasks = median(&many[i]);
        if json {
            println!(
                "{}",
                json!({
                    "bench": "guard",
                    "mode": mode.name(),
                    "rounds": args.rounds,
                    "tasks": args.tasks,
                    "sequential_debits_per_s": round3(rate),
                    "sequential_ratio": round3(rate / unguarded_seq),
                    "p50_us": p50,
                    "p99_us": p99,
                    "concurrent_debits_per_s": round3(tasks),
                    "concurrent_ratio": round3(tasks / unguarded_many),
                })
            );
        } else {
            println!(
                "{:<11} {:>10.0} {:>8.3} {:>8.0} {:>8.0} {:>12.0} {:>8.3}",
                mode.name(),
                rate,
                rate / unguarded_seq,
                p50,
                p99,
                tasks,
                tasks / unguarded_many
            );
        }
    }
    Ok(())
}

/// One debit of account `id` the `mode` way.
async fn debit(db: &mut Client, mode: Mode, id: i64) -> anyhow::Result<()> {
    let tx = db.transaction().await?;
    if mode == Mode::Guarded {
        let resource = format!("bench:{id}");
        // The one holder of every guarded debit (a name: the bench holds no
        // lease).
        let holder = HolderId::parse("0123456789abcdef0123456789abcdef").context("holder id")?;
        let guard =
            leasehold_pg::guard_token(&tx, &resource, FencingToken::new(1), &holder).await?;
        anyhow::ensure!(guard.is_accepted(), "the bench's guard was refused");
    }
    let read = if mode == Mode::ForUpdate {
        "SELECT balance FROM bench_accounts WHERE id = $1 FOR UPDATE"
    } else {
        "SELECT balance FROM bench_accounts WHERE id = $1"
    };
    let balance: i64 = tx.query_one(read, &[&id]).await?.get(0);
    tx.execute(
        "UPDATE bench_accounts SET balance = $2 WHERE id = $1",
        &[&id, &(balance - 1)],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

async fn open(db: &Client, id: i64) -> anyhow::Result<()> {
    db.execute(
        "INSERT INTO bench_accounts (id, balance) VALUES ($1, 1000000000)
         ON CONFLICT (id) DO UPDATE SET balance = 1000000000",
        &[&id],
    )
    .await?;
    Ok(())
}

/// Debits per second, and latency p50 / p99 in us, of one task.
async fn sequential(
    db: &mut Client,
    mode: Mode,
    id: i64,
    duration: Duration,
) -> anyhow::Result<(f64, u64, u64)> {
    open(db, id).await?;
    let mut latency = Histogram::<u64>::new(3)?;
    let start = Instant::now();
    let mut n: u64 = 0;
    while start.elapsed() < duration {
        let asked = Instant::now();
        debit(db, mode, id).await?;
        let micros = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
        latency.saturating_record(micros.max(1));
        n += 1;
    }
    Ok((
        n as f64 / start.elapsed().as_secs_f64(),
        latency.value_at_quantile(0.5),
        latency.value_at_quantile(0.99),
    ))
}

/// Debits per second of every client at once, each on its own account;
/// gives the clients back.
async fn concurrent(
    clients: Vec<Object>,
    mode: Mode,
    base: i64,
    duration: Duration,
) -> anyhow::Result<(f64, Vec<Object>)> {
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (i, mut db) in clients.into_iter().enumerate() {
        let id = base + 1 + i as i64;
        set.spawn(async move {
            open(&db, id).await?;
            let mut n: u64 = 0;
            while start.elapsed() < duration {
                debit(&mut db, mode, id).await?;
                n += 1;
            }
            Ok::<_, anyhow::Error>((n, db))
        });
    }
    let (mut total, mut back) = (0, Vec::new());
    while let Some(joined) = set.join_next().await {
        let (n, db) = joined??;
        total += n;
        back.push(db);
    }
    Ok((total as f64 / start.elapsed().as_secs_f64(), back))
}
