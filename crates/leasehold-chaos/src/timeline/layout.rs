//! Where things go: the page's dimensions, the fault labels packed into
//! rows, lane labels cut to fit, and round axis steps.

/// The width of the lane labels, in pixels.
pub(super) const LABEL_W: f64 = 120.0;
/// The width of the plot, in pixels.
pub(super) const PLOT_W: f64 = 1160.0;
/// The space right of the plot.
pub(super) const RIGHT_PAD: f64 = 24.0;
/// The height of one row of fault labels above the lanes.
pub(super) const FAULT_ROW_H: f64 = 16.0;
/// How many rows of fault labels may hold full labels; past them a label
/// is shortened to its number.
pub(super) const FULL_LABEL_ROWS: usize = 3;
/// The space between two labels in a row, in pixels.
pub(super) const LABEL_GAP: f64 = 6.0;
/// Estimated widths of one character (pixels, a little generous): the
/// bold fault labels, the monospace lane labels, the tick labels.
pub(super) const FAULT_CHAR_W: f64 = 7.4;
pub(super) const LANE_CHAR_W: f64 = 7.3;
pub(super) const TICK_CHAR_W: f64 = 7.0;
/// How wide (pixels) one hover target of accepted or insufficient writes
/// is.
pub(super) const HIT_PX: f64 = 12.0;
/// The height of one lane.
pub(super) const LANE_H: f64 = 26.0;
/// The height of the axis below the lanes.
pub(super) const AXIS_H: f64 = 40.0;
/// Writes in flight longer than this (pixels) are drawn from when they
/// started.
pub(super) const MIN_IN_FLIGHT_PX: f64 = 3.0;
/// Leases narrower than this (pixels) are merged.
pub(super) const MIN_LEASE_PX: f64 = 2.0;

/// A fault window's label, placed.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct FaultLabel {
    /// The full text, `#3 redis-pause (redis)`.
    pub(super) full: String,
    /// What is drawn: the full text, or `#3` when there was no room.
    pub(super) text: String,
    /// The left edge of its box.
    pub(super) x: f64,
    /// The estimated width of its box.
    pub(super) width: f64,
    /// Its row, from the top.
    pub(super) row: usize,
}

/// Places the labels of windows spanning `spans` (pixels): each takes the
/// first row where it clears every label already placed there, in order
/// of start; a full label only in the first [`FULL_LABEL_ROWS`] rows, its
/// number in any (a new row if need be). Returns the labels, by window,
/// and how many rows they take.
pub(super) fn layout_fault_labels(
    spans: &[(f64, f64)],
    full: &[(usize, String)],
) -> (Vec<FaultLabel>, usize) {
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

/// The baseline of a row of fault labels.
pub(super) fn label_y(row: usize) -> f64 {
    12.0 + row as f64 * FAULT_ROW_H
}

/// `text`, cut with an ellipsis to fit `width` pixels at `char_w` each.
pub(super) fn fit_text(text: &str, width: f64, char_w: f64) -> String {
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
pub(super) fn tick_step(span_ms: f64, last_ms: f64) -> f64 {
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
pub(super) fn trim_number(value: f64) -> String {
    let rounded = (value * 1000.0).round() / 1000.0;
    format!("{rounded}")
}

#[cfg(test)]
mod tests {
    use super::*;

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
