//! Figures of ways measured side by side over rounds, as `bench etcd` and
//! `bench pg` report them: each figure's median with its spread
//! (min..max) over the rounds, and the medians of the rounds' ratios
//! against the first way (each round's runs are seconds apart, so a load
//! that comes and goes on a shared machine moves both sides of a ratio,
//! and the ratio less than either).

use anyhow::Context as _;
use serde_json::{Map, Value, json};

use super::contention;
use super::uncontended::Pairs;
use super::{median, round3};

/// One case of one way in one round: `(figure, value)`; NaN where the way
/// has no such figure.
pub(crate) type Figures = Vec<(&'static str, f64)>;

/// An uncontended case's figures: pairs per second, the pairs' latency
/// quantiles (asked for of the run), and how many there were.
pub(crate) fn pairs(pairs: &Pairs) -> anyhow::Result<Figures> {
    let latency = pairs.latency.as_ref().context("no latencies")?;
    let us = |q| latency.value_at_quantile(q) as f64;
    Ok(vec![
        ("per_s", pairs.per_s),
        ("p50_us", us(0.5)),
        ("p99_us", us(0.99)),
        ("leases", pairs.count as f64),
    ])
}

/// The tutorial case's figures: leases per second, the gap from a release
/// to the next holder, the workload's own, and how many leases there were.
pub(crate) fn tutorial(figures: &contention::Figures) -> Figures {
    let metrics = figures.metrics();
    let metric = |name| value(&metrics, name);
    vec![
        (
            "per_s",
            metric("acquisitions") / figures.elapsed.as_secs_f64(),
        ),
        ("p50_us", metric("gap_p50_us")),
        ("p99_us", metric("gap_p99_us")),
        ("elapsed_ms", metric("elapsed_ms")),
        ("utilisation", metric("utilisation")),
        ("round_trips_per_acq", metric("round_trips_per_acq")),
        ("gave_up", metric("gave_up")),
        ("fairness", metric("fairness")),
        ("leases", metric("acquisitions")),
    ]
}

/// The value of figure `name` in `round` (NaN if missing).
pub(crate) fn value(round: &Figures, name: &str) -> f64 {
    round
        .iter()
        .find(|(k, _)| *k == name)
        .map_or(f64::NAN, |(_, v)| *v)
}

/// The row of `case` for `way`: each figure's median and spread over
/// `rounds`, and, for the figures named in `ratios`, the medians of the
/// rounds' ratios against `base`'s (as `{figure}_ratio`).
pub(crate) fn row(
    case: &str,
    way: &str,
    rounds: &[Figures],
    base: &[Figures],
    ratios: &[&str],
) -> Value {
    let mut row = Map::new();
    row.insert("case".into(), json!(case));
    row.insert("way".into(), json!(way));
    for (name, _) in &rounds[0] {
        let values: Vec<f64> = rounds.iter().map(|r| value(r, name)).collect();
        let known = values.iter().copied().filter(|x| !x.is_nan());
        let (min, max) = known.fold((f64::NAN, f64::NAN), |(lo, hi), x| (lo.min(x), hi.max(x)));
        row.insert(
            (*name).into(),
            json!({
                "median": number(median(&values)),
                "min": number(min),
                "max": number(max),
            }),
        );
        if ratios.contains(name) {
            let ratios: Vec<f64> = rounds
                .iter()
                .zip(base)
                .map(|(r, b)| value(r, name) / value(b, name))
                .collect();
            row.insert(format!("{name}_ratio"), number(median(&ratios)));
        }
    }
    Value::Object(row)
}

/// A finite `x` to three decimals; null otherwise.
/// A figure as JSON: rounded, `"inf"` when infinite (a fairness where a
/// caller got no lease), null when there is none.
fn number(x: f64) -> Value {
    if x.is_finite() {
        json!(round3(x))
    } else if x == f64::INFINITY {
        json!("inf")
    } else {
        Value::Null
    }
}

/// Prints `rows` as a table: the columns every way-by-way bench has (the
/// case, the way, pairs or leases per second, the latency quantiles and
/// their ratios), then `more`; each figure as `median (min..max)`.
pub(crate) fn print(rows: &[Value], more: &[(&str, &str)]) {
    let mut columns = vec![
        ("case", "case"),
        ("way", "way"),
        ("per_s", "per s"),
        ("p50_us", "p50 us"),
        ("p99_us", "p99 us"),
        ("per_s_ratio", "per s ratio"),
        ("p50_us_ratio", "p50 ratio"),
        ("p99_us_ratio", "p99 ratio"),
    ];
    columns.extend_from_slice(more);
    super::print_table(&columns, &cells(rows));
}

/// `rows` ready for [`print_table`](super::print_table): each figure as
/// `median (min..max)`, the rest as they are.
pub(crate) fn cells(rows: &[Value]) -> Vec<Value> {
    let text = |x: &Value| match (x.as_f64(), x.as_str()) {
        (Some(x), _) => Some(short(x)),
        (None, Some(x)) => Some(x.to_owned()),
        (None, None) => None,
    };
    let spread = |figure: &Value| match (
        text(&figure["median"]),
        text(&figure["min"]),
        text(&figure["max"]),
    ) {
        (Some(median), Some(min), Some(max)) => json!(format!("{median} ({min}..{max})")),
        (Some(median), _, _) => json!(median),
        _ => Value::Null,
    };
    rows.iter()
        .map(|row| {
            let mut cells = Map::new();
            for (key, value) in row.as_object().into_iter().flatten() {
                let cell = if value.is_object() {
                    spread(value)
                } else {
                    value.clone()
                };
                cells.insert(key.clone(), cell);
            }
            Value::Object(cells)
        })
        .collect()
}

/// `x` to about three significant digits (whole numbers from 100 up).
pub(crate) fn short(x: f64) -> String {
    let decimals = match x.abs() {
        a if a >= 100.0 => 0,
        a if a >= 10.0 => 1,
        a if a >= 1.0 => 2,
        _ => 3,
    };
    format!("{x:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_infinite_figure_is_inf_in_its_spread_and_in_the_cells() {
        let rounds: Vec<Figures> = vec![
            vec![("fairness", 1.0)],
            vec![("fairness", f64::INFINITY)],
            vec![("fairness", 2.0)],
        ];
        let row = row("timed", "pg", &rounds, &rounds, &[]);
        assert_eq!(row["fairness"]["median"], 2.0);
        assert_eq!(row["fairness"]["min"], 1.0);
        assert_eq!(row["fairness"]["max"], "inf");
        assert_eq!(cells(&[row])[0]["fairness"], "2.00 (1.00..inf)");
    }

    #[test]
    fn a_row_has_medians_spreads_and_ratios_against_the_base() {
        let base: Vec<Figures> = vec![
            vec![("per_s", 100.0), ("elapsed_ms", 10.0)],
            vec![("per_s", 200.0), ("elapsed_ms", 20.0)],
            vec![("per_s", 300.0), ("elapsed_ms", 30.0)],
        ];
        let way: Vec<Figures> = vec![
            vec![("per_s", 50.0), ("elapsed_ms", 15.0), ("dead", f64::NAN)],
            vec![("per_s", 100.0), ("elapsed_ms", 40.0), ("dead", f64::NAN)],
            vec![("per_s", 300.0), ("elapsed_ms", 30.0), ("dead", f64::NAN)],
        ];
        let row = row("tutorial", "pg", &way, &base, &["elapsed_ms"]);
        assert_eq!(row["case"], "tutorial");
        assert_eq!(row["way"], "pg");
        assert_eq!(row["per_s"]["median"], 100.0);
        assert_eq!(row["per_s"]["min"], 50.0);
        assert_eq!(row["per_s"]["max"], 300.0);
        // The median of the rounds' ratios (1.5, 2, 1), not of the medians.
        assert_eq!(row["elapsed_ms_ratio"], 1.5);
        assert!(row.get("per_s_ratio").is_none());
        assert!(row["dead"]["median"].is_null());
        assert!(row["dead"]["min"].is_null() && row["dead"]["max"].is_null());
        let cells = cells(&[row]);
        assert_eq!(cells[0]["per_s"], "100 (50.0..300)");
        assert!(cells[0]["dead"].is_null());
    }
}
