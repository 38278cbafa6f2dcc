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

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use leasehold::FencedKeys;
use leasehold_testkit::RedisServer;
use rand::RngExt;
use redis::aio::MultiplexedConnection;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use self::candidate::{Event, Spec, now_us};
use super::{Measurements, median, round3};
use crate::child;
use crate::cli::{LeaderArgs, LeaderWay};
use crate::exit;
use crate::progress::note;

pub(crate) mod candidate;

/// Candidate processes per way.
const CANDIDATES: usize = 3;

/// How long a team settles before each measurement.
const SETTLE: Duration = Duration::from_millis(200);

/// How long a candidate may take to start and connect.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Measurements spoiled in a row (a term lost on its own each time)
/// before the bench gives up.
const SPOILED_IN_A_ROW: u32 = 5;

/// How many times, and how far apart, the connections fault kills the
/// clients.
const KILLS: u32 = 4;
const KILL_EVERY: Duration = Duration::from_millis(300);

/// How long after a fault's end a leader still leading has kept its term.
const KEPT_MARGIN: Duration = Duration::from_millis(500);

/// Issue 27's targets.
const RESIGN_TARGET_MS: f64 = 50.0;
const STOP_TARGET_EXCESS_MS: f64 = 100.0;

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
    report(&teams, args);
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

/// A figure over rounds.
#[derive(Debug, Clone, Copy)]
struct Spread {
    min: f64,
    p10: f64,
    median: f64,
    p90: f64,
    max: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Spread {
        Spread {
            min: quantile(values, 0.0),
            p10: quantile(values, 0.1),
            median: median(values),
            p90: quantile(values, 0.9),
            max: quantile(values, 1.0),
        }
    }

    fn json(self) -> serde_json::Value {
        json!({
            "min": round3(self.min),
            "p10": round3(self.p10),
            "median": round3(self.median),
            "p90": round3(self.p90),
            "max": round3(self.max),
        })
    }

    fn text(self) -> String {
        format!("{:.1} ({:.1}..{:.1})", self.median, self.p10, self.p90)
    }
}

/// The `q` quantile of `values`, interpolated between the nearest two.
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let at = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (low, high) = (at.floor() as usize, at.ceil() as usize);
    v[low] + (v[high] - v[low]) * (at - low as f64)
}

/// A way's figures, in milliseconds.
struct Figures {
    resign: Spread,
    stop_excess: Spread,
    stop: Spread,
    expiry: Spread,
}

impl Team {
    fn figures(&self) -> Figures {
        let ttl_ms = self.ttl.as_secs_f64() * 1e3;
        let excess: Vec<f64> = self.stop_ms.iter().map(|ms| ms - ttl_ms).collect();
        Figures {
            resign: Spread::of(&self.resign_ms),
            stop_excess: Spread::of(&excess),
            stop: Spread::of(&self.stop_ms),
            expiry: Spread::of(&self.expiry_ms),
        }
    }
}

/// A fault, injected on a way's servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Restart,
    Connections,
}

impl Fault {
    const ALL: [Fault; 2] = [Fault::Restart, Fault::Connections];

    fn name(self) -> &'static str {
        match self {
            Fault::Restart => "restart",
            Fault::Connections => "connections",
        }
    }

    /// Injects the fault on `servers` (a way's); returns when it ended, in
    /// microseconds since the epoch.
    async fn inject(self, servers: &mut [RedisServer], round: u32) -> anyhow::Result<u64> {
        match self {
            Fault::Restart => {
                let at = round as usize % servers.len();
                tokio::task::block_in_place(|| servers[at].restart())
                    .context("restarting a redis-server")?;
            }
            Fault::Connections => {
                for kill in 0..KILLS {
                    if kill > 0 {
                        tokio::time::sleep(KILL_EVERY).await;
                    }
                    for server in servers.iter() {
                        tokio::task::block_in_place(|| {
                            server.command(&["CLIENT", "KILL", "TYPE", "normal"])
                        })
                        .context("killing a redis-server's connections")?;
                    }
                }
            }
        }
        Ok(now_us())
    }
}

/// One fault round's outcome.
struct FaultRound {
    round: u32,
    fault: Fault,
    /// Errors returned to the candidates during the round.
    errors: usize,
    /// The terms lost during the round, with their causes.
    lost: Vec<String>,
    /// From the fault's end to the next election; `None`: the leader kept
    /// its term.
    to_elected_ms: Option<f64>,
}

impl FaultRound {
    fn json(&self) -> serde_json::Value {
        json!({
            "round": self.round,
            "fault": self.fault.name(),
            "errors": self.errors,
            "lost_terms": self.lost.len(),
            "lost": self.lost,
            "fault_end_to_elected_ms": self.to_elected_ms.map(round3),
        })
    }
}

/// A way's figures under one fault, over rounds.
struct FaultFigures {
    fault: Fault,
    rounds: usize,
    errors: usize,
    lost_terms: usize,
    kept: usize,
    to_elected: Spread,
}

impl Team {
    fn fault_figures(&self) -> Vec<FaultFigures> {
        Fault::ALL
            .iter()
            .map(|&fault| {
                let rounds: Vec<&FaultRound> =
                    self.faults.iter().filter(|r| r.fault == fault).collect();
                let elected: Vec<f64> = rounds.iter().filter_map(|r| r.to_elected_ms).collect();
                FaultFigures {
                    fault,
                    rounds: rounds.len(),
                    errors: rounds.iter().map(|r| r.errors).sum(),
                    lost_terms: rounds.iter().map(|r| r.lost.len()).sum(),
                    kept: rounds.len() - elected.len(),
                    to_elected: Spread::of(&elected),
                }
            })
            .filter(|f| f.rounds > 0)
            .collect()
    }
}

impl FaultFigures {
    fn json(&self) -> serde_json::Value {
        json!({
            "rounds": self.rounds,
            "errors": self.errors,
            "lost_terms": self.lost_terms,
            "kept": self.kept,
            "fault_end_to_elected_ms": self.to_elected.json(),
        })
    }
}

fn met(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn report(teams: &[Team], args: &LeaderArgs) {
    let ttl_ms = args.ttl.as_secs_f64() * 1e3;
    let figures: Vec<Figures> = teams.iter().map(Team::figures).collect();
    let by_way = |way| teams.iter().position(|t| t.way == way).map(|i| &figures[i]);
    let ratios = by_way(LeaderWay::Poll)
        .zip(by_way(LeaderWay::Handoff))
        .map(|(poll, handoff)| {
            (
                handoff.resign.median / poll.resign.median,
                handoff.stop.median / poll.stop.median,
                handoff.expiry.median / poll.expiry.median,
            )
        });
    if args.json {
        for (team, f) in teams.iter().zip(&figures) {
            println!(
                "{}",
                json!({
                    "bench": "leader",
                    "way": team.way.name(),
                    "candidates": CANDIDATES,
                    "rounds": args.rounds,
                    "ttl_ms": ttl_ms,
                    "resign_ms": f.resign.json(),
                    "stop_excess_ms": f.stop_excess.json(),
                    "expiry_to_elected_ms": f.expiry.json(),
                    "resign_target_met": f.resign.median <= RESIGN_TARGET_MS,
                    "stop_target_met": f.stop_excess.median <= STOP_TARGET_EXCESS_MS,
                    "redone": team.redone,
                    "fences": team.fences,
                    "handovers": team.handovers.iter().map(Handover::json).collect::<Vec<_>>(),
                    "errors": team.errors.len(),
                    "error_texts": team.errors,
                    "errors_target_met": team.errors.is_empty(),
                    "lost_terms": team.lost.len(),
                    "faults": team
                        .fault_figures()
                        .iter()
                        .map(|f| (f.fault.name().to_owned(), f.json()))
                        .collect::<serde_json::Map<_, _>>(),
                    "fault_rounds": team.faults.iter().map(FaultRound::json).collect::<Vec<_>>(),
                })
            );
        }
        if let Some((resign, stop, expiry)) = ratios {
            println!(
                "{}",
                json!({
                    "bench": "leader",
                    "ratio": "handoff/poll",
                    "resign": round3(resign),
                    "stop": round3(stop),
                    "expiry_to_elected": round3(expiry),
                })
            );
        }
        return;
    }
    println!(
        "bench leader: {CANDIDATES} candidate processes per way, term TTL {}, {} rounds (ms: median (p10..p90))",
        humantime::format_duration(args.ttl),
        args.rounds
    );
    println!(
        "{:<8} {:>22} {:>26} {:>22}",
        "way", "resigned -> elected", "stopped -> elected - TTL", "expiry -> elected"
    );
    for (team, f) in teams.iter().zip(&figures) {
        println!(
            "{:<8} {:>22} {:>26} {:>22}",
            team.way.name(),
            f.resign.text(),
            f.stop_excess.text(),
            f.expiry.text()
        );
    }
    if let Some((resign, stop, expiry)) = ratios {
        println!(
            "handoff / poll (of the medians): resigned {resign:.3}, stopped {stop:.3}, expiry -> elected {expiry:.3}"
        );
    }
    if teams.iter().any(|t| !t.faults.is_empty()) {
        println!(
            "{:<8} {:<12} {:>6} {:>6} {:>10} {:>5} {:>26}",
            "way", "fault", "rounds", "errors", "lost terms", "kept", "fault end -> elected"
        );
        for team in teams {
            for f in team.fault_figures() {
                println!(
                    "{:<8} {:<12} {:>6} {:>6} {:>10} {:>5} {:>26}",
                    team.way.name(),
                    f.fault.name(),
                    f.rounds,
                    f.errors,
                    f.lost_terms,
                    f.kept,
                    if f.kept == f.rounds {
                        "- (term kept)".to_owned()
                    } else {
                        f.to_elected.text()
                    }
                );
            }
        }
    }
    for (team, f) in teams.iter().zip(&figures) {
        println!(
            "{}: resigned leader replaced in {:.1} ms (target 50 ms: {}); stopped leader in TTL {:+.1} ms (target TTL + 100 ms: {})",
            team.way.name(),
            f.resign.median,
            met(f.resign.median <= RESIGN_TARGET_MS),
            f.stop_excess.median,
            met(f.stop_excess.median <= STOP_TARGET_EXCESS_MS)
        );
        println!(
            "{}: {} errors returned to the candidates in the whole run (target 0: {}); {} terms lost",
            team.way.name(),
            team.errors.len(),
            met(team.errors.is_empty()),
            team.lost.len()
        );
        for error in &team.errors {
            println!("{}: error: {error}", team.way.name());
        }
        if team.redone > 0 {
            println!(
                "{}: {} measurements redone (the leader lost its term on its own first)",
                team.way.name(),
                team.redone
            );
        }
    }
}

/// One measured change of leader.
struct Handover {
    round: u32,
    kind: &'static str,
    from: u32,
    to: u32,
    from_fence: u64,
    to_fence: u64,
}

impl Handover {
    fn json(&self) -> serde_json::Value {
        json!({
            "round": self.round,
            "kind": self.kind,
            "from": format!("c{}", self.from),
            "to": format!("c{}", self.to),
            "from_fence": self.from_fence,
            "to_fence": self.to_fence,
        })
    }
}

/// What a candidate's stdout says: an event, or that it closed.
enum Line {
    Event(Event),
    Closed,
}

/// A candidate process.
struct Member {
    id: u32,
    child: Child,
    stdin: ChildStdin,
    /// The last lines of its stderr, once it closes.
    stderr: JoinHandle<String>,
}

/// One way's candidates, and what was measured of them.
struct Team {
    way: LeaderWay,
    spec: Spec,
    ttl: Duration,
    /// The election's lock key.
    lock: String,
    /// A connection to each of the way's servers, to read the lock's PTTL.
    nodes: Vec<MultiplexedConnection>,
    members: Vec<Member>,
    sender: mpsc::UnboundedSender<(u32, Line)>,
    events: mpsc::UnboundedReceiver<(u32, Line)>,
    next_id: u32,
    /// Who leads, as the events say, with its term's fence.
    leader: Option<(u32, u64)>,
    /// Every term's fence, in order.
    fences: Vec<u64>,
    handovers: Vec<Handover>,
    resign_ms: Vec<f64>,
    stop_ms: Vec<f64>,
    expiry_ms: Vec<f64>,
    redone: u32,
    violations: Vec<String>,
    /// Every error a candidate reported, as `c<id>: <call>: <error>`.
    errors: Vec<String>,
    /// Every term lost, in any round, as `c<id>: <cause>`.
    lost: Vec<String>,
    faults: Vec<FaultRound>,
}

impl Team {
    async fn start(way: LeaderWay, urls: Vec<String>, ttl: Duration) -> anyhow::Result<Team> {
        let election = format!("bench-{}", way.name());
        let lock = FencedKeys::for_resource(&format!("leader:{election}"))?
            .lock()
            .to_owned();
        let nodes = connect(&urls).await?;
        let (sender, events) = mpsc::unbounded_channel();
        let mut team = Team {
            way,
            spec: Spec {
                way,
                urls,
                election,
                candidate: String::new(),
                ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            },
            ttl,
            lock,
            nodes,
            members: Vec::new(),
            sender,
            events,
            next_id: 0,
            leader: None,
            fences: Vec::new(),
            handovers: Vec::new(),
            resign_ms: Vec::new(),
            stop_ms: Vec::new(),
            expiry_ms: Vec::new(),
            redone: 0,
            violations: Vec::new(),
            errors: Vec::new(),
            lost: Vec::new(),
            faults: Vec::new(),
        };
        let mut waiting = Vec::new();
        for _ in 0..CANDIDATES {
            waiting.push(team.spawn().await?);
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        while !waiting.is_empty() {
            if let (id, Event::Ready) = team.next_event(deadline).await? {
                waiting.retain(|w| *w != id);
            }
        }
        team.wait_for_leader().await?;
        Ok(team)
    }

    /// How long any one awaited event may take: a hang detector, not a
    /// measurement.
    fn hang(&self) -> Duration {
        self.ttl * 3 + Duration::from_secs(10)
    }

    /// Starts a candidate process; returns its id.
    async fn spawn(&mut self) -> anyhow::Result<u32> {
        let id = self.next_id;
        self.next_id += 1;
        let spec = Spec {
            candidate: format!("c{id}"),
            ..self.spec.clone()
        };
        let child = child::spawn(&["bench", "leader-candidate"], "candidate", &spec).await?;
        let stdout = child.stdout;
        let sender = self.sender.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(event) = Event::parse(&line) {
                    let _ = sender.send((id, Line::Event(event)));
                }
            }
            let _ = sender.send((id, Line::Closed));
        });
        self.members.push(Member {
            id,
            child: child.process,
            stdin: child.stdin,
            stderr: child.stderr,
        });
        Ok(id)
    }

    /// The next event of a live candidate before `until`, if any, with the
    /// team's view of who leads updated. A candidate that exits is an
    /// error (those the bench kills are no longer members).
    async fn pump(&mut self, until: Instant) -> anyhow::Result<Option<(u32, Event)>> {
        loop {
            let Ok(received) = tokio::time::timeout_at(until, self.events.recv()).await else {
                return Ok(None);
            };
            let (id, line) = received.context("the candidates' event channel closed")?;
            let Some(at) = self.members.iter().position(|m| m.id == id) else {
                continue;
            };
            let event = match line {
                Line::Closed => {
                    let member = self.members.remove(at);
                    let stderr = member.stderr.await.unwrap_or_default();
                    anyhow::bail!("{} candidate c{id} exited: {stderr}", self.way.name());
                }
                Line::Event(event) => event,
            };
            self.observe(id, &event);
            return Ok(Some((id, event)));
        }
    }

    fn observe(&mut self, id: u32, event: &Event) {
        match *event {
            Event::Elected { fence, .. } => {
                if let Some(&last) = self.fences.last()
                    && fence <= last
                {
                    self.violations.push(format!(
                        "c{id} was elected with fence {fence}, not above the last term's {last}"
                    ));
                }
                self.fences.push(fence);
                self.leader = Some((id, fence));
            }
            Event::Resigned { .. } | Event::Lost { .. } | Event::Error { .. } => {
                if self.leader.is_some_and(|(leader, _)| leader == id) {
                    self.leader = None;
                }
                match event {
                    Event::Lost { cause, .. } => self.lost.push(format!("c{id}: {cause}")),
                    Event::Error { text, .. } => self.errors.push(format!("c{id}: {text}")),
                    _ => {}
                }
            }
            Event::Ready => {}
        }
    }

    async fn next_event(&mut self, deadline: Instant) -> anyhow::Result<(u32, Event)> {
        self.pump(deadline).await?.with_context(|| {
            format!(
                "{}: no candidate event within {:?}",
                self.way.name(),
                self.hang()
            )
        })
    }

    async fn wait_for_leader(&mut self) -> anyhow::Result<(u32, u64)> {
        let deadline = Instant::now() + self.hang();
        loop {
            if let Some(leader) = self.leader {
                return Ok(leader);
            }
            self.next_event(deadline).await?;
        }
    }

    /// Lets `SETTLE + extra` pass, taking the events meanwhile; returns who
    /// leads then.
    async fn settle(&mut self, extra: Duration) -> anyhow::Result<(u32, u64)> {
        let until = Instant::now() + SETTLE + extra;
        while self.pump(until).await?.is_some() {}
        self.wait_for_leader().await
    }

    async fn send(&mut self, id: u32, line: &str) -> anyhow::Result<()> {
        let member = self
            .members
            .iter_mut()
            .find(|m| m.id == id)
            .context("no such candidate")?;
        member
            .stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .with_context(|| format!("telling candidate c{id} to {line}"))
    }

    fn redo(&mut self, spoiled: &mut u32) -> anyhow::Result<()> {
        self.redone += 1;
        *spoiled += 1;
        anyhow::ensure!(
            *spoiled < SPOILED_IN_A_ROW,
            "{}: the leader lost its term on its own {SPOILED_IN_A_ROW} times in a row (is the machine overloaded for this TTL?)",
            self.way.name()
        );
        Ok(())
    }

    /// The leader resigns; another takes over.
    async fn resign_round(&mut self, round: u32) -> anyhow::Result<()> {
        let mut spoiled = 0;
        loop {
            let (leader, fence) = self.settle(Duration::ZERO).await?;
            self.send(leader, &format!("resign {fence}")).await?;
            let deadline = Instant::now() + self.hang();
            let (mut resigned, mut elected, mut lost) = (None, None, false);
            while !lost && (resigned.is_none() || elected.is_none()) {
                match self.next_event(deadline).await? {
                    (id, Event::Resigned { before_us, .. }) if id == leader => {
                        resigned = Some(before_us);
                    }
                    (id, Event::Lost { .. } | Event::Error { .. }) if id == leader => lost = true,
                    (id, Event::Elected { fence, at_us }) if id != leader && elected.is_none() => {
                        elected = Some((id, fence, at_us));
                    }
                    _ => {}
                }
            }
            // A candidate still campaigning ignores it.
            self.send(leader, "campaign").await?;
            let (Some(before_us), Some((to, to_fence, at_us)), false) = (resigned, elected, lost)
            else {
                self.redo(&mut spoiled)?;
                continue;
            };
            self.resign_ms.push(micros_between(before_us, at_us));
            self.handovers.push(Handover {
                round,
                kind: "resign",
                from: leader,
                to,
                from_fence: fence,
                to_fence,
            });
            return Ok(());
        }
    }

    /// The leader is stopped at a random moment of its watchdog's period;
    /// another takes over when its lease runs out. Then the stopped one is
    /// killed and a fresh candidate joins.
    async fn stop_round(&mut self, round: u32) -> anyhow::Result<()> {
        let mut spoiled = 0;
        loop {
            let phase = rand::rng().random_range(Duration::ZERO..self.ttl / 3);
            let (leader, fence) = self.settle(phase).await?;
            let pid = self
                .members
                .iter()
                .find(|m| m.id == leader)
                .and_then(|m| m.child.id())
                .context("the leader's process id")?;
            let stopped_us = now_us();
            tokio::task::spawn_blocking(move || leasehold_testkit::pause_process(pid))
                .await
                .context("stopping the leader")?
                .context("stopping the leader")?;
            let expiry_us = self.lock_expiry().await?;
            let deadline = Instant::now() + self.hang();
            let (mut elected, mut lost) = (None, false);
            while elected.is_none() {
                match self.next_event(deadline).await? {
                    // Printed before the stop: the term was over already.
                    (id, Event::Lost { .. }) if id == leader => lost = true,
                    (id, Event::Elected { fence, at_us }) if id != leader => {
                        elected = Some((id, fence, at_us));
                    }
                    _ => {}
                }
            }
            self.replace(leader).await?;
            let Some((to, to_fence, at_us)) = elected.filter(|_| !lost) else {
                self.redo(&mut spoiled)?;
                continue;
            };
            self.stop_ms.push(micros_between(stopped_us, at_us));
            self.expiry_ms.push(micros_between(expiry_us, at_us));
            self.handovers.push(Handover {
                round,
                kind: "stop",
                from: leader,
                to,
                from_fence: fence,
                to_fence,
            });
            return Ok(());
        }
    }

    /// A fault on the way's `servers` while the leader leads and the others
    /// campaign; then waits for the next election, or for the leader to
    /// have kept its term.
    async fn fault_round(
        &mut self,
        round: u32,
        fault: Fault,
        servers: &mut [RedisServer],
    ) -> anyhow::Result<()> {
        let (leader, fence) = self.settle(Duration::ZERO).await?;
        let (errors, lost) = (self.errors.len(), self.lost.len());
        let ended_us = fault.inject(servers, round).await?;
        let kept_by = Instant::now() + self.ttl + KEPT_MARGIN;
        let hang = Instant::now() + self.hang();
        let elected_us = loop {
            let leading = self.leader == Some((leader, fence));
            if leading && Instant::now() >= kept_by {
                break None;
            }
            match self.pump(if leading { kept_by } else { hang }).await? {
                Some((_, Event::Elected { at_us, .. })) => break Some(at_us),
                Some(_) => {}
                None => anyhow::ensure!(
                    leading,
                    "{}: no leader elected within {:?} of a {} fault",
                    self.way.name(),
                    self.hang(),
                    fault.name()
                ),
            }
        };
        // The old leader may find its term lost after another's election.
        while self.pump(kept_by).await?.is_some() {}
        // The fault ended the bench's own connections too.
        self.nodes = connect(&self.spec.urls).await?;
        self.faults.push(FaultRound {
            round,
            fault,
            errors: self.errors.len() - errors,
            lost: self.lost[lost..].to_vec(),
            to_elected_ms: elected_us.map(|at_us| micros_between(ended_us, at_us)),
        });
        Ok(())
    }

    /// Kills candidate `id` (stopped) and starts a fresh one.
    async fn replace(&mut self, id: u32) -> anyhow::Result<()> {
        if let Some(at) = self.members.iter().position(|m| m.id == id) {
            let mut member = self.members.remove(at);
            member
                .child
                .kill()
                .await
                .context("killing a stopped candidate")?;
        }
        let fresh = self.spawn().await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let (id, Event::Ready) = self.next_event(deadline).await?
                && id == fresh
            {
                return Ok(());
            }
        }
    }

    /// When the election's lock expires, in microseconds since the epoch,
    /// as its `PTTL` says now; for a quorum, when a majority of nodes have
    /// let it go.
    async fn lock_expiry(&mut self) -> anyhow::Result<u64> {
        let mut expiries = Vec::new();
        for node in &mut self.nodes {
            let asked = now_us();
            let pttl: i64 = redis::cmd("PTTL")
                .arg(&self.lock)
                .query_async(node)
                .await
                .context("reading the lock's PTTL")?;
            expiries.push(asked + u64::try_from(pttl.max(0)).unwrap_or(0) * 1000);
        }
        expiries.sort_unstable();
        Ok(expiries[expiries.len() / 2])
    }
}

/// A connection to each of `urls`.
async fn connect(urls: &[String]) -> anyhow::Result<Vec<MultiplexedConnection>> {
    let mut nodes = Vec::new();
    for url in urls {
        let client = redis::Client::open(url.as_str())?;
        nodes.push(
            client
                .get_multiplexed_async_connection()
                .await
                .with_context(|| format!("connecting to {url}"))?,
        );
    }
    Ok(nodes)
}

/// Milliseconds from `from` to `to`, both in microseconds since the epoch.
fn micros_between(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        let v = [3.0, 1.0, 2.0, 4.0, 5.0];
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 1.0), 5.0);
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert!((quantile(&v, 0.1) - 1.4).abs() < 1e-9);
        assert!(quantile(&[], 0.5).is_nan());
        assert_eq!(quantile(&[7.0], 0.9), 7.0);
    }
}
