//! Why a lab could not start or a fault could not be injected: [`LabError`],
//! and the helpers that wrap a server's or Redis's error in it.

use std::time::Duration;

use crate::fault::Fault;

/// Why a lab could not start or a fault could not be injected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    /// A throwaway server failed (its log is in the source).
    #[error("{what} failed")]
    Server {
        /// What was being done.
        what: String,
        /// The testkit's error.
        #[source]
        source: leasehold_testkit::Error,
    },
    /// Options that do not go together, or a fault the lab cannot inject
    /// the way it was asked.
    #[error("{0}")]
    Options(&'static str),
    /// The Redis URL given to [`LabOptions::redis_url`] cannot be used
    /// (the URL itself is not shown: it may hold a password).
    ///
    /// [`LabOptions::redis_url`]: super::LabOptions::redis_url
    #[error("the redis url cannot be used: {0}")]
    RedisUrl(&'static str),
    /// A command to the Redis server given by URL failed.
    #[error("{what} failed on the redis at the given url")]
    External {
        /// What was being done.
        what: String,
        /// redis-rs's error.
        #[source]
        source: redis::RedisError,
    },
    /// A statement of the pg lab's own connection to its PostgreSQL
    /// failed (a fault's statement, or its setup).
    #[error("{what} failed on the lab's postgresql")]
    Postgres {
        /// What was being done.
        what: String,
        /// leasehold-pg's error.
        #[source]
        source: leasehold_pg::Error,
    },
    /// The fault needs a server this lab does not have.
    #[error("fault {fault} needs {needs}, which this lab does not have")]
    Unsupported {
        /// The fault.
        fault: Fault,
        /// What it needs.
        needs: &'static str,
    },
    /// The user of the Redis given by URL may not run a command the fault
    /// needs ([`Fault::needs_commands`]; `NOPERM`), found before the run
    /// injects anything. Grant it (`+` the command, see
    /// [`HARNESS_ACL_RULES`](crate::HARNESS_ACL_RULES)) or pick another
    /// fault.
    #[error(
        "fault {fault} needs the redis command `{command}`, which the given url's user may not run (add +{command} to its acl)"
    )]
    Permission {
        /// The fault.
        fault: Fault,
        /// The command, as its ACL name (`script|flush`).
        command: &'static str,
    },
    /// The port given to [`LabOptions::proxy_port`] cannot be bound on
    /// `127.0.0.1` (it is taken, or needs privileges).
    ///
    /// [`LabOptions::proxy_port`]: super::LabOptions::proxy_port
    #[error("the fault proxy cannot listen on 127.0.0.1:{port}")]
    ProxyPort {
        /// The port asked for.
        port: u16,
        /// Why binding it failed.
        #[source]
        source: std::io::Error,
    },
    /// The TLS files of [`LabOptions::tls`] (or the URL they go with)
    /// cannot be used: the library's error says which file and why (never
    /// the URL itself).
    ///
    /// [`LabOptions::tls`]: super::LabOptions::tls
    #[error("the redis url's tls settings cannot be used")]
    Tls(#[source] leasehold::Error),
    /// A request of the lab's own to its etcd cluster failed (an
    /// operator's lease revoke, [`Fault::EtcdRevoke`]; reaching the
    /// cluster given to [`LabOptions::etcd_endpoints`]).
    ///
    /// [`LabOptions::etcd_endpoints`]: super::LabOptions::etcd_endpoints
    #[error("{what} failed on the etcd cluster")]
    Etcd {
        /// What was being done.
        what: String,
        /// The etcd client's error.
        #[source]
        source: leasehold_etcd::client::EtcdError,
    },
    /// A request of the lab's own to its ZooKeeper ensemble failed (a
    /// lock's node deleted by hand, [`Fault::ZookeeperNodeDelete`]).
    #[error("{what} failed on the zookeeper ensemble")]
    ZooKeeper {
        /// What was being done.
        what: String,
        /// The ZooKeeper client's error.
        #[source]
        source: zookeeper_client::Error,
    },
    /// The etcd cluster given to [`LabOptions::etcd_endpoints`] refused
    /// the lab's user or password (or asked for one, or has no
    /// authentication enabled though credentials were given), found when
    /// the lab starts, before any run. Never shows the password.
    ///
    /// [`LabOptions::etcd_endpoints`]: super::LabOptions::etcd_endpoints
    #[error("etcd at {endpoint} refused to authenticate {}", user_shown(user.as_deref()))]
    EtcdAuth {
        /// The member that refused.
        endpoint: String,
        /// The user name given, if any.
        user: Option<String>,
        /// The etcd client's error (boxed: it is large).
        #[source]
        source: Box<leasehold_etcd::client::EtcdError>,
    },
    /// The user of the etcd cluster given to
    /// [`LabOptions::etcd_endpoints`] may not read or write the lock keys'
    /// prefix, found when the lab starts, before any run. Grant its role
    /// `readwrite` on the prefix (`etcdctl role grant-permission ROLE
    /// readwrite leasehold --prefix`).
    ///
    /// [`LabOptions::etcd_endpoints`]: super::LabOptions::etcd_endpoints
    #[error(
        "etcd at {endpoint} does not let {} {needs} keys under the prefix {prefix:?} (grant its role readwrite on that prefix)",
        user_shown(user.as_deref())
    )]
    EtcdPermission {
        /// The member that refused.
        endpoint: String,
        /// The user name given, if any.
        user: Option<String>,
        /// `read` or `readwrite`.
        needs: &'static str,
        /// The prefix the lock keys live under.
        prefix: &'static str,
        /// The etcd client's error (boxed: it is large).
        #[source]
        source: Box<leasehold_etcd::client::EtcdError>,
    },
}

/// `user "NAME"`, or `the anonymous user`.
fn user_shown(user: Option<&str>) -> String {
    match user {
        Some(user) => format!("user {user:?}"),
        None => "the anonymous user".to_owned(),
    }
}

pub(super) fn server(what: impl Into<String>) -> impl FnOnce(leasehold_testkit::Error) -> LabError {
    let what = what.into();
    move |source| LabError::Server { what, source }
}

pub(super) fn server_err(what: &str) -> impl FnOnce(leasehold_testkit::Error) -> LabError {
    server(what.to_owned())
}

/// How long a command to an external Redis may take.
pub(super) const EXTERNAL_TIMEOUT: Duration = Duration::from_secs(2);

pub(super) fn external(what: impl Into<String>) -> impl FnOnce(redis::RedisError) -> LabError {
    let what = what.into();
    move |source| LabError::External { what, source }
}
