//! The etcd rows' negative control: etcd's own Lock RPC (`v3lockpb.Lock`,
//! served by every etcd member), used as its documentation shows: a
//! session lease of the TTL kept alive every `ttl / 3`, `Lock(name,
//! lease)` waiting server-side until every earlier waiter's key is gone,
//! a blind read-modify-write, `Unlock(key)`, the lease revoked.
//!
//! Jepsen's etcd 3.4.3 analysis (2020) found that the Lock RPC returns the
//! lock to a waiter whose session lease expired while it waited (its key
//! went with the lease, so a waiter behind it may hold the lock too);
//! etcd 3.5.0 fixed it (PR 11408: the RPC fails with "session expired").
//! Every grant here is followed by a read of the returned key: when it is
//! already gone (or no longer under our lease), the history says so as a
//! [`Kind::Lost`] whose cause is [`EXPIRED_GRANT`], at the holder's
//! release (the caller wrote all the same, as a user of the RPC would).
//! The read is reporting only: it changes nothing the caller does. It
//! counts Jepsen's case (the key gone before the grant) and also a key
//! that went between the grant and the read (a lease that ended just
//! after a rightful grant, in a paused process or under a revoke): an
//! upper bound, which a run on etcd 3.5 (`LEASEHOLD_ETCD`), where the
//! first case is fixed, tells apart.
//!
//! The v3lock messages are not among the vendored protos (the library
//! does not use them): the few fields needed are written here by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use deadpool_postgres::Pool;
use leasehold::CancellationToken;
use leasehold_chaos::{Call, Kind, Recorder, Stall, lock_key};
use leasehold_etcd::client::{EtcdClient, Range};
use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

use crate::cli::ChaosMode;

/// The cause of the [`Kind::Lost`] recorded for a grant whose key was
/// already gone when read right after it: the session's lease had ended
/// (expired or revoked) before the Lock RPC answered, or just after.
pub(crate) const EXPIRED_GRANT: &str = "key_gone_at_grant";

/// The prefix of the control's lock names (each lock's waiters are
/// `PREFIX<lock key>/<lease ID>`), under the lab's revoke prefix.
const NAME_PREFIX: &str = "leasehold-rpc/";

/// How long an unlock, a revoke, a grant or the key's read may take.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);

/// `v3lockpb.LockRequest`: the lock's name and the session's lease.
#[derive(Clone, PartialEq, prost::Message)]
struct LockRequest {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(int64, tag = "2")]
    lease: i64,
}

/// `v3lockpb.LockResponse`, its header left out: the key that holds the
/// lock (the waiter's own key, `name/<lease ID in hex>`).
#[derive(Clone, PartialEq, prost::Message)]
struct LockResponse {
    #[prost(bytes = "vec", tag = "2")]
    key: Vec<u8>,
}

/// `v3lockpb.UnlockRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct UnlockRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
}

/// `v3lockpb.UnlockResponse`, its header left out.
#[derive(Clone, PartialEq, prost::Message)]
struct UnlockResponse {}

/// etcd's Lock service on the cluster's members: one lazily connected
/// channel per member, the first one first; a member that cannot be
/// reached sends the next call to the next one.
pub(crate) struct LockService {
    channels: Vec<Channel>,
    current: AtomicUsize,
}

impl LockService {
    /// The service on `endpoints` (`http://host:port`); dials nothing yet.
    pub(crate) fn new(endpoints: &[String]) -> anyhow::Result<LockService> {
        let channels = endpoints
            .iter()
            .map(|url| {
                Endpoint::from_shared(url.clone())
                    .map(|endpoint| endpoint.connect_timeout(COMMAND_TIMEOUT).connect_lazy())
                    .context("an etcd endpoint that is not a url")
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        anyhow::ensure!(!channels.is_empty(), "no etcd endpoint");
        Ok(LockService {
            channels,
            current: AtomicUsize::new(0),
        })
    }

    async fn call<Req, Resp>(
        &self,
        path: &'static str,
        request: Req,
        timeout: Duration,
    ) -> Result<Resp, tonic::Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let index = self.current.load(Ordering::Relaxed) % self.channels.len();
        let mut grpc = tonic::client::Grpc::new(self.channels[index].clone());
        let mut request = tonic::Request::new(request);
        request.set_timeout(timeout);
        let call = async {
            grpc.ready()
                .await
                .map_err(|_| tonic::Status::unavailable("the member cannot be reached"))?;
            grpc.unary(
                request,
                PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::default(),
            )
            .await
        };
        // A paused member accepts and never answers: the deadline is ours
        // too, with a margin for the server's own.
        let reply = match tokio::time::timeout(timeout + COMMAND_TIMEOUT, call).await {
            Ok(reply) => reply,
            Err(_) => Err(tonic::Status::deadline_exceeded("no answer in time")),
        };
        if let Err(status) = &reply
            && matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::DeadlineExceeded
            )
        {
            let _ = self.current.compare_exchange(
                index,
                index + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        reply.map(tonic::Response::into_inner)
    }

    /// `Lock(name, lease)`, waiting up to `wait`: the key that holds it.
    async fn lock(&self, name: &str, lease: i64, wait: Duration) -> Result<Vec<u8>, tonic::Status> {
        let request = LockRequest {
            name: name.as_bytes().to_vec(),
            lease,
        };
        self.call::<_, LockResponse>("/v3lockpb.Lock/Lock", request, wait)
            .await
            .map(|reply| reply.key)
    }

    /// `Unlock(key)`.
    async fn unlock(&self, key: Vec<u8>) -> Result<(), tonic::Status> {
        self.call::<_, UnlockResponse>(
            "/v3lockpb.Lock/Unlock",
            UnlockRequest { key },
            COMMAND_TIMEOUT,
        )
        .await
        .map(drop)
    }
}

/// What the control's callers of one worker run.
pub(crate) struct RpcCallers {
    pub(crate) worker: u32,
    pub(crate) tasks: u32,
    pub(crate) resources: Vec<String>,
    pub(crate) ttl: Duration,
    pub(crate) wait: Duration,
    pub(crate) work: Duration,
    pub(crate) seed: u64,
}

impl RpcCallers {
    /// Runs the callers until `stop`, each letting the write it is in
    /// finish and unlocking.
    pub(crate) async fn run(
        &self,
        endpoints: &[String],
        pool: &Pool,
        recorder: &Recorder,
        stop: &CancellationToken,
        stall: &Stall,
    ) -> anyhow::Result<()> {
        let service = Arc::new(LockService::new(endpoints)?);
        let client = EtcdClient::builder(endpoints.to_vec())
            .attempt_timeout(COMMAND_TIMEOUT)
            .build()
            .context("an etcd client")?;
        let callers = (0..self.tasks)
            .map(|task| self.caller(task, &service, &client, pool, recorder, stop, stall));
        futures_util::future::join_all(callers).await;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn caller(
        &self,
        task: u32,
        service: &LockService,
        client: &EtcdClient,
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
            let grant = match client
                .grant(self.ttl, Instant::now() + COMMAND_TIMEOUT)
                .await
            {
                Ok(grant) => grant,
                Err(_) => {
                    recorder.record(&actor, failed("unreachable"));
                    pause_after_error(stop).await;
                    continue;
                }
            };
            let keeper = AbortOnDropHandle::new(tokio::spawn(keep_alive(
                client.clone(),
                grant.id,
                self.ttl,
            )));
            let name = format!("{NAME_PREFIX}{key}");
            let locked = tokio::select! {
                () = stop.cancelled() => Err(None),
                locked = service.lock(&name, grant.id, self.wait) => locked.map_err(Some),
            };
            let held = match locked {
                Ok(held) => held,
                Err(status) => {
                    let reason = match status.as_ref().map(tonic::Status::code) {
                        None => "cancelled",
                        Some(tonic::Code::DeadlineExceeded) => "deadline",
                        Some(_) => "error",
                    };
                    recorder.record(&actor, failed(reason));
                    drop(keeper);
                    let _ = client
                        .revoke(grant.id, Instant::now() + COMMAND_TIMEOUT)
                        .await;
                    if reason == "error" {
                        pause_after_error(stop).await;
                    }
                    continue;
                }
            };
            let token: String = format!("{:016x}", grant.id).chars().take(8).collect();
            recorder.record(
                &actor,
                Kind::Acquired {
                    op,
                    key: key.clone(),
                    token: token.clone(),
                    fence: None,
                },
            );
            // Reporting only: is the key the RPC returned there, under our
            // lease? (Unknown when the read fails: not counted.)
            let expired = client
                .range(&Range::key(held.clone()), Instant::now() + COMMAND_TIMEOUT)
                .await
                .is_ok_and(|read| read.kvs.first().is_none_or(|kv| kv.lease != grant.id));
            op += 1;
            let started_us = recorder.now_us();
            let call = Call::new(&actor, resource, amount, None, stall);
            let written = ChaosMode::EtcdLockRpc.write(pool, call, self.work).await;
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
            if expired {
                recorder.record(
                    &actor,
                    Kind::Lost {
                        key: key.clone(),
                        token: token.clone(),
                        cause: EXPIRED_GRANT.to_owned(),
                    },
                );
            }
            let released_at = recorder.now_us();
            let outcome = match service.unlock(held).await {
                Ok(()) if expired => "not_held",
                Ok(()) => "released",
                Err(_) => "error",
            };
            drop(keeper);
            let _ = client
                .revoke(grant.id, Instant::now() + COMMAND_TIMEOUT)
                .await;
            recorder.record_at(
                released_at,
                &actor,
                Kind::Released {
                    key,
                    token,
                    outcome: outcome.to_owned(),
                },
            );
        }
    }
}

/// Keeps lease `id` alive every `ttl / 3` until dropped, as a session
/// does; a failed keep-alive is tried again at the next tick.
async fn keep_alive(client: EtcdClient, id: i64, ttl: Duration) {
    let every = (ttl / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        let _ = client.keep_alive_once(id, Instant::now() + every).await;
    }
}

/// After a failure the lock's contention does not explain: a short pause,
/// so a caller does not spin on a member that is down.
async fn pause_after_error(stop: &CancellationToken) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = tokio::time::sleep(Duration::from_millis(20)) => {}
    }
}

/// How many grants in `events` came after the session had expired.
pub(crate) fn expired_grants(events: &[leasehold_chaos::Event]) -> usize {
    events
        .iter()
        .filter(|event| matches!(&event.kind, Kind::Lost { cause, .. } if cause == EXPIRED_GRANT))
        .count()
}
