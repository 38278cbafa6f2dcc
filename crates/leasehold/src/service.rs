//! Which lock service an error came from: a leaf that the error type and
//! every way of taking a lease import.

/// The lock service a lease lives on, as an error names it: its
/// messages say which server failed or did not answer ("etcd did not
/// answer refresh within 667ms"), whatever way took the lease.
///
/// The services of this crate are constants; a backend written outside it
/// names its own with [`Service::named`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Service(&'static str);

impl Service {
    /// Redis (or Valkey): polling, hand-off, Redlock, Cluster, Sentinel.
    pub const REDIS: Service = Service("redis");
    /// etcd (`leasehold-etcd`'s `EtcdLocker`).
    pub const ETCD: Service = Service("etcd");

    /// A service by the name its messages should use: lowercase, as a
    /// sentence says it (`"zookeeper"`, `"postgresql"`).
    pub const fn named(name: &'static str) -> Service {
        Service(name)
    }

    /// Its name, as messages say it.
    pub const fn name(self) -> &'static str {
        self.0
    }
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}
