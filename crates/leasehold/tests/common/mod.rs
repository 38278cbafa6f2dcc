//! Helpers shared by the integration tests: one throwaway server per test.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use leasehold::{Connection, Locker};
use leasehold_testkit::RedisServer;
use redis::AsyncCommands;

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

pub const SECOND: Duration = Duration::from_secs(1);

/// Far above any deadline in these tests, far below "hung": an outer bound
/// that turns a hang (a call waiting out a socket timeout, a loss never
/// noticed) into a failure. Not a timing assertion.
pub const HUNG: Duration = Duration::from_secs(5);

/// A fresh server, a connection to it, and a locker over that connection.
pub async fn setup() -> Result<(RedisServer, Connection, Locker), Box<dyn std::error::Error>> {
    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let locker = Locker::builder()
        .command_timeout(SECOND)
        .connect(&client)
        .await?;
    let conn = locker.connection().clone();
    Ok((server, conn, locker))
}

/// Waits for Redis to expire `key` (checks the condition; no blind sleep).
pub async fn until_gone(conn: &mut Connection, key: &str) -> TestResult {
    tokio::time::timeout(HUNG, async {
        loop {
            let exists: bool = conn.exists(key).await?;
            if !exists {
                return Ok::<_, redis::RedisError>(());
            }
            tokio::task::yield_now().await;
        }
    })
    .await??;
    Ok(())
}

/// One attempt, no retry: the lease if the key is free now.
pub fn once() -> leasehold::AcquireOptions {
    leasehold::AcquireOptions::new()
        .retry(leasehold::RetryStrategy::none())
        .wait(SECOND)
}

/// The minimal ACL the README documents for a lock user, as `ACL SETUSER`
/// arguments (every mode: polling, fenced, hand-off, wait for replicas).
/// Not every binary that includes this module uses it.
#[allow(unused_imports)]
pub use leasehold_testkit::LOCK_USER_ACL;
