//! The lock modes of the matrix: how a caller takes the lock, and how it
//! writes the wallet. The modes are the values of `--modes`, so
//! [`ChaosMode`] itself is declared with the other flags, in `cli`.

use std::time::Duration;

use anyhow::Context;
use deadpool_postgres::Pool;
use leasehold::tls::TlsFiles;
use leasehold::{HandoffLocker, Locker, Quorum, Sentinel};
use leasehold_chaos::{Call, Fault, Lock, WriteOutcome, Written};
use leasehold_etcd::EtcdLocker;
use leasehold_pg::Outcome;
use leasehold_pg::Snapshot;
use leasehold_pg::tokio_postgres::{Client, GenericClient};
use leasehold_zookeeper::ZkLocker;

use crate::cli::ChaosMode;
use crate::env::EtcdAccess;
use crate::ledger;

/// How long any Redis request of a worker may take.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
/// How long an etcd request of the etcd mode may take: the etcd locker's
/// default, since every etcd write is a raft commit a majority syncs to
/// disk (etcd 3.4 cannot skip the sync), slower than a Redis write.
const ETCD_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a ZooKeeper request of the ZooKeeper modes may take: as etcd's,
/// every lock step is a write a majority commits.
const ZOOKEEPER_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a request of the pg modes' `PgLocker` may take: its default.
const PG_COMMAND_TIMEOUT: Duration = leasehold_pg::DEFAULT_LOCK_COMMAND_TIMEOUT;
/// How often a waiter of the pg modes looks again when no release woke it
/// (a lease that ran out or was deleted wakes no one; through PgBouncer,
/// nothing does): often, as the Redis modes' retries are, so that waiters
/// contend as they do there.
const PG_POLL_EVERY: Duration = Duration::from_millis(25);
/// The cluster client's retry waits, in milliseconds (redis-rs's defaults
/// are 1,280 to 655,360).
const CLUSTER_RETRY_WAIT_MIN_MS: u64 = 1;
const CLUSTER_RETRY_WAIT_MAX_MS: u64 = 50;

/// What a mode is expected to do under a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// No violation in any run.
    Holds,
    /// A negative control: a violation in at least 90% of runs.
    Breaks,
    /// Not a safety claim: violations are reported, not judged.
    MayBreak,
}

impl ChaosMode {
    /// The blind write is the control where the fault makes two holders.
    /// The fenced-only write (`WHERE fence < token`) refuses an older
    /// holder's late write, but not a newer holder's write from a read
    /// taken before the older one wrote: whenever two leases overlap, it
    /// can lose an update (documented in leasehold-pg). Leases overlap
    /// without any injected fault too, when a 100 ms lease expires on a
    /// loaded machine, so it makes no safety claim under any fault: its
    /// rows are reported, not judged.
    pub(crate) fn expect(self, fault: Fault) -> Expect {
        match self {
            ChaosMode::Blind
            | ChaosMode::EtcdLockRpc
            | ChaosMode::ZookeeperBlind
            | ChaosMode::ZookeeperCurator
            | ChaosMode::PgBlind
                if fault.breaks_the_lock() =>
            {
                Expect::Breaks
            }
            ChaosMode::Blind
            | ChaosMode::EtcdLockRpc
            | ChaosMode::ZookeeperBlind
            | ChaosMode::ZookeeperCurator
            | ChaosMode::PgBlind
            | ChaosMode::Fenced => Expect::MayBreak,
            _ => Expect::Holds,
        }
    }

    /// Debits per lease: a term of 20 for the leader mode, one otherwise.
    pub(crate) fn writes_per_lease(self) -> u32 {
        if self == ChaosMode::Leader { 20 } else { 1 }
    }

    /// Whether the mode can run under `fault` at all.
    pub(crate) fn supports(self, fault: Fault) -> bool {
        if self.is_etcd() {
            // No Redis there: the etcd faults, and those that hit a holder
            // or the database.
            return fault.needs_etcd()
                || matches!(
                    fault,
                    Fault::None
                        | Fault::HolderPause
                        | Fault::PostgresPause
                        | Fault::PostgresRestart
                );
        }
        if self.is_zookeeper() {
            // No Redis there either: the ZooKeeper faults, and those that
            // hit a holder or the database.
            return fault.needs_zookeeper()
                || matches!(
                    fault,
                    Fault::None
                        | Fault::HolderPause
                        | Fault::PostgresPause
                        | Fault::PostgresRestart
                );
        }
        if self.is_pg() {
            // No Redis there: the pg faults (PgBouncer's on the mode
            // through it only), and those that hit a holder or the
            // database.
            return (fault.needs_pg()
                && (!fault.needs_pgbouncer() || self == ChaosMode::PgPgbouncer))
                || matches!(
                    fault,
                    Fault::None
                        | Fault::HolderPause
                        | Fault::PostgresPause
                        | Fault::PostgresRestart
                );
        }
        match fault {
            fault if fault.needs_etcd() || fault.needs_zookeeper() || fault.needs_pg() => false,
            // A quorum has no replica to fail over to; a lone replica
            // promoted is one node of three, not a failover.
            Fault::Failover => self != ChaosMode::Quorum,
            // A cluster runs polling and hand-off locks (a quorum of
            // independent servers is another topology).
            fault if fault.needs_cluster() => self != ChaosMode::Quorum,
            // Sentinel runs the polling and hand-off locks on its
            // primary; a quorum is independent servers, and db takes no
            // lock at all, so neither would meet the failover.
            fault if fault.needs_sentinel() => !matches!(self, ChaosMode::Quorum | ChaosMode::Db),
            _ => true,
        }
    }

    /// How many independent Redis servers the mode needs, given the
    /// quorum's size.
    pub(crate) fn nodes(self, quorum: usize) -> usize {
        if self == ChaosMode::Quorum { quorum } else { 1 }
    }

    /// Connects the mode's lock to `urls` (one, or a quorum's), over TLS
    /// with `tls` for a `rediss://` URL (a cluster and Sentinel here are
    /// plain TCP); the etcd mode to its endpoints with `etcd`'s TLS files
    /// and user; the ZooKeeper modes to the ensemble's servers, asking for
    /// a session timeout of `ttl` (the longest TTL a lease may have).
    pub(crate) async fn lock(
        self,
        urls: &[String],
        cluster: bool,
        tls: &TlsFiles,
        etcd: &EtcdAccess,
        ttl: Duration,
    ) -> anyhow::Result<Lock> {
        // Every mode but the blind controls writes with a fencing token.
        let fenced = !matches!(
            self,
            ChaosMode::Blind | ChaosMode::ZookeeperBlind | ChaosMode::PgBlind
        );
        let first = urls.first().context("no redis url")?;
        match self {
            ChaosMode::Pg | ChaosMode::PgBlind | ChaosMode::PgPgbouncer => {
                // The URL is the database's, or PgBouncer's: there
                // LISTEN wakes no one, so waiters only poll.
                let locker = leasehold_pg::PgLocker::builder()
                    .command_timeout(PG_COMMAND_TIMEOUT)
                    .poll_every(PG_POLL_EVERY)
                    .listen(self != ChaosMode::PgPgbouncer)
                    .connect(first)
                    .await?;
                return Ok(Lock::new(locker, fenced));
            }
            ChaosMode::Zookeeper | ChaosMode::ZookeeperBlind => {
                // The servers come rotated per worker: the client starts
                // at another one in each. A session as short as the TTL
                // (the servers grant 2 ticks at least): a holder paused
                // past it loses its node, as one paused past its TTL loses
                // a Redis key.
                let locker = ZkLocker::builder()
                    .session_timeout(ttl)
                    .command_timeout(ZOOKEEPER_COMMAND_TIMEOUT)
                    .connect(&urls.join(","))
                    .await?;
                return Ok(Lock::new(locker, fenced));
            }
            ChaosMode::Etcd => {
                // The endpoints come rotated per worker: each starts at
                // another member, as services spread over a cluster do.
                let mut builder =
                    EtcdLocker::builder(urls.to_vec()).command_timeout(ETCD_COMMAND_TIMEOUT);
                if let Some(files) = etcd.tls_files() {
                    builder = builder.tls(files);
                }
                if let Some(credentials) = etcd.credentials() {
                    builder = builder.credentials(credentials);
                }
                let locker = builder.connect().await?;
                return Ok(Lock::new(locker, true));
            }
            ChaosMode::EtcdLockRpc => {
                anyhow::bail!("etcd's Lock RPC is not a leasehold lock: its callers run apart")
            }
            ChaosMode::ZookeeperCurator => {
                anyhow::bail!(
                    "the Curator-layout lock is not a leasehold lock: its callers run apart"
                )
            }
            _ => {}
        }
        anyhow::ensure!(
            tls.is_empty() || !(cluster || Sentinel::is_sentinel_url(first)),
            "tls files for a redis cluster or sentinel url, which this mode connects to over plain tcp"
        );
        if cluster {
            // Short retry waits, as the Locker docs advise: redis-rs waits
            // at least 1.28 s before retrying a TRYAGAIN by default, which
            // held callers a whole command timeout after a slot migration.
            let mut builder = redis::cluster::ClusterClient::builder(urls.to_vec())
                .connection_timeout(COMMAND_TIMEOUT)
                .response_timeout(COMMAND_TIMEOUT)
                .min_retry_wait(CLUSTER_RETRY_WAIT_MIN_MS)
                .max_retry_wait(CLUSTER_RETRY_WAIT_MAX_MS);
            if self == ChaosMode::Handoff {
                // Hand-off's sharded pub/sub needs RESP3 pushes.
                builder = builder.use_protocol(redis::ProtocolVersion::RESP3);
            }
            let client = builder.build().context("opening the redis cluster")?;
            let conn = client
                .get_async_connection()
                .await
                .context("connecting to the redis cluster")?;
            let locker = Locker::builder()
                .command_timeout(COMMAND_TIMEOUT)
                .build(conn)?;
            return Ok(match self {
                ChaosMode::Db => Lock::none(),
                ChaosMode::Handoff => {
                    let handoff = HandoffLocker::builder().build(locker, &client).await?;
                    Lock::new(handoff, fenced)
                }
                ChaosMode::Quorum => {
                    anyhow::bail!("{} does not run on a redis cluster", self.name())
                }
                _ => Lock::new(locker, fenced),
            });
        }
        if Sentinel::is_sentinel_url(first) {
            // The primary the sentinels name, followed across failovers.
            let sentinel = Sentinel::from_url(first).context("opening redis sentinel")?;
            return Ok(match self {
                ChaosMode::Db => Lock::none(),
                ChaosMode::Quorum => {
                    anyhow::bail!("{} does not run on redis sentinel", self.name())
                }
                ChaosMode::Handoff => {
                    let locker = Locker::builder()
                        .command_timeout(COMMAND_TIMEOUT)
                        .connect(&sentinel)
                        .await?;
                    let handoff = HandoffLocker::builder().build(locker, &sentinel).await?;
                    Lock::new(handoff, fenced)
                }
                _ => {
                    let locker = Locker::builder()
                        .command_timeout(COMMAND_TIMEOUT)
                        .connect(&sentinel)
                        .await?;
                    Lock::new(locker, fenced)
                }
            });
        }
        let client = leasehold::tls::client(first, tls).context("opening redis")?;
        Ok(match self {
            ChaosMode::Db => Lock::none(),
            ChaosMode::Quorum => {
                let clients = urls
                    .iter()
                    .map(|url| leasehold::tls::client(url, tls))
                    .collect::<Result<Vec<_>, _>>()
                    .context("opening redis")?;
                // Each node's connection opened now and reconnecting as a
                // locker's does (Quorum::connect's connect lazily, with
                // other reconnect waits).
                let mut conns = Vec::new();
                for client in &clients {
                    let node = Locker::builder()
                        .command_timeout(COMMAND_TIMEOUT)
                        .connect(client)
                        .await?;
                    conns.push(node.connection().clone());
                }
                let quorum = Quorum::builder()
                    .node_timeout(COMMAND_TIMEOUT)
                    .build(conns)?;
                Lock::new(quorum, fenced)
            }
            ChaosMode::Handoff => {
                let locker = Locker::builder()
                    .command_timeout(COMMAND_TIMEOUT)
                    .connect(&client)
                    .await?;
                let handoff = HandoffLocker::builder().build(locker, &client).await?;
                Lock::new(handoff, fenced)
            }
            _ => {
                let locker = Locker::builder()
                    .command_timeout(COMMAND_TIMEOUT)
                    .connect(&client)
                    .await?;
                Lock::new(locker, fenced)
            }
        })
    }

    /// One debit of `call.amount` on `call.resource`'s wallet, with `work`
    /// between the read and the write.
    pub(crate) async fn write(self, pool: &Pool, call: Call<'_>, work: Duration) -> Written {
        let id = match wallet_id(call.resource) {
            Some(id) => id,
            None => return Written::with_detail(WriteOutcome::Failed, "not a wallet resource"),
        };
        let mut db = match pool.get().await {
            Ok(db) => db,
            Err(_) => {
                return Written::with_detail(WriteOutcome::Failed, "no postgresql connection");
            }
        };
        let client: &mut Client = &mut db;
        match self.debit(client, id, &call, work).await {
            Ok(outcome) => outcome,
            Err(Step::Before(detail)) => Written::with_detail(WriteOutcome::Failed, detail),
            Err(Step::During(detail)) => Written::with_detail(WriteOutcome::Unknown, detail),
        }
    }

    async fn debit(
        self,
        client: &mut Client,
        id: i64,
        call: &Call<'_>,
        work: Duration,
    ) -> Result<Written, Step> {
        let amount = call.amount;
        match self {
            ChaosMode::Db => {
                let tx = client.transaction().await.map_err(before)?;
                let locked = leasehold_pg::lock_for_update(&tx, id)
                    .await
                    .map_err(before)?;
                call.pause_point().await;
                tokio::time::sleep(work).await;
                let outcome = locked.debit(amount).await.map_err(before)?;
                tx.commit().await.map_err(during)?;
                Ok(written(outcome))
            }
            ChaosMode::Guard
            | ChaosMode::Leader
            | ChaosMode::Etcd
            | ChaosMode::Zookeeper
            | ChaosMode::Pg
            | ChaosMode::PgPgbouncer => {
                let lease = call
                    .lease
                    .ok_or_else(|| Step::Before("guard mode takes a lease".into()))?;
                // A lease of PgLocker's lives in this database: the guard
                // checks its row too.
                let options = leasehold_pg::GuardOptions::new().check_lease_row(self.is_pg());
                let tx = client.transaction().await.map_err(before)?;
                if let leasehold_pg::Guard::Refused { .. } =
                    leasehold_pg::guard_with_options(&tx, lease, &options)
                        .await
                        .map_err(before)?
                {
                    return Ok(WriteOutcome::RefusedStale.into());
                }
                let Some(read) = read_then_work(&tx, id, call, work).await? else {
                    return Ok(WriteOutcome::Insufficient.into());
                };
                ledger::debit_unchecked(&tx, &read, amount, None)
                    .await
                    .map_err(|err| Step::Before(crate::cause::describe(&err)))?;
                tx.commit().await.map_err(during)?;
                Ok(WriteOutcome::Accepted.into())
            }
            ChaosMode::Blind
            | ChaosMode::EtcdLockRpc
            | ChaosMode::ZookeeperBlind
            | ChaosMode::ZookeeperCurator
            | ChaosMode::PgBlind => {
                let Some(read) = read_then_work(&*client, id, call, work).await? else {
                    return Ok(WriteOutcome::Insufficient.into());
                };
                ledger::debit_unchecked(&*client, &read, amount, None)
                    .await
                    .map_err(|err| Step::During(crate::cause::describe(&err)))?;
                Ok(WriteOutcome::Accepted.into())
            }
            ChaosMode::Fenced | ChaosMode::Cas | ChaosMode::Handoff | ChaosMode::Quorum => {
                let token = call.fence().ok_or_else(|| {
                    Step::Before("a fenced lease came back without a fence".into())
                })?;
                let Some(read) = read_then_work(&*client, id, call, work).await? else {
                    return Ok(WriteOutcome::Insufficient.into());
                };
                let outcome = if self == ChaosMode::Fenced {
                    leasehold_pg::debit_fenced(&*client, &read, amount, token).await
                } else {
                    leasehold_pg::debit_check_and_set(&*client, &read, amount, token).await
                }
                .map_err(during)?;
                if let (Outcome::StaleToken { fence } | Outcome::StaleRead { fence }, Some(lease)) =
                    (outcome, call.lease)
                {
                    // The documented healing step: if Redis lost fence
                    // increments, raise the counter past what the row has
                    // seen, or every later token is refused too.
                    if let Ok(seen) = leasehold::FencingToken::try_from(fence) {
                        let _ = lease.raise_fence(seen).await;
                    }
                }
                Ok(written(outcome))
            }
        }
    }
}

/// The read half of a read-modify-write: reads wallet `id` and, if it can
/// pay the call's amount, does what separates the read from the write (the
/// call's pause point, then `work`). `None` when the balance is short.
async fn read_then_work<C: GenericClient>(
    db: &C,
    id: i64,
    call: &Call<'_>,
    work: Duration,
) -> Result<Option<Snapshot>, Step> {
    let read = leasehold_pg::read_wallet(db, id).await.map_err(before)?;
    if read.balance() < call.amount {
        return Ok(None);
    }
    call.pause_point().await;
    tokio::time::sleep(work).await;
    Ok(Some(read))
}

/// Where a write failed: before anything could be written, or during the
/// statement or commit that writes (the outcome is then unknown).
enum Step {
    Before(String),
    During(String),
}

fn before(err: impl Into<leasehold_pg::Error>) -> Step {
    Step::Before(describe(err.into()))
}

fn during(err: impl Into<leasehold_pg::Error>) -> Step {
    let err = err.into();
    // Unless the server answered with an error (then nothing committed),
    // the connection failed mid-statement: it may have committed. So may
    // a session the server terminated in place of its answer (a crash,
    // an immediate or fast shutdown, pg_terminate_backend): the commit
    // can be durable before the backend is told to end.
    let unanswered = match &err {
        leasehold_pg::Error::Unreachable(_) => true,
        leasehold_pg::Error::Postgres(err) => err.code().is_none(),
        leasehold_pg::Error::SessionEnded(err) => terminated(err.code()),
        _ => false,
    };
    if unanswered {
        Step::During(describe(err))
    } else {
        Step::Before(describe(err))
    }
}

/// Whether a session ended with this SQLSTATE was terminated (`57P01`
/// admin_shutdown, `57P02` crash_shutdown, `57P04` database_dropped),
/// which can happen after its statement committed; the idle timeouts
/// never interrupt a statement.
fn terminated(code: Option<&str>) -> bool {
    matches!(code, Some("57P01" | "57P02" | "57P04"))
}

fn describe(err: leasehold_pg::Error) -> String {
    crate::cause::describe(&anyhow::Error::new(err))
}

fn written(outcome: Outcome) -> Written {
    match outcome {
        Outcome::Applied { .. } => WriteOutcome::Accepted,
        Outcome::StaleToken { .. } | Outcome::StaleRead { .. } => WriteOutcome::RefusedStale,
        Outcome::InsufficientFunds { .. } => WriteOutcome::Insufficient,
        _ => WriteOutcome::Failed,
    }
    .into()
}

/// The wallet id of resource `wallet:N`.
pub(crate) fn wallet_id(resource: &str) -> Option<i64> {
    resource.strip_prefix("wallet:")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::terminated;

    #[test]
    fn a_terminated_session_leaves_its_commit_unknown_an_idle_timeout_does_not() {
        for code in ["57P01", "57P02", "57P04"] {
            assert!(terminated(Some(code)), "{code}");
        }
        for code in [Some("25P03"), Some("57P05"), Some("23505"), None] {
            assert!(!terminated(code), "{code:?}");
        }
    }
}
