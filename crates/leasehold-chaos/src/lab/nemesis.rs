//! The nemesis: checks that the lab can inject a run's faults, then
//! follows the schedule on its own thread, recording each fault's start
//! and end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::etcd::NEEDS_ETCD_PROCESS;
use super::inject::NEEDS_FAKE_CLOCK;
use super::pg::{NEEDS_FAKE_PG_CLOCK, NEEDS_PG};
use super::servers::Primary;
use super::zookeeper::NEEDS_ZOOKEEPER;
use super::{Lab, LabError};
use crate::callers::{Stall, lock_key};
use crate::fault::Fault;
use crate::history::Kind;
use crate::recorder::Recorder;
use crate::schedule::Window;

impl Lab {
    /// Checks, before a run, that this lab can inject `fault` as asked:
    /// the servers it needs ([`LabError::Unsupported`]: the fault proxy,
    /// control of the Redis process, control of the etcd members, which
    /// an etcd given by
    /// [`LabOptions::etcd_endpoints`](super::LabOptions::etcd_endpoints)
    /// refuses), and on a Redis given by URL that its
    /// user may run the fault's commands ([`Fault::needs_commands`],
    /// each probed in a harmless form, see
    /// [`HARNESS_ACL_RULES`](crate::HARNESS_ACL_RULES)):
    /// [`LabError::Permission`] names the first one refused. `keys` are the
    /// run's lock keys (the key commands are probed next to the first).
    /// Blocking (a round trip per command, at most 2 s each).
    /// [`Harness::run`](crate::Harness::run) and [`run_nemesis`] call it
    /// before anything runs.
    ///
    /// # Errors
    /// As above, and [`LabError::External`] when the Redis cannot be
    /// reached.
    pub fn check_fault(&self, fault: Fault, keys: &[String]) -> Result<(), LabError> {
        if fault.needs_proxy() && self.proxy.is_none() {
            return Err(LabError::Unsupported {
                fault,
                needs: "the fault proxy (a cluster or sentinel lab has none, nor one with LabOptions::proxy(false))",
            });
        }
        let servers = self.servers();
        let etcd = matches!(servers.primary, Primary::Etcd(_));
        if fault.needs_etcd() && !etcd {
            return Err(LabError::Unsupported {
                fault,
                needs: "a throwaway etcd cluster (LabOptions::etcd, the etcd modes)",
            });
        }
        if fault.needs_etcd_process()
            && matches!(&servers.primary, Primary::Etcd(lab) if lab.cluster.is_none())
        {
            return Err(LabError::Unsupported {
                fault,
                needs: NEEDS_ETCD_PROCESS,
            });
        }
        if etcd
            && !fault.needs_etcd()
            && !matches!(
                fault,
                Fault::None | Fault::HolderPause | Fault::PostgresPause | Fault::PostgresRestart
            )
        {
            return Err(LabError::Unsupported {
                fault,
                needs: "a redis server (an etcd lab runs the etcd faults, the holder pause and the postgresql faults)",
            });
        }
        let zookeeper = matches!(servers.primary, Primary::ZooKeeper(_));
        if fault.needs_zookeeper() && !zookeeper {
            return Err(LabError::Unsupported {
                fault,
                needs: NEEDS_ZOOKEEPER,
            });
        }
        if zookeeper
            && !fault.needs_zookeeper()
            && !matches!(
                fault,
                Fault::None | Fault::HolderPause | Fault::PostgresPause | Fault::PostgresRestart
            )
        {
            return Err(LabError::Unsupported {
                fault,
                needs: "a redis server or an etcd cluster (a zookeeper lab runs the zookeeper faults, the holder pause and the postgresql faults)",
            });
        }
        let pg = matches!(servers.primary, Primary::Postgres(_));
        if fault.needs_pg() && !pg {
            return Err(LabError::Unsupported {
                fault,
                needs: NEEDS_PG,
            });
        }
        if pg
            && !fault.needs_pg()
            && !matches!(
                fault,
                Fault::None | Fault::HolderPause | Fault::PostgresPause | Fault::PostgresRestart
            )
        {
            return Err(LabError::Unsupported {
                fault,
                needs: "a redis server, an etcd cluster or a zookeeper ensemble (a pg lab runs the pg faults, the holder pause and the postgresql faults)",
            });
        }
        if fault.needs_pgbouncer() && self.pgbouncer_url_locked(&servers).is_none() {
            return Err(LabError::Unsupported {
                fault,
                needs: "a pg lab with pgbouncer in front (LabOptions::pgbouncer: the pg-pgbouncer mode)",
            });
        }
        // A zero step tells whether libfaketime drives its clock.
        if fault == Fault::PgClockStep
            && servers
                .postgres
                .as_ref()
                .is_none_or(|pg| pg.jump_clock(Duration::ZERO).is_err())
        {
            return Err(LabError::Unsupported {
                fault,
                needs: NEEDS_FAKE_PG_CLOCK,
            });
        }
        if fault.needs_fake_clock()
            && !matches!(&servers.primary, Primary::Own(primary) if primary.clock_rate().is_some())
        {
            return Err(LabError::Unsupported {
                fault,
                needs: NEEDS_FAKE_CLOCK,
            });
        }
        let external = matches!(
            servers.primary,
            Primary::External { .. } | Primary::ExternalCluster { .. }
        );
        if external && fault.needs_redis_process() {
            return Err(LabError::Unsupported {
                fault,
                needs: "a single redis-server the lab started (it controls the process)",
            });
        }
        if !external {
            // The lab's connections to its own servers are the default user.
            return Ok(());
        }
        let key = keys
            .first()
            .map_or_else(|| lock_key("leasehold-acl-probe"), String::clone);
        for &command in fault.needs_commands() {
            let Some(args) = crate::access::probe(command, &key) else {
                continue;
            };
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match servers
                .primary
                .command(&args, &format!("checking the acl for {command}"))
            {
                Ok(()) => {}
                Err(LabError::External { source, .. }) if source.code() == Some("NOPERM") => {
                    return Err(LabError::Permission { fault, command });
                }
                // Any other refusal is the probe's argument: allowed.
                Err(LabError::External { source, .. }) if source.code().is_some() => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }
}

/// How often a repeated fault fires within its window.
fn period(fault: Fault) -> Duration {
    match fault {
        Fault::KeyLoss | Fault::EarlyExpiry => Duration::from_millis(5),
        Fault::NetCut | Fault::ConnKill | Fault::PgBackendKill => Duration::from_millis(100),
        Fault::PgRowDelete => Duration::from_millis(20),
        Fault::PubsubKill => Duration::from_millis(300),
        Fault::ClockJump => Duration::from_millis(25),
        // Each revoke is a raft commit (synced to disk on etcd 3.4): a
        // storm of them would measure the disk, not the lock.
        Fault::EtcdRevoke => Duration::from_millis(200),
        _ => Duration::from_millis(50),
    }
}

/// Runs `windows` against `lab` from `t0` (the run's start), recording each
/// fault's start and end, until the schedule ends or `stop` is set. Every
/// fault is ended (and the lab healed) before it returns, even on error.
/// Blocking: run it on its own thread.
///
/// # Errors
/// The first [`LabError`]: the run's results would not mean what they say.
pub fn run_nemesis(
    lab: &Lab,
    windows: &[Window],
    keys: &[String],
    recorder: &Recorder,
    stall: &Stall,
    t0: Instant,
    stop: &AtomicBool,
) -> Result<(), LabError> {
    let mut faults: Vec<Fault> = windows.iter().map(|window| window.fault).collect();
    faults.dedup();
    if let Err(err) = faults
        .into_iter()
        .try_for_each(|fault| lab.check_fault(fault, keys))
    {
        lab.heal();
        return Err(err);
    }
    let result = windows.iter().try_for_each(|window| {
        if !sleep_until(t0 + window.start, stop) {
            return Ok(());
        }
        let fault = window.fault.name().to_owned();
        let began = lab.begin(window, keys, stall);
        let target = match &began {
            Ok(target) => target.clone(),
            Err(_) => "error".to_owned(),
        };
        recorder.record(
            "nemesis",
            Kind::FaultStart {
                fault: fault.clone(),
                target: target.clone(),
            },
        );
        let mut result = began.map(drop);
        let until = t0 + window.end();
        if window.fault.is_repeated() || window.fault == Fault::NetCut {
            while result.is_ok()
                && sleep_until((Instant::now() + period(window.fault)).min(until), stop)
                && Instant::now() < until
            {
                result = lab.repeat(window.fault, keys);
            }
        }
        sleep_until(until, stop);
        let ended = lab.end(window, keys, stall);
        recorder.record("nemesis", Kind::FaultEnd { fault, target });
        result.and(ended)
    });
    lab.heal();
    result
}

/// Sleeps until `at` in small steps; false if `stop` was set first.
fn sleep_until(at: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        let now = Instant::now();
        if now >= at {
            return true;
        }
        std::thread::sleep((at - now).min(Duration::from_millis(5)));
    }
}
