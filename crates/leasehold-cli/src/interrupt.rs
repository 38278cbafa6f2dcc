//! Ctrl-C (SIGINT) and SIGTERM: stop what the CLI started, then exit 130.
//!
//! Every throwaway server belongs to the run that started it (`Env`,
//! `Database`, or an experiment's own servers, some held by a task it
//! spawned), and dropping a server stops it: `SIGKILL` for a redis-server,
//! which also ends a stopped (paused) process; for PostgreSQL a `SIGCONT`
//! if paused, then an immediate shutdown. So on a signal `main` drops the
//! run, then shuts the runtime down (dropping the spawned tasks and waiting
//! for a server still starting up), and only then exits. The CLI never
//! pauses a server it did not start: `failover` and `redlock`, the only
//! experiments that pause or kill, start their own.

use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

use crate::progress::note;

/// How long the shutdown may wait for servers to stop (or to finish
/// starting, to be stopped): a throwaway PostgreSQL may take up to 30 s to
/// become ready and 5 s to shut down.
pub(crate) const SHUTDOWN: Duration = Duration::from_secs(45);

/// Waits for SIGINT or SIGTERM and returns its name. The handlers are in
/// place from the first poll on. If they cannot be installed, says so and
/// never returns (the signals then end the process the default way).
pub(crate) async fn signalled() -> &'static str {
    let (mut interrupt, mut terminate) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(interrupt), Ok(terminate)) => (interrupt, terminate),
        (Err(err), _) | (_, Err(err)) => {
            note!(
                "leasehold: cannot handle Ctrl-C ({err}); interrupting may leave throwaway servers behind"
            );
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    }
}
