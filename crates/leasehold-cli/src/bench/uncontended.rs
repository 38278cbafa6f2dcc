//! `bench uncontended`: what the library costs when nobody waits.
//!
//! The library's acquire+release pairs per second against the **floor**: the
//! least a client can do for the same two requests, `SET key token NX PX`
//! then `EVALSHA` of the same compare-and-delete script, on one bare redis-rs
//! `MultiplexedConnection` (redis-rs's defaults), with the token taken from a
//! counter (no random draw, no allocation, no deadline of its own). Redis
//! sees exactly two commands per pair from both, so the ratio is the
//! library's client-side overhead. Measured twice: sequentially (one task,
//! one key: bound by the round trip) and throughput-bound (`--tasks`
//! concurrent tasks, each on a key of its own, over one connection: bound by
//! CPU, which the client and the server share). The two run side by side in
//! every round, in alternating order (floor first in even rounds); the
//! rates are medians over rounds, the ratios the medians of the rounds'
//! ratios.

use std::time::Duration;

use hdrhistogram::Histogram;
use leasehold::{Lessor, Locker};
use redis::Value;
use redis::aio::MultiplexedConnection;
use serde_json::json;
use tokio::time::Instant;

use super::{Measurements, median, round3};
use crate::cli::UncontendedArgs;
use crate::env::Env;
use crate::exit::Usage;

const TTL: Duration = Duration::from_secs(10);

/// The same compare-and-delete the library runs (its `release.lua`).
const RELEASE: &str = r#"if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0"#;

/// Pairs per second of each side, one entry per round.
#[derive(Default)]
struct Side {
    library: Vec<f64>,
    floor: Vec<f64>,
}

impl Side {
    fn medians(&self) -> (f64, f64) {
        (median(&self.library), median(&self.floor))
    }

    /// The median of the rounds' ratios (library / floor): each round's
    /// two runs are seconds apart, so a load that comes and goes on a
    /// shared machine moves both, and their ratio less than either.
    fn ratio(&self) -> f64 {
        let ratios: Vec<f64> = self
            .library
            .iter()
            .zip(&self.floor)
            .map(|(library, floor)| library / floor)
            .collect();
        median(&ratios)
    }
}

pub(crate) async fn run(env: &Env, args: &UncontendedArgs, json: bool) -> anyhow::Result<()> {
    let locker = Locker::builder()
        .command_timeout(env.locker.command_timeout())
        .build(env.redis.clone())?;
    let Some(server) = &env.server else {
        return Err(Usage(
            "bench uncontended needs one server's URL (redis:// or rediss://) for its floor loop, not redis+sentinel://".to_owned(),
        )
        .into());
    };
    let floor = server.get_multiplexed_async_connection().await?;
    let mut conn = floor.clone();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(RELEASE)
        .query_async(&mut conn)
        .await?;
    let (mut seq, mut many) = (Side::default(), Side::default());
    let progress = Measurements::new("bench uncontended", u64::from(args.rounds) * 4, json);
    for round in 1..=args.rounds {
        let start = |what: &str| progress.start(format!("round {round}/{}: {what}", args.rounds));
        let floor_first = round % 2 == 0;
        for floor_turn in [floor_first, !floor_first] {
            if floor_turn {
                start("floor, one task");
                seq.floor
                    .push(floor_tasks(&floor, &sha, 1, args.duration).await?);
            } else {
                start("library, one task");
                seq.library
                    .push(library_tasks(&locker, 1, args.duration).await?.per_s);
            }
        }
        for floor_turn in [floor_first, !floor_first] {
            if floor_turn {
                start("floor, many tasks");
                many.floor
                    .push(floor_tasks(&floor, &sha, args.tasks, args.duration).await?);
            } else {
                start("library, many tasks");
                many.library.push(
                    library_tasks(&locker, args.tasks, args.duration)
                        .await?
                        .per_s,
                );
            }
        }
    }
    let (lib, floor) = seq.medians();
    let (many_lib, many_floor) = many.medians();
    let (ratio, many_ratio) = (seq.ratio(), many.ratio());
    if json {
        println!(
            "{}",
            json!({
                "bench": "uncontended",
                "rounds": args.rounds,
                "duration_ms": args.duration.as_secs_f64() * 1e3,
                "library_pairs_per_s": round3(lib),
                "floor_pairs_per_s": round3(floor),
                "overhead_ratio": round3(ratio),
                "tasks": args.tasks,
                "tasks_library_pairs_per_s": round3(many_lib),
                "tasks_floor_pairs_per_s": round3(many_floor),
                "tasks_ratio": round3(many_ratio),
            })
        );
    } else {
        println!(
            "bench uncontended: {} rounds of {:?} (medians)",
            args.rounds, args.duration
        );
        println!("one task, library: {lib:.0} acquire+release pairs/s");
        println!("one task, floor:   {floor:.0} SET NX PX + EVALSHA pairs/s");
        println!("sequential ratio (library / floor, median of rounds): {ratio:.3}");
        println!("{} tasks, library: {many_lib:.0} pairs/s", args.tasks);
        println!("{} tasks, floor:   {many_floor:.0} pairs/s", args.tasks);
        println!("throughput ratio (library / floor, median of rounds): {many_ratio:.3}");
    }
    Ok(())
}

/// `tasks` tasks, each taking and releasing a key of its own through the
/// locker for `duration`: pairs per second, all tasks together.
async fn library_tasks(locker: &Locker, tasks: u32, duration: Duration) -> anyhow::Result<Pairs> {
    let keys = Keys::new("lock:bench:u:lib", TTL);
    lessor_tasks(locker, &keys, tasks, duration, false).await
}

/// The lock keys and TTL of a run of [`lessor_tasks`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keys {
    /// Task `i` takes the key `{prefix}:{i}`.
    prefix: &'static str,
    ttl: Duration,
}

impl Keys {
    pub(crate) const fn new(prefix: &'static str, ttl: Duration) -> Keys {
        Keys { prefix, ttl }
    }

    /// The key task `task` takes.
    pub(crate) fn key(&self, task: u32) -> String {
        format!("{}:{task}", self.prefix)
    }
}

/// What a run of [`lessor_tasks`] did.
pub(crate) struct Pairs {
    /// Acquire+release pairs, all tasks together.
    pub(crate) count: u64,
    /// Acquire+release pairs per second, all tasks together.
    pub(crate) per_s: f64,
    /// Each pair's time, from the acquire's call to the release's return,
    /// in microseconds, when asked for.
    pub(crate) latency: Option<Histogram<u64>>,
}

/// `tasks` tasks, each taking and releasing a key of its own through
/// `lessor` (any way of taking a lease: `bench etcd` runs it on etcd too)
/// for `duration`, each pair timed when `latency` says so (two clock reads
/// and a histogram entry per pair, kept out of the floor comparison).
pub(crate) async fn lessor_tasks<L: Lessor>(
    lessor: &L,
    keys: &Keys,
    tasks: u32,
    duration: Duration,
    latency: bool,
) -> anyhow::Result<Pairs> {
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (lessor, keys) = (lessor.clone(), *keys);
        set.spawn(async move {
            let key = keys.key(task);
            let mut times = latency.then(|| Histogram::<u64>::new(3)).transpose()?;
            let mut pairs: u64 = 0;
            while start.elapsed() < duration {
                let began = latency.then(Instant::now);
                let lease = lessor.acquire(key.as_str(), keys.ttl).await?;
                lease.release().await?;
                if let (Some(times), Some(began)) = (&mut times, began) {
                    let us = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
                    times.record(us.max(1))?;
                }
                pairs += 1;
            }
            Ok::<_, anyhow::Error>((pairs, times))
        });
    }
    let mut total: u64 = 0;
    let mut all = latency.then(|| Histogram::<u64>::new(3)).transpose()?;
    while let Some(joined) = set.join_next().await {
        let (pairs, times) = joined??;
        total += pairs;
        if let (Some(all), Some(times)) = (&mut all, times) {
            all.add(times)?;
        }
    }
    Ok(Pairs {
        count: total,
        per_s: total as f64 / start.elapsed().as_secs_f64(),
        latency: all,
    })
}

/// The floor loop in `tasks` tasks over the one connection `conn`, each on
/// a key of its own, for `duration`: pairs per second, all tasks together.
async fn floor_tasks(
    conn: &MultiplexedConnection,
    sha: &str,
    tasks: u32,
    duration: Duration,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (conn, sha) = (conn.clone(), sha.to_owned());
        set.spawn(async move { floor_pairs(conn, &sha, task, start, duration).await });
    }
    let mut total: u64 = 0;
    while let Some(joined) = set.join_next().await {
        total += joined??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// The floor: two requests per pair and nothing else. The token is the
/// task and a counter in 32 hex digits, written in place.
async fn floor_pairs(
    mut conn: MultiplexedConnection,
    sha: &str,
    task: u32,
    start: Instant,
    duration: Duration,
) -> anyhow::Result<u64> {
    let key = format!("lock:bench:u:floor:{task}");
    let px = u64::try_from(TTL.as_millis())?;
    let mut token = [0u8; 32];
    let mut pairs: u64 = 0;
    while start.elapsed() < duration {
        let value = (u128::from(task) << 64) | u128::from(pairs);
        for (i, digit) in token.iter_mut().enumerate() {
            let nibble = (value >> (4 * (31 - i))) & 0xf;
            *digit = b"0123456789abcdef"[nibble as usize];
        }
        let set: Value = redis::cmd("SET")
            .arg(&key)
            .arg(&token[..])
            .arg("NX")
            .arg("PX")
            .arg(px)
            .query_async(&mut conn)
            .await?;
        anyhow::ensure!(set == Value::Okay, "floor SET NX found {key} busy");
        let deleted: Value = redis::cmd("EVALSHA")
            .arg(sha)
            .arg(1)
            .arg(&key)
            .arg(&token[..])
            .query_async(&mut conn)
            .await?;
        anyhow::ensure!(
            deleted == Value::Int(1),
            "floor release did not delete {key}"
        );
        pairs += 1;
    }
    Ok(pairs)
}
