//! Helpers shared by the integration tests.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex, Weak};

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
