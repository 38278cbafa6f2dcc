//! The `metrics` feature: what each way of taking a lease records, through
//! a debugging recorder. Enabled for every `cargo test` by the crate's
//! dev-dependency on itself with the feature.
//!
//! Each test runs on its own current-thread runtime inside
//! `metrics::with_local_recorder`, so everything the library records (in
//! spawned tasks too) reaches that test's recorder and no other.

use leasehold::Lessor;
use std::collections::BTreeMap;
use std::time::Duration;

use leasehold::metrics::{
    ACQUIRE_ATTEMPTS, ACQUIRE_SECONDS, ACQUIRE_WAIT_SECONDS, GIVE_UPS_TOTAL, HANDOFF_WAITERS,
    HANDOFFS_TOTAL, LEASES_LOST_TOTAL, REFRESHES_TOTAL, RELEASES_TOTAL, TERM_SECONDS, TERMS_TOTAL,
};
use leasehold::{AcquireOptions, CancellationToken, HandoffLocker, Locker, Quorum, RetryStrategy};
use leasehold_testkit::RedisServer;
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TTL: Duration = Duration::from_secs(5);
/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(10);

type Labels = Vec<(String, String)>;

/// What a recorder has seen so far. Snapshots of the debugging recorder
/// reset counters and gauges and drain histograms, so they are accumulated
/// here.
struct Recorded {
    snapshotter: Snapshotter,
    counters: BTreeMap<(String, Labels), u64>,
    gauges: BTreeMap<(String, Labels), f64>,
    histograms: BTreeMap<(String, Labels), Vec<f64>>,
}

impl Recorded {
    fn new(recorder: &DebuggingRecorder) -> Recorded {
        Recorded {
            snapshotter: recorder.snapshotter(),
            counters: BTreeMap::new(),
            gauges: BTreeMap::new(),
            histograms: BTreeMap::new(),
        }
    }

    fn update(&mut self) {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let mut labels: Labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let id = (key.name().to_owned(), labels);
            match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => {
                    *self.counters.entry(id).or_default() += n;
                }
                (MetricKind::Gauge, DebugValue::Gauge(delta)) => {
                    *self.gauges.entry(id).or_default() += delta.into_inner();
                }
                (MetricKind::Histogram, DebugValue::Histogram(samples)) => {
                    self.histograms
                        .entry(id)
                        .or_default()
                        .extend(samples.into_iter().map(|s| s.into_inner()));
                }
                _ => {}
            }
        }
    }

    /// Whether `labels` has every pair of `wanted`.
    fn matches(labels: &Labels, wanted: &[(&str, &str)]) -> bool {
        wanted
            .iter()
            .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
    }

    /// The sum of the counters `name` with at least the labels `wanted`.
    fn counter(&mut self, name: &str, wanted: &[(&str, &str)]) -> u64 {
        self.update();
        self.counters
            .iter()
            .filter(|((n, l), _)| n == name && Self::matches(l, wanted))
            .map(|(_, v)| v)
            .sum()
    }

    fn gauge(&mut self, name: &str, wanted: &[(&str, &str)]) -> f64 {
        self.update();
        self.gauges
            .iter()
            .filter(|((n, l), _)| n == name && Self::matches(l, wanted))
            .map(|(_, v)| v)
            .sum()
    }

    fn samples(&mut self, name: &str, wanted: &[(&str, &str)]) -> Vec<f64> {
        self.update();
        self.histograms
            .iter()
            .filter(|((n, l), _)| n == name && Self::matches(l, wanted))
            .flat_map(|(_, v)| v.iter().copied())
            .collect()
    }

    /// Every label value recorded so far.
    fn label_values(&mut self) -> Vec<String> {
        self.update();
        let ids = self
            .counters
            .keys()
            .chain(self.gauges.keys())
            .chain(self.histograms.keys());
        ids.flat_map(|(_, labels)| labels.iter().map(|(_, v)| v.clone()))
            .collect()
    }

    /// Waits (bounded) until `condition` holds on what was recorded.
    async fn until(&mut self, mut condition: impl FnMut(&mut Recorded) -> bool) -> TestResult {
        tokio::time::timeout(HUNG, async {
            while !condition(self) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await?;
        Ok(())
    }
}

/// Runs `test` on a current-thread runtime with a fresh debugging recorder
/// as this thread's recorder.
fn with_recorder<F, Fut>(test: F) -> TestResult
where
    F: FnOnce(Recorded) -> Fut,
    Fut: Future<Output = TestResult>,
{
    let recorder = DebuggingRecorder::new();
    let recorded = Recorded::new(&recorder);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    metrics::with_local_recorder(&recorder, || runtime.block_on(test(recorded)))
}

fn once() -> AcquireOptions {
    AcquireOptions::new().retry(RetryStrategy::none())
}

#[test]
fn acquires_are_measured_by_mode_and_outcome_and_give_ups_by_reason() -> TestResult {
    with_recorder(async |mut m| {
        let server = RedisServer::start()?;
        let client = redis::Client::open(server.url())?;
        let locker = Locker::connect(&client).await?;

        let held = locker.acquire("m:busy", TTL).await?;
        assert!(locker.acquire_with("m:busy", TTL, &once()).await.is_err());
        let short = AcquireOptions::new().wait(Duration::from_millis(30));
        assert!(locker.acquire_with("m:busy", TTL, &short).await.is_err());
        let cancel = CancellationToken::new();
        cancel.cancel();
        let cancelled = AcquireOptions::new().cancel(cancel);
        assert!(
            locker
                .acquire_with("m:busy", TTL, &cancelled)
                .await
                .is_err()
        );
        held.release().await?;

        let quorum = Quorum::connect(vec![client.clone()]).await?;
        quorum.acquire("m:quorum", TTL).await?.release().await?;
        let handoff = HandoffLocker::builder()
            .build(locker.clone(), &client)
            .await?;
        handoff.acquire("m:handoff", TTL).await?.release().await?;

        let acquired = [("mode", "poll"), ("outcome", "acquired")];
        assert_eq!(m.samples(ACQUIRE_SECONDS, &acquired).len(), 1);
        // Won on the first attempt: one attempt, no waiting at all.
        assert_eq!(m.samples(ACQUIRE_ATTEMPTS, &acquired), [1.0]);
        assert_eq!(m.samples(ACQUIRE_WAIT_SECONDS, &acquired), [0.0]);
        let gave_up = [("mode", "poll"), ("outcome", "gave_up")];
        assert_eq!(m.samples(ACQUIRE_SECONDS, &gave_up).len(), 3);
        let poll = [("mode", "poll")];
        for reason in ["retries_exhausted", "deadline_expired", "cancelled"] {
            let labels = [poll[0], ("reason", reason)];
            assert_eq!(m.counter(GIVE_UPS_TOTAL, &labels), 1, "{reason}");
        }
        // The deadline give-up waited for the busy lock between attempts;
        // the single try and the cancelled one did not wait at all.
        let mut waits = m.samples(ACQUIRE_WAIT_SECONDS, &gave_up);
        waits.sort_by(f64::total_cmp);
        assert_eq!(waits[..2], [0.0, 0.0]);
        assert!(waits[2] > 0.0, "{waits:?}");
        let mut attempts = m.samples(ACQUIRE_ATTEMPTS, &gave_up);
        attempts.sort_by(f64::total_cmp);
        assert_eq!(
            attempts[..2],
            [0.0, 1.0],
            "cancelled before any attempt, then one try"
        );
        assert!(attempts[2] >= 1.0);

        for mode in ["quorum", "handoff"] {
            let labels = [("mode", mode), ("outcome", "acquired")];
            assert_eq!(m.samples(ACQUIRE_SECONDS, &labels).len(), 1, "{mode}");
            assert_eq!(m.samples(ACQUIRE_ATTEMPTS, &labels), [1.0], "{mode}");
        }
        assert_eq!(
            m.counter(
                RELEASES_TOTAL,
                &[("outcome", "released"), ("trigger", "release")]
            ),
            3
        );
        // No label carries a lock key.
        let values = m.label_values();
        assert!(
            values.iter().all(|v| !v.starts_with("m:")),
            "a key in a label: {values:?}"
        );
        Ok(())
    })
}

#[test]
fn stale_releases_and_lost_leases_are_counted_once() -> TestResult {
    with_recorder(async |mut m| {
        let server = RedisServer::start()?;
        let locker = Locker::connect(&redis::Client::open(server.url())?).await?;

        let stale = locker.acquire("m:stale", TTL).await?;
        server.redis_cli(&["DEL", "m:stale"])?;
        assert!(stale.release().await.is_err());
        assert_eq!(
            m.counter(
                RELEASES_TOTAL,
                &[("outcome", "not_held"), ("trigger", "release")]
            ),
            1
        );

        let lost = locker.acquire("m:lost", TTL).await?;
        lost.refresh(TTL).await?;
        server.redis_cli(&["DEL", "m:lost"])?;
        assert!(lost.refresh(TTL).await.is_err());
        // Already lost: refused without I/O, and not counted again.
        assert!(lost.refresh(TTL).await.is_err());
        assert_eq!(m.counter(LEASES_LOST_TOTAL, &[("cause", "expired")]), 1);
        assert_eq!(
            m.counter(REFRESHES_TOTAL, &[("by", "caller"), ("outcome", "ok")]),
            1
        );
        assert_eq!(
            m.counter(
                REFRESHES_TOTAL,
                &[("by", "caller"), ("outcome", "not_held")]
            ),
            1
        );
        // Dropped, unreleased: given back in the background, found gone.
        drop(lost);
        m.until(|m| {
            m.counter(
                RELEASES_TOTAL,
                &[("outcome", "not_held"), ("trigger", "drop")],
            ) == 1
        })
        .await?;

        // The watchdog refreshes, then finds the lease gone.
        let watched = locker
            .acquire("m:watched", Duration::from_millis(300))
            .await?;
        let signal = watched.watch()?;
        m.until(|m| m.counter(REFRESHES_TOTAL, &[("by", "watchdog"), ("outcome", "ok")]) >= 1)
            .await?;
        server.redis_cli(&["DEL", "m:watched"])?;
        tokio::time::timeout(HUNG, signal.cancelled()).await?;
        assert_eq!(m.counter(LEASES_LOST_TOTAL, &[("cause", "expired")]), 2);
        assert_eq!(
            m.counter(
                REFRESHES_TOTAL,
                &[("by", "watchdog"), ("outcome", "not_held")]
            ),
            1
        );
        Ok(())
    })
}

#[test]
fn handoff_waiters_are_gauged_and_handoffs_counted() -> TestResult {
    with_recorder(async |mut m| {
        let server = RedisServer::start()?;
        let client = redis::Client::open(server.url())?;
        let relaying = HandoffLocker::builder().connect(&client).await?;
        let other = HandoffLocker::builder()
            .relay_limit(0)
            .connect(&client)
            .await?;

        let first = relaying.acquire("m:q", TTL).await?;
        let local = {
            let relaying = relaying.clone();
            tokio::spawn(async move { relaying.acquire("m:q", TTL).await })
        };
        let remote = {
            let other = other.clone();
            tokio::spawn(async move { other.acquire("m:q", TTL).await })
        };
        m.until(|m| {
            m.gauge(HANDOFF_WAITERS, &[("queue", "process")]) == 1.0
                && m.gauge(HANDOFF_WAITERS, &[("queue", "redis")]) == 1.0
        })
        .await?;
        assert_eq!(relaying.queued_in_process("m:q"), 1);

        // The release relays to the local waiter; its release grants the
        // lock to the other locker's waiter in Redis's queue.
        first.release().await?;
        local.await??.release().await?;
        remote.await??.release().await?;
        assert_eq!(m.counter(HANDOFFS_TOTAL, &[("via", "relay")]), 1);
        assert_eq!(m.counter(HANDOFFS_TOTAL, &[("via", "grant")]), 1);
        assert_eq!(m.gauge(HANDOFF_WAITERS, &[("queue", "process")]), 0.0);
        assert_eq!(m.gauge(HANDOFF_WAITERS, &[("queue", "redis")]), 0.0);
        Ok(())
    })
}

#[test]
fn terms_are_counted_and_timed_by_how_they_end() -> TestResult {
    with_recorder(async |mut m| {
        let server = RedisServer::start()?;
        let client = redis::Client::open(server.url())?;
        let election = leasehold::Election::builder(Locker::connect(&client).await?, "m:terms")
            .ttl(TTL)
            .build()?;
        election.campaign().await?.resign().await?;
        let superseded = election.campaign().await?;
        superseded.mark_superseded();
        superseded.resign().await?;
        drop(election.campaign().await?);

        assert_eq!(m.counter(TERMS_TOTAL, &[]), 3);
        for end in ["resigned", "superseded", "dropped"] {
            assert_eq!(m.samples(TERM_SECONDS, &[("end", end)]).len(), 1, "{end}");
        }
        assert_eq!(m.counter(LEASES_LOST_TOTAL, &[("cause", "superseded")]), 1);
        Ok(())
    })
}
