//! The chart: one SVG of lanes, leases, marks, overlaps, fault windows and
//! the time axis; and the legend that shows its marks.

use std::collections::BTreeMap;
use std::fmt::{self, Write};

use super::layout::{
    AXIS_H, FAULT_ROW_H, FaultLabel, HIT_PX, LABEL_W, LANE_CHAR_W, LANE_H, MIN_LEASE_PX, PLOT_W,
    RIGHT_PAD, fit_text, label_y, tick_step, trim_number,
};
use super::page::{Lane, Mark, MarkKind, Page};
use super::{esc, ms};
use crate::check::{self, LeaseEnd, LeaseSpan};

/// A stable colour for a token label: FNV-1a of the label picks a hue,
/// kept away from the reds of the overlap marks.
fn token_colour(token: &str) -> (u32, &'static str, &'static str) {
    let hash = token.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (35 + (hash % 285) as u32, "62%", "38%")
}

impl Page<'_> {
    pub(super) fn write_svg(&self, out: &mut String) -> fmt::Result {
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
    pub(super) fn fault_text(&self, fault: &check::FaultWindow, label: &FaultLabel) -> String {
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

pub(super) fn write_legend(out: &mut String) -> fmt::Result {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_colours_are_stable_and_not_red() {
        assert_eq!(token_colour("a1b2"), token_colour("a1b2"));
        for token in ["a", "b", "c7", "ffff", "0"] {
            let (hue, ..) = token_colour(token);
            assert!((35..320).contains(&hue), "{token}: hue {hue}");
        }
    }
}
