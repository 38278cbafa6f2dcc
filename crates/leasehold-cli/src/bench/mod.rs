//! `leasehold bench`: performance figures for `BENCHMARKS.md`. Build with
//! `--release`; the machine is shared and noisy, so every bench runs its
//! modes side by side for several rounds and reports medians.

use std::process::ExitCode;

use serde_json::Value;

use crate::cli::Bench;
use crate::env::{Database, Env};
use crate::progress::Progress;

pub(crate) mod consensus;
pub(crate) mod contention;
pub(crate) mod guard;
pub(crate) mod leader;
pub(crate) mod pg;
pub(crate) mod rounds;
pub(crate) mod site;
pub(crate) mod uncontended;

/// Runs the bench; its figures are printed, not judged, so it exits 0
/// unless a server fails (or `bench leader` sees a term's fencing token
/// not above the last: exit 1).
pub(crate) async fn run(bench: Bench) -> anyhow::Result<ExitCode> {
    match bench {
        Bench::Contention(args) => {
            site::check(&args)?;
            let env = Env::connect(&args.redis).await?;
            contention::run(&env, &args, args.output.json).await?;
        }
        Bench::Uncontended(args) => {
            let env = Env::connect(&args.redis).await?;
            uncontended::run(&env, &args, args.output.json).await?;
        }
        Bench::Etcd(args) => {
            let env = Env::connect(&args.redis).await?;
            consensus::run(&env, &args, consensus::Bench::Etcd).await?;
        }
        Bench::Consensus(args) => {
            let env = Env::connect(&args.redis).await?;
            consensus::run(&env, &args, consensus::Bench::Consensus).await?;
        }
        Bench::Pg(args) => {
            let env = Env::connect(&args.redis).await?;
            pg::run(&env, &args, args.output.json).await?;
        }
        Bench::Guard(args) => {
            let db = Database::new(&args.database);
            guard::run(&db, &args, args.output.json).await?;
        }
        Bench::Leader(args) => return leader::run(&args).await,
        Bench::LeaderCandidate => leader::candidate::run().await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The bar of a bench of `len` measurements, or, when no bar can be drawn
/// (stderr is not a terminal) and the output is text, one line per
/// measurement on stderr.
pub(crate) struct Measurements {
    bar: Progress,
    lines: bool,
}

impl Measurements {
    pub(crate) fn new(what: &'static str, len: u64, json: bool) -> Measurements {
        Measurements {
            bar: Progress::new(what, len),
            lines: !json && !crate::progress::enabled(),
        }
    }

    /// A measurement begins.
    pub(crate) fn start(&self, what: String) {
        if self.lines {
            eprintln!("{what}");
        }
        self.bar.start(what);
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Prints `rows` as a table: one column per `(field, heading)` of `cols`,
/// strings as they are, a missing field as `-`.
pub(crate) fn print_table(cols: &[(&str, &str)], rows: &[Value]) {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            cols.iter()
                .map(|(k, _)| match &r[*k] {
                    Value::String(s) => s.clone(),
                    Value::Null => "-".into(),
                    v => v.to_string(),
                })
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = cols.iter().map(|(_, h)| h.len()).collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cols: Vec<&str>| {
        let padded: Vec<String> = cols
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(cols.iter().map(|(_, h)| *h).collect());
    for row in &cells {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Rounds to 3 significant decimals for printing and JSON.
pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[f64::NAN, 1.0]), 1.0);
        assert_eq!(median(&[f64::INFINITY, 1.0, 5.0]), 5.0);
    }
}
