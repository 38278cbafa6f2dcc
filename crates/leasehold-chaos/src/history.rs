//! The history of a run: one [`Event`] per JSON line.
//!
//! Every actor (a caller task in a worker process, the nemesis injecting
//! faults, the checker reading the final state) appends events with a
//! timestamp in microseconds since the run started. Workers run on the same
//! machine as the coordinator and take their timestamps from the system
//! clock against the run's start, so events of different processes can be
//! ordered; the checks allow for the few microseconds this can be off.
//!
//! Operations that take time are recorded as an invocation and a completion
//! carrying the same `op` number (unique per actor), as in Jepsen: an
//! acquire is [`Kind::Acquire`] then [`Kind::Acquired`] or
//! [`Kind::AcquireFailed`]; a write is recorded once it completes, with its
//! start time in `started_us`.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

/// One line of a history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// When, in microseconds since the run started.
    pub at_us: u64,
    /// Who: `w{worker}.t{task}` for a caller, `nemesis` for the fault
    /// injector, `checker` for the final state.
    pub actor: String,
    /// What happened.
    #[serde(flatten)]
    pub kind: Kind,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Kind {
    /// The run's header, written first by the coordinator.
    Run {
        /// The lock mode, e.g. `fenced-cas`.
        mode: String,
        /// The fault schedule's name, e.g. `process-pause` or `none`.
        fault: String,
        /// The seed of the workload and the fault schedule.
        seed: u64,
        /// The lease TTL in milliseconds.
        ttl_ms: u64,
        /// True for a negative control: a mode expected to break under
        /// this fault.
        control: bool,
        /// True when the mode makes no safety claim under this fault (its
        /// violations are reported, not judged); absent means false.
        #[serde(default)]
        reported_only: bool,
        /// The resources (wallets) and their initial balances.
        initial: Vec<(String, i64)>,
    },
    /// A caller starts to acquire the lock on `key`.
    Acquire {
        /// The operation number, unique per actor.
        op: u64,
        /// The lock key.
        key: String,
    },
    /// Redis (or a quorum) confirmed the lease.
    Acquired {
        /// The matching [`Kind::Acquire`]'s number.
        op: u64,
        /// The lock key.
        key: String,
        /// A short, unique label of the lease's token (not the token).
        token: String,
        /// The fencing token, for a fenced lock.
        fence: Option<u64>,
    },
    /// The acquire gave up.
    AcquireFailed {
        /// The matching [`Kind::Acquire`]'s number.
        op: u64,
        /// The lock key.
        key: String,
        /// Why, e.g. `deadline`, `unreachable`.
        reason: String,
    },
    /// The watchdog or the caller extended the lease.
    Refreshed {
        /// The lock key.
        key: String,
        /// The lease's token label.
        token: String,
    },
    /// The holder learnt its lease is gone (refresh refused, or it ran out).
    Lost {
        /// The lock key.
        key: String,
        /// The lease's token label.
        token: String,
        /// Why, e.g. `expired`, `taken`, `unreachable`.
        cause: String,
    },
    /// The holder released (or tried to).
    Released {
        /// The lock key.
        key: String,
        /// The lease's token label.
        token: String,
        /// `released`, `not_held` (the key was gone or another's), or
        /// `error`.
        outcome: String,
    },
    /// A write to the protected state completed (or failed).
    Write {
        /// The operation number, unique per actor.
        op: u64,
        /// When the write started, in microseconds since the run started.
        started_us: u64,
        /// The lock key it was made under (empty for database-only).
        key: String,
        /// The resource written, e.g. `wallet:1`.
        resource: String,
        /// The amount debited.
        amount: i64,
        /// The fencing token it carried, if any.
        fence: Option<u64>,
        /// What the database said.
        outcome: WriteOutcome,
        /// A short reason for `failed` / `unknown` (never a secret).
        detail: Option<String>,
    },
    /// The nemesis starts a fault.
    FaultStart {
        /// The fault, e.g. `redis-pause`.
        fault: String,
        /// What it hits, e.g. `redis`, `w2`.
        target: String,
    },
    /// The nemesis ends a fault (resumed, healed, restarted).
    FaultEnd {
        /// The fault, as in its [`Kind::FaultStart`].
        fault: String,
        /// What it hit.
        target: String,
    },
    /// The final state of one resource, read by the checker after every
    /// worker stopped.
    Final {
        /// The resource, as in [`Kind::Run`]'s `initial`.
        resource: String,
        /// Its balance.
        balance: i64,
        /// The sum of its ledger's amounts.
        ledger_sum: i64,
        /// The number of its ledger rows.
        ledger_rows: u64,
    },
    /// The final state of one resource, judged by the user's own
    /// invariant (the [`Harness`](crate::Harness)'s, for any state that is
    /// not a balance and a ledger: a job counter, a set of rows). It takes
    /// the place of [`Kind::Final`] for that resource.
    ResourceCheck {
        /// The resource, as in [`Kind::Run`]'s `initial`.
        resource: String,
        /// Whether the state is what the committed writes explain.
        ok: bool,
        /// What the check found (never a secret).
        detail: String,
    },
    /// What the callers may spend on one call, recorded by the coordinator
    /// after the header: the errors they are returned are judged against
    /// it (see [`mod@crate::check`]). A history without one is not judged.
    Budget {
        /// How long an acquire waits for the lock, in milliseconds.
        wait_ms: u64,
    },
    /// A call returned an error to its caller that the lock's contention
    /// does not explain: an acquire that failed other than with
    /// `NotAcquired` (the lock stayed busy through the wait), a release
    /// that failed other than with `NotHeld` / `LeaseLost` (Redis said the
    /// lease was gone), or a lease the watchdog gave up on because Redis
    /// did not answer its refreshes before the lease ran out (`LeaseLost`
    /// with cause `unreachable`: the work was stopped though Redis never
    /// said the lease was gone).
    CallerError {
        /// `acquire`, `release` or `refresh`.
        call: String,
        /// The lock key.
        key: String,
        /// The error's kind: `timeout`, `unreachable`, `auth`,
        /// `no_permission`, `quorum_not_reached`, `not_replicated`,
        /// `lease_lost_unreachable` or `other`.
        error: String,
        /// The error's message (the library's messages hold no secret).
        detail: String,
    },
    /// Where the history's clock stands on the system clock, recorded by
    /// the coordinator at the run's start: this event's `at_us` is
    /// `unix_us` microseconds since the Unix epoch. It lets fault windows
    /// marked from outside on the wall clock be placed in the history
    /// (see [`mod@crate::marks`]), during the run or after it.
    WallClock {
        /// The wall-clock time of `at_us`, in microseconds since the Unix
        /// epoch.
        unix_us: u64,
    },
    /// A user-supplied invariant check's verdict (the library harness).
    Invariant {
        /// Whether the state is right.
        ok: bool,
        /// What the check said.
        detail: String,
    },
}

/// What the database said to a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteOutcome {
    /// Committed: the debit happened.
    Accepted,
    /// Refused by the fence or check-and-set: nothing written.
    RefusedStale,
    /// Refused for lack of funds: nothing written.
    Insufficient,
    /// Failed before commit: nothing written.
    Failed,
    /// The outcome is not known (the connection died during `COMMIT`):
    /// the debit may or may not have happened.
    Unknown,
}

/// Why a history could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// Reading or writing failed.
    #[error("history i/o failed")]
    Io(#[from] std::io::Error),
    /// A line is not an event.
    #[error("history line {line} is not an event")]
    Parse {
        /// The 1-based line number.
        line: usize,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
}

/// Writes `events` as JSON lines.
///
/// # Errors
/// [`HistoryError::Io`] when writing fails.
pub fn write_jsonl<W: Write>(mut out: W, events: &[Event]) -> Result<(), HistoryError> {
    for event in events {
        serde_json::to_writer(&mut out, event).map_err(std::io::Error::from)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// Reads a history of JSON lines (blank lines are skipped), sorted by time
/// (stable: events with the same timestamp keep their order).
///
/// # Errors
/// [`HistoryError::Parse`] naming the first line that is not an event,
/// [`HistoryError::Io`] when reading fails.
pub fn read_jsonl<R: BufRead>(input: R) -> Result<Vec<Event>, HistoryError> {
    let mut events = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line).map_err(|source| HistoryError::Parse {
            line: index + 1,
            source,
        })?;
        events.push(event);
    }
    events.sort_by_key(|event: &Event| event.at_us);
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_round_trips_through_json_lines() -> Result<(), HistoryError> {
        let events = vec![
            Event {
                at_us: 5,
                actor: "w0.t1".into(),
                kind: Kind::Acquired {
                    op: 1,
                    key: "lock:{wallet:1}".into(),
                    token: "a1b2".into(),
                    fence: Some(7),
                },
            },
            Event {
                at_us: 9,
                actor: "w0.t1".into(),
                kind: Kind::Write {
                    op: 2,
                    started_us: 6,
                    key: "lock:{wallet:1}".into(),
                    resource: "wallet:1".into(),
                    amount: 10,
                    fence: Some(7),
                    outcome: WriteOutcome::RefusedStale,
                    detail: None,
                },
            },
        ];
        let mut buf = Vec::new();
        write_jsonl(&mut buf, &events)?;
        let text = String::from_utf8_lossy(&buf);
        assert!(text.contains(r#""type":"write""#), "{text}");
        assert!(text.contains(r#""outcome":"refused_stale""#), "{text}");
        assert_eq!(read_jsonl(buf.as_slice())?, events);
        Ok(())
    }

    #[test]
    fn a_line_that_is_not_an_event_is_named() {
        let input = b"{\"at_us\":1,\"actor\":\"nemesis\",\"type\":\"fault_end\",\"fault\":\"x\",\"target\":\"redis\"}\n\nnot json\n";
        match read_jsonl(input.as_slice()) {
            Err(HistoryError::Parse { line, .. }) => assert_eq!(line, 3),
            other => panic!("expected a parse error on line 3, got {other:?}"),
        }
    }
}
