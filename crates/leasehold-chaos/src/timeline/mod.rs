//! A run's timeline as one self-contained HTML page: who held the lock
//! when, where the faults were, and where the database refused a stale
//! write.
//!
//! The page is inline CSS, one inline SVG and one small inline script,
//! with no external asset and nothing fetched, so it can be attached to a
//! bug report or opened from a CI artifact (the script and the style sheet
//! are `timeline.js` and `timeline.css` beside this file, built in). Without the script (JS off, a
//! mail client, an image converter) the full static chart stays, and every
//! mark still shows its details on hover (SVG `<title>`).
//!
//! One lane per caller: its leases are bars coloured by token (the same
//! token, the same colour, in every page), a lost lease ends in a cross,
//! accepted writes are ticks above the bar (a write whose answer took
//! long enough to see is a thin line from when it started, `path.in-flight`:
//! a holder paused mid-write, a guard waiting on a row lock), refused stale
//! writes blue
//! diamonds (drawn on top of everything), writes of unknown outcome orange
//! dots, acquires that gave up grey dashes from their start. Fault windows are
//! shaded bands across all lanes; two leases held at once are red hatched
//! on both holders' lanes. The fault windows and the violations are listed
//! under the chart.
//!
//! # Reading a long run
//!
//! - **Labels never overlap.** Fault windows are numbered in order of
//!   start (`#1`, `#2`, ...). Their labels are packed into rows above the
//!   lanes, left to right, by estimated text width (a greedy interval
//!   packing: a label takes the first row where it clears every label
//!   already there); a label that finds no room in the first three rows
//!   is shortened to its number, which always finds a row (a new one if
//!   need be), and the full text is in its tooltip and in the list under
//!   the chart (`ol#faults`). Lane labels too long for their column are
//!   cut with an ellipsis (the full name is the tooltip); axis ticks are
//!   spaced for their widest label. The layout depends only on the
//!   history.
//! - **Zoom** (with the script): drag across the chart to zoom to that
//!   time range, click a fault window (its band, its label or its line in
//!   the list) to zoom to it, or use the buttons above the chart (zoom in,
//!   zoom out, reset). The axis ticks and the fault labels are laid out
//!   again for the range shown. Zoom stretches the drawing made for the
//!   whole run: marks merged at full width (below) stay merged, and
//!   their tooltip counts them. For a true close-up, [`render_html_between`]
//!   draws only a time range at the chart's full width.
//! - **Hover**: every lease and every mark says who, which key, which
//!   token and fence, what happened and when (an SVG `<title>`; with the
//!   script, the same text in a tooltip shown at once). Accepted and
//!   insufficient writes, drawn as one path per lane, get transparent
//!   hover targets a few pixels wide.
//!
//! Size stays bounded on long runs: marks of one kind that fall on the same
//! pixel of a lane (within 6 pixels for symbols) are drawn once (their
//! tooltip counts them), leases
//! narrower than two pixels are merged into grey "busy" bars, and overlaps
//! are merged per lane where they touch.
//!
//! Elements carry stable ids and classes for tests and styling:
//! `svg#timeline` (with `data-duration-us`, `data-plot-x`, `data-plot-w`),
//! `g.lane[data-actor]` (its marks in `g.marks`), `rect.lease[data-token]`,
//! `g.fault-window[data-window]` holding `rect.fault`,
//! `text.fault-label[data-window]`, `rect.overlap`, `path.refused`,
//! `path.accepted`, `rect.hit` (hover targets of the ticks), `path.in-flight`,
//! `circle.unknown`, `circle.failed`, `path.lost`, `path.acquire-failed`,
//! `g.ticks` (`text.tick-label`), `#legend`, `#zoom-controls`,
//! `ol#faults` (`li[data-window]`),
//! `#violations` (`li.violation`), `#overlaps`, `#recovery`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write};

use crate::check::{self, LeaseEnd, LeaseSpan, RunCheck};
use crate::history::{Event, Kind, WriteOutcome};
use crate::verdicts::Verdict;

/// The width of the lane labels, in pixels.
const LABEL_W: f64 = 120.0;
/// The width of the plot, in pixels.
const PLOT_W: f64 = 1160.0;
/// The space right of the plot.
const RIGHT_PAD: f64 = 24.0;
/// The height of one row of fault labels above the lanes.
const FAULT_ROW_H: f64 = 16.0;
/// How many rows of fault labels may hold full labels; past them a label
/// is shortened to its number.
const FULL_LABEL_ROWS: usize = 3;
/// The space between two labels in a row, in pixels.
const LABEL_GAP: f64 = 6.0;
/// Estimated widths of one character (pixels, a little generous): the
/// bold fault labels, the monospace lane labels, the tick labels.
const FAULT_CHAR_W: f64 = 7.4;
const LANE_CHAR_W: f64 = 7.3;
const TICK_CHAR_W: f64 = 7.0;
/// How wide (pixels) one hover target of accepted or insufficient writes
/// is.
const HIT_PX: f64 = 12.0;
/// The height of one lane.
const LANE_H: f64 = 26.0;
/// The height of the axis below the lanes.
const AXIS_H: f64 = 40.0;
/// Writes in flight longer than this (pixels) are drawn from when they
/// started.
const MIN_IN_FLIGHT_PX: f64 = 3.0;
/// Leases narrower than this (pixels) are merged.
const MIN_LEASE_PX: f64 = 2.0;
/// How many overlaps are listed under the chart.
const LISTED_OVERLAPS: usize = 50;

/// The page's style sheet (`timeline.css`).
const STYLE: &str = include_str!("timeline.css");

/// The page's one script: zoom, tooltips, the layout of the ticks and the
/// fault labels for the range shown. Nothing fetched; without it the
/// static chart stays.
const SCRIPT: &str = include_str!("timeline.js");

/// Renders `events` and their `check` as one HTML page.
#[must_use]
pub fn render_html(events: &[Event], check: &RunCheck) -> String {
    render_html_judged(events, check, check.verdict())
}

/// [`render_html`] with the run's `verdict` given (the harness's, which
/// knows its control).
pub(crate) fn render_html_judged(events: &[Event], check: &RunCheck, verdict: Verdict) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = Page::new(events, check, None, verdict).write(&mut out);
    out
}

/// Renders `events` and their `check` as one HTML page whose chart shows
/// only the time from `range.start` to `range.end` (microseconds since the
/// run started), drawn at the chart's full width: a close-up that stays
/// true where a zoom into the whole run's page would stretch marks merged
/// at its scale. The verdict, the counts and the lists are the whole
/// run's; a mark outside the range is left out, a lease or a fault window
/// that crosses an edge is cut there. An empty or reversed range shows
/// the whole run.
#[must_use]
pub fn render_html_between(
    events: &[Event],
    check: &RunCheck,
    range: std::ops::Range<u64>,
) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = Page::new(events, check, Some(range), check.verdict()).write(&mut out);
    out
}

/// Escapes text for HTML content and attribute values.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

/// A stable colour for a token label: FNV-1a of the label picks a hue,
/// kept away from the reds of the overlap marks.
fn token_colour(token: &str) -> (u32, &'static str, &'static str) {
    let hash = token.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (35 + (hash % 285) as u32, "62%", "38%")
}

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
struct Mark {
    /// Where the first one is.
    x: f64,
    /// Where the first one's operation started, for a failed acquire.
    x0: f64,
    count: usize,
    title: String,
}

struct Lane {
    actor: String,
    leases: Vec<LeaseSpan>,
    /// Overlap intervals on this lane, in pixels, with their tooltip.
    overlaps: Vec<(f64, f64, String)>,
    /// Marks by kind, then by bucket (see [`MarkKind::bucket_px`]).
    marks: BTreeMap<MarkKind, BTreeMap<i64, Mark>>,
}

/// The kinds of marks, in drawing order: the refused stale write, the
/// point of the page, on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum MarkKind {
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
    fn bucket_px(self) -> f64 {
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

/// A fault window's label, placed.
#[derive(Debug, Clone, PartialEq)]
struct FaultLabel {
    /// The full text, `#3 redis-pause (redis)`.
    full: String,
    /// What is drawn: the full text, or `#3` when there was no room.
    text: String,
    /// The left edge of its box.
    x: f64,
    /// The estimated width of its box.
    width: f64,
    /// Its row, from the top.
    row: usize,
}

/// Places the labels of windows spanning `spans` (pixels): each takes the
/// first row where it clears every label already placed there, in order
/// of start; a full label only in the first [`FULL_LABEL_ROWS`] rows, its
/// number in any (a new row if need be). Returns the labels, by window,
/// and how many rows they take.
fn layout_fault_labels(spans: &[(f64, f64)], full: &[(usize, String)]) -> (Vec<FaultLabel>, usize) {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by(|&a, &b| spans[a].0.total_cmp(&spans[b].0).then(a.cmp(&b)));
    let mut rows: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut labels: Vec<FaultLabel> = full
        .iter()
        .map(|(_, text)| FaultLabel {
            full: text.clone(),
            text: text.clone(),
            x: LABEL_W,
            width: 0.0,
            row: 0,
        })
        .collect();
    for i in order {
        let (Some(&(x0, _)), Some(label), Some((n, _))) =
            (spans.get(i), labels.get_mut(i), full.get(i))
        else {
            continue;
        };
        let marker = format!("#{n}");
        for (text, max_rows) in [(label.full.clone(), FULL_LABEL_ROWS), (marker, usize::MAX)] {
            let width = text.chars().count() as f64 * FAULT_CHAR_W;
            if width > PLOT_W {
                continue;
            }
            let x = (x0 + 3.0).min(LABEL_W + PLOT_W - width).max(LABEL_W);
            let clear = |row: &Vec<(f64, f64)>| {
                row.iter()
                    .all(|&(a, b)| x + width + LABEL_GAP <= a || b + LABEL_GAP <= x)
            };
            // A row past the last is empty: the search ends there at the
            // latest.
            let Some(row) =
                (0..max_rows.min(rows.len() + 1)).find(|&r| rows.get(r).is_none_or(clear))
            else {
                continue;
            };
            if row == rows.len() {
                rows.push(Vec::new());
            }
            if let Some(taken) = rows.get_mut(row) {
                taken.push((x, x + width));
            }
            *label = FaultLabel {
                full: label.full.clone(),
                text,
                x,
                width,
                row,
            };
            break;
        }
    }
    (labels, rows.len().max(1))
}

struct Page<'a> {
    check: &'a RunCheck,
    /// The run's verdict, as its report says it.
    verdict: Verdict,
    /// When the run ended.
    duration_us: u64,
    /// The time the chart shows.
    from_us: u64,
    to_us: u64,
    lanes: Vec<Lane>,
    /// The fault windows the chart shows, with their number (from 1, in
    /// the whole run).
    faults: Vec<(usize, check::FaultWindow)>,
    /// Where each fault window's label goes, by window.
    labels: Vec<FaultLabel>,
    /// How many rows the fault labels take.
    label_rows: usize,
}

impl<'a> Page<'a> {
    fn new(
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
    fn lease_at(&self, actor: &str, key: &str, at_us: u64) -> Option<&LeaseSpan> {
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
    fn fault_x(&self, fault: &check::FaultWindow) -> (f64, f64) {
        let x0 = self.x(fault.from_us.unwrap_or(0));
        let x1 = self
            .x(fault.to_us.unwrap_or(self.duration_us))
            .max(x0 + 2.0);
        (x0, x1)
    }

    fn lane_mut(&mut self, actor: &str) -> Option<&mut Lane> {
        self.lanes.iter_mut().find(|l| l.actor == actor)
    }

    fn mark(&mut self, actor: &str, kind: MarkKind, at_us: u64, title: String) {
        self.mark_from(actor, kind, at_us, at_us, title);
    }

    fn mark_from(&mut self, actor: &str, kind: MarkKind, from_us: u64, at_us: u64, title: String) {
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

    fn x(&self, at_us: u64) -> f64 {
        let span = self.to_us.saturating_sub(self.from_us).max(1);
        let at = at_us.clamp(self.from_us, self.to_us) - self.from_us;
        LABEL_W + at as f64 / span as f64 * PLOT_W
    }

    /// Where the lanes start: under the rows of fault labels.
    fn top(&self) -> f64 {
        self.label_rows as f64 * FAULT_ROW_H + 12.0
    }

    fn lanes_bottom(&self) -> f64 {
        self.top() + self.lanes.len().max(1) as f64 * LANE_H
    }

    fn write(&self, out: &mut String) -> fmt::Result {
        let header = self.check.header.as_ref();
        let name = header.map_or_else(
            || "a run without a header".to_owned(),
            |h| format!("{} under {}, seed {}", h.mode, h.fault, h.seed),
        );
        writeln!(out, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>")?;
        writeln!(out, "<meta charset=\"utf-8\">")?;
        writeln!(out, "<title>leasehold chaos: {}</title>", esc(&name))?;
        writeln!(out, "<style>\n{STYLE}</style>\n</head>\n<body>")?;
        match header {
            Some(h) => writeln!(
                out,
                "<h1>leasehold chaos: <code class=\"mode\">{}</code> under <code \
                 class=\"fault\">{}</code>, seed {}</h1>",
                esc(&h.mode),
                esc(&h.fault),
                h.seed
            )?,
            None => writeln!(out, "<h1>leasehold chaos: a run without a header</h1>")?,
        }
        self.write_verdict(out)?;
        self.write_summary(out)?;
        write_legend(out)?;
        writeln!(
            out,
            "<div id=\"zoom-controls\" hidden><button type=\"button\" data-zoom=\"in\">zoom \
             in</button><button type=\"button\" data-zoom=\"out\">zoom out</button><button \
             type=\"button\" data-zoom=\"reset\">reset</button><span id=\"zoom-range\"></span>\
             <span class=\"summary\">drag across the chart to zoom; click a fault window to \
             zoom to it</span></div>"
        )?;
        writeln!(out, "<div class=\"chart\">")?;
        self.write_svg(out)?;
        writeln!(out, "</div>")?;
        self.write_lists(out)?;
        writeln!(
            out,
            "<div id=\"tip\" hidden></div>\n<script>\n{SCRIPT}</script>"
        )?;
        writeln!(out, "</body>\n</html>")
    }

    fn write_verdict(&self, out: &mut String) -> fmt::Result {
        let class = match self.verdict {
            Verdict::ControlCaught { .. } | Verdict::Reported { .. } => "expected",
            verdict if verdict.passes() => "ok",
            _ => "broken",
        };
        writeln!(
            out,
            "<p class=\"verdict {class}\" id=\"verdict\">{}</p>",
            esc(&self.verdict.to_string())
        )
    }

    fn write_summary(&self, out: &mut String) -> fmt::Result {
        if self.from_us > 0 || self.to_us < self.duration_us {
            writeln!(
                out,
                "<p class=\"summary\" id=\"range\">The chart shows {} to {} of the run; the \
                 counts and the lists are the whole run's.</p>",
                ms(self.from_us),
                ms(self.to_us)
            )?;
        }
        let c = &self.check.counts;
        let w = &c.writes;
        let ttl = self
            .check
            .header
            .as_ref()
            .map_or_else(String::new, |h| format!("ttl {} ms · ", h.ttl_ms));
        writeln!(
            out,
            "<p class=\"summary\">{ttl}run {} · acquires: {} ({} acquired, {} gave up) · \
             writes: {} accepted, <b>{} refused stale</b>, {} insufficient, {} failed, {} \
             unknown · lost leases: {} · double-holder overlaps: {}</p>",
            ms(self.check.duration_us),
            c.acquires,
            c.acquired,
            c.acquire_failed,
            w.accepted,
            w.refused_stale,
            w.insufficient,
            w.failed,
            w.unknown,
            c.leases_lost,
            self.check.overlaps.len()
        )
    }

    fn write_svg(&self, out: &mut String) -> fmt::Result {
        let width = LABEL_W + PLOT_W + RIGHT_PAD;
        let top = self.top();
        let bottom = self.lanes_bottom();
        let height = bottom + AXIS_H;
        writeln!(
            out,
            "<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" \
             height=\"{height}\" viewBox=\"0 0 {width} {height}\" role=\"img\" \
             data-from-us=\"{}\" data-duration-us=\"{}\" data-plot-x=\"{LABEL_W}\" \
             data-plot-w=\"{PLOT_W}\" \
             data-top=\"{top}\" data-bottom=\"{bottom}\" data-label-rows=\"{}\" \
             data-row-h=\"{FAULT_ROW_H}\">",
            self.from_us,
            self.to_us - self.from_us,
            self.label_rows
        )?;
        writeln!(
            out,
            "<defs><pattern id=\"hatch\" width=\"6\" height=\"6\" \
             patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">\
             <rect width=\"6\" height=\"6\" fill=\"#d32f2f\" fill-opacity=\"0.18\"/>\
             <line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#d32f2f\" \
             stroke-width=\"1.6\"/></pattern><clipPath id=\"plot-clip\"><rect x=\"{LABEL_W}\" \
             y=\"0\" width=\"{PLOT_W}\" height=\"{height}\"/></clipPath></defs>"
        )?;
        for i in 0..self.lanes.len() {
            let y = top + i as f64 * LANE_H;
            let fill = if i % 2 == 0 { "#f7f7f7" } else { "#ffffff" };
            writeln!(
                out,
                "<rect class=\"lane-bg\" x=\"0\" y=\"{y}\" width=\"{}\" height=\"{LANE_H}\" \
                 fill=\"{fill}\"/>",
                LABEL_W + PLOT_W,
            )?;
        }
        self.write_axis(out, top, bottom)?;
        self.write_faults(out, bottom)?;
        for (i, lane) in self.lanes.iter().enumerate() {
            self.write_lane(out, top, i, lane)?;
        }
        writeln!(out, "</svg>")
    }

    fn write_axis(&self, out: &mut String, top: f64, bottom: f64) -> fmt::Result {
        let (from_ms, to_ms) = (self.from_us as f64 / 1000.0, self.to_us as f64 / 1000.0);
        let span_ms = (to_ms - from_ms).max(0.001);
        let step = tick_step(span_ms, to_ms);
        writeln!(
            out,
            "<g class=\"axis\"><line x1=\"{LABEL_W}\" y1=\"{bottom}\" x2=\"{}\" y2=\"{bottom}\" \
             stroke=\"#888\"/><g class=\"ticks\">",
            LABEL_W + PLOT_W
        )?;
        let mut k = (from_ms / step - 1e-9).ceil() as i64;
        loop {
            let t_ms = k as f64 * step;
            if t_ms > to_ms + step * 1e-9 {
                break;
            }
            let x = LABEL_W + (t_ms - from_ms) / span_ms * PLOT_W;
            writeln!(
                out,
                "<line class=\"grid\" x1=\"{x:.1}\" y1=\"{top}\" x2=\"{x:.1}\" y2=\"{bottom}\"/>\
                 <line x1=\"{x:.1}\" y1=\"{bottom}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#888\"/>\
                 <text class=\"tick-label\" x=\"{x:.1}\" y=\"{}\" \
                 text-anchor=\"middle\">{}</text>",
                bottom + 5.0,
                bottom + 18.0,
                trim_number(t_ms)
            )?;
            k += 1;
        }
        writeln!(
            out,
            "</g><text class=\"tick-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">time since the \
             run started (ms)</text></g>",
            LABEL_W + PLOT_W,
            bottom + 34.0
        )
    }

    fn write_faults(&self, out: &mut String, bottom: f64) -> fmt::Result {
        writeln!(
            out,
            "<g class=\"faults zoom\" clip-path=\"url(#plot-clip)\">"
        )?;
        for ((n, fault), label) in self.faults.iter().zip(&self.labels) {
            let (x0, x1) = self.fault_x(fault);
            let band_y = label_y(label.row) + 4.0;
            writeln!(
                out,
                "<g class=\"fault-window\" data-window=\"{}\"><rect class=\"fault\" \
                 data-fault=\"{}\" x=\"{x0:.2}\" y=\"{band_y}\" width=\"{:.2}\" height=\"{:.1}\" \
                 fill=\"#ffb300\" fill-opacity=\"0.18\" stroke=\"#e69500\" \
                 stroke-dasharray=\"4 3\"><title>{}</title></rect></g>",
                n,
                esc(&fault.fault),
                x1 - x0,
                bottom - band_y,
                esc(&self.fault_text(fault, label))
            )?;
        }
        writeln!(out, "</g>\n<g class=\"fault-labels\">")?;
        for ((n, fault), label) in self.faults.iter().zip(&self.labels) {
            let (x0, x1) = self.fault_x(fault);
            writeln!(
                out,
                "<text class=\"fault-label\" data-window=\"{}\" data-full=\"{}\" \
                 data-x0=\"{x0:.2}\" data-x1=\"{x1:.2}\" data-w=\"{:.1}\" x=\"{:.1}\" y=\"{}\" \
                 text-anchor=\"start\">{}<title>{}</title></text>",
                n,
                esc(&label.full),
                label.width,
                label.x,
                label_y(label.row),
                esc(&label.text),
                esc(&self.fault_text(fault, label))
            )?;
        }
        writeln!(out, "</g>")
    }

    /// A fault window's tooltip and line in the list.
    fn fault_text(&self, fault: &check::FaultWindow, label: &FaultLabel) -> String {
        format!(
            "{}: {} to {}",
            label.full,
            fault.from_us.map_or_else(|| "?".to_owned(), ms),
            fault
                .to_us
                .map_or_else(|| "the end of the run".to_owned(), ms)
        )
    }

    fn write_lane(&self, out: &mut String, top: f64, index: usize, lane: &Lane) -> fmt::Result {
        let y = top + index as f64 * LANE_H;
        let mid = y + 14.0;
        writeln!(
            out,
            "<g class=\"lane\" id=\"lane-{index}\" data-actor=\"{}\">\
             <text class=\"lane-label\" x=\"6\" y=\"{:.1}\">{}<title>{}</title></text>\
             <g class=\"marks zoom\" clip-path=\"url(#plot-clip)\">",
            esc(&lane.actor),
            y + 17.0,
            esc(&fit_text(&lane.actor, LABEL_W - 12.0, LANE_CHAR_W)),
            esc(&lane.actor)
        )?;
        // Wide leases one by one; narrow ones merged into busy runs.
        let mut busy: Option<Busy<'_>> = None;
        for span in &lane.leases {
            let (x0, x1) = (self.x(span.from_us), self.x(span.to_us));
            if x1 - x0 < MIN_LEASE_PX {
                busy = match busy {
                    Some(mut run) if x0 <= run.x1 + 1.0 => {
                        run.x1 = run.x1.max(x1);
                        run.last = span;
                        run.count += 1;
                        Some(run)
                    }
                    other => {
                        if let Some(run) = other {
                            write_busy(out, y, &run)?;
                        }
                        Some(Busy {
                            x0,
                            x1,
                            first: span,
                            last: span,
                            count: 1,
                        })
                    }
                };
                continue;
            }
            let (hue, sat, dark) = token_colour(&span.token);
            let (class, end) = match &span.end {
                LeaseEnd::Released => ("lease", "released".to_owned()),
                LeaseEnd::Lost { cause } => ("lease", format!("lost ({cause})")),
                LeaseEnd::Open => ("lease open", "still held when the run ended".to_owned()),
            };
            let fence = span
                .fence
                .map_or_else(|| "no fence".to_owned(), |f| format!("fence {f}"));
            writeln!(
                out,
                "<rect class=\"{class}\" data-token=\"{}\" x=\"{x0:.2}\" y=\"{:.1}\" \
                 width=\"{:.2}\" height=\"12\" rx=\"2\" fill=\"hsl({hue},{sat},72%)\" \
                 stroke=\"hsl({hue},{sat},{dark})\"><title>{} held {}\ntoken {}, {}\n\
                 from {} to {} ({}): {}</title></rect>",
                esc(&span.token),
                y + 8.0,
                x1 - x0,
                esc(&span.actor),
                esc(&span.key),
                esc(&span.token),
                fence,
                ms(span.from_us),
                ms(span.to_us),
                ms(span.to_us.saturating_sub(span.from_us)),
                esc(&end)
            )?;
        }
        if let Some(run) = busy {
            write_busy(out, y, &run)?;
        }
        write_overlaps(out, y, &lane.overlaps)?;
        for (kind, marks) in &lane.marks {
            write_marks(out, *kind, marks, y, mid)?;
        }
        writeln!(out, "</g></g>")
    }

    fn write_lists(&self, out: &mut String) -> fmt::Result {
        writeln!(out, "<h2>Fault windows ({})</h2>", self.faults.len())?;
        if self.faults.is_empty() {
            writeln!(out, "<p id=\"faults\" class=\"none\">None injected.</p>")?;
        } else {
            writeln!(out, "<ol id=\"faults\">")?;
            for ((n, fault), label) in self.faults.iter().zip(&self.labels) {
                writeln!(
                    out,
                    "<li data-window=\"{}\" value=\"{}\">{}</li>",
                    n,
                    n,
                    esc(&self.fault_text(fault, label))
                )?;
            }
            writeln!(out, "</ol>")?;
        }
        writeln!(out, "<h2>Violations</h2>")?;
        if self.check.violations.is_empty() {
            writeln!(
                out,
                "<p id=\"violations\" class=\"none\">None: every balance and ledger adds \
                 up.</p>"
            )?;
        } else {
            writeln!(out, "<ol id=\"violations\">")?;
            for violation in &self.check.violations {
                writeln!(
                    out,
                    "<li class=\"violation\">{}</li>",
                    esc(&violation.to_string())
                )?;
            }
            writeln!(out, "</ol>")?;
        }
        writeln!(
            out,
            "<h2>Double holders ({})</h2>\n<p>Two callers believed they held one lock at once \
             (counted, not a violation: the database must absorb it).</p>\n<ul id=\"overlaps\">",
            self.check.overlaps.len()
        )?;
        for overlap in self.check.overlaps.iter().take(LISTED_OVERLAPS) {
            writeln!(
                out,
                "<li class=\"overlap-item\"><code>{}</code>: {} ({}) and {} ({}), {} to {}</li>",
                esc(&overlap.key),
                esc(&overlap.a.actor),
                esc(&overlap.a.token),
                esc(&overlap.b.actor),
                esc(&overlap.b.token),
                ms(overlap.from_us),
                ms(overlap.to_us)
            )?;
        }
        if self.check.overlaps.len() > LISTED_OVERLAPS {
            writeln!(
                out,
                "<li>and {} more</li>",
                self.check.overlaps.len() - LISTED_OVERLAPS
            )?;
        }
        writeln!(
            out,
            "</ul>\n<h2>Recovery after each fault</h2>\n<ul id=\"recovery\">"
        )?;
        for recovery in &self.check.recovery {
            writeln!(out, "<li>{}</li>", esc(&recovery.to_string()))?;
        }
        writeln!(out, "</ul>")
    }
}

/// A run of leases too short to draw one by one.
struct Busy<'a> {
    x0: f64,
    x1: f64,
    first: &'a LeaseSpan,
    last: &'a LeaseSpan,
    count: usize,
}

fn write_busy(out: &mut String, y: f64, run: &Busy<'_>) -> fmt::Result {
    let tokens = if run.count == 1 {
        format!("token {}", run.first.token)
    } else {
        format!("tokens {} to {}", run.first.token, run.last.token)
    };
    writeln!(
        out,
        "<rect class=\"lease merged\" x=\"{:.2}\" y=\"{:.1}\" width=\"{:.2}\" height=\"12\" \
         fill=\"#a9b4c0\"><title>{} short leases of {}, {}\nfrom {} to {} (too short to draw \
         one by one)</title></rect>",
        run.x0,
        y + 8.0,
        (run.x1 - run.x0).max(1.0),
        run.count,
        esc(&run.first.actor),
        esc(&tokens),
        ms(run.first.from_us),
        ms(run.last.to_us)
    )
}

/// The baseline of a row of fault labels.
fn label_y(row: usize) -> f64 {
    12.0 + row as f64 * FAULT_ROW_H
}

/// `text`, cut with an ellipsis to fit `width` pixels at `char_w` each.
fn fit_text(text: &str, width: f64, char_w: f64) -> String {
    let room = (width / char_w).floor().max(1.0) as usize;
    if text.chars().count() <= room {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(room.saturating_sub(1)).collect();
    cut.push('\u{2026}');
    cut
}

/// The axis step (ms) for `span_ms` shown, up to `last_ms`: about ten
/// ticks, and never closer than the widest label needs.
fn tick_step(span_ms: f64, last_ms: f64) -> f64 {
    let mut step = nice_step(span_ms / 10.0);
    for _ in 0..8 {
        let widest = (trim_number(last_ms.max(step)).len() + 1) as f64 * TICK_CHAR_W;
        if step / span_ms.max(f64::MIN_POSITIVE) * PLOT_W >= widest + 12.0 {
            break;
        }
        step = nice_step(step * 1.01);
    }
    step
}

fn write_overlaps(out: &mut String, y: f64, overlaps: &[(f64, f64, String)]) -> fmt::Result {
    let mut sorted: Vec<&(f64, f64, String)> = overlaps.iter().collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut merged: Vec<(f64, f64, &str, usize)> = Vec::new();
    for (x0, x1, title) in sorted {
        let x1 = x1.max(x0 + 2.0);
        match merged.last_mut() {
            Some(last) if *x0 <= last.1 + 1.0 => {
                last.1 = last.1.max(x1);
                last.3 += 1;
            }
            _ => merged.push((*x0, x1, title, 1)),
        }
    }
    for (x0, x1, title, n) in merged {
        let more = if n > 1 {
            format!(" (and {} more)", n - 1)
        } else {
            String::new()
        };
        writeln!(
            out,
            "<rect class=\"overlap\" x=\"{x0:.2}\" y=\"{:.1}\" width=\"{:.2}\" \
             height=\"{:.1}\" fill=\"url(#hatch)\" stroke=\"#d32f2f\" stroke-width=\"1.5\">\
             <title>{}{more}</title></rect>",
            y + 2.0,
            x1 - x0,
            LANE_H - 4.0,
            esc(title)
        )?;
    }
    Ok(())
}

fn write_marks(
    out: &mut String,
    kind: MarkKind,
    marks: &BTreeMap<i64, Mark>,
    y: f64,
    mid: f64,
) -> fmt::Result {
    let title = |mark: &Mark| {
        let more = if mark.count > 1 {
            format!(" (and {} more here)", mark.count - 1)
        } else {
            String::new()
        };
        format!("<title>{}{more}</title>", esc(&mark.title))
    };
    match kind {
        // Plentiful: one path per lane, and a transparent hover target
        // per few pixels, with the first one's details and a count.
        MarkKind::Accepted | MarkKind::Insufficient => {
            let (class, y0, stroke) = if kind == MarkKind::Accepted {
                ("accepted", y + 2.0, "#2e7d32")
            } else {
                ("insufficient", y + 20.0, "#9e9e9e")
            };
            write!(
                out,
                "<path class=\"{class}\" stroke=\"{stroke}\" stroke-width=\"1.2\" d=\""
            )?;
            for mark in marks.values() {
                write!(out, "M{:.1} {y0}v5", mark.x)?;
            }
            writeln!(out, "\"/>")?;
            let mut hits: BTreeMap<i64, (&Mark, usize)> = BTreeMap::new();
            for mark in marks.values() {
                hits.entry((mark.x / HIT_PX).floor() as i64)
                    .or_insert((mark, 0))
                    .1 += mark.count;
            }
            for (bucket, (mark, count)) in hits {
                let more = if count > 1 {
                    format!(" (and {} more here)", count - 1)
                } else {
                    String::new()
                };
                writeln!(
                    out,
                    "<rect class=\"hit {class}\" x=\"{}\" y=\"{}\" width=\"{HIT_PX}\" \
                     height=\"8\"><title>{}{more}</title></rect>",
                    bucket as f64 * HIT_PX,
                    y0 - 1.0,
                    esc(&mark.title)
                )?;
            }
            Ok(())
        }
        MarkKind::Refused => {
            for mark in marks.values() {
                writeln!(
                    out,
                    "<circle class=\"refused-halo\" cx=\"{:.2}\" cy=\"{mid}\" r=\"11\"/>\
                     <path class=\"refused\" d=\"M{:.2} {:.1}l7 8l-7 8l-7 -8z\">{}</path>",
                    mark.x,
                    mark.x,
                    mid - 8.0,
                    title(mark)
                )?;
            }
            Ok(())
        }
        MarkKind::InFlight => {
            for mark in marks.values() {
                writeln!(
                    out,
                    "<path class=\"in-flight\" d=\"M{:.2} {}v5M{:.2} {}H{:.2}\" \
                     stroke=\"#455a64\" stroke-width=\"1.2\" fill=\"none\">{}</path>",
                    mark.x0,
                    y + 2.0,
                    mark.x0,
                    y + 4.5,
                    mark.x,
                    title(mark)
                )?;
            }
            Ok(())
        }
        MarkKind::AcquireFailed => {
            for mark in marks.values() {
                writeln!(
                    out,
                    "<path class=\"acquire-failed\" d=\"M{:.2} {mid}H{:.2}m0 -5v10\" \
                     stroke=\"#757575\" stroke-width=\"1.5\" stroke-dasharray=\"3 2\" \
                     fill=\"none\">{}</path>",
                    mark.x0,
                    mark.x,
                    title(mark)
                )?;
            }
            Ok(())
        }
        MarkKind::Unknown | MarkKind::Failed => {
            let (class, r, fill, stroke) = if kind == MarkKind::Unknown {
                ("unknown", 4.5, "#ef6c00", "#fff")
            } else {
                ("failed", 3.5, "#fff", "#616161")
            };
            for mark in marks.values() {
                writeln!(
                    out,
                    "<circle class=\"{class}\" cx=\"{:.2}\" cy=\"{mid}\" r=\"{r}\" \
                     fill=\"{fill}\" stroke=\"{stroke}\" stroke-width=\"1.5\">{}</circle>",
                    mark.x,
                    title(mark)
                )?;
            }
            Ok(())
        }
        MarkKind::Lost => {
            for mark in marks.values() {
                writeln!(
                    out,
                    "<path class=\"lost\" d=\"M{:.2} {}l8 8m0 -8l-8 8\" stroke=\"#111\" \
                     stroke-width=\"2.2\">{}</path>",
                    // Just right of the bar's end, clear of a refused
                    // write at the same instant.
                    mark.x + 3.0,
                    mid - 4.0,
                    title(mark)
                )?;
            }
            Ok(())
        }
    }
}

fn write_legend(out: &mut String) -> fmt::Result {
    let (hue, sat, dark) = token_colour("a1b2");
    let items: [(&str, String); 10] = [
        (
            "lease held (colour per token)",
            format!(
                "<rect x=\"1\" y=\"4\" width=\"26\" height=\"12\" rx=\"2\" \
                 fill=\"hsl({hue},{sat},72%)\" stroke=\"hsl({hue},{sat},{dark})\"/>"
            ),
        ),
        (
            "many short leases",
            "<rect x=\"1\" y=\"4\" width=\"26\" height=\"12\" fill=\"#a9b4c0\"/>".to_owned(),
        ),
        (
            "fault window",
            "<rect x=\"1\" y=\"1\" width=\"26\" height=\"18\" fill=\"#ffb300\" \
             fill-opacity=\"0.18\" stroke=\"#e69500\" stroke-dasharray=\"4 3\"/>"
                .to_owned(),
        ),
        (
            "double holders (lease failed)",
            "<rect x=\"1\" y=\"1\" width=\"26\" height=\"18\" fill=\"url(#legend-hatch)\" \
             stroke=\"#d32f2f\" stroke-width=\"1.5\"/>"
                .to_owned(),
        ),
        (
            "stale write refused: the database saved the day",
            "<circle cx=\"14\" cy=\"10\" r=\"9.5\" fill=\"#1565c0\" fill-opacity=\"0.22\"/>\
             <path d=\"M14 3l6 7l-6 7l-6 -7z\" fill=\"#1565c0\"/>"
                .to_owned(),
        ),
        (
            "write accepted",
            "<path d=\"M14 5v8\" stroke=\"#2e7d32\" stroke-width=\"1.5\"/>".to_owned(),
        ),
        (
            "write from its start to its answer",
            "<path d=\"M3 5v5M3 7.5H25\" stroke=\"#455a64\" stroke-width=\"1.2\" fill=\"none\"/>\
             <path d=\"M25 5v8\" stroke=\"#2e7d32\" stroke-width=\"1.5\"/>"
                .to_owned(),
        ),
        (
            "write unknown / failed",
            "<circle cx=\"8\" cy=\"10\" r=\"4.5\" fill=\"#ef6c00\"/><circle cx=\"20\" cy=\"10\" \
             r=\"3.5\" fill=\"#fff\" stroke=\"#616161\" stroke-width=\"1.5\"/>"
                .to_owned(),
        ),
        (
            "lease lost (holder told)",
            "<path d=\"M10 6l8 8m0 -8l-8 8\" stroke=\"#111\" stroke-width=\"2.2\"/>".to_owned(),
        ),
        (
            "acquire gave up",
            "<path d=\"M2 10H25m0 -5v10\" stroke=\"#757575\" stroke-width=\"1.5\" \
             stroke-dasharray=\"3 2\" fill=\"none\"/>"
                .to_owned(),
        ),
    ];
    writeln!(
        out,
        "<div id=\"legend\"><svg width=\"0\" height=\"0\" style=\"position:absolute\">\
         <defs><pattern id=\"legend-hatch\" width=\"6\" height=\"6\" \
         patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\"><rect width=\"6\" \
         height=\"6\" fill=\"#d32f2f\" fill-opacity=\"0.18\"/><line x1=\"0\" y1=\"0\" x2=\"0\" \
         y2=\"6\" stroke=\"#d32f2f\" stroke-width=\"1.6\"/></pattern></defs></svg>"
    )?;
    for (label, shape) in items {
        writeln!(
            out,
            "<span class=\"item\"><svg width=\"28\" height=\"20\">{shape}</svg>{label}</span>"
        )?;
    }
    writeln!(out, "</div>")
}

/// A step of 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) || !raw.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    let mantissa = raw / power;
    let nice = if mantissa <= 1.0 {
        1.0
    } else if mantissa <= 2.0 {
        2.0
    } else if mantissa <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * power
}

/// A tick value without float noise: `0.3`, not `0.30000000000000004`.
fn trim_number(value: f64) -> String {
    let rounded = (value * 1000.0).round() / 1000.0;
    format!("{rounded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_html() {
        assert_eq!(
            esc(r#"<w0 & "t1" 'x'>"#),
            "&lt;w0 &amp; &quot;t1&quot; &#39;x&#39;&gt;"
        );
    }

    #[test]
    fn actors_sort_naturally() {
        let mut actors = vec!["w1.t10", "w1.t9", "w10.t0", "w2.t0"];
        actors.sort_by_cached_key(|a| natural_key(a));
        assert_eq!(actors, ["w1.t9", "w1.t10", "w2.t0", "w10.t0"]);
    }

    #[test]
    fn token_colours_are_stable_and_not_red() {
        assert_eq!(token_colour("a1b2"), token_colour("a1b2"));
        for token in ["a", "b", "c7", "ffff", "0"] {
            let (hue, ..) = token_colour(token);
            assert!((35..320).contains(&hue), "{token}: hue {hue}");
        }
    }

    fn boxes_overlap(a: &FaultLabel, b: &FaultLabel) -> bool {
        a.row == b.row && a.x < b.x + b.width && b.x < a.x + a.width
    }

    #[test]
    fn crowded_fault_labels_fall_back_to_numbers_and_new_rows() {
        // Thirty windows within ten pixels: three full labels, then
        // numbers, in as many rows as they need.
        let spans: Vec<(f64, f64)> = (0..30)
            .map(|i| (LABEL_W + 400.0 + f64::from(i) / 3.0, LABEL_W + 420.0))
            .collect();
        let full: Vec<(usize, String)> = (1..=30)
            .map(|n| (n, format!("#{n} process-pause (w{n})")))
            .collect();
        let (labels, rows) = layout_fault_labels(&spans, &full);
        assert_eq!(labels.len(), 30);
        let shortened = labels.iter().filter(|l| l.text != l.full).count();
        assert_eq!(shortened, 30 - FULL_LABEL_ROWS);
        for (i, label) in labels.iter().enumerate() {
            if label.text != label.full {
                assert_eq!(label.text, format!("#{}", i + 1));
            }
            assert!(label.x >= LABEL_W && label.x + label.width <= LABEL_W + PLOT_W);
            for other in &labels[i + 1..] {
                assert!(!boxes_overlap(label, other), "{label:?} {other:?}");
            }
        }
        assert_eq!(
            rows,
            labels.iter().map(|l| l.row).max().map_or(1, |r| r + 1)
        );
        assert!(rows > FULL_LABEL_ROWS, "{rows}");
        // At the right edge, a label is pulled back into the plot.
        let (edge, _) = layout_fault_labels(
            &[(LABEL_W + PLOT_W - 1.0, LABEL_W + PLOT_W)],
            &[(1, "#1 redis-restart (redis)".to_owned())],
        );
        assert_eq!(edge[0].text, "#1 redis-restart (redis)");
        assert!((edge[0].x + edge[0].width - (LABEL_W + PLOT_W)).abs() < 1e-9);
    }

    #[test]
    fn long_lane_labels_are_cut_to_fit() {
        assert_eq!(fit_text("w1.t0", 108.0, 7.3), "w1.t0");
        let cut = fit_text("worker-with-a-very-long-name", 108.0, 7.3);
        assert_eq!(cut, "worker-with-a\u{2026}");
        assert!(cut.chars().count() as f64 * 7.3 <= 108.0);
    }

    #[test]
    fn axis_steps_are_round() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(13.0), 20.0);
        assert_eq!(nice_step(260.0), 500.0);
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(trim_number(0.1 + 0.2), "0.3");
    }
}
