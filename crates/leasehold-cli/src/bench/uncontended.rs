//! `bench uncontended`: what the library costs when nobody waits.
//!
//! On one connection, sequentially: the library's acquire+release pairs per
//! second against a raw `SET key token NX PX` + `EVALSHA release` loop on the
//! same connection; their ratio is the library's overhead. Then the same
//! two, throughput-bound: `--tasks` concurrent tasks, each on its own keys,
//! over the one multiplexed connection.

use std::time::Duration;

use leasehold::Locker;
use serde_json::json;
use tokio::time::Instant;

use super::{Measurements, median, round3};
use crate::cli::UncontendedArgs;
use crate::env::Env;

const TTL: Duration = Duration::from_secs(10);

/// The same compare-and-delete the library runs (its `release.lua`).
const RELEASE: &str = r#"if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0"#;

pub(crate) async fn run(env: &Env, args: &UncontendedArgs, json: bool) -> anyhow::Result<()> {
    let locker = Locker::builder()
        .command_timeout(env.locker.command_timeout())
        .build(env.redis.clone())?;
    let mut conn = env.redis.clone();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(RELEASE)
        .query_async(&mut conn)
        .await?;
    let (mut lib, mut raw, mut many, mut raw_many) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let progress = Measurements::new("bench uncontended", u64::from(args.rounds) * 4, json);
    for round in 1..=args.rounds {
        let start = |what: &str| progress.start(format!("round {round}/{}: {what}", args.rounds));
        start("library, one connection");
        lib.push(library_loop(&locker, "lock:bench:u:lib", args.duration).await?);
        start("raw loop, one connection");
        raw.push(raw_loop(env, &sha, "lock:bench:u:raw", args.duration).await?);
        start("library, many keys");
        many.push(many_tasks(&locker, args.tasks, args.duration).await?);
        start("raw loop, many keys");
        raw_many.push(raw_many_tasks(env, &sha, args.tasks, args.duration).await?);
    }
    let (lib, raw, many, raw_many) = (median(&lib), median(&raw), median(&many), median(&raw_many));
    let ratio = lib / raw;
    let many_ratio = many / raw_many;
    if json {
        println!(
            "{}",
            json!({
                "bench": "uncontended",
                "rounds": args.rounds,
                "duration_ms": args.duration.as_secs_f64() * 1e3,
                "library_pairs_per_s": round3(lib),
                "raw_pairs_per_s": round3(raw),
                "overhead_ratio": round3(ratio),
                "tasks": args.tasks,
                "many_keys_pairs_per_s": round3(many),
                "raw_many_keys_pairs_per_s": round3(raw_many),
                "many_keys_ratio": round3(many_ratio),
            })
        );
    } else {
        println!(
            "bench uncontended: {} rounds of {:?} (medians)",
            args.rounds, args.duration
        );
        println!("one connection, library:   {lib:.0} acquire+release pairs/s");
        println!("one connection, raw loop:  {raw:.0} SET NX PX + EVALSHA pairs/s");
        println!("overhead ratio (library / raw): {ratio:.3}");
        println!(
            "{} tasks over many keys, library: {many:.0} pairs/s",
            args.tasks
        );
        println!(
            "{} tasks over many keys, raw loop: {raw_many:.0} pairs/s",
            args.tasks
        );
        println!("throughput ratio (library / raw): {many_ratio:.3}");
    }
    Ok(())
}

async fn library_loop(locker: &Locker, key: &str, duration: Duration) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut pairs: u64 = 0;
    while start.elapsed() < duration {
        let lease = locker.acquire(key, TTL).await?;
        lease.release().await?;
        pairs += 1;
    }
    Ok(pairs as f64 / start.elapsed().as_secs_f64())
}

async fn raw_loop(env: &Env, sha: &str, key: &str, duration: Duration) -> anyhow::Result<f64> {
    let start = Instant::now();
    let pairs = raw_pairs(
        env.redis.clone(),
        sha,
        key.to_owned(),
        start,
        duration,
        None,
    )
    .await?;
    Ok(pairs as f64 / start.elapsed().as_secs_f64())
}

/// The raw two-request loop until `duration` after `start`; with `task`,
/// on that task's 16 keys in turn.
async fn raw_pairs(
    mut conn: leasehold::Connection,
    sha: &str,
    key: String,
    start: Instant,
    duration: Duration,
    task: Option<u32>,
) -> anyhow::Result<u64> {
    let px = u64::try_from(TTL.as_millis())?;
    let mut pairs: u64 = 0;
    while start.elapsed() < duration {
        let this = match task {
            Some(task) => format!("{key}:{task}:{}", pairs % 16),
            None => key.clone(),
        };
        let key = &this;
        // A token per pair, as the library draws one.
        let token = format!("{:032x}", rand::random::<u128>());
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(px)
            .query_async(&mut conn)
            .await?;
        anyhow::ensure!(set.is_some(), "raw SET NX found {key} busy");
        let deleted: i64 = redis::cmd("EVALSHA")
            .arg(sha)
            .arg(1)
            .arg(key)
            .arg(&token)
            .query_async(&mut conn)
            .await?;
        anyhow::ensure!(deleted == 1, "raw release did not delete {key}");
        pairs += 1;
    }
    Ok(pairs)
}

async fn raw_many_tasks(
    env: &Env,
    sha: &str,
    tasks: u32,
    duration: Duration,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (conn, sha) = (env.redis.clone(), sha.to_owned());
        set.spawn(async move {
            raw_pairs(
                conn,
                &sha,
                "lock:bench:u:rawmany".to_owned(),
                start,
                duration,
                Some(task),
            )
            .await
        });
    }
    let mut total: u64 = 0;
    while let Some(joined) = set.join_next().await {
        total += joined??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

async fn many_tasks(locker: &Locker, tasks: u32, duration: Duration) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let locker = locker.clone();
        set.spawn(async move {
            let mut pairs: u64 = 0;
            while start.elapsed() < duration {
                let key = format!("lock:bench:u:many:{task}:{}", pairs % 16);
                let lease = locker.acquire(&key, TTL).await?;
                lease.release().await?;
                pairs += 1;
            }
            Ok::<u64, leasehold::Error>(pairs)
        });
    }
    let mut total: u64 = 0;
    while let Some(joined) = set.join_next().await {
        total += joined??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}
