//! Safety diagnostics: server settings that weaken what a lease promises.
//!
//! None of these stop a lease from working; each one names a way it can be
//! lost or granted twice. Check once at startup and log the findings:
//!
//! - an `allkeys-*` eviction policy lets Redis evict lock keys and fence
//!   counters under memory pressure, before their TTL: a held lock
//!   vanishes, a fence counter starts again (which costs one refused write
//!   before it heals);
//! - no persistence (or `appendfsync` other than `always`): a restart loses
//!   recent locks and fence increments;
//! - replicas: replication is asynchronous, so after a failover the promoted
//!   replica may not have a lock the old primary granted (the Redis docs'
//!   "safety violation");
//! - a TTL shorter than the observed p99 hold time: leases expire under
//!   holders that are still working, routinely.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::call;
use crate::error::Result;
use crate::node::RedisConnection;

/// One setting that weakens a lease's guarantees.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finding {
    /// `maxmemory-policy` is `allkeys-lru`, `allkeys-lfu` or `allkeys-random`.
    EvictionPolicy {
        /// The policy in force.
        policy: String,
    },
    /// Neither RDB snapshots nor an AOF with `appendfsync always`: a restart
    /// loses recent locks and fence counters.
    NoDurablePersistence {
        /// What persistence is configured, in words.
        configured: String,
    },
    /// The server replicates asynchronously (it has replicas, or is one).
    AsyncReplication {
        /// `master` or `slave`, as reported by `INFO replication`.
        role: String,
        /// Replicas connected to this server.
        replicas: u64,
    },
    /// Holders routinely outlive their lease.
    TtlBelowHoldTime {
        /// The TTL in use.
        ttl: Duration,
        /// The observed 99th-percentile hold time.
        p99: Duration,
    },
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::EvictionPolicy { policy } => write!(
                f,
                "maxmemory-policy is {policy}: redis may evict lock keys and fence counters under memory pressure; use noeviction or volatile-*"
            ),
            Finding::NoDurablePersistence { configured } => write!(
                f,
                "persistence is {configured}: a restart loses recent locks and fence increments, so a lock can be granted twice and tokens can repeat"
            ),
            Finding::AsyncReplication { role, replicas } => write!(
                f,
                "replication is asynchronous (role {role}, {replicas} replicas): after a failover the promoted replica may not have a granted lock"
            ),
            Finding::TtlBelowHoldTime { ttl, p99 } => write!(
                f,
                "lock ttl {} is shorter than the p99 hold time {}: leases expire under working holders",
                Millis(*ttl),
                Millis(*p99)
            ),
        }
    }
}

/// A duration in milliseconds with one decimal, as people write it.
struct Millis(Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1}ms", self.0.as_secs_f64() * 1000.0)
    }
}

/// Reads `INFO` and `CONFIG GET maxmemory-policy` and reports what weakens
/// a lease on this server. `CONFIG` may be disabled (managed services); the
/// eviction check is then skipped.
///
/// # Errors
/// [`Error::Timeout`](crate::Error::Timeout) and friends when `INFO` itself
/// cannot be read within `timeout`.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn diagnose<C: RedisConnection>(conn: &C, timeout: Duration) -> Result<Vec<Finding>> {
    let deadline = Instant::now() + timeout;
    let mut conn = conn.clone();
    let info: String = call::bounded(
        "diagnose",
        "",
        deadline,
        redis::cmd("INFO").arg("all").query_async(&mut conn),
    )
    .await?;
    let config: HashMap<String, String> = call::bounded(
        "diagnose",
        "",
        deadline,
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .arg("appendfsync")
            .query_async(&mut conn),
    )
    .await
    .unwrap_or_default();
    Ok(findings_from(&info, &config))
}

/// The findings for an `INFO all` text and some `CONFIG GET` values (empty
/// when `CONFIG` is disabled).
pub(crate) fn findings_from(info: &str, config: &HashMap<String, String>) -> Vec<Finding> {
    let policy = config.get("maxmemory-policy").map(String::as_str);
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let mut findings = Vec::new();
    if let Some(policy) = policy.filter(|p| p.starts_with("allkeys-")) {
        findings.push(Finding::EvictionPolicy {
            policy: policy.to_owned(),
        });
    }
    // Snapshots lose everything since the last one, so only an AOF fsynced
    // on every write counts as durable. When CONFIG is unavailable the fsync
    // policy is unknown and an enabled AOF gets the benefit of the doubt.
    let aof = field("aof_enabled") == Some("1");
    let fsync = config.get("appendfsync").map(String::as_str);
    if !aof {
        findings.push(Finding::NoDurablePersistence {
            configured: "off or snapshots only".to_owned(),
        });
    } else if let Some(fsync) = fsync.filter(|f| *f != "always") {
        findings.push(Finding::NoDurablePersistence {
            configured: format!("aof with appendfsync {fsync}"),
        });
    }
    let role = field("role").unwrap_or("master").to_owned();
    let replicas = field("connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if role != "master" || replicas > 0 {
        findings.push(Finding::AsyncReplication { role, replicas });
    }
    findings
}

/// A finding when the observed p99 hold time reaches the TTL.
pub fn check_hold_time(ttl: Duration, p99: Duration) -> Option<Finding> {
    (p99 >= ttl).then_some(Finding::TtlBelowHoldTime { ttl, p99 })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAFE: &str =
        "# Persistence\r\naof_enabled:1\r\n# Replication\r\nrole:master\r\nconnected_slaves:0\r\n";

    fn config(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_safe_server_has_no_findings() {
        let found = findings_from(
            SAFE,
            &config(&[
                ("appendfsync", "always"),
                ("maxmemory-policy", "noeviction"),
            ]),
        );
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn eviction_policy() {
        let found = findings_from(SAFE, &config(&[("maxmemory-policy", "allkeys-lru")]));
        assert!(found.contains(&Finding::EvictionPolicy {
            policy: "allkeys-lru".into()
        }));
        assert!(
            !findings_from(SAFE, &config(&[("maxmemory-policy", "volatile-lru")]))
                .iter()
                .any(|f| matches!(f, Finding::EvictionPolicy { .. }))
        );
    }

    #[test]
    fn aof_without_fsync_always_is_not_durable() {
        let found = findings_from(SAFE, &config(&[("appendfsync", "everysec")]));
        assert!(
            matches!(&found[..], [Finding::NoDurablePersistence { configured }] if configured.contains("everysec"))
        );
    }

    #[test]
    fn persistence_and_replication() {
        let found = findings_from(
            "aof_enabled:0\r\nrole:master\r\nconnected_slaves:1\r\n",
            &HashMap::new(),
        );
        assert!(matches!(found[0], Finding::NoDurablePersistence { .. }));
        assert_eq!(
            found[1],
            Finding::AsyncReplication {
                role: "master".into(),
                replicas: 1
            }
        );
        let replica = findings_from("role:slave\r\n", &HashMap::new());
        assert!(
            replica
                .iter()
                .any(|f| matches!(f, Finding::AsyncReplication { .. }))
        );
    }

    #[test]
    fn hold_time() {
        let ms = Duration::from_millis;
        assert!(check_hold_time(ms(100), ms(99)).is_none());
        let found = check_hold_time(ms(100), Duration::from_micros(302_158));
        assert_eq!(
            found.map(|f| f.to_string()).as_deref(),
            Some(
                "lock ttl 100.0ms is shorter than the p99 hold time 302.2ms: leases expire under working holders"
            )
        );
    }
}
