//! A run's timeline as one self-contained HTML page: who held the lock
//! when, where the faults were, and where the database refused a stale
//! write.
//!
//! The page is inline CSS and one inline SVG, with no script and no
//! external asset, so it can be attached to a bug report or opened from a
//! CI artifact. Hovering an element shows its details (SVG `<title>`).
//!
//! One lane per caller: its leases are bars coloured by token (the same
//! token, the same colour, in every page), a lost lease ends in a cross,
//! accepted writes are ticks above the bar, refused stale writes blue
//! diamonds (drawn on top of everything), writes of unknown outcome orange
//! dots, acquires that gave up grey dashes from their start. Fault windows are
//! shaded bands across all lanes; two leases held at once are red hatched
//! on both holders' lanes. The violations are listed under the chart.
//!
//! Size stays bounded on long runs: marks of one kind that fall on the same
//! pixel of a lane (within 6 pixels for symbols) are drawn once (their
//! tooltip counts them), leases
//! narrower than two pixels are merged into grey "busy" bars, and overlaps
//! are merged per lane where they touch.
//!
//! Elements carry stable ids and classes for tests and styling:
//! `svg#timeline`, `g.lane[data-actor]`, `rect.lease[data-token]`,
//! `rect.fault`, `rect.overlap`, `path.refused`, `path.accepted`,
//! `circle.unknown`, `circle.failed`, `path.lost`, `path.acquire-failed`,
//! `#legend`,
//! `#violations` (`li.violation`), `#overlaps`, `#recovery`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write};

use crate::check::{self, LeaseEnd, LeaseSpan, RunCheck};
use crate::history::{Event, Kind, WriteOutcome};

/// The width of the lane labels, in pixels.
const LABEL_W: f64 = 120.0;
/// The width of the plot, in pixels.
const PLOT_W: f64 = 1160.0;
/// The space right of the plot.
const RIGHT_PAD: f64 = 24.0;
/// The height of the fault labels above the lanes.
const TOP: f64 = 44.0;
/// The height of one lane.
const LANE_H: f64 = 26.0;
/// The height of the axis below the lanes.
const AXIS_H: f64 = 40.0;
/// Leases narrower than this (pixels) are merged.
const MIN_LEASE_PX: f64 = 2.0;
/// How many overlaps are listed under the chart.
const LISTED_OVERLAPS: usize = 50;

const STYLE: &str = r#"
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; margin: 16px; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 20px 0 6px; }
.verdict { font-weight: 600; font-size: 16px; margin: 4px 0; }
.verdict.ok { color: #1b5e20; }
.verdict.broken { color: #b71c1c; }
.verdict.expected { color: #6a1b9a; }
.summary { color: #555; margin: 4px 0 10px; }
#legend { display: flex; flex-wrap: wrap; gap: 6px 18px; margin: 8px 0 12px; color: #333; }
#legend .item { display: inline-flex; align-items: center; gap: 6px; }
.chart { overflow-x: auto; }
svg#timeline { font: 12px system-ui, sans-serif; background: #fff; }
svg#timeline .lane-label { fill: #333; font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
svg#timeline .fault-label { fill: #8a5300; font-weight: 600; }
svg#timeline .tick-label { fill: #555; }
svg#timeline .grid { stroke: #e3e3e3; }
ol#violations li, ul#overlaps li, ul#recovery li { margin: 2px 0; }
.none { color: #1b5e20; }
code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
"#;

/// Renders `events` and their `check` as one HTML page.
#[must_use]
pub fn render_html(events: &[Event], check: &RunCheck) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = Page::new(events, check).write(&mut out);
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
            MarkKind::AcquireFailed
            | MarkKind::Failed
            | MarkKind::Unknown
            | MarkKind::Refused
            | MarkKind::Lost => 6.0,
        }
    }
}

struct Page<'a> {
    check: &'a RunCheck,
    duration_us: u64,
    lanes: Vec<Lane>,
    faults: Vec<check::FaultWindow>,
}

impl<'a> Page<'a> {
    fn new(events: &[Event], check: &'a RunCheck) -> Page<'a> {
        let duration_us = events
            .iter()
            .map(|e| e.at_us)
            .max()
            .unwrap_or(0)
            .max(check.duration_us)
            .max(1);
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
            duration_us,
            lanes: actors
                .iter()
                .map(|actor| Lane {
                    actor: (*actor).to_owned(),
                    leases: Vec::new(),
                    overlaps: Vec::new(),
                    marks: BTreeMap::new(),
                })
                .collect(),
            faults: check::fault_windows(events),
        };
        for span in check::lease_spans(events) {
            if let LeaseEnd::Lost { cause } = &span.end {
                let title = format!(
                    "{} lost its lease on {} (token {}) at {}: {}",
                    span.actor,
                    span.key,
                    span.token,
                    ms(span.to_us),
                    cause
                );
                page.mark(&span.actor.clone(), MarkKind::Lost, span.to_us, title);
            }
            if let Some(lane) = page.lane_mut(&span.actor) {
                lane.leases.push(span);
            }
        }
        for overlap in &check.overlaps {
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
                resource,
                amount,
                fence,
                outcome,
                detail,
                ..
            } = &event.kind
            {
                let fence = fence.map_or_else(|| "no fence".to_owned(), |f| format!("fence {f}"));
                let detail = detail
                    .as_deref()
                    .map_or_else(String::new, |d| format!(": {d}"));
                let (kind, title) = match outcome {
                    WriteOutcome::Accepted => (MarkKind::Accepted, String::new()),
                    WriteOutcome::Insufficient => (MarkKind::Insufficient, String::new()),
                    WriteOutcome::RefusedStale => (
                        MarkKind::Refused,
                        format!(
                            "stale write refused by the database (it saved the day): {} \
                             debit {amount} on {resource} with {fence} at {}",
                            event.actor,
                            ms(event.at_us)
                        ),
                    ),
                    WriteOutcome::Unknown => (
                        MarkKind::Unknown,
                        format!(
                            "write of unknown outcome: {} debit {amount} on {resource} \
                             with {fence} at {}{detail}",
                            event.actor,
                            ms(event.at_us)
                        ),
                    ),
                    WriteOutcome::Failed => (
                        MarkKind::Failed,
                        format!(
                            "write failed: {} debit {amount} on {resource} at {}{detail}",
                            event.actor,
                            ms(event.at_us)
                        ),
                    ),
                };
                page.mark(&event.actor, kind, event.at_us, title);
            }
        }
        page
    }

    fn lane_mut(&mut self, actor: &str) -> Option<&mut Lane> {
        self.lanes.iter_mut().find(|l| l.actor == actor)
    }

    fn mark(&mut self, actor: &str, kind: MarkKind, at_us: u64, title: String) {
        self.mark_from(actor, kind, at_us, at_us, title);
    }

    fn mark_from(&mut self, actor: &str, kind: MarkKind, from_us: u64, at_us: u64, title: String) {
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
        LABEL_W + at_us.min(self.duration_us) as f64 / self.duration_us as f64 * PLOT_W
    }

    fn lanes_bottom(&self) -> f64 {
        TOP + self.lanes.len().max(1) as f64 * LANE_H
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
        writeln!(out, "<style>{STYLE}</style>\n</head>\n<body>")?;
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
        writeln!(out, "<div class=\"chart\">")?;
        self.write_svg(out)?;
        writeln!(out, "</div>")?;
        self.write_lists(out)?;
        writeln!(out, "</body>\n</html>")
    }

    fn write_verdict(&self, out: &mut String) -> fmt::Result {
        let n = self.check.violations.len();
        let (class, text) = match (self.check.holds(), self.check.is_control()) {
            (true, false) => ("ok", "OK: no violation".to_owned()),
            (true, true) => (
                "broken",
                "FAILED: a negative control with no violation (the checker or the fault did \
                 not work)"
                    .to_owned(),
            ),
            (false, false) if self.check.is_reported_only() => (
                "expected",
                format!(
                    "{n} violations (reported: this mode makes no safety claim under this fault)"
                ),
            ),
            (false, false) => ("broken", format!("BROKEN: {n} violations")),
            (false, true) => (
                "expected",
                format!("BROKEN, as a negative control should be: {n} violations"),
            ),
        };
        writeln!(
            out,
            "<p class=\"verdict {class}\" id=\"verdict\">{text}</p>"
        )
    }

    fn write_summary(&self, out: &mut String) -> fmt::Result {
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
        let bottom = self.lanes_bottom();
        let height = bottom + AXIS_H;
        writeln!(
            out,
            "<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" \
             height=\"{height}\" viewBox=\"0 0 {width} {height}\" role=\"img\">"
        )?;
        writeln!(
            out,
            "<defs><pattern id=\"hatch\" width=\"6\" height=\"6\" \
             patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">\
             <rect width=\"6\" height=\"6\" fill=\"#d32f2f\" fill-opacity=\"0.18\"/>\
             <line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#d32f2f\" \
             stroke-width=\"3\"/></pattern></defs>"
        )?;
        for (i, lane) in self.lanes.iter().enumerate() {
            let y = TOP + i as f64 * LANE_H;
            let fill = if i % 2 == 0 { "#f7f7f7" } else { "#ffffff" };
            writeln!(
                out,
                "<rect class=\"lane-bg\" x=\"0\" y=\"{y}\" width=\"{}\" height=\"{LANE_H}\" \
                 fill=\"{fill}\"><title>{}</title></rect>",
                LABEL_W + PLOT_W,
                esc(&lane.actor)
            )?;
        }
        self.write_axis(out, bottom)?;
        self.write_faults(out, bottom)?;
        for (i, lane) in self.lanes.iter().enumerate() {
            self.write_lane(out, i, lane)?;
        }
        writeln!(out, "</svg>")
    }

    fn write_axis(&self, out: &mut String, bottom: f64) -> fmt::Result {
        let duration_ms = self.duration_us as f64 / 1000.0;
        let step = nice_step(duration_ms / 10.0);
        writeln!(
            out,
            "<g class=\"axis\"><line x1=\"{LABEL_W}\" y1=\"{bottom}\" x2=\"{}\" y2=\"{bottom}\" \
             stroke=\"#888\"/>",
            LABEL_W + PLOT_W
        )?;
        let mut k = 0u32;
        loop {
            let t_ms = f64::from(k) * step;
            if t_ms > duration_ms + step * 1e-9 {
                break;
            }
            let x = LABEL_W + t_ms / duration_ms * PLOT_W;
            writeln!(
                out,
                "<line class=\"grid\" x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{bottom}\"/>\
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
            "<text class=\"tick-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">time since the \
             run started (ms)</text></g>",
            LABEL_W + PLOT_W,
            bottom + 34.0
        )
    }

    fn write_faults(&self, out: &mut String, bottom: f64) -> fmt::Result {
        for (i, fault) in self.faults.iter().enumerate() {
            let x0 = self.x(fault.from_us.unwrap_or(0));
            let x1 = self
                .x(fault.to_us.unwrap_or(self.duration_us))
                .max(x0 + 2.0);
            let when = format!(
                "{} to {}",
                fault.from_us.map_or_else(|| "?".to_owned(), ms),
                fault
                    .to_us
                    .map_or_else(|| "the end of the run".to_owned(), ms)
            );
            let label = format!("{} ({})", fault.fault, fault.target);
            let label_y = if i % 2 == 0 { 16.0 } else { 32.0 };
            let (label_x, anchor) = if x0 > LABEL_W + PLOT_W - 180.0 {
                (x1 - 3.0, "end")
            } else {
                (x0 + 3.0, "start")
            };
            writeln!(
                out,
                "<g class=\"fault-window\"><rect class=\"fault\" data-fault=\"{}\" \
                 x=\"{x0:.1}\" y=\"{}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#ffb300\" \
                 fill-opacity=\"0.18\" stroke=\"#e69500\" stroke-dasharray=\"4 3\">\
                 <title>{}: {}</title></rect>\
                 <text class=\"fault-label\" x=\"{label_x:.1}\" y=\"{label_y}\" \
                 text-anchor=\"{anchor}\">{}</text></g>",
                esc(&fault.fault),
                label_y + 4.0,
                x1 - x0,
                bottom - label_y - 4.0,
                esc(&label),
                esc(&when),
                esc(&label)
            )?;
        }
        Ok(())
    }

    fn write_lane(&self, out: &mut String, index: usize, lane: &Lane) -> fmt::Result {
        let y = TOP + index as f64 * LANE_H;
        let mid = y + 14.0;
        writeln!(
            out,
            "<g class=\"lane\" id=\"lane-{index}\" data-actor=\"{}\">\
             <text class=\"lane-label\" x=\"6\" y=\"{:.1}\">{}</text>",
            esc(&lane.actor),
            y + 17.0,
            esc(&lane.actor)
        )?;
        // Wide leases one by one; narrow ones merged into busy runs.
        let mut busy: Option<(f64, f64, usize)> = None;
        for span in &lane.leases {
            let (x0, x1) = (self.x(span.from_us), self.x(span.to_us));
            if x1 - x0 < MIN_LEASE_PX {
                busy = match busy {
                    Some((b0, b1, n)) if x0 <= b1 + 1.0 => Some((b0, b1.max(x1), n + 1)),
                    other => {
                        if let Some(run) = other {
                            write_busy(out, y, run)?;
                        }
                        Some((x0, x1, 1))
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
                .map_or_else(String::new, |f| format!(", fence {f}"));
            writeln!(
                out,
                "<rect class=\"{class}\" data-token=\"{}\" x=\"{x0:.1}\" y=\"{:.1}\" \
                 width=\"{:.1}\" height=\"12\" rx=\"2\" fill=\"hsl({hue},{sat},72%)\" \
                 stroke=\"hsl({hue},{sat},{dark})\"><title>{} held {} (token {}{}) from {} \
                 to {}: {}</title></rect>",
                esc(&span.token),
                y + 8.0,
                x1 - x0,
                esc(&span.actor),
                esc(&span.key),
                esc(&span.token),
                fence,
                ms(span.from_us),
                ms(span.to_us),
                esc(&end)
            )?;
        }
        if let Some(run) = busy {
            write_busy(out, y, run)?;
        }
        write_overlaps(out, y, &lane.overlaps)?;
        for (kind, marks) in &lane.marks {
            write_marks(out, *kind, marks, y, mid)?;
        }
        writeln!(out, "</g>")
    }

    fn write_lists(&self, out: &mut String) -> fmt::Result {
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

fn write_busy(out: &mut String, y: f64, (x0, x1, n): (f64, f64, usize)) -> fmt::Result {
    writeln!(
        out,
        "<rect class=\"lease merged\" x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"12\" \
         fill=\"#a9b4c0\"><title>{n} short leases</title></rect>",
        y + 8.0,
        (x1 - x0).max(1.0)
    )
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
            "<rect class=\"overlap\" x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" \
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
        // Plentiful: one path per lane, no tooltips.
        MarkKind::Accepted | MarkKind::Insufficient => {
            let (class, y0, stroke) = if kind == MarkKind::Accepted {
                ("accepted", y + 1.5, "#2e7d32")
            } else {
                ("insufficient", y + 20.5, "#9e9e9e")
            };
            write!(
                out,
                "<path class=\"{class}\" stroke=\"{stroke}\" stroke-width=\"1.2\" d=\""
            )?;
            for mark in marks.values() {
                write!(out, "M{:.0} {y0}v5", mark.x)?;
            }
            writeln!(out, "\"/>")
        }
        MarkKind::Refused => {
            for mark in marks.values() {
                writeln!(
                    out,
                    "<circle class=\"refused-halo\" cx=\"{:.1}\" cy=\"{mid}\" r=\"11\" \
                     fill=\"#1565c0\" fill-opacity=\"0.22\"/><path class=\"refused\" \
                     d=\"M{:.1} {:.1}l7 8l-7 8l-7 -8z\" fill=\"#1565c0\" stroke=\"#fff\" \
                     stroke-width=\"1.2\">{}</path>",
                    mark.x,
                    mark.x,
                    mid - 8.0,
                    title(mark)
                )?;
            }
            Ok(())
        }
        MarkKind::AcquireFailed => {
            for mark in marks.values() {
                writeln!(
                    out,
                    "<path class=\"acquire-failed\" d=\"M{:.1} {mid}H{:.1}m0 -5v10\" \
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
                    "<circle class=\"{class}\" cx=\"{:.1}\" cy=\"{mid}\" r=\"{r}\" \
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
                    "<path class=\"lost\" d=\"M{:.1} {}l8 8m0 -8l-8 8\" stroke=\"#111\" \
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
    let items: [(&str, String); 9] = [
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
         y2=\"6\" stroke=\"#d32f2f\" stroke-width=\"3\"/></pattern></defs></svg>"
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

    #[test]
    fn axis_steps_are_round() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(13.0), 20.0);
        assert_eq!(nice_step(260.0), 500.0);
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(trim_number(0.1 + 0.2), "0.3");
    }
}
