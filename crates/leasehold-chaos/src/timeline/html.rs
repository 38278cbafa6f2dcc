//! The page around the chart: its head with the style sheet, the verdict
//! and the counts, the zoom controls, the lists under the chart, and the
//! script.

use std::fmt::{self, Write};

use super::page::Page;
use super::svg::write_legend;
use super::{esc, ms};
use crate::verdicts::Verdict;

/// How many overlaps are listed under the chart.
const LISTED_OVERLAPS: usize = 50;

/// The page's style sheet (`timeline.css`).
const STYLE: &str = include_str!("timeline.css");

/// The page's one script: zoom, tooltips, the layout of the ticks and the
/// fault labels for the range shown. Nothing fetched; without it the
/// static chart stays.
const SCRIPT: &str = include_str!("timeline.js");

impl Page<'_> {
    pub(super) fn write(&self, out: &mut String) -> fmt::Result {
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
