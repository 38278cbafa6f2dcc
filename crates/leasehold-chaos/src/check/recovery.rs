//! Liveness, recovery after a fault (the module docs' "Liveness"): the
//! fault windows, and each one's throughput after against before.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;

use crate::history::{Event, Kind, WriteOutcome};

/// How far before a fault's start its pre-fault rate is measured, at most:
/// 2 s.
pub const PRE_WINDOW_US: u64 = 2_000_000;

/// The smallest recovery window: 250 ms (the window is the TTL when that is
/// longer).
pub const MIN_RECOVERY_WINDOW_US: u64 = 250_000;

/// The share of the pre-fault rate that counts as recovered: 80%.
pub const RECOVERY_FRACTION: f64 = 0.8;

/// How throughput recovered after one fault.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Recovery {
    /// The fault.
    pub fault: String,
    /// What it hit.
    pub target: String,
    /// When it started, if the history says.
    pub started_us: Option<u64>,
    /// When it ended.
    pub ended_us: u64,
    /// Accepted writes per second before the fault (see the module docs).
    pub pre_rate: f64,
    /// The sliding window's width, in microseconds.
    pub window_us: u64,
    /// False when there is no pre-fault rate to compare with (no accepted
    /// write before the fault, or no start).
    pub measurable: bool,
    /// How long after the fault's end throughput was back; `None` when not
    /// measurable or never within the history.
    pub recovered_after_us: Option<u64>,
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}: ", self.fault, self.target)?;
        match (self.measurable, self.recovered_after_us) {
            (false, _) => write!(f, "not measurable (no accepted write before it)"),
            (true, Some(after)) => write!(
                f,
                "throughput back to 80% of {:.1} writes/s {:.1} ms after its end",
                self.pre_rate,
                after as f64 / 1000.0
            ),
            (true, None) => write!(
                f,
                "throughput never back to 80% of {:.1} writes/s within the run",
                self.pre_rate
            ),
        }
    }
}

/// A fault's window.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultWindow {
    /// The fault.
    pub fault: String,
    /// What it hit.
    pub target: String,
    /// Its [`Kind::FaultStart`], if recorded.
    pub from_us: Option<u64>,
    /// Its [`Kind::FaultEnd`], if recorded.
    pub to_us: Option<u64>,
}

pub(super) fn fault_windows_sorted(events: &[&Event]) -> Vec<FaultWindow> {
    let mut windows: Vec<FaultWindow> = Vec::new();
    let mut open: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for event in events {
        match &event.kind {
            Kind::FaultStart { fault, target } => {
                open.entry((fault, target)).or_default().push(windows.len());
                windows.push(FaultWindow {
                    fault: fault.clone(),
                    target: target.clone(),
                    from_us: Some(event.at_us),
                    to_us: None,
                });
            }
            Kind::FaultEnd { fault, target } => {
                let started = open
                    .get_mut(&(fault.as_str(), target.as_str()))
                    .and_then(Vec::pop);
                match started.and_then(|i| windows.get_mut(i)) {
                    Some(window) => window.to_us = Some(event.at_us),
                    None => windows.push(FaultWindow {
                        fault: fault.clone(),
                        target: target.clone(),
                        from_us: None,
                        to_us: Some(event.at_us),
                    }),
                }
            }
            _ => {}
        }
    }
    windows.sort_by_key(|w| w.from_us.or(w.to_us));
    windows
}

pub(super) fn recovery(events: &[&Event], window_us: u64) -> Vec<Recovery> {
    let accepted: Vec<u64> = events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                Kind::Write {
                    outcome: WriteOutcome::Accepted,
                    ..
                }
            )
        })
        .map(|e| e.at_us)
        .collect();
    let workload_start = events
        .iter()
        .find_map(|e| match &e.kind {
            Kind::Acquire { .. } => Some(e.at_us),
            Kind::Write { started_us, .. } => Some((*started_us).min(e.at_us)),
            _ => None,
        })
        .unwrap_or(0);
    let windows = fault_windows_sorted(events);
    let fault_ends: Vec<u64> = windows.iter().filter_map(|w| w.to_us).collect();
    let mut recoveries: Vec<Recovery> = windows
        .iter()
        .filter_map(|w| {
            let ended_us = w.to_us?;
            let pre_rate = w.from_us.map_or(0.0, |started| {
                let earlier_end = fault_ends
                    .iter()
                    .copied()
                    .filter(|end| *end <= started)
                    .max()
                    .unwrap_or(0);
                let from = started
                    .saturating_sub(PRE_WINDOW_US)
                    .max(workload_start)
                    .max(earlier_end);
                rate(&accepted, from, started)
            });
            let measurable = pre_rate > 0.0;
            let recovered_after_us = if measurable {
                recovered_after(&accepted, ended_us, pre_rate, window_us)
            } else {
                None
            };
            Some(Recovery {
                fault: w.fault.clone(),
                target: w.target.clone(),
                started_us: w.from_us,
                ended_us,
                pre_rate,
                window_us,
                measurable,
                recovered_after_us,
            })
        })
        .collect();
    recoveries.sort_by_key(|r| r.ended_us);
    recoveries
}

/// Accepted writes per second in `[from, to)`; 0 for an empty window.
fn rate(accepted: &[u64], from: u64, to: u64) -> f64 {
    if to <= from {
        return 0.0;
    }
    let n = accepted.iter().filter(|t| (from..to).contains(*t)).count();
    n as f64 * 1_000_000.0 / (to - from) as f64
}

fn recovered_after(accepted: &[u64], ended_us: u64, pre_rate: f64, window_us: u64) -> Option<u64> {
    let needed = (RECOVERY_FRACTION * pre_rate * window_us as f64 / 1_000_000.0).ceil();
    // A float-to-int cast saturates; at least one write is needed.
    let needed = (needed as usize).max(1);
    let after: Vec<u64> = accepted
        .iter()
        .copied()
        .filter(|t| *t >= ended_us)
        .collect();
    after.windows(needed).find_map(|run| {
        let (first, last) = (run.first()?, run.last()?);
        (last - first < window_us).then(|| first - ended_us)
    })
}
