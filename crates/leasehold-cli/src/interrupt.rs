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
//! experiments that pause or kill, start their own. `chaos` runs its
//! nemesis on a thread of its own, holding the run's servers: dropping the
//! run stops that thread and waits for it, and the worker processes are
//! killed as their handles drop.
//!
//! The message that the servers are stopped is only printed when it is
//! true: after the shutdown, `main` looks for any process this one started
//! that still runs ([`still_running`]) and names them instead.

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

/// The processes this one started (its children, theirs, ...) that still
/// run: not gone, not a zombie (an exited child not yet reaped runs
/// nothing). Read from `/proc/PID/task/TID/children`; empty where `/proc`
/// cannot be read.
pub(crate) fn still_running() -> Vec<u32> {
    let mut found = leasehold_testkit::descendants(std::process::id());
    found.retain(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let state = stat[stat.rfind(')')? + 1..].trim_start().chars().next()?;
                Some(state != 'Z' && state != 'X')
            })
            .unwrap_or(false)
    });
    found
}
