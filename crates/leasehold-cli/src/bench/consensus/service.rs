//! The consensus services `bench consensus` takes leases on: a throwaway
//! etcd cluster or ZooKeeper ensemble, a locker on it, and what its
//! members paid their disk ([`Flushes`]).
//!
//! Both services make a write durable before they acknowledge it: etcd
//! fsyncs its write-ahead log (3.4 cannot be told not to), ZooKeeper its
//! transaction log (`forceSync=yes`, its default, which the test kit
//! turns off and the bench turns back on). Each member does so, and a
//! write is acknowledged once a majority has. What they paid is read from
//! each member's own counters, summed over the members: etcd's
//! `etcd_disk_wal_fsync_duration_seconds` histogram (`GET /metrics`),
//! ZooKeeper's `fsynctime` summary (`mntr`: `zk_cnt_fsynctime`, and
//! `zk_sum_fsynctime` in whole milliseconds, each fsync's time cut to the
//! millisecond below). Neither counts the stores' other flushes (etcd's
//! backend commits, batched every 100 ms; ZooKeeper's snapshots).

use std::time::Duration;

use anyhow::Context as _;
use leasehold_etcd::EtcdLocker;
use leasehold_testkit::{EtcdCluster, ZooKeeperEnsemble};
use leasehold_zookeeper::ZkLocker;

use crate::bench::rounds::Figures;
use crate::progress::note;
use crate::waiting::Waiter;

/// ZooKeeper's own default tick (`tickTime`, the test kit's is 200 ms):
/// its servers grant sessions of 4 to 40 s, so the session a bench TTL
/// of 10 s needs.
const ZOOKEEPER_TICK: Duration = Duration::from_secs(2);

/// ZooKeeper's own durability, over the test kit's `forceSync=no`.
pub(super) const ZOOKEEPER_SETTINGS: [&str; 1] = ["forceSync=yes"];

/// A throwaway service of a consensus way.
pub(super) enum Service {
    Etcd(EtcdCluster),
    ZooKeeper {
        ensemble: ZooKeeperEnsemble,
        /// What `mntr` calls it (`3.8.0-...`).
        version: String,
    },
}

impl Service {
    /// Starts an etcd cluster of `members`.
    pub(super) async fn etcd(members: usize) -> anyhow::Result<Service> {
        let cluster = tokio::task::spawn_blocking(move || EtcdCluster::start(members))
            .await
            .context("starting a throwaway etcd cluster")?
            .context("starting a throwaway etcd cluster")?;
        note!(
            "leasehold: started a throwaway etcd {} cluster of {members} at {}",
            cluster.version(),
            cluster.endpoints().join(",")
        );
        Ok(Service::Etcd(cluster))
    }

    /// Starts a ZooKeeper ensemble of `members` (1: a standalone server)
    /// with ZooKeeper's own tick and durability.
    pub(super) async fn zookeeper(members: usize) -> anyhow::Result<Service> {
        let ensemble = tokio::task::spawn_blocking(move || {
            ZooKeeperEnsemble::start_with_settings(members, ZOOKEEPER_TICK, &ZOOKEEPER_SETTINGS)
        })
        .await
        .context("starting a throwaway zookeeper ensemble")?
        .context("starting a throwaway zookeeper ensemble")?;
        let mntr = ensemble.member(0).four_letter_word("mntr")?;
        let version = field(&mntr, "zk_version")
            .unwrap_or("unknown")
            .split([',', ' '])
            .next()
            .unwrap_or("unknown")
            .to_owned();
        note!(
            "leasehold: started a throwaway zookeeper {version} ensemble of {members} at {} ({}, tickTime {:?})",
            ensemble.connect_string(),
            ZOOKEEPER_SETTINGS.join(", "),
            ensemble.tick_time()
        );
        Ok(Service::ZooKeeper { ensemble, version })
    }

    /// The service's version.
    pub(super) fn version(&self) -> &str {
        match self {
            Service::Etcd(cluster) => cluster.version(),
            Service::ZooKeeper { version, .. } => version,
        }
    }

    /// Whether it is an etcd cluster (else a ZooKeeper ensemble).
    pub(super) fn is_etcd(&self) -> bool {
        matches!(self, Service::Etcd(_))
    }

    /// A fresh locker on the service, every request bounded by
    /// `command_timeout`; on ZooKeeper with a session of `ttl` (the
    /// longest TTL it will be asked for: ZooKeeper honours no longer one).
    pub(super) async fn waiter(
        &self,
        command_timeout: Duration,
        ttl: Duration,
    ) -> anyhow::Result<Waiter> {
        match self {
            Service::Etcd(cluster) => {
                let locker = EtcdLocker::builder(cluster.endpoints())
                    .command_timeout(command_timeout)
                    .connect()
                    .await
                    .context("connecting to the etcd cluster")?;
                Ok(Waiter::of(locker))
            }
            Service::ZooKeeper { ensemble, .. } => {
                let locker = ZkLocker::builder()
                    .session_timeout(ttl)
                    .command_timeout(command_timeout)
                    .connect(&ensemble.connect_string())
                    .await
                    .context("connecting to the zookeeper ensemble")?;
                anyhow::ensure!(
                    locker.session_timeout() >= ttl,
                    "zookeeper granted a session of {:?}, shorter than the bench's ttl of {ttl:?}",
                    locker.session_timeout()
                );
                Ok(Waiter::of(locker))
            }
        }
    }

    /// What every member has paid its disk so far, summed. Blocking: a
    /// request to each member.
    pub(super) fn flushes(&self) -> anyhow::Result<Flushes> {
        let mut sum = Flushes::default();
        match self {
            Service::Etcd(cluster) => {
                for member in cluster.members() {
                    let metrics = member.metrics()?;
                    sum.add(
                        etcd_flushes(&metrics).context("no wal fsync figures in etcd's metrics")?,
                    );
                }
            }
            Service::ZooKeeper { ensemble, .. } => {
                for member in ensemble.members() {
                    let mntr = member.four_letter_word("mntr")?;
                    sum.add(
                        zookeeper_flushes(&mntr)
                            .context("no fsynctime figures in zookeeper's mntr")?,
                    );
                }
            }
        }
        Ok(sum)
    }
}

/// The fsyncs of a service's logs, and the time they took, summed over
/// its members.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Flushes {
    count: f64,
    seconds: f64,
}

impl Flushes {
    fn add(&mut self, other: Flushes) {
        self.count += other.count;
        self.seconds += other.seconds;
    }

    /// The figures of the flushes since `before` over `leases` leases:
    /// fsyncs per lease (all members together) and the mean fsync's
    /// milliseconds (NaN with no fsync).
    pub(super) fn per_lease(&self, before: &Flushes, leases: f64) -> Figures {
        let count = self.count - before.count;
        let seconds = self.seconds - before.seconds;
        let mean_ms = if count > 0.0 {
            seconds * 1e3 / count
        } else {
            f64::NAN
        };
        vec![("fsyncs_per_lease", count / leases), ("fsync_ms", mean_ms)]
    }
}

/// The WAL fsyncs in an etcd member's Prometheus metrics.
fn etcd_flushes(metrics: &str) -> Option<Flushes> {
    let value = |name: &str| {
        metrics.lines().find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.trim().parse::<f64>().ok())?
        })
    };
    Some(Flushes {
        count: value("etcd_disk_wal_fsync_duration_seconds_count")?,
        seconds: value("etcd_disk_wal_fsync_duration_seconds_sum")?,
    })
}

/// The transaction log fsyncs in a ZooKeeper member's `mntr`.
fn zookeeper_flushes(mntr: &str) -> Option<Flushes> {
    let value = |name| field(mntr, name)?.parse::<f64>().ok();
    Some(Flushes {
        count: value("zk_cnt_fsynctime")?,
        seconds: value("zk_sum_fsynctime")? / 1e3,
    })
}

/// The value of `name` in a `mntr` answer (`name<TAB>value` lines).
fn field<'a>(mntr: &'a str, name: &str) -> Option<&'a str> {
    mntr.lines().find_map(|line| {
        let (key, value) = line.split_once('\t')?;
        (key == name).then_some(value.trim())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_are_read_from_etcd_metrics_and_zookeeper_mntr() {
        let metrics = "# HELP etcd_disk_wal_fsync_duration_seconds ...\n\
             etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.001\"} 3\n\
             etcd_disk_wal_fsync_duration_seconds_sum 0.25\n\
             etcd_disk_wal_fsync_duration_seconds_count 100\n";
        assert_eq!(
            etcd_flushes(metrics),
            Some(Flushes {
                count: 100.0,
                seconds: 0.25
            })
        );
        assert_eq!(
            etcd_flushes("etcd_disk_wal_fsync_duration_seconds_sum 1\n"),
            None
        );
        let mntr = "zk_version\t3.8.0-debian, built on ...\nzk_avg_fsynctime\t2.5\n\
             zk_cnt_fsynctime\t40\nzk_sum_fsynctime\t100\n";
        assert_eq!(
            zookeeper_flushes(mntr),
            Some(Flushes {
                count: 40.0,
                seconds: 0.1
            })
        );
        assert_eq!(
            field(mntr, "zk_version"),
            Some("3.8.0-debian, built on ...")
        );
        let after = Flushes {
            count: 140.0,
            seconds: 0.35,
        };
        let before = Flushes {
            count: 40.0,
            seconds: 0.1,
        };
        let figures = after.per_lease(&before, 50.0);
        assert_eq!(figures[0], ("fsyncs_per_lease", 2.0));
        assert!((figures[1].1 - 2.5).abs() < 1e-9, "{figures:?}");
        assert!(before.per_lease(&before, 1.0)[1].1.is_nan());
    }
}
