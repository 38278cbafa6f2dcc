//! Metrics for long runs: the library's metrics (`leasehold` and
//! `leasehold-pg`, feature `metrics`) served as Prometheus text on an
//! address when asked, and always a short human summary for the end of the
//! run.
//!
//! [`install`] sets the process's one global recorder: a fan-out to the
//! Prometheus recorder (only with an address) and to a [`Summary`], which
//! keeps just what its report needs, in bounded memory (counters and one
//! HDR histogram), so a run of any length can keep it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use anyhow::{Context, Result};
use hdrhistogram::Histogram as Hdr;
use leasehold::metrics as lock;
use leasehold_pg::metrics as pg;
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::PrometheusBuilder;
use metrics_util::layers::FanoutBuilder;

/// Installs the global metrics recorder: Prometheus text served over HTTP
/// on `addr` (any path, e.g. `http://ADDR/metrics`) when given, and always
/// the [`Summary`] it returns. Registers the library's metric descriptions.
///
/// Call it once, inside the tokio runtime (the HTTP listener and the
/// Prometheus upkeep run as tasks on it), before the run starts.
///
/// # Errors
/// When `addr` cannot be bound, or a recorder is already installed.
pub(crate) fn install(addr: Option<SocketAddr>) -> Result<Summary> {
    let summary = Summary::default();
    let mut fanout = FanoutBuilder::default().add_recorder(summary.clone());
    if let Some(addr) = addr {
        let (prometheus, exporter) = PrometheusBuilder::new()
            .with_http_listener(addr)
            .build()
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        tokio::spawn(async move {
            if let Err(err) = exporter.await {
                tracing::warn!(%addr, error = ?err, "the metrics endpoint stopped");
            }
        });
        fanout = fanout.add_recorder(prometheus);
    }
    metrics::set_global_recorder(fanout.build())
        .map_err(|_| anyhow::anyhow!("a metrics recorder is already installed"))?;
    lock::describe();
    pg::describe();
    Ok(summary)
}

/// What the end-of-run summary reports, recorded as the run goes. A
/// recorder of its own (only the metrics it reports are kept; the rest are
/// ignored). Cheap to clone: clones share the figures.
#[derive(Clone, Default)]
pub(crate) struct Summary {
    inner: Arc<Figures>,
}

#[derive(Default)]
struct Figures {
    /// Counters by name and labels.
    counters: RwLock<HashMap<Key, Arc<AtomicU64>>>,
    /// Acquires by outcome (the count of the latency histogram's samples).
    acquires: RwLock<HashMap<Key, Arc<Latency>>>,
}

/// Acquire latencies of one outcome: how many, and (in microseconds) their
/// distribution.
struct Latency {
    count: AtomicU64,
    /// Three significant digits, resizing as needed: a few KiB. (`None`
    /// only if the histogram could not be made, which 3 digits cannot.)
    micros: Mutex<Option<Hdr<u64>>>,
}

impl HistogramFn for Latency {
    fn record(&self, seconds: f64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = Duration::try_from_secs_f64(seconds)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        if let Some(hdr) = &mut *self.micros.lock().unwrap_or_else(PoisonError::into_inner) {
            // Auto-resizing: no value is out of range.
            let _ = hdr.record(micros);
        }
    }
}

/// The counters the summary reports.
const COUNTED: [&str; 4] = [
    lock::GIVE_UPS_TOTAL,
    lock::LEASES_LOST_TOTAL,
    lock::RELEASES_TOTAL,
    pg::STALE_WRITES_REFUSED_TOTAL,
];

/// The label `name` of `key`, if it has one.
fn label<'k>(key: &'k Key, name: &str) -> Option<&'k str> {
    key.labels().find(|l| l.key() == name).map(|l| l.value())
}

/// Returns `map`'s entry for `key`, inserting `new()` the first time.
fn entry<T>(map: &RwLock<HashMap<Key, Arc<T>>>, key: &Key, new: impl FnOnce() -> T) -> Arc<T> {
    if let Some(found) = map.read().unwrap_or_else(PoisonError::into_inner).get(key) {
        return found.clone();
    }
    map.write()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(key.clone())
        .or_insert_with(|| Arc::new(new()))
        .clone()
}

impl Recorder for Summary {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        if !COUNTED.contains(&key.name()) {
            return Counter::noop();
        }
        Counter::from_arc(entry(&self.inner.counters, key, AtomicU64::default))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        if key.name() != lock::ACQUIRE_SECONDS {
            return Histogram::noop();
        }
        Histogram::from_arc(entry(&self.inner.acquires, key, || Latency {
            count: AtomicU64::default(),
            micros: Mutex::new(Hdr::new(3).ok()),
        }))
    }
}

impl Summary {
    /// The sum of counter `name` over the keys whose label `label` (if
    /// given) is `value`, grouped by the value of label `by` (if given).
    fn counted(
        &self,
        name: &str,
        only: Option<(&str, &str)>,
        by: Option<&str>,
    ) -> BTreeMap<String, u64> {
        let mut sums = BTreeMap::new();
        let counters = self
            .inner
            .counters
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        for (key, value) in counters.iter().filter(|(k, _)| k.name() == name) {
            if only.is_some_and(|(l, v)| label(key, l) != Some(v)) {
                continue;
            }
            let group = by.and_then(|l| label(key, l)).unwrap_or("").to_owned();
            *sums.entry(group).or_default() += value.load(Ordering::Relaxed);
        }
        sums
    }

    /// The summary, in two lines (no trailing newline):
    ///
    /// ```text
    /// metrics: acquires=120 acquired=100 gave_up=15 error=5 dropped=0 acquire p50=1.2ms p99=35.0ms
    /// metrics: gave up deadline_expired=5 retries_exhausted=10 leases_lost=2 stale_releases=3 stale_writes_refused=4
    /// ```
    ///
    /// The percentiles are those of acquires that got the lease (`-` when
    /// none did); give-ups are listed by reason (`gave up none` when there
    /// were none).
    pub(crate) fn render(&self) -> String {
        let mut by_outcome: BTreeMap<&str, u64> = ["acquired", "gave_up", "error", "dropped"]
            .map(|o| (o, 0))
            .into();
        let mut acquired = Hdr::<u64>::new(3).ok();
        for (key, latency) in self
            .inner
            .acquires
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            let outcome = label(key, lock::LABEL_OUTCOME).unwrap_or("");
            if let Some(n) = by_outcome.get_mut(outcome) {
                *n += latency.count.load(Ordering::Relaxed);
            }
            let micros = latency
                .micros
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if outcome == "acquired"
                && let (Some(all), Some(these)) = (&mut acquired, &*micros)
            {
                let _ = all.add(these);
            }
        }
        let total: u64 = by_outcome.values().sum();
        let quantile = |q: f64| match &acquired {
            Some(h) if !h.is_empty() => millis(h.value_at_quantile(q)),
            _ => "-".to_owned(),
        };
        let mut first = format!("metrics: acquires={total}");
        for outcome in ["acquired", "gave_up", "error", "dropped"] {
            first.push_str(&format!(" {outcome}={}", by_outcome[outcome]));
        }
        first.push_str(&format!(
            " acquire p50={} p99={}",
            quantile(0.5),
            quantile(0.99)
        ));

        let give_ups = self.counted(lock::GIVE_UPS_TOTAL, None, Some(lock::LABEL_REASON));
        let mut second = "metrics: gave up".to_owned();
        if give_ups.values().all(|n| *n == 0) {
            second.push_str(" none");
        }
        for (reason, n) in give_ups.iter().filter(|(_, n)| **n > 0) {
            second.push_str(&format!(" {reason}={n}"));
        }
        let sum = |m: BTreeMap<String, u64>| m.values().sum::<u64>();
        let lost = sum(self.counted(lock::LEASES_LOST_TOTAL, None, None));
        let stale_releases = sum(self.counted(
            lock::RELEASES_TOTAL,
            Some((lock::LABEL_OUTCOME, "not_held")),
            None,
        ));
        let stale_writes = sum(self.counted(pg::STALE_WRITES_REFUSED_TOTAL, None, None));
        second.push_str(&format!(
            " leases_lost={lost} stale_releases={stale_releases} stale_writes_refused={stale_writes}"
        ));
        format!("{first}\n{second}")
    }

    /// Prints [`render`](Self::render) to stderr (stdout stays the run's
    /// own output, JSON included), unless no lease was asked for (`race`).
    pub(crate) fn print(&self) {
        if self.acquires() > 0 {
            eprintln!("{}", self.render());
        }
    }

    /// How many acquires ended, whatever their outcome.
    fn acquires(&self) -> u64 {
        self.inner
            .acquires
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|latency| latency.count.load(Ordering::Relaxed))
            .sum()
    }
}

/// `micros` as milliseconds with one decimal (truncated), as the
/// experiments print latencies: `12.3ms`.
fn millis(micros: u64) -> String {
    format!("{}.{}ms", micros / 1000, (micros % 1000) / 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one test of this binary that installs the global recorder.
    #[tokio::test]
    async fn install_serves_prometheus_text_and_keeps_the_summary() -> anyhow::Result<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = SocketAddr::from(([127, 0, 0, 1], leasehold_testkit::free_port()?));
        let summary = install(Some(addr))?;
        assert!(install(None).is_err(), "a second recorder was installed");
        metrics::counter!(lock::LEASES_LOST_TOTAL, "cause" => "expired").increment(2);
        metrics::counter!(pg::STALE_WRITES_REFUSED_TOTAL, "kind" => "fenced").increment(1);

        let mut conn = tokio::net::TcpStream::connect(addr).await?;
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await?;
        let mut reply = String::new();
        tokio::time::timeout(Duration::from_secs(10), conn.read_to_string(&mut reply)).await??;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(
            reply.contains("leasehold_leases_lost_total{cause=\"expired\"} 2"),
            "{reply}"
        );
        assert!(
            reply.contains("# HELP leasehold_leases_lost_total"),
            "{reply}"
        );
        assert!(
            summary
                .render()
                .ends_with("leases_lost=2 stale_releases=0 stale_writes_refused=1"),
            "{}",
            summary.render()
        );
        Ok(())
    }

    #[test]
    fn an_empty_run_renders_zeros_and_dashes() {
        assert_eq!(
            Summary::default().render(),
            "metrics: acquires=0 acquired=0 gave_up=0 error=0 dropped=0 acquire p50=- p99=-\n\
             metrics: gave up none leases_lost=0 stale_releases=0 stale_writes_refused=0"
        );
    }

    #[test]
    fn the_summary_counts_what_the_libraries_record() {
        let summary = Summary::default();
        metrics::with_local_recorder(&summary, || {
            let acquired = [("mode", "poll"), ("outcome", "acquired")];
            for ms in 1..=100 {
                metrics::histogram!(lock::ACQUIRE_SECONDS, &acquired)
                    .record(Duration::from_millis(ms));
            }
            // Another mode: counted with the rest.
            metrics::histogram!(lock::ACQUIRE_SECONDS, "mode" => "handoff", "outcome" => "acquired")
                .record(Duration::from_millis(1));
            metrics::histogram!(lock::ACQUIRE_SECONDS, "mode" => "poll", "outcome" => "gave_up")
                .record(Duration::from_secs(5));
            metrics::counter!(lock::GIVE_UPS_TOTAL, "mode" => "poll", "reason" => "deadline_expired")
                .increment(1);
            metrics::counter!(lock::GIVE_UPS_TOTAL, "mode" => "handoff", "reason" => "deadline_expired")
                .increment(2);
            metrics::counter!(lock::GIVE_UPS_TOTAL, "mode" => "poll", "reason" => "cancelled")
                .increment(1);
            metrics::counter!(lock::LEASES_LOST_TOTAL, "cause" => "expired").increment(2);
            metrics::counter!(lock::LEASES_LOST_TOTAL, "cause" => "unreachable").increment(1);
            metrics::counter!(lock::RELEASES_TOTAL, "outcome" => "not_held", "trigger" => "release")
                .increment(4);
            metrics::counter!(lock::RELEASES_TOTAL, "outcome" => "released", "trigger" => "release")
                .increment(90);
            metrics::counter!(pg::STALE_WRITES_REFUSED_TOTAL, "kind" => "fenced").increment(5);
            metrics::counter!(pg::STALE_WRITES_REFUSED_TOTAL, "kind" => "guarded").increment(1);
            // Not reported: ignored.
            metrics::counter!(lock::REFRESHES_TOTAL, "by" => "caller", "outcome" => "ok")
                .increment(7);
        });
        assert_eq!(
            summary.render(),
            "metrics: acquires=102 acquired=101 gave_up=1 error=0 dropped=0 acquire p50=50.0ms p99=99.0ms\n\
             metrics: gave up cancelled=1 deadline_expired=3 leases_lost=3 stale_releases=4 stale_writes_refused=6"
        );
    }
}
