//! A ZooKeeper negative control closer to "Curator's recipe as it is":
//! the `zookeeper-client` crate's own lock, `Client::lock` with
//! `LockPrefix::new_curator(dir, "lock-")`, which follows Curator's
//! `InterProcessMutex` (a protected ephemeral sequential node
//! `_c_<uuid>-lock-<sequence>`, the lowest holds, each waiter watching the
//! one ahead; a create whose answer was lost is found again by its
//! prefix), written in Rust, not Curator itself (a JVM per worker was
//! left out). The lock is held until it is dropped or its session ends;
//! nothing tells the holder when its node goes (a session expired while
//! it was paused, a node deleted by hand), and its write is blind.
//!
//! Each caller keeps its own session, asked as long as the TTL (as the
//! `zookeeper` mode's), and opens a new one once it ended.

use std::time::Duration;

use deadpool_postgres::Pool;
use leasehold::CancellationToken;
use leasehold_chaos::{Call, Kind, Recorder, Stall, lock_key};
use rand::{RngExt, SeedableRng, rngs::StdRng};
use zookeeper_client::{Acls, Client, CreateMode, LockOptions, LockPrefix};

use crate::cli::ChaosMode;

/// How long opening a session may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the control's callers of one worker run.
pub(crate) struct CuratorCallers {
    pub(crate) worker: u32,
    pub(crate) tasks: u32,
    pub(crate) resources: Vec<String>,
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    pub(crate) work: Duration,
    pub(crate) seed: u64,
}

impl CuratorCallers {
    /// Runs the callers on the ensemble `servers` until `stop`, each
    /// letting the write it is in finish and dropping its lock.
    pub(crate) async fn run(
        &self,
        servers: &[String],
        pool: &Pool,
        recorder: &Recorder,
        stop: &CancellationToken,
        stall: &Stall,
    ) {
        let connect = servers.join(",");
        let callers =
            (0..self.tasks).map(|task| self.caller(task, &connect, pool, recorder, stop, stall));
        futures_util::future::join_all(callers).await;
    }

    async fn caller(
        &self,
        task: u32,
        connect: &str,
        pool: &Pool,
        recorder: &Recorder,
        stop: &CancellationToken,
        stall: &Stall,
    ) {
        let actor = format!("w{}.t{task}", self.worker);
        let mut rng = StdRng::seed_from_u64(
            self.seed
                ^ (u64::from(self.worker) << 32 | u64::from(task))
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        let mut session: Option<Client> = None;
        let mut op = 0u64;
        while !stop.is_cancelled() && !self.resources.is_empty() {
            let resource = &self.resources[rng.random_range(0..self.resources.len())];
            let amount = rng.random_range(1..=9);
            let key = lock_key(resource);
            op += 1;
            recorder.record(
                &actor,
                Kind::Acquire {
                    op,
                    key: key.clone(),
                },
            );
            let failed = |reason: &str| Kind::AcquireFailed {
                op,
                key: key.clone(),
                reason: reason.to_owned(),
            };
            if session
                .as_ref()
                .is_none_or(|client| client.state().is_terminated())
            {
                let opened = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    Client::connector()
                        .with_session_timeout(self.ttl)
                        .connect(connect),
                )
                .await;
                match opened {
                    Ok(Ok(client)) => session = Some(client),
                    _ => {
                        recorder.record(&actor, failed("unreachable"));
                        pause_after_error(stop).await;
                        continue;
                    }
                }
            }
            let Some(client) = &session else {
                continue;
            };
            let dir = format!("{}/{key}", leasehold_zookeeper::DEFAULT_ROOT);
            let (Ok(prefix), Ok(options)) = (
                LockPrefix::new_curator(&dir, "lock-"),
                LockOptions::new(Acls::anyone_all())
                    .with_ancestor_options(CreateMode::Container.with_acls(Acls::anyone_all())),
            ) else {
                recorder.record(&actor, failed("error"));
                pause_after_error(stop).await;
                continue;
            };
            let locked = tokio::select! {
                () = stop.cancelled() => Err("cancelled"),
                locked = tokio::time::timeout(self.wait, client.lock(prefix, b"", options)) => {
                    match locked {
                        Ok(Ok(lock)) => Ok(lock),
                        Ok(Err(_)) => Err("error"),
                        Err(_) => Err("deadline"),
                    }
                }
            };
            let lock = match locked {
                Ok(lock) => lock,
                Err(reason) => {
                    recorder.record(&actor, failed(reason));
                    if reason == "error" {
                        pause_after_error(stop).await;
                    }
                    continue;
                }
            };
            // The node's sequence: unique per holder of one lock.
            let path = lock.lock_path();
            let token = path
                .get(path.len().saturating_sub(10)..)
                .unwrap_or(path)
                .to_owned();
            recorder.record(
                &actor,
                Kind::Acquired {
                    op,
                    key: key.clone(),
                    token: token.clone(),
                    fence: None,
                },
            );
            op += 1;
            let started_us = recorder.now_us();
            let call = Call::new(&actor, resource, amount, None, stall);
            let written = ChaosMode::ZookeeperCurator
                .write(pool, call, self.work)
                .await;
            recorder.record(
                &actor,
                Kind::Write {
                    op,
                    started_us,
                    key: key.clone(),
                    resource: resource.clone(),
                    amount,
                    fence: None,
                    outcome: written.outcome,
                    detail: written.detail,
                },
            );
            let released_at = recorder.now_us();
            // Curator's release: the node deleted (here in the
            // background, as the client's lock does when dropped).
            drop(lock);
            recorder.record_at(
                released_at,
                &actor,
                Kind::Released {
                    key,
                    token,
                    outcome: "released".to_owned(),
                },
            );
        }
    }
}

/// After a failure the lock's contention does not explain: a short pause,
/// so a caller does not spin on an ensemble that is down.
async fn pause_after_error(stop: &CancellationToken) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = tokio::time::sleep(Duration::from_millis(20)) => {}
    }
}
