//! `bench guard`: what the fence guard costs a debit in PostgreSQL.
//!
//! The same read-modify-write debit of one account row in a transaction
//! (`BEGIN`, `SELECT balance`, `UPDATE balance`, `COMMIT`; the two
//! statements prepared once per connection, as a pool's statement cache
//! does), four ways:
//!
//! - **unguarded**: nothing else (what a lock alone would protect);
//! - **guarded-term**: `leasehold_pg::guard_token` first, pipelined with
//!   the read (sent together, one round trip), the same token and holder
//!   every time: one lease, many debits (a leader's term);
//! - **guarded-new**: the same with a new, higher token for every debit
//!   (a lease per debit), so the guard raises the row each time;
//! - **for-update**: `SELECT ... FOR UPDATE` instead of the plain read
//!   (the database-only way), for reference;
//! - **lease**: `leasehold_pg::guarded` under a `PgLocker` lease on the
//!   same database (one lease per account, held through the run, its
//!   watchdog refreshing it): the guard, the read and the write in the
//!   transaction it opens, and the `SELECT 1` it sends with the `COMMIT`;
//! - **lease-row**: the same with
//!   [`GuardOptions::check_lease_row`](leasehold_pg::GuardOptions::check_lease_row):
//!   the guard also reads the lease's row, and the batch with the `COMMIT`
//!   checks it again under `FOR SHARE`. Its ratio to **lease** is what the
//!   check costs.
//!
//! Each sequentially (one connection, one account: latency) and with
//! `--tasks` connections each on its own account (throughput), straight to
//! the server and through a proxy that adds `--latency` of round-trip
//! time, all interleaved in every round. Through the proxy the round trips
//! of each sequential debit are counted. No Redis: only the database's
//! work and the wire are measured. Every ratio is a round's figure over
//! the unguarded figure of the same round, link and concurrency (for
//! latency, the unguarded p50 over this p50, so that higher is better
//! throughout); the report gives the median and the range over rounds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use hdrhistogram::Histogram;
use std::collections::HashMap;

use leasehold::{FencedKeys, FencingToken, HolderId, Lease, Lessor as _};
use leasehold_pg::tokio_postgres::Config;
use leasehold_pg::tokio_postgres::config::Host;
use leasehold_pg::{GuardOptions, Guarded, PgLocker};
use leasehold_testkit::{Direction, FaultProxy};
use serde_json::json;
use tokio::time::Instant;

use super::{Measurements, median, round3};
use crate::cli::GuardArgs;
use crate::env::Database;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Mode {
    Unguarded,
    Term,
    NewToken,
    ForUpdate,
    Lease,
    LeaseRow,
}

const MODES: [Mode; 6] = [
    Mode::Unguarded,
    Mode::Term,
    Mode::NewToken,
    Mode::ForUpdate,
    Mode::Lease,
    Mode::LeaseRow,
];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Unguarded => "unguarded",
            Mode::Term => "guarded-term",
            Mode::NewToken => "guarded-new",
            Mode::ForUpdate => "for-update",
            Mode::Lease => "lease",
            Mode::LeaseRow => "lease-row",
        }
    }

    fn is_guarded(self) -> bool {
        matches!(self, Mode::Term | Mode::NewToken)
    }
}

/// Straight to the server, or through the latency proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Direct,
    Proxied,
}

impl Link {
    fn name(self) -> &'static str {
        match self {
            Link::Direct => "direct",
            Link::Proxied => "proxied",
        }
    }
}

const READ: &str = "SELECT balance FROM bench_accounts WHERE id = $1";
const READ_FOR_UPDATE: &str = "SELECT balance FROM bench_accounts WHERE id = $1 FOR UPDATE";
const UPDATE: &str = "UPDATE bench_accounts SET balance = $2 WHERE id = $1";

/// What every debit shares: the one holder of the guard-only modes (a
/// name: they hold no lease) and the source of new tokens, above any an
/// earlier run stored (microseconds since the epoch, as Redis issues
/// them); and for the lease modes, the locker and each account's lease.
struct Tokens {
    holder: HolderId,
    next: AtomicU64,
    locker: PgLocker,
    leases: tokio::sync::Mutex<HashMap<(Mode, i64), Arc<Lease>>>,
}

/// The TTL of the lease modes' leases (their watchdogs keep them).
const LEASE_TTL: Duration = Duration::from_secs(30);

impl Tokens {
    async fn new(url: &str) -> anyhow::Result<Tokens> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
        let locker = PgLocker::connect(url).await.context("PgLocker")?;
        locker.setup().await.context("PgLocker setup")?;
        Ok(Tokens {
            holder: HolderId::parse("0123456789abcdef0123456789abcdef").context("holder id")?,
            next: AtomicU64::new(u64::try_from(now.as_micros())?),
            locker,
            leases: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    /// The `mode`'s lease on account `id`, taken at its first debit (not
    /// measured) and held through the run.
    async fn lease(&self, mode: Mode, id: i64) -> anyhow::Result<Arc<Lease>> {
        let mut leases = self.leases.lock().await;
        if let Some(lease) = leases.get(&(mode, id)) {
            return Ok(Arc::clone(lease));
        }
        let keys = FencedKeys::for_resource(&format!("bench:{}:{id}", mode.name()))?;
        let lease = Arc::new(self.locker.acquire(keys, LEASE_TTL).await?);
        leases.insert((mode, id), Arc::clone(&lease));
        Ok(lease)
    }

    fn token(&self, mode: Mode) -> FencingToken {
        match mode {
            Mode::NewToken => FencingToken::new(self.next.fetch_add(1, Ordering::Relaxed)),
            _ => FencingToken::new(1),
        }
    }
}

/// One sequential measurement.
#[derive(Debug, Clone, Copy)]
struct Sequential {
    rate: f64,
    p50: f64,
    p99: f64,
    /// Round trips per debit, counted by the proxy (proxied link only).
    round_trips: Option<f64>,
}

/// Every measurement of one link and mode, one per round.
#[derive(Debug, Default, Clone)]
struct Series {
    sequential: Vec<Sequential>,
    concurrent: Vec<f64>,
}

pub(crate) async fn run(db: &Database, args: &GuardArgs, json: bool) -> anyhow::Result<()> {
    let pool = db.postgres().await?;
    let url = db.postgres_url().await?;
    let mut setup = crate::env::pg_connection(pool).await?;
    leasehold_pg::setup(&mut **setup).await?;
    setup
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS bench_accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)",
        )
        .await
        .context("creating bench_accounts")?;
    let tasks = args.tasks.max(1) as usize;
    let proxy = if args.latency.is_zero() {
        None
    } else {
        Some(latency_proxy(url, args.latency).await?)
    };
    let mut links = vec![(Link::Direct, clients(pool, tasks).await?)];
    if let Some((_, proxied)) = &proxy {
        links.push((Link::Proxied, clients(proxied, tasks).await?));
    }
    let tokens = Arc::new(Tokens::new(url).await?);
    let mut series = vec![vec![Series::default(); MODES.len()]; links.len()];
    let len = u64::from(args.rounds) * (MODES.len() * links.len() * 2) as u64;
    let progress = Measurements::new("bench guard", len, json);
    for round in 1..=args.rounds {
        for (l, (link, link_clients)) in links.iter_mut().enumerate() {
            for (m, mode) in MODES.into_iter().enumerate() {
                let base = 1_000_000 * (m as i64 + 1) + 100_000 * l as i64;
                let label = |what: &str| {
                    format!(
                        "round {round}/{}: {}, {}, {what}",
                        args.rounds,
                        link.name(),
                        mode.name()
                    )
                };
                progress.start(label("sequential"));
                let counter = match link {
                    Link::Proxied => proxy.as_ref().map(|(p, _)| p),
                    Link::Direct => None,
                };
                let one = &mut link_clients[0];
                let measured = sequential(one, mode, base, &tokens, counter, args.duration).await?;
                series[l][m].sequential.push(measured);
                progress.start(label(&format!("{tasks} tasks")));
                let (rate, back) = concurrent(
                    std::mem::take(link_clients),
                    mode,
                    base,
                    &tokens,
                    args.duration,
                )
                .await?;
                *link_clients = back;
                series[l][m].concurrent.push(rate);
            }
        }
    }
    if !json {
        println!(
            "bench guard: {} rounds of {:?}, {} tasks; proxied: {:?} of round trip added (medians over rounds; ratios: median [min, max])",
            args.rounds, args.duration, args.tasks, args.latency
        );
        println!(
            "{:<8} {:<13} {:>10} {:>21} {:>7} {:>21} {:>7} {:>8} {:>6} {:>11} {:>21}",
            "link",
            "mode",
            "seq deb/s",
            "ratio",
            "p50 us",
            "p50 ratio",
            "p99 us",
            "+us p50",
            "rt/tx",
            "tasks deb/s",
            "ratio"
        );
    }
    for (l, (link, _)) in links.iter().enumerate() {
        let base = &series[l][0];
        for (m, mode) in MODES.into_iter().enumerate() {
            report(*link, mode, &series[l][m], base, args, json);
        }
    }
    // The connections through the proxy end before it does (it would cut
    // them, and their tasks would log it).
    drop(links);
    if let Some((proxy, pool)) = proxy {
        pool.close();
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(proxy);
    }
    Ok(())
}

/// Prints one line (text or JSON) for `mode` on `link`, against the
/// unguarded series `base` of the same link.
fn report(link: Link, mode: Mode, this: &Series, base: &Series, args: &GuardArgs, json: bool) {
    let seq = |pick: fn(&Sequential) -> f64| {
        median(&this.sequential.iter().map(pick).collect::<Vec<_>>())
    };
    let (rate, p50, p99) = (seq(|s| s.rate), seq(|s| s.p50), seq(|s| s.p99));
    let round_trips = seq(|s| s.round_trips.unwrap_or(f64::NAN));
    let seq_ratios = ratios(
        this.sequential.iter().map(|s| s.rate),
        base.sequential.iter().map(|s| s.rate),
    );
    // Latency: the unguarded p50 over this p50, per round (steadier than
    // the rate on a loaded machine, where a few stalls move the mean).
    let p50_ratios = ratios(
        base.sequential.iter().map(|s| s.p50),
        this.sequential.iter().map(|s| s.p50),
    );
    let added_us = median(
        &this
            .sequential
            .iter()
            .zip(&base.sequential)
            .map(|(s, b)| s.p50 - b.p50)
            .collect::<Vec<_>>(),
    );
    let tasks = median(&this.concurrent);
    let task_ratios = ratios(
        this.concurrent.iter().copied(),
        base.concurrent.iter().copied(),
    );
    if json {
        let spread = |r: &Ratios| json!({"median": round3(r.median), "min": round3(r.min), "max": round3(r.max)});
        println!(
            "{}",
            json!({
                "bench": "guard",
                "link": link.name(),
                "added_rtt_us": if link == Link::Proxied { args.latency.as_micros() } else { 0 },
                "mode": mode.name(),
                "guarded": mode.is_guarded(),
                "rounds": args.rounds,
                "tasks": args.tasks,
                "sequential_debits_per_s": round3(rate),
                "sequential_ratio": spread(&seq_ratios),
                "p50_us": p50,
                "p50_ratio": spread(&p50_ratios),
                "p99_us": p99,
                "p50_added_us": round3(added_us),
                "round_trips_per_debit": if round_trips.is_nan() { serde_json::Value::Null } else { json!(round3(round_trips)) },
                "concurrent_debits_per_s": round3(tasks),
                "concurrent_ratio": spread(&task_ratios),
            })
        );
    } else {
        let rt = if round_trips.is_nan() {
            "-".to_owned()
        } else {
            format!("{round_trips:.2}")
        };
        println!(
            "{:<8} {:<13} {:>10.0} {:>21} {:>7.0} {:>21} {:>7.0} {:>8.0} {:>6} {:>11.0} {:>21}",
            link.name(),
            mode.name(),
            rate,
            seq_ratios.to_string(),
            p50,
            p50_ratios.to_string(),
            p99,
            added_us,
            rt,
            tasks,
            task_ratios.to_string()
        );
    }
}

/// A ratio over rounds: median, min and max of the per-round ratios.
struct Ratios {
    median: f64,
    min: f64,
    max: f64,
}

impl std::fmt::Display for Ratios {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.3} [{:.3}, {:.3}]", self.median, self.min, self.max)
    }
}

/// Each round's `this` over the same round's `base`.
fn ratios(this: impl Iterator<Item = f64>, base: impl Iterator<Item = f64>) -> Ratios {
    let each: Vec<f64> = this.zip(base).map(|(t, b)| t / b).collect();
    Ratios {
        median: median(&each),
        min: each.iter().copied().fold(f64::INFINITY, f64::min),
        max: each.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    }
}

/// A proxy to the server of `url` adding `latency` of round trip (half
/// each way), and a pool of connections through it.
async fn latency_proxy(url: &str, latency: Duration) -> anyhow::Result<(FaultProxy, Pool)> {
    let (config, connector) = leasehold_pg::config(url)?;
    let upstream = upstream(&config).await?;
    let proxy = FaultProxy::start(upstream).context("starting the latency proxy")?;
    proxy.set_latency(Direction::Both, latency / 2);
    // The same settings, the proxy's address: the host name is kept for
    // TLS, `hostaddr` says where to connect.
    let mut through = Config::new();
    if let Some(user) = config.get_user() {
        through.user(user);
    }
    if let Some(password) = config.get_password() {
        through.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        through.dbname(dbname);
    }
    through.ssl_mode(config.get_ssl_mode());
    match config.get_hosts().first() {
        Some(Host::Tcp(host)) => through.host(host),
        _ => through.host("127.0.0.1"),
    };
    through
        .hostaddr(proxy.addr().ip())
        .port(proxy.port())
        .connect_timeout(Duration::from_secs(5));
    let manager = Manager::from_config(
        through,
        connector,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(64)
        .build()
        .context("building the proxied postgresql pool")?;
    Ok((proxy, pool))
}

/// The TCP address of the server `config` names (its first host).
async fn upstream(config: &Config) -> anyhow::Result<SocketAddr> {
    let port = config.get_ports().first().copied().unwrap_or(5432);
    if let Some(ip) = config.get_hostaddrs().first() {
        return Ok(SocketAddr::new(*ip, port));
    }
    let Some(Host::Tcp(host)) = config.get_hosts().first() else {
        anyhow::bail!("the latency proxy needs a TCP host in the database url (or --latency 0)");
    };
    tokio::net::lookup_host((host.as_str(), port))
        .await?
        .next()
        .with_context(|| format!("resolving {host}"))
}

/// `n` connections from `pool`.
async fn clients(pool: &Pool, n: usize) -> anyhow::Result<Vec<Object>> {
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(crate::env::pg_connection(pool).await?);
    }
    Ok(clients)
}

/// One debit of account `id` the `mode` way.
async fn debit(db: &mut Object, mode: Mode, id: i64, tokens: &Tokens) -> anyhow::Result<()> {
    let read = db
        .prepare_cached(if mode == Mode::ForUpdate {
            READ_FOR_UPDATE
        } else {
            READ
        })
        .await?;
    let update = db.prepare_cached(UPDATE).await?;
    if matches!(mode, Mode::Lease | Mode::LeaseRow) {
        let lease = tokens.lease(mode, id).await?;
        let options = GuardOptions::default().check_lease_row(mode == Mode::LeaseRow);
        let outcome = leasehold_pg::guarded_with_options(db, &lease, &options, async |tx| {
            let balance: i64 = tx.query_one(&read, &[&id]).await?.get(0);
            tx.execute(&update, &[&id, &(balance - 1)]).await?;
            Ok::<_, anyhow::Error>(())
        })
        .await?;
        anyhow::ensure!(
            matches!(outcome, Guarded::Committed(())),
            "the bench's guarded debit did not commit: {outcome:?}"
        );
        return Ok(());
    }
    let tx = db.transaction().await?;
    let balance: i64 = if mode.is_guarded() {
        let resource = format!("bench:{}:{id}", mode.name());
        let token = tokens.token(mode);
        // The guard, then the read, sent together: one round trip. The
        // server runs them in order, so the read is made under the
        // guard's row lock; its answer is used only once the guard's is
        // known.
        let (guard, row) = tokio::try_join!(
            leasehold_pg::guard_token(&*tx, &resource, token, &tokens.holder),
            async { Ok::<_, leasehold_pg::Error>(tx.query_one(&read, &[&id]).await?) },
        )?;
        anyhow::ensure!(
            guard.is_accepted(),
            "the bench's guard was refused: {guard:?}"
        );
        row.get(0)
    } else {
        tx.query_one(&read, &[&id]).await?.get(0)
    };
    tx.execute(&update, &[&id, &(balance - 1)]).await?;
    tx.commit().await?;
    Ok(())
}

async fn open(db: &Object, id: i64) -> anyhow::Result<()> {
    db.execute(
        "INSERT INTO bench_accounts (id, balance) VALUES ($1, 1000000000)
         ON CONFLICT (id) DO UPDATE SET balance = 1000000000",
        &[&id],
    )
    .await?;
    Ok(())
}

/// Debits per second, latency p50 / p99 in us, and round trips per debit
/// (counted by `proxy`, when given) of one task.
async fn sequential(
    db: &mut Object,
    mode: Mode,
    id: i64,
    tokens: &Tokens,
    proxy: Option<&FaultProxy>,
    duration: Duration,
) -> anyhow::Result<Sequential> {
    open(db, id).await?;
    // The first debit prepares the statements: not measured.
    debit(db, mode, id, tokens).await?;
    // Up to a minute: a debit through the proxy takes milliseconds.
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let trips = proxy.map(FaultProxy::round_trips);
    let start = Instant::now();
    let mut n: u64 = 0;
    while start.elapsed() < duration {
        let asked = Instant::now();
        debit(db, mode, id, tokens).await?;
        let micros = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
        latency.saturating_record(micros.max(1));
        n += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let round_trips = proxy
        .zip(trips)
        .map(|(proxy, before)| (proxy.round_trips() - before) as f64 / n as f64);
    Ok(Sequential {
        rate: n as f64 / elapsed,
        p50: latency.value_at_quantile(0.5) as f64,
        p99: latency.value_at_quantile(0.99) as f64,
        round_trips,
    })
}

/// Debits per second of every client at once, each on its own account
/// and its own task; gives the clients back.
async fn concurrent(
    clients: Vec<Object>,
    mode: Mode,
    base: i64,
    tokens: &Arc<Tokens>,
    duration: Duration,
) -> anyhow::Result<(f64, Vec<Object>)> {
    let mut set = tokio::task::JoinSet::new();
    let ready = Arc::new(tokio::sync::Barrier::new(clients.len()));
    for (i, mut db) in clients.into_iter().enumerate() {
        let id = base + 1 + i as i64;
        let (tokens, ready) = (Arc::clone(tokens), Arc::clone(&ready));
        set.spawn(async move {
            open(&db, id).await?;
            debit(&mut db, mode, id, &tokens).await?;
            ready.wait().await;
            let start = Instant::now();
            let mut n: u64 = 0;
            while start.elapsed() < duration {
                debit(&mut db, mode, id, &tokens).await?;
                n += 1;
            }
            Ok::<_, anyhow::Error>((n as f64 / start.elapsed().as_secs_f64(), db))
        });
    }
    let (mut total, mut back) = (0.0, Vec::new());
    while let Some(joined) = set.join_next().await {
        let (rate, db) = joined??;
        total += rate;
        back.push(db);
    }
    Ok((total, back))
}
