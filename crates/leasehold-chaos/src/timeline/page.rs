//! The drawing's model, gathered from the history: one lane per caller
//! with its leases, overlaps and marks (merged where they share a pixel),
//! the fault windows and their labels, and the scale from time to pixels.

use std::collections::{BTreeMap, BTreeSet};

use super::layout::{
    FAULT_ROW_H, FaultLabel, LABEL_W, LANE_H, MIN_IN_FLIGHT_PX, PLOT_W, layout_fault_labels,
};
use super::ms;
use crate::check::{self, LeaseEnd, LeaseSpan, RunCheck};
use crate::history::{Event, Kind, WriteOutcome};
use crate::verdicts::Verdict;

/// Sorts `w2.t10` after `w2.t9`.
fn natural_key(text: &str) -> Vec<(String, u64)> {
    let mut key = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (word, tail) = rest.split_at(split);
        let digits = tail
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (number, tail) = tail.split_at(digits);
        key.push((word.to_owned(), number.parse().unwrap_or(u64::MAX)));
        rest = tail;
    }
    key
}

/// One mark, or several close enough to draw as one.
pub(super) struct Mark {
    /// Where the first one is.
    pub(super) x: f64,
    /// Where the first one's operation started, for a failed acquire.
    pub(super) x0: f64,
    pub(super) count: usize,
    pub(super) title: String,
}

pub(super) struct Lane {
    pub(super) actor: String,
    pub(super) leases: Vec<LeaseSpan>,
    /// Overlap intervals on this lane, in pixels, with their tooltip.
    pub(super) overlaps: Vec<(f64, f64, String)>,
    /// Marks by kind, then by bucket (see [`MarkKind::bucket_px`]).
    pub(super) marks: BTreeMap<MarkKind, BTreeMap<i64, Mark>>,
}

/// The kinds of marks, in drawing order: the refused stale write, the
/// point of the page, on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum MarkKind {
    /// A write from when it started to its answer, when that is wide
    /// enough to see.
    InFlight,
    Accepted,
    Insufficient,
    AcquireFailed,
    Lost,
    Failed,
    Unknown,
    Refused,
}

impl MarkKind {
    /// How wide (pixels) a bucket of marks drawn as one is: a pixel for
    /// ticks, about a symbol's width for symbols.
    pub(super) fn bucket_px(self) -> f64 {
        match self {
            MarkKind::Accepted | MarkKind::Insufficient => 1.0,
            MarkKind::InFlight
            | MarkKind::AcquireFailed
            | MarkKind::Failed
            | MarkKind::Unknown
            | MarkKind::Refused
            | MarkKind::Lost => 6.0,
        }
    }
}

pub(super) struct Page<'a> {
    pub(super) check: &'a RunCheck,
    /// The run's verdict, as its report says it.
    pub(super) verdict: Verdict,
    /// When the run ended.
    pub(super) duration_us: u64,
    /// The time the chart shows.
    pub(super) from_us: u64,
    pub(super) to_us: u64,
    pub(super) lanes: Vec<Lane>,
    /// The fault windows the chart shows, with their number (from 1, in
    /// the whole run).
    pub(super) faults: Vec<(usize, check::FaultWindow)>,
    /// Where each fault window's label goes, by window.
    pub(super) labels: Vec<FaultLabel>,
    /// How many rows the fault labels take.
    pub(super) label_rows: usize,
}

impl<'a> Page<'a> {
    pub(super) fn new(
        events: &[Event],
        check: &'a RunCheck,
        range: Option<std::ops::Range<u64>>,
        verdict: Verdict,
    ) -> Page<'a> {
        let duration_us = events
            .iter()
            .map(|e| e.at_us)
            .max()
            .unwrap_or(0)
            .max(check.duration_us)
            .max(1);
        let (from_us, to_us) = match range {
            Some(range) if range.start < range.end => (range.start, range.end),
            _ => (0, duration_us),
        };
        let mut actors = BTreeSet::new();
        for event in events {
            if matches!(
                event.kind,
                Kind::Acquire { .. }
                    | Kind::Acquired { .. }
                    | Kind::AcquireFailed { .. }
                    | Kind::Refreshed { .. }
                    | Kind::Lost { .. }
                    | Kind::Released { .. }
                    | Kind::Write { .. }
            ) {
                actors.insert(event.actor.as_str());
            }
        }
        let mut actors: Vec<&str> = actors.into_iter().collect();
        actors.sort_by_cached_key(|a| natural_key(a));
        let mut page = Page {
            check,
            verdict,
            duration_us,
            from_us,
            to_us,
            lanes: actors
                .iter()
                .map(|actor| Lane {
                    actor: (*actor).to_owned(),
                    leases: Vec::new(),
                    overlaps: Vec::new(),
                    marks: BTreeMap::new(),
                })
                .collect(),
            faults: check::fault_windows(events)
                .into_iter()
                .enumerate()
                .map(|(i, f)| (i + 1, f))
                .filter(|(_, f)| {
                    f.from_us.unwrap_or(0) <= to_us && f.to_us.unwrap_or(duration_us) >= from_us
                })
                .collect(),
            labels: Vec::new(),
            label_rows: 1,
        };
        let spans: Vec<(f64, f64)> = page.faults.iter().map(|(_, f)| page.fault_x(f)).collect();
        let full: Vec<(usize, String)> = page
            .faults
            .iter()
            .map(|(n, f)| (*n, format!("#{n} {} ({})", f.fault, f.target)))
            .collect();
        (page.labels, page.label_rows) = layout_fault_labels(&spans, &full);
        for span in check::lease_spans(events) {
            if span.to_us < from_us || span.from_us > to_us {
                continue;
            }
            if let LeaseEnd::Lost { cause } = &span.end {
                let title = format!(
                    "{} lost its lease on {} (token {}{}) at {}: {}",
                    span.actor,
                    span.key,
                    span.token,
                    span.fence
                        .map_or_else(String::new, |f| format!(", fence {f}")),
                    ms(span.to_us),
                    cause
                );
                page.mark(&span.actor.clone(), MarkKind::Lost, span.to_us, title);
            }
            if let Some(lane) = page.lane_mut(&span.actor) {
                lane.leases.push(span);
            }
        }
        for lane in &mut page.lanes {
            lane.leases.sort_by_key(|s| s.from_us);
        }
        for overlap in &check.overlaps {
            if overlap.to_us < from_us || overlap.from_us > to_us {
                continue;
            }
            let title = format!(
                "double holders of {}: {} (token {}) and {} (token {}), {} to {}",
                overlap.key,
                overlap.a.actor,
                overlap.a.token,
                overlap.b.actor,
                overlap.b.token,
                ms(overlap.from_us),
                ms(overlap.to_us)
            );
            let (x0, x1) = (page.x(overlap.from_us), page.x(overlap.to_us));
            for actor in [&overlap.a.actor, &overlap.b.actor] {
                if let Some(lane) = page.lane_mut(actor)
                    && lane.overlaps.last().is_none_or(|o| o.2 != title)
                {
                    lane.overlaps.push((x0, x1, title.clone()));
                }
            }
        }
        let mut acquires = BTreeMap::new();
        for event in events {
            match &event.kind {
                Kind::Acquire { op, .. } => {
                    acquires.insert((event.actor.as_str(), *op), event.at_us);
                }
                Kind::AcquireFailed { op, key, reason } => {
                    let from = acquires
                        .get(&(event.actor.as_str(), *op))
                        .copied()
                        .unwrap_or(event.at_us)
                        .min(event.at_us);
                    let title = format!(
                        "{} gave up acquiring {key} at {} after {}: {reason}",
                        event.actor,
                        ms(event.at_us),
                        ms(event.at_us - from)
                    );
                    page.mark_from(
                        &event.actor,
                        MarkKind::AcquireFailed,
                        from,
                        event.at_us,
                        title,
                    );
                }
                _ => {}
            }
        }
        for event in events {
            if let Kind::Write {
                started_us,
                key,
                resource,
                amount,
                fence,
                outcome,
                detail,
                ..
            } = &event.kind
            {
                let (kind, what) = match outcome {
                    WriteOutcome::Accepted => (MarkKind::Accepted, "write accepted"),
                    WriteOutcome::Insufficient => (
                        MarkKind::Insufficient,
                        "write refused for lack of funds (nothing written)",
                    ),
                    WriteOutcome::RefusedStale => {
                        (MarkKind::Refused, "stale write refused by the database")
                    }
                    WriteOutcome::Unknown => (MarkKind::Unknown, "write of unknown outcome"),
                    WriteOutcome::Failed => (MarkKind::Failed, "write failed (nothing written)"),
                };
                let token = page
                    .lease_at(&event.actor, key, *started_us)
                    .map_or_else(|| "no lease".to_owned(), |s| format!("token {}", s.token));
                let fence = fence.map_or_else(|| "no fence".to_owned(), |f| format!("fence {f}"));
                let detail = detail
                    .as_deref()
                    .map_or_else(String::new, |d| format!("\n{d}"));
                let title = format!(
                    "{what}: {} debit {amount} on {resource}\nlock {key}, {token}, {fence}\n\
                     started {}, answered {}{detail}",
                    event.actor,
                    ms(*started_us),
                    ms(event.at_us)
                );
                if page.x(event.at_us) - page.x(*started_us) >= MIN_IN_FLIGHT_PX {
                    page.mark_from(
                        &event.actor,
                        MarkKind::InFlight,
                        *started_us,
                        event.at_us,
                        title.clone(),
                    );
                }
                page.mark(&event.actor, kind, event.at_us, title);
            }
        }
        page
    }

    /// The lease `actor` held on `key` at `at_us`, if any.
    pub(super) fn lease_at(&self, actor: &str, key: &str, at_us: u64) -> Option<&LeaseSpan> {
        let lane = self.lanes.iter().find(|l| l.actor == actor)?;
        let end = lane.leases.partition_point(|s| s.from_us <= at_us);
        lane.leases
            .get(..end)?
            .iter()
            .rev()
            .take(8)
            .find(|s| s.key == key && s.to_us >= at_us)
    }

    /// Where a fault window's band starts and ends, in pixels.
    pub(super) fn fault_x(&self, fault: &check::FaultWindow) -> (f64, f64) {
        let x0 = self.x(fault.from_us.unwrap_or(0));
        let x1 = self
            .x(fault.to_us.unwrap_or(self.duration_us))
            .max(x0 + 2.0);
        (x0, x1)
    }

    fn lane_mut(&mut self, actor: &str) -> Option<&mut Lane> {
        self.lanes.iter_mut().find(|l| l.actor == actor)
    }

    pub(super) fn mark(&mut self, actor: &str, kind: MarkKind, at_us: u64, title: String) {
        self.mark_from(actor, kind, at_us, at_us, title);
    }

    pub(super) fn mark_from(
        &mut self,
        actor: &str,
        kind: MarkKind,
        from_us: u64,
        at_us: u64,
        title: String,
    ) {
        if at_us < self.from_us || from_us > self.to_us {
            return;
        }
        let (x0, x) = (self.x(from_us), self.x(at_us));
        let bucket = (x / kind.bucket_px()).floor() as i64;
        if let Some(lane) = self.lane_mut(actor) {
            let mark = lane
                .marks
                .entry(kind)
                .or_default()
                .entry(bucket)
                .or_insert(Mark {
                    x,
                    x0,
                    count: 0,
                    title,
                });
            mark.count += 1;
        }
    }

    pub(super) fn x(&self, at_us: u64) -> f64 {
        let span = self.to_us.saturating_sub(self.from_us).max(1);
        let at = at_us.clamp(self.from_us, self.to_us) - self.from_us;
        LABEL_W + at as f64 / span as f64 * PLOT_W
    }

    /// Where the lanes start: under the rows of fault labels.
    pub(super) fn top(&self) -> f64 {
        self.label_rows as f64 * FAULT_ROW_H + 12.0
    }

    pub(super) fn lanes_bottom(&self) -> f64 {
        self.top() + self.lanes.len().max(1) as f64 * LANE_H
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_sort_naturally() {
        let mut actors = vec!["w1.t10", "w1.t9", "w10.t0", "w2.t0"];
        actors.sort_by_cached_key(|a| natural_key(a));
        assert_eq!(actors, ["w1.t9", "w1.t10", "w2.t0", "w10.t0"]);
    }
}
