//! `leasehold demo`: every experiment, in tutorial order, against what the
//! tutorial shows.

use std::process::ExitCode;

use crate::cli::{LockArgs, SpendArgs, TtlArgs};
use crate::env::Env;
use crate::experiments;
use crate::report::Report;

/// What the tutorial's printed result says a step must show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shows {
    Ok,
    Broken,
}

impl Shows {
    fn matches(self, report: &Report) -> bool {
        report.errors == 0 && report.ok == (self == Shows::Ok) && report.tutorial_also
    }
}

struct Row {
    step: &'static str,
    what: &'static str,
    tutorial: &'static str,
    report: Report,
    matches: bool,
}

/// Runs the steps and prints the table; non-zero exit on any mismatch.
pub(crate) async fn run(env: &Env) -> anyhow::Result<ExitCode> {
    let mut rows = Vec::new();
    let mut add = |step, what, tutorial, shows: Shows, report: Report| {
        let matches = shows.matches(&report);
        rows.push(Row {
            step,
            what,
            tutorial,
            report,
            matches,
        });
    };

    let spend = SpendArgs::default();
    add(
        "1",
        "race: 50 spenders, no lock",
        "accepted=50 balance=80 expected=-400 BROKEN",
        Shows::Broken,
        experiments::race::run(env, &spend).await?,
    );
    add(
        "2",
        "lock: SET NX PX + token release",
        "accepted=10 balance=0 expected=0 OK",
        Shows::Ok,
        experiments::lock::run(env, &LockArgs::default()).await?,
    );
    let ttl = TtlArgs::default();
    let broken = experiments::ttl::run(env, &ttl).await?;
    // The tutorial also shows every release refused as stale.
    let all_stale = broken.extra.get("stale_releases") == Some(&ttl.callers.into());
    add(
        "3",
        "ttl: 300ms work on a 100ms lease",
        "accepted=5 balance=80 expected=50 BROKEN",
        Shows::Broken,
        broken.tutorial_also(all_stale),
    );
    add(
        "3",
        "ttl --watchdog",
        "accepted=5 balance=50 expected=50 OK",
        Shows::Ok,
        experiments::ttl::run(
            env,
            &TtlArgs {
                watchdog: true,
                ..TtlArgs::default()
            },
        )
        .await?,
    );

    print_table(&rows);
    let failed = rows.iter().filter(|r| !r.matches).count();
    if failed == 0 {
        println!("\nall {} steps show what the tutorial shows", rows.len());
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "\n{failed} of {} steps do NOT show what the tutorial shows",
            rows.len()
        );
        Ok(ExitCode::FAILURE)
    }
}

fn print_table(rows: &[Row]) {
    let header = [
        "step",
        "experiment",
        "tutorial shows",
        "observed",
        "matches",
    ];
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                r.step.to_owned(),
                r.what.to_owned(),
                r.tutorial.to_owned(),
                r.report.check_line(),
                if r.matches { "yes" } else { "NO" }.to_owned(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cols: [&str; 5]| {
        let padded: Vec<String> = cols
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header);
    for row in &cells {
        line([&row[0], &row[1], &row[2], &row[3], &row[4]]);
    }
}
