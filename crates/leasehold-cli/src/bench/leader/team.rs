//! A way's team: its candidate processes, the events they print, who
//! leads as those say, and what the rounds measured of them.

use std::time::Duration;

use anyhow::Context;
use leasehold::FencedKeys;
use redis::aio::MultiplexedConnection;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::CANDIDATES;
use super::candidate::{Event, Spec, now_us};
use super::rounds::{FaultRound, Handover};
use crate::child;
use crate::cli::LeaderWay;

/// How long a team settles before each measurement.
const SETTLE: Duration = Duration::from_millis(200);

/// How long a candidate may take to start and connect.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Measurements spoiled in a row (a term lost on its own each time)
/// before the bench gives up.
const SPOILED_IN_A_ROW: u32 = 5;

/// What a candidate's stdout says: an event, or that it closed.
enum Line {
    Event(Event),
    Closed,
}

/// A candidate process.
pub(super) struct Member {
    pub(super) id: u32,
    pub(super) child: Child,
    stdin: ChildStdin,
    /// The last lines of its stderr, once it closes.
    stderr: JoinHandle<String>,
}

/// One way's candidates, and what was measured of them.
pub(super) struct Team {
    pub(super) way: LeaderWay,
    pub(super) spec: Spec,
    pub(super) ttl: Duration,
    /// The election's lock key.
    lock: String,
    /// A connection to each of the way's servers, to read the lock's PTTL.
    pub(super) nodes: Vec<MultiplexedConnection>,
    pub(super) members: Vec<Member>,
    sender: mpsc::UnboundedSender<(u32, Line)>,
    events: mpsc::UnboundedReceiver<(u32, Line)>,
    next_id: u32,
    /// Who leads, as the events say, with its term's fence.
    pub(super) leader: Option<(u32, u64)>,
    /// Every term's fence, in order.
    pub(super) fences: Vec<u64>,
    pub(super) handovers: Vec<Handover>,
    pub(super) resign_ms: Vec<f64>,
    pub(super) stop_ms: Vec<f64>,
    pub(super) expiry_ms: Vec<f64>,
    pub(super) redone: u32,
    pub(super) violations: Vec<String>,
    /// Every error a candidate reported, as `c<id>: <call>: <error>`.
    pub(super) errors: Vec<String>,
    /// Every term lost, in any round, as `c<id>: <cause>`.
    pub(super) lost: Vec<String>,
    pub(super) faults: Vec<FaultRound>,
}

impl Team {
    pub(super) async fn start(
        way: LeaderWay,
        urls: Vec<String>,
        ttl: Duration,
    ) -> anyhow::Result<Team> {
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
    pub(super) fn hang(&self) -> Duration {
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
    pub(super) async fn pump(&mut self, until: Instant) -> anyhow::Result<Option<(u32, Event)>> {
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

    pub(super) async fn next_event(&mut self, deadline: Instant) -> anyhow::Result<(u32, Event)> {
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
    pub(super) async fn settle(&mut self, extra: Duration) -> anyhow::Result<(u32, u64)> {
        let until = Instant::now() + SETTLE + extra;
        while self.pump(until).await?.is_some() {}
        self.wait_for_leader().await
    }

    pub(super) async fn send(&mut self, id: u32, line: &str) -> anyhow::Result<()> {
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

    pub(super) fn redo(&mut self, spoiled: &mut u32) -> anyhow::Result<()> {
        self.redone += 1;
        *spoiled += 1;
        anyhow::ensure!(
            *spoiled < SPOILED_IN_A_ROW,
            "{}: the leader lost its term on its own {SPOILED_IN_A_ROW} times in a row (is the machine overloaded for this TTL?)",
            self.way.name()
        );
        Ok(())
    }

    /// Kills candidate `id` (stopped) and starts a fresh one.
    pub(super) async fn replace(&mut self, id: u32) -> anyhow::Result<()> {
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
    pub(super) async fn lock_expiry(&mut self) -> anyhow::Result<u64> {
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
pub(super) async fn connect(urls: &[String]) -> anyhow::Result<Vec<MultiplexedConnection>> {
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
