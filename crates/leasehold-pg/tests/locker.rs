//! PostgreSQL as the lock service (`PgLocker`): the conformance suite
//! against a throwaway server, with every fault it can be put through (a
//! lease row or a counter deleted by hand, the server's processes stopped
//! with SIGSTOP).

use leasehold::backend::ServiceFault;
use leasehold::conformance::{self, Faults, Offered, Settings, Verdict};
use leasehold::{Error, Service};
use leasehold_pg::PgLocker;
use leasehold_testkit::PostgresServer;

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct OnPostgres<'a> {
    server: &'a PostgresServer,
    raw: tokio_postgres::Client,
}

fn testkit(err: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::service(
        Service::named("testkit"),
        "fault",
        ServiceFault::Refused,
        err,
    )
}

impl Faults for OnPostgres<'_> {
    fn offers(&self) -> Offered {
        Offered::ALL
    }

    async fn expire(&self, key: &str) -> leasehold::Result<()> {
        self.raw
            .execute("DELETE FROM leasehold_leases WHERE resource = $1", &[&key])
            .await
            .map_err(testkit)?;
        Ok(())
    }

    async fn lose_fence(&self, fence_key: &str) -> leasehold::Result<()> {
        self.raw
            .execute(
                "DELETE FROM leasehold_lease_counters WHERE fence_key = $1",
                &[&fence_key],
            )
            .await
            .map_err(testkit)?;
        Ok(())
    }

    async fn pause(&self) -> leasehold::Result<()> {
        self.server.pause().map_err(testkit)
    }

    async fn resume(&self) -> leasehold::Result<()> {
        self.server.resume().map_err(testkit)
    }
}

/// Every check passes, the election's included (its leader record in
/// the database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_passes_the_conformance_suite() -> TestResult {
    let server = PostgresServer::start()?;
    let locker = PgLocker::connect(&server.url()).await?;
    locker.setup().await?;
    let other = PgLocker::connect(&server.url()).await?;
    let faults = OnPostgres {
        server: &server,
        raw: leasehold_pg::connect(&server.url()).await?,
    };
    let report = conformance::run_pair(&locker, &other, &faults, &Settings::default()).await;
    assert!(report.is_ok(), "{report}");
    assert!(
        report.checks.iter().all(|c| c.verdict == Verdict::Passed),
        "{report}"
    );
    Ok(())
}
