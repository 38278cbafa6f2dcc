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
//!
//! # How it is built
//!
//! `page` gathers the drawing's model from the history (the lanes, their
//! leases and merged marks, the fault windows, the time scale); `layout`
//! places what must not overlap (the fault labels, the lane labels, the
//! axis steps); `svg` draws the chart and its legend; `html` writes the
//! page around it, with `timeline.css` and `timeline.js`.

mod html;
mod layout;
mod page;
mod svg;

use crate::check::RunCheck;
use crate::history::Event;
use crate::verdicts::Verdict;
use page::Page;

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

/// Microseconds as milliseconds with one decimal: `12.3 ms`.
fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
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
}
