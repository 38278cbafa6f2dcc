//! Helpers shared by the integration tests.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex, Weak};

use leasehold::Lessor;
use leasehold_testkit::PostgresServer;

/// One server shared by the tests of a binary that run at the same time;
/// dropped (and stopped) when the last of them ends, so nothing outlives
/// the binary.
pub fn server() -> Result<Arc<PostgresServer>, leasehold_testkit::Error> {
    static SHARED: Mutex<Weak<PostgresServer>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(server) = shared.upgrade() {
        return Ok(server);
    }
    let server = Arc::new(PostgresServer::start()?);
    *shared = Arc::downgrade(&server);
    Ok(server)
}

/// An error and its sources, one after the other (`a: b: c`).
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A lease held by a holder that then freezes (as under `SIGSTOP`): taken
/// through a `Locker` of its own on a runtime of its own, which nothing
/// drives after the acquire, so the lease's watchdog and its Redis
/// connection (both spawned there) never run again and the lock expires
/// after `ttl`. Its database work runs on the caller's runtime. Shut the
/// runtime down at the end (`shutdown_background`).
pub fn frozen_lease(
    redis_url: String,
    keys: leasehold::FencedKeys,
    ttl: std::time::Duration,
) -> Result<(leasehold::Lease, tokio::runtime::Runtime), Box<dyn std::error::Error>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let lease = runtime.block_on(async {
            let client = leasehold::redis::Client::open(redis_url).map_err(|e| e.to_string())?;
            let locker = leasehold::Locker::connect(&client)
                .await
                .map_err(|e| e.to_string())?;
            locker.acquire(&keys, ttl).await.map_err(|e| e.to_string())
        })?;
        Ok::<_, String>((lease, runtime))
    })
    .join()
    .map_err(|_| "the frozen holder's thread panicked")?
    .map_err(Into::into)
}

/// A term that has been superseded without knowing it, and the term that
/// superseded it: two candidates of the election `name` on one in-memory
/// lock service; `old` leads, its lock then runs out under it (the
/// service expires it, as a pause past the TTL would; its watchdog, every
/// 10 s of the 30 s TTL, has not looked yet), and `new` is elected.
pub async fn superseded_term(
    name: &str,
) -> Result<(leasehold::Term, leasehold::Term), Box<dyn std::error::Error>> {
    let lock = leasehold::MemoryLocker::new();
    let candidate = |who: &str| {
        leasehold::Election::builder(lock.clone(), name)
            .candidate(who)
            .ttl(std::time::Duration::from_secs(30))
            .build()
    };
    let (old, new) = (candidate("old")?, candidate("new")?);
    let stale = old.campaign().await?;
    lock.expire(old.keys().lock());
    let newer = new.campaign().await?;
    Ok((stale, newer))
}
