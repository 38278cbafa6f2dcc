//! Safety diagnostics read from real servers.

use std::time::Duration;

use leasehold::diagnostics::{Finding, diagnose};
use leasehold_testkit::{RedisOptions, RedisServer};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn findings(server: &RedisServer) -> Result<Vec<Finding>, Box<dyn std::error::Error>> {
    let client = redis::Client::open(server.url())?;
    let conn = leasehold_testkit::connection(&client, Duration::from_secs(1)).await?;
    Ok(diagnose(&conn, Duration::from_secs(1)).await?)
}

#[tokio::test]
async fn throwaway_server_has_no_persistence_and_eviction_is_caught() -> TestResult {
    let server = RedisServer::start()?;
    let found = findings(&server).await?;
    assert!(
        found
            .iter()
            .any(|f| matches!(f, Finding::NoDurablePersistence { .. })),
        "{found:?}"
    );
    assert!(
        !found
            .iter()
            .any(|f| matches!(f, Finding::EvictionPolicy { .. })),
        "{found:?}"
    );

    server.redis_cli(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])?;
    server.redis_cli(&["CONFIG", "SET", "appendonly", "yes"])?;
    server.redis_cli(&["CONFIG", "SET", "appendfsync", "always"])?;
    let found = findings(&server).await?;
    assert_eq!(
        found,
        vec![Finding::EvictionPolicy {
            policy: "allkeys-lru".into()
        }]
    );
    Ok(())
}

#[tokio::test]
async fn replication_is_reported_on_both_sides() -> TestResult {
    // Without the delay the primary waits 5 s before the first sync.
    let primary =
        RedisServer::start_with(RedisOptions::default().args(["--repl-diskless-sync-delay", "0"]))?;
    let replica = RedisServer::start_with(
        RedisOptions::default().replica_of(primary.host(), primary.port()),
    )?;
    let on_replica = findings(&replica).await?;
    assert!(
        on_replica
            .iter()
            .any(|f| matches!(f, Finding::AsyncReplication { role, .. } if role == "slave")),
        "{on_replica:?}"
    );
    // The primary sees its replica once the link is up.
    primary.redis_cli(&["WAIT", "1", "5000"])?;
    let on_primary = findings(&primary).await?;
    assert!(
        on_primary
            .iter()
            .any(|f| matches!(f, Finding::AsyncReplication { replicas: 1, .. })),
        "{on_primary:?}"
    );
    Ok(())
}
