//! `bench leader`: how soon a new leader takes over an election.
//!
//! Issue 27's targets: a leader that stops is replaced within its term's
//! TTL + 100 ms, one that resigns within 50 ms, measured with 3 processes.
//! Per way (poll: a `Locker`; handoff: a `HandoffLocker`; quorum: a
//! `Quorum` of 3 servers) three candidate processes of this binary
//! ([`candidate`]) campaign in a loop on one election on the way's own
//! throwaway redis-servers (5 in all, so that a fault reaches one way), and report each term on stdout. Every round, for every
//! way (in an order that rotates by round):
//!
//! - **resigned**: the leader is told to resign; measured from just before
//!   its `Term::resign` call to the moment another process's `campaign`
//!   returned (both read from the wall clock, in their processes);
//! - **stopped**: the leader's process is stopped (SIGSTOP) at a random
//!   moment of its watchdog's period; measured from just before the stop
//!   to another process's election, and reported as the excess over the
//!   TTL (negative: replaced before a whole TTL had passed since the stop,
//!   because the lease had been refreshed up to ttl/3 before it). Also
//!   from the lock's expiry (its `PTTL` read right after the stop; the
//!   quorum's: when a majority of its nodes have let it go) to the
//!   election: the time followers take to notice. Then the stopped
//!   process is killed and a fresh candidate takes its place.
//!
//! Then (unless `--no-faults`), for every way, two fault rounds, each
//! shorter than the election's budget (30 s), for issue 27's third target,
//! "0 errors reach the service for faults shorter than its budget":
//!
//! - **restart**: the way's server is killed and started again, empty (no
//!   persistence): the lock, the queue and the counter are gone; for the
//!   quorum, one node (the round's number modulo 3);
//! - **connections**: `CLIENT KILL TYPE normal` on each of the way's
//!   servers, 4 times 300 ms apart.
//!
//! Each counts the errors the candidates' library calls returned to them
//! (a campaign's, a resign's other than `NotHeld` or `LeaseLost`; the
//! candidates print each one), the terms lost (not errors), and the time
//! from the fault's end to the next election, read as a new `elected`
//! event (negative: during the fault). A leader still leading one TTL +
//! 500 ms after the fault's end kept its term: no election to time. Every
//! error a candidate reports, in any round, counts in its way's total.
//!
//! Before each measurement the team settles for 200 ms, so the last leader
//! campaigns again (queued, or polling) before anything happens. A round
//! whose leader lost its term on its own first is measured again (the
//! count is reported). Every term's fencing token must be above the last
//! one of its election: if not, the bench says BROKEN and exits 1.
//!
//! The figures are medians with the 10th..90th percentiles over rounds;
//! the ratios handoff / poll are of the medians. All the ways' candidates
//! run for the whole bench, so an idle way's followers (polling ones every
//! 5 to 15 ms) share the machine with the way being measured.
//!
//! The parts: [`team`] (the candidate processes and their events),
//! [`rounds`] (the measured rounds and faults), [`report`] (the figures
//! and the targets); [`candidate`] is what each process runs.

use std::process::ExitCode;

use anyhow::Context;
use leasehold_testkit::RedisServer;
use tokio::time::Instant;

use self::rounds::Fault;
use self::team::Team;
use crate::bench::Measurements;
use crate::cli::{LeaderArgs, LeaderWay};
use crate::exit;
use crate::progress::note;

pub(crate) mod candidate;
mod report;
mod rounds;
mod team;

/// Candidate processes per way.
const CANDIDATES: usize = 3;

pub(crate) async fn run(args: &LeaderArgs) -> anyhow::Result<ExitCode> {
    let mut ways: Vec<LeaderWay> = Vec::new();
    for way in if args.ways.is_empty() {
        &LeaderWay::ALL[..]
    } else {
        &args.ways
    } {
        if !ways.contains(way) {
            ways.push(*way);
        }
    }
    // Each way its own servers, so that a fault round reaches one way.
    let mut ranges = Vec::new();
    let mut nodes = 0;
    for &way in &ways {
        let n = if way == LeaderWay::Quorum { 3 } else { 1 };
        ranges.push(nodes..nodes + n);
        nodes += n;
    }
    let mut servers = tokio::task::spawn_blocking(move || RedisServer::start_many(nodes))
        .await
        .context("starting throwaway redis-servers")?
        .context("starting throwaway redis-servers")?;
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    note!(
        "leasehold: started {} at {}",
        if nodes == 1 {
            "a throwaway redis-server".to_owned()
        } else {
            format!("{nodes} throwaway redis-servers")
        },
        urls.join(", ")
    );
    let mut teams = Vec::new();
    for (&way, range) in ways.iter().zip(&ranges) {
        teams.push(Team::start(way, urls[range.clone()].to_vec(), args.ttl).await?);
    }
    let faults: &[Fault] = if args.no_faults { &[] } else { &Fault::ALL };
    let len = u64::from(args.rounds) * teams.len() as u64 * (2 + faults.len() as u64);
    let progress = Measurements::new("bench leader", len, args.json);
    for round in 1..=args.rounds {
        let n = teams.len();
        let order: Vec<usize> = (0..n).map(|i| (i + round as usize) % n).collect();
        for &i in &order {
            progress.start(format!(
                "round {round}/{}: {}, resign",
                args.rounds,
                teams[i].way.name()
            ));
            teams[i].resign_round(round).await?;
        }
        for &i in &order {
            progress.start(format!(
                "round {round}/{}: {}, stop",
                args.rounds,
                teams[i].way.name()
            ));
            teams[i].stop_round(round).await?;
        }
        for &i in &order {
            for &fault in faults {
                progress.start(format!(
                    "round {round}/{}: {}, {}",
                    args.rounds,
                    teams[i].way.name(),
                    fault.name()
                ));
                teams[i]
                    .fault_round(round, fault, &mut servers[ranges[i].clone()])
                    .await?;
            }
        }
    }
    drop(progress);
    for team in &mut teams {
        // What the candidates said since the team's last round.
        while team.pump(Instant::now()).await?.is_some() {}
    }
    report::report(&teams, args);
    let mut broken = false;
    for team in &teams {
        for violation in &team.violations {
            note!("leasehold: BROKEN: {}: {violation}", team.way.name());
            broken = true;
        }
    }
    drop(teams);
    drop(servers);
    Ok(if broken {
        ExitCode::from(exit::BROKEN)
    } else {
        ExitCode::SUCCESS
    })
}
