//! The example service keeps the `LockService` contract: leasehold's
//! conformance suite, with every fault the service can be put through.

use std::time::Duration;

use leasehold::conformance::{self, Faults, Offered, Settings, Verdict};
use map_service::MapService;

/// The faults, caused on the service's own table.
struct OnMap<'a>(&'a MapService);

impl Faults for OnMap<'_> {
    fn offers(&self) -> Offered {
        Offered::ALL
    }

    async fn expire(&self, key: &str) -> leasehold::Result<()> {
        self.0.delete(key).await;
        Ok(())
    }

    async fn lose_fence(&self, fence_key: &str) -> leasehold::Result<()> {
        self.0.forget_fence(fence_key).await;
        Ok(())
    }

    async fn pause(&self) -> leasehold::Result<()> {
        self.0.set_down(true);
        Ok(())
    }

    async fn resume(&self) -> leasehold::Result<()> {
        self.0.set_down(false);
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn it_passes_the_conformance_suite() {
    let service = MapService::new(Duration::from_secs(1));
    let report = conformance::run(&service, &OnMap(&service), &Settings::default()).await;
    assert!(report.is_ok(), "{report}");
    // It offers no leader record, so the election check is skipped; every
    // other check ran and passed.
    let skipped: Vec<_> = report
        .checks
        .iter()
        .filter(|c| c.verdict != Verdict::Passed)
        .map(|c| c.name)
        .collect();
    assert_eq!(skipped, ["an_election_names_its_leader"], "{report}");
}
