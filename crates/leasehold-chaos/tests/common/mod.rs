//! Hand-made histories for the checker, report and timeline tests, and
//! an in-memory account for the harness tests ([`account`]).
#![allow(dead_code, unreachable_pub)]

pub mod account;

use leasehold_chaos::{Event, Kind, WriteOutcome};

/// A history under construction; timestamps are data, in microseconds.
pub struct History {
    pub events: Vec<Event>,
    op: u64,
}

pub const KEY: &str = "lock:{wallet:1}";
pub const WALLET: &str = "wallet:1";

impl History {
    /// A history with a header over `initial`.
    pub fn new(mode: &str, fault: &str, control: bool, initial: &[(&str, i64)]) -> History {
        let mut h = History::headless();
        h.push(
            0,
            "coordinator",
            Kind::Run {
                mode: mode.into(),
                fault: fault.into(),
                seed: 7,
                ttl_ms: 100,
                control,
                reported_only: false,
                initial: initial.iter().map(|(r, b)| ((*r).into(), *b)).collect(),
            },
        );
        h
    }

    /// One wallet of 100.
    pub fn wallet(mode: &str, fault: &str, control: bool) -> History {
        History::new(mode, fault, control, &[(WALLET, 100)])
    }

    pub fn headless() -> History {
        History {
            events: Vec::new(),
            op: 0,
        }
    }

    pub fn push(&mut self, at_us: u64, actor: &str, kind: Kind) -> &mut History {
        self.events.push(Event {
            at_us,
            actor: actor.into(),
            kind,
        });
        self
    }

    fn op(&mut self) -> u64 {
        self.op += 1;
        self.op
    }

    /// An acquire at `at_us` granted 10 µs later.
    pub fn acquired(&mut self, at_us: u64, actor: &str, token: &str, fence: u64) -> &mut History {
        let op = self.op();
        self.push(
            at_us,
            actor,
            Kind::Acquire {
                op,
                key: KEY.into(),
            },
        );
        self.push(
            at_us + 10,
            actor,
            Kind::Acquired {
                op,
                key: KEY.into(),
                token: token.into(),
                fence: Some(fence),
            },
        )
    }

    pub fn released(&mut self, at_us: u64, actor: &str, token: &str) -> &mut History {
        self.push(
            at_us,
            actor,
            Kind::Released {
                key: KEY.into(),
                token: token.into(),
                outcome: "released".into(),
            },
        )
    }

    pub fn lost(&mut self, at_us: u64, actor: &str, token: &str) -> &mut History {
        self.push(
            at_us,
            actor,
            Kind::Lost {
                key: KEY.into(),
                token: token.into(),
                cause: "expired".into(),
            },
        )
    }

    /// A write on wallet:1 completing at `at_us`, started 5 µs earlier.
    pub fn write(
        &mut self,
        at_us: u64,
        actor: &str,
        amount: i64,
        fence: u64,
        outcome: WriteOutcome,
    ) -> &mut History {
        let op = self.op();
        self.push(
            at_us,
            actor,
            Kind::Write {
                op,
                started_us: at_us.saturating_sub(5),
                key: KEY.into(),
                resource: WALLET.into(),
                amount,
                fence: Some(fence),
                outcome,
                detail: (outcome == WriteOutcome::Unknown).then(|| "connection reset".into()),
            },
        )
    }

    pub fn fault(&mut self, from_us: u64, to_us: u64, fault: &str, target: &str) -> &mut History {
        self.push(
            from_us,
            "nemesis",
            Kind::FaultStart {
                fault: fault.into(),
                target: target.into(),
            },
        );
        self.push(
            to_us,
            "nemesis",
            Kind::FaultEnd {
                fault: fault.into(),
                target: target.into(),
            },
        )
    }

    pub fn final_state(
        &mut self,
        at_us: u64,
        resource: &str,
        balance: i64,
        ledger_sum: i64,
        ledger_rows: u64,
    ) -> &mut History {
        self.push(
            at_us,
            "checker",
            Kind::Final {
                resource: resource.into(),
                balance,
                ledger_sum,
                ledger_rows,
            },
        )
    }

    /// A clean fenced run: w0.t0 then w0.t1 each hold the lock and debit 10.
    pub fn clean() -> History {
        let mut h = History::wallet("fenced-cas", "none", false);
        h.acquired(100, "w0.t0", "aaaa", 1)
            .write(200, "w0.t0", 10, 1, WriteOutcome::Accepted)
            .released(300, "w0.t0", "aaaa")
            .acquired(400, "w0.t1", "bbbb", 2)
            .write(500, "w0.t1", 10, 2, WriteOutcome::Accepted)
            .released(600, "w0.t1", "bbbb")
            .final_state(1000, WALLET, 80, 20, 2);
        h
    }

    /// A process pause: w0.t0's lease expires while it is paused, w1.t0
    /// takes the lock, w0.t0 wakes and writes with its old fence, the
    /// database refuses it. One overlap, no violation.
    pub fn saved_by_the_fence() -> History {
        let mut h = History::wallet("fenced-cas", "process-pause", false);
        h.acquired(100, "w0.t0", "aaaa", 1)
            .fault(150, 5_000, "process-pause", "w0")
            .acquired(1_000, "w1.t0", "bbbb", 2)
            .write(1_200, "w1.t0", 10, 2, WriteOutcome::Accepted)
            .released(1_300, "w1.t0", "bbbb")
            .write(5_100, "w0.t0", 10, 1, WriteOutcome::RefusedStale)
            .lost(5_200, "w0.t0", "aaaa")
            .final_state(6_000, WALLET, 90, 10, 1);
        h
    }
}

/// A throughput dip: one caller's accepted writes every 10 ms from 10 ms
/// to 2 s (100/s), a Redis pause from 2 s to 2.5 s with no write, then
/// writes every 10 ms again from 2.5 s + `gap_us` to 4 s. With a 100 ms
/// TTL the window is 250 ms and 20 writes in it are 80%: recovery is
/// `gap_us` after the fault's end.
pub fn dip(gap_us: u64) -> History {
    let mut h = History::new("fenced-cas", "redis-pause", false, &[(WALLET, 1_000_000)]);
    let mut accepted = 0;
    let mut t = 10_000;
    while t < 2_000_000 {
        h.write(t, "w0.t0", 1, 1, WriteOutcome::Accepted);
        accepted += 1;
        t += 10_000;
    }
    h.fault(2_000_000, 2_500_000, "redis-pause", "redis");
    let mut t = 2_500_000 + gap_us;
    while t < 4_000_000 {
        h.write(t, "w0.t0", 1, 1, WriteOutcome::Accepted);
        accepted += 1;
        t += 10_000;
    }
    h.final_state(
        4_100_000,
        WALLET,
        1_000_000 - accepted,
        accepted,
        accepted as u64,
    );
    h
}

/// A plausible three-second run of four callers taking turns on one
/// wallet, 50 ms each with two debits per turn: a process pause on `w1`
/// from 1 s to 1.6 s freezes w1.t1 holding the lock (taken at 0.97 s); its
/// lease expires, the others go on, and when it wakes its stale write is
/// refused. A Redis
/// pause from 2.2 s to 2.4 s makes acquires give up and one write's
/// outcome unknown.
pub fn sample() -> History {
    let callers = ["w0.t0", "w0.t1", "w1.t0", "w1.t1"];
    let mut h = History::new("fenced-cas", "process-pause", false, &[(WALLET, 10_000)]);
    let mut balance = 10_000;
    let mut rows = 0;
    let mut fence = 0;
    let mut turn = 0usize;
    let mut t = 20_000;
    h.fault(1_000_000, 1_600_000, "process-pause", "w1");
    h.fault(2_200_000, 2_400_000, "redis-pause", "redis");
    while t < 3_000_000 {
        if (2_200_000..2_400_000).contains(&t) {
            // Redis paused: acquires give up.
            let op = 1_000 + turn as u64;
            let actor = callers[turn % callers.len()];
            h.push(
                t,
                actor,
                Kind::Acquire {
                    op,
                    key: KEY.into(),
                },
            );
            h.push(
                t + 40_000,
                actor,
                Kind::AcquireFailed {
                    op,
                    key: KEY.into(),
                    reason: "deadline".into(),
                },
            );
            turn += 1;
            t += 50_000;
            continue;
        }
        let actor = callers[turn % callers.len()];
        turn += 1;
        if actor.starts_with("w1.") && (1_000_000..1_600_000).contains(&t) {
            continue;
        }
        fence += 1;
        let token = format!("t{fence:03x}");
        h.acquired(t, actor, &token, fence);
        if t == 970_000 {
            // Paused with the rest of w1 until 1.6 s.
            h.write(1_600_200, actor, 5, fence, WriteOutcome::RefusedStale)
                .lost(1_600_400, actor, &token);
            t += 120_000;
            continue;
        }
        // The first turn after the Redis pause loses a COMMIT's answer.
        let outcome_2 = if (2_400_000..2_450_000).contains(&t) {
            WriteOutcome::Unknown
        } else {
            WriteOutcome::Accepted
        };
        h.write(t + 15_000, actor, 5, fence, WriteOutcome::Accepted);
        h.write(t + 30_000, actor, 5, fence, outcome_2);
        balance -= 10;
        rows += 2;
        h.released(t + 40_000, actor, &token);
        t += 50_000;
    }
    h.final_state(3_100_000, WALLET, balance, 10_000 - balance, rows);
    h
}

/// A 15 s run of four callers taking turns (100 ms each, one debit per
/// turn) under ten fault windows, several close together (the case whose
/// labels used to print over each other), with one stale write refused
/// after the first pause.
pub fn fifteen_seconds_ten_faults() -> History {
    let callers = ["w0.t0", "w0.t1", "w1.t0", "w1.longer-caller-name"];
    let mut h = History::new("fenced-cas", "mixed", false, &[(WALLET, 100_000)]);
    let windows: [(u64, u64, &str, &str); 10] = [
        (1_000, 1_600, "process-pause", "w1"),
        (1_250, 1_500, "redis-pause", "redis"),
        (1_400, 2_200, "network-partition", "w0"),
        (2_000, 2_100, "redis-restart", "redis"),
        (5_000, 5_800, "process-pause", "w0"),
        (5_100, 5_300, "clock-jump", "redis"),
        (9_000, 9_400, "redis-pause", "redis"),
        (12_000, 12_900, "network-delay", "w1"),
        (14_200, 14_600, "process-pause", "w1"),
        (14_800, 15_000, "redis-restart", "redis"),
    ];
    for (from_ms, to_ms, fault, target) in windows {
        h.fault(from_ms * 1_000, to_ms * 1_000, fault, target);
    }
    let mut balance = 100_000;
    let mut rows = 0;
    for turn in 0..150u64 {
        let actor = callers[(turn % 4) as usize];
        let t = turn * 100_000;
        let token = format!("t{turn:03}");
        h.acquired(t, actor, &token, turn + 1);
        if turn == 9 {
            h.write(1_650_000, actor, 7, turn + 1, WriteOutcome::RefusedStale)
                .lost(1_660_000, actor, &token);
            continue;
        }
        h.write(t + 50_000, actor, 7, turn + 1, WriteOutcome::Accepted)
            .released(t + 90_000, actor, &token);
        balance -= 7;
        rows += 1;
    }
    h.final_state(15_000_000, WALLET, balance, 100_000 - balance, rows);
    h
}
