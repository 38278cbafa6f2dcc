//! A worker process: the callers of one process, re-invoked by the
//! coordinator as `leasehold chaos worker`, so that a holder pause is a
//! real process pause (SIGSTOP). It reads its spec as one JSON line on
//! stdin (it holds the database URL, which must not show in `ps`),
//! connects, prints `ready`, reads the run's start (microseconds since the
//! Unix epoch) as a second line, and writes its history as JSON lines on
//! stdout.

use std::time::{Duration, SystemTime};

use anyhow::Context;
use leasehold::CancellationToken;
use leasehold_chaos::{Callers, Lock, Recorder, Stall, start_from_micros};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::task::AbortOnDropHandle;

use super::curator::CuratorCallers;
use super::lock_rpc::RpcCallers;
use crate::cli::ChaosMode;
use crate::env::{EtcdAccess, TlsFlags};

/// What a worker prints once connected.
pub(crate) const READY: &[u8] = b"ready\n";

/// What a worker runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Spec {
    pub(crate) worker: u32,
    pub(crate) tasks: u32,
    pub(crate) mode: ChaosMode,
    /// Redis URLs (one, a quorum's, or a cluster's seeds), or for the
    /// etcd modes the members' client endpoints, this worker's first.
    pub(crate) redis_urls: Vec<String>,
    /// The URLs are a Redis Cluster's seed nodes.
    #[serde(default)]
    pub(crate) cluster: bool,
    /// The TLS files for `rediss://` URLs (the user's Redis).
    #[serde(default)]
    pub(crate) tls: TlsFlags,
    /// The TLS files and the user for the user's etcd (the etcd modes on
    /// `--etcd-endpoints`).
    #[serde(default)]
    pub(crate) etcd: EtcdAccess,
    pub(crate) database_url: String,
    pub(crate) resources: Vec<String>,
    pub(crate) ttl_ms: u64,
    pub(crate) wait_ms: u64,
    pub(crate) work_ms: u64,
    pub(crate) watchdog: bool,
    pub(crate) seed: u64,
    /// How long after the start the callers stop.
    pub(crate) duration_ms: u64,
}

/// How long a worker keeps trying to connect its lock before the run
/// starts: on a loaded machine a handshake can take longer than the
/// workers' command timeout, which would otherwise end the whole run.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);

/// The mode's lock, connected. A connect that failed for a reason that may
/// pass (Redis slow or unreachable) is tried again, 50 ms doubling to
/// 500 ms apart, for up to [`CONNECT_PATIENCE`]: the worker has not said
/// it is ready, so the run has not started and nothing is recorded.
async fn connect_lock(spec: &Spec) -> anyhow::Result<Lock> {
    let give_up = std::time::Instant::now() + CONNECT_PATIENCE;
    let mut pause = Duration::from_millis(50);
    loop {
        match spec
            .mode
            .lock(
                &spec.redis_urls,
                spec.cluster,
                &spec.tls.files(),
                &spec.etcd,
                Duration::from_millis(spec.ttl_ms),
            )
            .await
        {
            Err(err) if std::time::Instant::now() < give_up && may_pass(&err) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            connected => return connected,
        }
    }
}

/// Whether a connect error may pass by itself.
fn may_pass(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<leasehold::Error>()
            .is_some_and(leasehold::Error::is_retryable)
            || cause
                .downcast_ref::<leasehold_pg::Error>()
                .is_some_and(leasehold_pg::Error::is_retryable)
            || cause
                .downcast_ref::<redis::RedisError>()
                .is_some_and(|e| e.is_io_error() || e.is_timeout() || e.is_connection_refusal())
    })
}

/// Runs the worker described on stdin until its run ends.
pub(crate) async fn run() -> anyhow::Result<()> {
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let input = stdin
        .next_line()
        .await
        .context("reading the worker spec")?
        .context("no worker spec on stdin")?;
    let spec: Spec = serde_json::from_str(&input).context("parsing the worker spec")?;
    let pool = crate::env::pg_pool(&spec.database_url, spec.tasks as usize)?;
    anyhow::ensure!(
        spec.mode != ChaosMode::EtcdLockRpc || !spec.etcd.is_set(),
        "etcd's Lock RPC control speaks neither tls nor etcd's authentication"
    );
    // etcd's Lock RPC and the Curator-layout lock are not leasehold
    // locks: their callers run apart.
    let lock = if matches!(
        spec.mode,
        ChaosMode::EtcdLockRpc | ChaosMode::ZookeeperCurator
    ) {
        None
    } else {
        Some(connect_lock(&spec).await?)
    };
    // Every connection open before the run starts: a first write that
    // spends the TTL on a connection handshake would show as a double
    // holder the faults did not cause.
    let warm: Vec<_> = futures_util::future::join_all((0..spec.tasks).map(|_| pool.get()))
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .context("connecting to postgresql")?;
    drop(warm);
    let mut stdout = tokio::io::stdout();
    stdout.write_all(READY).await.context("saying ready")?;
    stdout.flush().await.context("saying ready")?;
    let start_us: u64 = stdin
        .next_line()
        .await
        .context("reading the run's start")?
        .context("no start on stdin")?
        .trim()
        .parse()
        .context("parsing the run's start")?;
    // From now on the coordinator may say `pause` (stop this process at the
    // next pause point: a holder between its read and its write) or
    // `unpause` (never mind).
    let stall = Stall::default();
    let commands = {
        let stall = stall.clone();
        async move {
            while let Ok(Some(line)) = stdin.next_line().await {
                match line.trim() {
                    "pause" => stall.arm_process_stop(),
                    "unpause" => stall.disarm(),
                    _ => {}
                }
            }
        }
    };
    let commands = AbortOnDropHandle::new(tokio::spawn(commands));
    let start = start_from_micros(start_us);
    if let Ok(wait) = start.duration_since(SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
    let recorder = Recorder::to_writer(start, std::io::stdout());
    let callers = Callers {
        worker: spec.worker,
        tasks: spec.tasks,
        resources: spec.resources.clone(),
        ttl: Duration::from_millis(spec.ttl_ms),
        wait: Duration::from_millis(spec.wait_ms),
        watchdog: spec.watchdog,
        amounts: 1..=9,
        seed: spec.seed,
        writes_per_lease: spec.mode.writes_per_lease(),
    };
    let stop = CancellationToken::new();
    let end = start + Duration::from_millis(spec.duration_ms);
    let timer = {
        let stop = stop.clone();
        async move {
            // Wall-clock based, so a worker paused past the end stops as
            // soon as it resumes.
            loop {
                let left = end
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO);
                if left.is_zero() {
                    break;
                }
                tokio::time::sleep(left.min(Duration::from_millis(50))).await;
            }
            stop.cancel();
        }
    };
    let (mode, work) = (spec.mode, Duration::from_millis(spec.work_ms));
    let write = async |call: leasehold_chaos::Call<'_>| mode.write(&pool, call, work).await;
    match &lock {
        Some(lock) => {
            tokio::join!(callers.run(lock, &recorder, &stop, &stall, &write), timer);
        }
        None if spec.mode == ChaosMode::ZookeeperCurator => {
            let curator = CuratorCallers {
                worker: spec.worker,
                tasks: spec.tasks,
                resources: spec.resources.clone(),
                ttl: callers.ttl,
                wait: callers.wait,
                work,
                seed: spec.seed,
            };
            tokio::join!(
                curator.run(&spec.redis_urls, &pool, &recorder, &stop, &stall),
                timer
            );
        }
        None => {
            let rpc = RpcCallers {
                worker: spec.worker,
                tasks: spec.tasks,
                resources: spec.resources.clone(),
                ttl: callers.ttl,
                wait: callers.wait,
                work,
                seed: spec.seed,
            };
            let (ran, ()) = tokio::join!(
                rpc.run(&spec.redis_urls, &pool, &recorder, &stop, &stall),
                timer
            );
            ran?;
        }
    }
    drop(commands);
    Ok(())
}
