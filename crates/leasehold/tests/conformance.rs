//! The conformance suite (`leasehold::conformance`) against every Redis
//! way this crate ships: polling, hand-off (queued in Redis, and with the
//! in-process relay) and Redlock, each with every fault the suite can
//! cause on real servers (a lock or fence counter deleted by hand, the
//! servers paused with SIGSTOP). The in-memory service runs it in
//! `memory_locker.rs`, etcd in `etcd_lease.rs`.

use std::time::Duration;

use leasehold::backend::ServiceFault;
use leasehold::conformance::{self, Faults, Offered, Report, Settings};
use leasehold::{Error, HandoffLocker, HandoffStyle, Locker, Quorum, Service};
use leasehold_testkit::RedisServer;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The suite's faults on real Redis servers: every lock and counter is on
/// each of them (one for a single server, all for a quorum).
struct OnRedis<'a>(&'a [RedisServer]);

fn testkit(err: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::service(
        Service::named("testkit"),
        "fault",
        ServiceFault::Refused,
        err,
    )
}

impl OnRedis<'_> {
    fn del(&self, key: &str) -> leasehold::Result<()> {
        for server in self.0 {
            server.redis_cli(&["DEL", key]).map_err(testkit)?;
        }
        Ok(())
    }
}

impl Faults for OnRedis<'_> {
    fn offers(&self) -> Offered {
        Offered::ALL
    }

    async fn expire(&self, key: &str) -> leasehold::Result<()> {
        self.del(key)
    }

    async fn lose_fence(&self, fence_key: &str) -> leasehold::Result<()> {
        self.del(fence_key)
    }

    async fn pause(&self) -> leasehold::Result<()> {
        self.0.iter().try_for_each(|s| s.pause().map_err(testkit))
    }

    async fn resume(&self) -> leasehold::Result<()> {
        self.0.iter().try_for_each(|s| s.resume().map_err(testkit))
    }
}

/// Every check passed; none skipped (the faults are all offered).
fn all_passed(report: &Report) {
    assert!(report.is_ok(), "{report}");
    assert_eq!(
        report.passed().count(),
        report.checks.len(),
        "a check was skipped: {report}"
    );
}

fn settings(way: &str) -> Settings {
    Settings::default().prefix(format!("conformance-{way}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_keeps_the_contract() -> TestResult {
    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let locker = Locker::builder()
        .command_timeout(Duration::from_secs(1))
        .connect(&client)
        .await?;
    let servers = [server];
    let report = conformance::run(&locker, &OnRedis(&servers), &settings("poll")).await;
    all_passed(&report);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_off_keeps_the_contract_queued_and_relayed() -> TestResult {
    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let servers = [server];
    for relay in [0, 8] {
        // Two lockers: with the relay, a successor in the same process
        // waits for the holder it knows of (until that lease ends), so the
        // successor is another client, as another process would be.
        let mut lockers = Vec::new();
        for _ in 0..2 {
            let locker = HandoffLocker::builder()
                .style(HandoffStyle::default())
                .relay_limit(relay)
                .connect(&client)
                .await?;
            lockers.push(locker);
        }
        let name = format!("handoff-relay{relay}");
        let faults = OnRedis(&servers);
        let report =
            conformance::run_pair(&lockers[0], &lockers[1], &faults, &settings(&name)).await;
        all_passed(&report);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_keeps_the_contract() -> TestResult {
    let servers = RedisServer::start_many(3)?;
    let clients = servers
        .iter()
        .map(|s| redis::Client::open(s.url()))
        .collect::<Result<Vec<_>, _>>()?;
    // Votes may be slow on a loaded machine; the suite is about outcomes.
    let quorum = Quorum::builder()
        .node_timeout(Duration::from_millis(500))
        .connect(clients)
        .await?;
    let report = conformance::run(&quorum, &OnRedis(&servers), &settings("quorum")).await;
    all_passed(&report);
    Ok(())
}
