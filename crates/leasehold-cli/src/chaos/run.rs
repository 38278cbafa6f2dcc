//! One run of the matrix: a lab, the worker processes, the nemesis, and
//! the final state of every wallet.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use deadpool_postgres::Pool;
use leasehold_chaos::{
    Event, Fault, Kind, Lab, LabError, LabOptions, Recorder, RunReport, Stall, lock_key,
    run_nemesis, schedule, start_to_micros,
};
use leasehold_testkit::PostgresServer;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::task::AbortOnDropHandle;

use super::etcd::EtcdTarget;
use super::modes::Expect;
use super::worker::Spec;
use crate::child;
use crate::cli::ChaosMode;
use crate::env::{EtcdAccess, TlsFlags};

/// The settings every run of one invocation shares.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) duration: Duration,
    pub(crate) workers: u32,
    pub(crate) tasks: u32,
    pub(crate) wallets: u32,
    pub(crate) initial: i64,
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    pub(crate) work: Duration,
    pub(crate) watchdog: bool,
    /// The quorum mode's number of Redis servers (3 or 5).
    pub(crate) quorum_nodes: usize,
    /// The user's Redis, instead of a throwaway one.
    pub(crate) redis_url: Option<String>,
    /// The user's Redis Cluster's seed URLs, instead of a throwaway Redis.
    pub(crate) cluster_urls: Vec<String>,
    /// The TLS files for a `rediss://` [`redis_url`](Self::redis_url)
    /// (none otherwise): the lab's own connection and the workers' use
    /// them.
    pub(crate) tls: TlsFlags,
    /// The fault proxy in front of [`redis_url`](Self::redis_url).
    pub(crate) proxy: Proxy,
    /// The user's etcd cluster, for the etcd modes, instead of a
    /// throwaway one.
    pub(crate) etcd: Option<EtcdTarget>,
}

/// The fault proxy's settings in front of the user's Redis.
#[derive(Debug, Clone, Default)]
pub(crate) struct Proxy {
    /// No proxy: the workers connect to the user's Redis directly.
    pub(crate) off: bool,
    /// The port it listens on (on `127.0.0.1`), instead of a free one.
    pub(crate) port: Option<u16>,
    /// The host name the workers dial for it, instead of `127.0.0.1`.
    pub(crate) host: Option<String>,
}

impl Plan {
    /// The wallets every run debits, each with its initial balance.
    pub(crate) fn resources(&self) -> Vec<(String, i64)> {
        (1..=self.wallets)
            .map(|id| (format!("wallet:{id}"), self.initial))
            .collect()
    }

    /// The lab's options for the servers given by URL (none: throwaway
    /// ones), before what a mode and a fault add.
    pub(crate) fn lab_options(&self) -> LabOptions {
        let mut options = LabOptions::default();
        if let Some(url) = &self.redis_url {
            options = options.redis_url(url.clone()).proxy(!self.proxy.off);
            if self.tls.is_set() {
                options = options.tls(self.tls.files());
            }
            if let Some(port) = self.proxy.port {
                options = options.proxy_port(port);
            }
            if let Some(host) = &self.proxy.host {
                options = options.proxy_host(host.clone());
            }
        }
        if !self.cluster_urls.is_empty() {
            options = options.cluster_urls(self.cluster_urls.clone());
        }
        options
    }
}

/// How long a worker may take to start and connect.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// From telling the workers to start to the run's start.
const START_MARGIN: Duration = Duration::from_millis(20);

/// How long a worker may outlive its run before it is killed.
const GRACE: Duration = Duration::from_secs(20);

/// Runs `mode` under `fault` once with `seed`.
pub(crate) async fn run_one(
    plan: &Plan,
    mode: ChaosMode,
    fault: Fault,
    seed: u64,
    postgres: &Arc<PostgresServer>,
    pool: &Pool,
) -> anyhow::Result<RunReport> {
    let servers = match &plan.etcd {
        Some(target) if mode.is_etcd() => target.lab_options(),
        _ => plan.lab_options(),
    };
    let options = servers
        .for_fault(fault)
        .etcd(mode.is_etcd())
        .zookeeper(mode.is_zookeeper())
        .pg(mode.is_pg())
        .pgbouncer(mode == ChaosMode::PgPgbouncer)
        .nodes(mode.nodes(plan.quorum_nodes))
        .postgres(postgres.clone());
    let resources = plan.resources();
    let keys: Vec<String> = resources.iter().map(|(r, _)| lock_key(r)).collect();
    // A fault this lab cannot inject (a clock fault on a server
    // libfaketime cannot drive) is LabError::Unsupported here, before any
    // worker starts: the matrix reports the cell as such.
    let lab = tokio::task::spawn_blocking({
        let keys = keys.clone();
        move || {
            let lab = Lab::start(&options)?;
            lab.check_fault(fault, &keys)?;
            Ok::<_, LabError>(lab)
        }
    })
    .await
    .context("starting the lab")??;
    reset(pool, &resources).await?;

    let header = Kind::Run {
        mode: mode.name().to_owned(),
        fault: fault.name().to_owned(),
        seed,
        ttl_ms: u64::try_from(plan.ttl.as_millis()).unwrap_or(u64::MAX),
        control: mode.expect(fault) == Expect::Breaks,
        reported_only: mode.expect(fault) == Expect::MayBreak,
        initial: resources.clone(),
    };
    let cluster = lab.is_cluster();
    let etcd = lab.is_etcd();
    // The servers of an etcd cluster or a ZooKeeper ensemble, each worker
    // starting at another.
    let members = etcd || lab.is_zookeeper();
    // The pg modes take their leases where they write: the database, or
    // the PgBouncer in front of it.
    let database_url = lab
        .pgbouncer_url()
        .or_else(|| lab.postgres_url())
        .context("the lab has no postgresql")?;
    let urls = if mode.is_pg() {
        vec![database_url.clone()]
    } else if mode.nodes(plan.quorum_nodes) > 1 || cluster || members {
        lab.node_urls()
    } else {
        vec![lab.redis_url()]
    };
    let mut workers = Vec::new();
    for worker in 0..plan.workers {
        let mut redis_urls = urls.clone();
        if members && !redis_urls.is_empty() {
            // Each worker starts at another member, as the services of one
            // cluster spread over its members.
            let first = worker as usize % redis_urls.len();
            redis_urls.rotate_left(first);
        }
        let spec = Spec {
            worker,
            tasks: plan.tasks,
            mode,
            redis_urls,
            cluster,
            tls: plan.tls.clone(),
            etcd: match &plan.etcd {
                Some(target) if mode.is_etcd() => target.access.clone(),
                _ => EtcdAccess::default(),
            },
            database_url: database_url.clone(),
            resources: resources.iter().map(|(r, _)| r.clone()).collect(),
            ttl_ms: millis(plan.ttl),
            wait_ms: millis(plan.wait),
            work_ms: millis(plan.work),
            // A leader keeps its term under the watchdog (an Election
            // always does): a term outlasts one TTL.
            watchdog: plan.watchdog || mode == ChaosMode::Leader,
            seed: seed ^ u64::from(worker).wrapping_mul(0x2545_f491_4f6c_dd1d),
            duration_ms: millis(plan.duration),
        };
        workers.push(spawn_worker(&spec).await?);
    }
    lab.set_workers(workers.iter().filter_map(|w| w.child.id()).collect());
    for (index, worker) in workers.iter_mut().enumerate() {
        let ready = tokio::time::timeout(READY_TIMEOUT, &mut worker.ready).await;
        if !matches!(ready, Ok(Ok(()))) {
            let _ = worker.child.kill().await;
            let stderr = (&mut worker.stderr).await.unwrap_or_default();
            anyhow::bail!("worker {index} did not get ready: {stderr}");
        }
    }
    // Every worker is connected: the run starts now, for all at once.
    let start = SystemTime::now() + START_MARGIN;
    let t0 = Instant::now() + START_MARGIN;
    let recorder = Recorder::in_memory(start);
    recorder.record_at(0, "coordinator", header);
    recorder.record_at(
        0,
        "coordinator",
        Kind::Budget {
            wait_ms: millis(plan.wait),
        },
    );
    // Where faults marked from outside go (`--fault-marks`).
    recorder.record_at(0, "coordinator", leasehold_chaos::marks::wall_clock(start));
    let mut stdins = Vec::new();
    for worker in &mut workers {
        if let Some(mut stdin) = worker.stdin.take() {
            stdin
                .write_all(format!("{}\n", start_to_micros(start)).as_bytes())
                .await
                .context("telling a worker the run's start")?;
            stdins.push(stdin);
        }
    }
    // The nemesis's holder pauses, passed on to the workers' stdin.
    let (pauses, mut pause_rx) = tokio::sync::mpsc::unbounded_channel::<(u32, bool)>();
    // Until the run ends: then the workers' stdin closes, which their
    // command readers need to finish.
    let run_end = tokio::time::Instant::from_std(t0 + plan.duration);
    let _relay = AbortOnDropHandle::new(tokio::spawn(async move {
        while let Ok(Some((worker, arm))) = tokio::time::timeout_at(run_end, pause_rx.recv()).await
        {
            if let Some(stdin) = usize::try_from(worker).ok().and_then(|w| stdins.get_mut(w)) {
                let line: &[u8] = if arm { b"pause\n" } else { b"unpause\n" };
                // A worker that is gone has nothing left to pause.
                let _ = stdin.write_all(line).await;
            }
        }
    }));
    lab.set_pauser(Arc::new(move |worker, arm| {
        let _ = pauses.send((worker, arm));
    }));

    let windows = schedule(fault, seed, plan.duration, plan.ttl, plan.workers);
    let stopped = Arc::new(AtomicBool::new(false));
    let nemesis = Nemesis {
        thread: Some({
            let (lab, recorder, stopped) = (lab.clone(), recorder.clone(), stopped.clone());
            std::thread::spawn(move || {
                run_nemesis(
                    &lab,
                    &windows,
                    &keys,
                    &recorder,
                    &Stall::default(),
                    t0,
                    &stopped,
                )
            })
        }),
        stop: stopped,
    };

    let deadline = tokio::time::Instant::from_std(t0 + plan.duration + GRACE);
    let mut failures = Vec::new();
    for (index, mut worker) in workers.into_iter().enumerate() {
        let failed = match tokio::time::timeout_at(deadline, worker.child.wait()).await {
            Ok(Ok(status)) if status.success() => None,
            Ok(Ok(status)) => Some(format!("worker {index} exited with {status}")),
            Ok(Err(err)) => Some(format!("worker {index}: {err}")),
            Err(_) => {
                lab.heal();
                let _ = worker.child.kill().await;
                Some(format!(
                    "worker {index} did not stop within {GRACE:?} of the run's end"
                ))
            }
        };
        let history = (&mut worker.history).await.unwrap_or_default();
        for event in history {
            recorder.record_at(event.at_us, &event.actor, event.kind);
        }
        let stderr = (&mut worker.stderr).await.unwrap_or_default();
        if let Some(failed) = failed {
            failures.push(format!("{failed}: {stderr}"));
        }
    }
    match nemesis.finish().await {
        Some(Ok(())) => {}
        Some(Err(err)) => anyhow::bail!(
            "the nemesis failed ({}): {}",
            crate::cause::chain(&anyhow::Error::new(err)),
            lab.logs()
        ),
        None => anyhow::bail!("the nemesis panicked"),
    }
    anyhow::ensure!(failures.is_empty(), "{}", failures.join("; "));

    let db = crate::env::pg_connection(pool).await?;
    for (resource, _) in &resources {
        let id = super::modes::wallet_id(resource).context("a wallet resource")?;
        let audit = leasehold_pg::audit(&**db, id).await?;
        recorder.record(
            "checker",
            Kind::Final {
                resource: resource.clone(),
                balance: audit.balance,
                ledger_sum: audit.ledger_sum,
                ledger_rows: audit.ledger_count,
            },
        );
    }
    Ok(RunReport::new(recorder.take()))
}

/// The nemesis's thread, stopped and joined when dropped. It holds a clone
/// of the lab, so a run dropped mid-way (on Ctrl-C or SIGTERM) must not
/// leave it running: the lab's servers (and the shared PostgreSQL) would
/// outlive the process, reparented to init. Stopping ends the fault in
/// progress and heals the lab first (see [`run_nemesis`]).
struct Nemesis {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<(), LabError>>>,
}

impl Nemesis {
    /// Stops the nemesis and waits for it; `None` if it panicked.
    async fn finish(mut self) -> Option<Result<(), LabError>> {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take()?;
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .ok()
            .and_then(Result::ok)
    }
}

impl Drop for Nemesis {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            // Blocks for as long as the fault in progress takes to end (a
            // restart: a second or so); the run is being torn down anyway.
            let _ = thread.join();
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Resets every wallet and its fence guard row.
async fn reset(pool: &Pool, resources: &[(String, i64)]) -> anyhow::Result<()> {
    let db = crate::env::pg_connection(pool).await?;
    for (resource, initial) in resources {
        let id = super::modes::wallet_id(resource).context("a wallet resource")?;
        leasehold_pg::reset_wallet(&**db, id, *initial).await?;
        // The Redis row, the etcd way's own (see the etcd locker's docs,
        // "Fencing tokens") and the ZooKeeper way's (its czxid, `zk:`).
        db.execute(
            "DELETE FROM leasehold_fences WHERE resource IN ($1, $2, $3)",
            &[
                &format!("fence:{{{resource}}}"),
                &format!("etcd:fence:{{{resource}}}"),
                &format!("zk:fence:{{{resource}}}"),
            ],
        )
        .await
        .map_err(leasehold_pg::Error::from)
        .context("resetting the fence guard")?;
    }
    Ok(())
}

/// A worker process and the tasks reading its output.
struct Worker {
    child: tokio::process::Child,
    /// Where the run's start goes, once every worker is ready.
    stdin: Option<tokio::process::ChildStdin>,
    /// Fires when the worker says it is connected.
    ready: tokio::sync::oneshot::Receiver<()>,
    /// The worker's history, once its stdout closes.
    history: tokio::task::JoinHandle<Vec<Event>>,
    /// The last lines of its stderr, once it closes.
    stderr: tokio::task::JoinHandle<String>,
}

/// Starts one worker process and hands it its spec on stdin.
async fn spawn_worker(spec: &Spec) -> anyhow::Result<Worker> {
    let child = child::spawn(&["chaos", "worker"], "worker", spec).await?;
    let stdout = child.stdout;
    let (said_ready, ready) = tokio::sync::oneshot::channel();
    let history = tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        let mut said_ready = Some(said_ready);
        let mut events = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.as_bytes() == super::worker::READY.trim_ascii_end() {
                if let Some(said) = said_ready.take() {
                    let _ = said.send(());
                }
            } else if let Ok(event) = serde_json::from_str::<Event>(&line) {
                events.push(event);
            }
        }
        events
    });
    Ok(Worker {
        child: child.process,
        stdin: Some(child.stdin),
        ready,
        history,
        stderr: child.stderr,
    })
}
