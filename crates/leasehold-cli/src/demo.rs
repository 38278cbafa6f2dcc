//! `leasehold demo`: every experiment, in tutorial order, against what the
//! tutorial shows.

use std::process::ExitCode;
use std::time::Duration;

use crate::cli::{
    BackoffArgs, FailoverArgs, FencingArgs, LockArgs, RedlockArgs, SpendArgs, TtlArgs, VerifyArgs,
    WriteMode,
};
use crate::env::{Database, Env};
use crate::experiments;
use crate::progress::Progress;
use crate::report::Report;

/// What the tutorial's printed result says a step must show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shows {
    Ok,
    Broken,
    /// The tutorial says the step *can* go either way; the row prints what
    /// happened and matches as long as no caller failed with an error.
    Either,
}

impl Shows {
    fn matches(self, report: &Report) -> bool {
        report.errors == 0
            && report.tutorial_also
            && match self {
                Shows::Ok => report.ok,
                Shows::Broken => !report.ok,
                Shows::Either => true,
            }
    }
}

struct Row {
    step: &'static str,
    what: &'static str,
    tutorial: &'static str,
    report: Report,
    matches: bool,
}

/// How many steps the demo runs.
const STEPS: u64 = 18;

/// The steps run so far, and the bar that shows which one is running.
struct Steps {
    rows: Vec<Row>,
    progress: Progress,
}

impl Steps {
    /// Runs one step: `report` is the experiment's run, `what` names it on
    /// the bar and in the table.
    async fn run(
        &mut self,
        step: &'static str,
        what: &'static str,
        tutorial: &'static str,
        shows: Shows,
        report: impl Future<Output = anyhow::Result<Report>>,
    ) -> anyhow::Result<()> {
        self.progress.start(what);
        let report = report.await?;
        let matches = shows.matches(&report);
        self.rows.push(Row {
            step,
            what,
            tutorial,
            report,
            matches,
        });
        Ok(())
    }
}

/// Runs the steps and prints the table (with `json`, one object per step
/// and a summary object); exit code 1 on any mismatch.
pub(crate) async fn run(env: &Env, db: &Database, json: bool) -> anyhow::Result<ExitCode> {
    let mut steps = Steps {
        rows: Vec::new(),
        progress: Progress::new("demo", STEPS),
    };

    let spend = SpendArgs::default();
    steps
        .run(
            "1",
            "race: 50 spenders, no lock",
            "accepted=50 balance=80 expected=-400 BROKEN",
            Shows::Broken,
            experiments::race::run(env, &spend),
        )
        .await?;
    let lock = LockArgs::default();
    steps
        .run(
            "2",
            "lock: SET NX PX + token release",
            "accepted=10 balance=0 expected=0 OK",
            Shows::Ok,
            experiments::lock::run(env, &lock),
        )
        .await?;
    let ttl = TtlArgs::default();
    steps
        .run(
            "3",
            "ttl: 300ms work on a 100ms lease",
            "accepted=5 balance=80 expected=50 BROKEN",
            Shows::Broken,
            async {
                let broken = experiments::ttl::run(env, &ttl).await?;
                // The tutorial also shows every release refused as stale.
                let all_stale = broken.extra.get("stale_releases") == Some(&ttl.callers.into());
                Ok(broken.tutorial_also(all_stale))
            },
        )
        .await?;
    let watchdog = TtlArgs {
        watchdog: true,
        ..TtlArgs::default()
    };
    steps
        .run(
            "3",
            "ttl --watchdog",
            "accepted=5 balance=50 expected=50 OK",
            Shows::Ok,
            experiments::ttl::run(env, &watchdog),
        )
        .await?;
    let backoff = BackoffArgs::default();
    steps
        .run(
            "4",
            "backoff: exponential 16..128ms, no jitter",
            "accepted=10 balance=0 expected=0 OK, gave up=0..5",
            Shows::Ok,
            experiments::backoff::run(env, &backoff),
        )
        .await?;
    let jitter = BackoffArgs {
        jitter: true,
        ..BackoffArgs::default()
    };
    steps
        .run(
            "4",
            "backoff: full jitter",
            "accepted=10 balance=0 expected=0 OK, gave up=0",
            Shows::Ok,
            none_gave_up(experiments::backoff::run(env, &jitter)),
        )
        .await?;
    let handoff = BackoffArgs {
        handoff: true,
        ..BackoffArgs::default()
    };
    steps
        .run(
            "4",
            "backoff: hand-off (FIFO, no polling)",
            "(beyond the tutorial) OK, gave up=0",
            Shows::Ok,
            none_gave_up(experiments::backoff::run(env, &handoff)),
        )
        .await?;
    let (fenced, unfenced) = (
        FencingArgs { unfenced: false },
        FencingArgs { unfenced: true },
    );
    steps
        .run(
            "5",
            "fencing: A paused past its lease",
            "A: write with fence 33 REJECTED, balance=90 fence=34",
            Shows::Ok,
            experiments::fencing::run(env, db, &fenced),
        )
        .await?;
    steps
        .run(
            "5",
            "fencing --unfenced",
            "A: wrote balance 90 with fence 33 (lost update)",
            Shows::Broken,
            experiments::fencing::run(env, db, &unfenced),
        )
        .await?;
    let verify = |ttl: Duration, mode: WriteMode| VerifyArgs {
        ttl,
        mode,
        ..VerifyArgs::default()
    };
    let (healthy, broken) = (Duration::from_secs(2), Duration::from_millis(1));
    for (what, tutorial, shows, args) in [
        (
            "verify: fenced, ttl 2s",
            "accepted=10 balance=0 expected=0 OK",
            Shows::Ok,
            verify(healthy, WriteMode::Fenced),
        ),
        (
            "verify: fenced only, ttl 1ms",
            "accepted=17..20 balance=0 BROKEN (can be)",
            Shows::Either,
            verify(broken, WriteMode::Fenced),
        ),
        (
            "verify: --same-version, ttl 1ms",
            "accepted=10 balance=0 expected=0 OK",
            Shows::Ok,
            verify(broken, WriteMode::Cas),
        ),
        (
            "verify: SELECT FOR UPDATE, no redis lock",
            "correct (recommended alternative)",
            Shows::Ok,
            verify(healthy, WriteMode::ForUpdate),
        ),
        (
            "verify: one conditional UPDATE, no lock",
            "correct (recommended alternative)",
            Shows::Ok,
            verify(healthy, WriteMode::Single),
        ),
        (
            "verify: no lock, no check (control)",
            "the Step 1 bug: BROKEN",
            Shows::Broken,
            verify(healthy, WriteMode::None),
        ),
    ] {
        steps
            .run(
                "6",
                what,
                tutorial,
                shows,
                experiments::verify::run(env, db, &args),
            )
            .await?;
    }
    let two_holders = FailoverArgs::default();
    steps
        .run(
            "safety",
            "failover: lock lost with the primary",
            "two holders (SAFETY VIOLATION), balance right",
            Shows::Ok,
            async {
                let report = experiments::failover::run(db, &two_holders).await?;
                // The tutorial's point: the lock was granted twice, and the
                // database still kept the balance right.
                let caught = report.extra.get("holders") == Some(&2.into())
                    && report.extra.get("refused_by_database") == Some(&1.into());
                Ok(report.tutorial_also(caught))
            },
        )
        .await?;
    let waited = FailoverArgs {
        wait_replicas: 1,
        ..FailoverArgs::default()
    };
    steps
        .run(
            "safety",
            "failover --wait-replicas 1",
            "WAIT narrows the window: acquire refused",
            Shows::Ok,
            async {
                let report = experiments::failover::run(db, &waited).await?;
                let refused = report.extra.get("not_replicated") == Some(&true.into())
                    && report.extra.get("holders") == Some(&1.into());
                Ok(report.tutorial_also(refused))
            },
        )
        .await?;
    let redlock = RedlockArgs::default();
    steps
        .run(
            "safety",
            "redlock: 3 nodes, one paused mid-run",
            "majority survives one node: balance right",
            Shows::Ok,
            experiments::redlock::run(db, &redlock),
        )
        .await?;
    let Steps { rows, progress } = steps;
    drop(progress);

    let failed = rows.iter().filter(|r| !r.matches).count();
    if json {
        for row in &rows {
            println!(
                "{}",
                serde_json::json!({
                    "step": row.step,
                    "experiment": row.what,
                    "tutorial": row.tutorial,
                    "matches": row.matches,
                    "report": row.report.to_json(),
                })
            );
        }
        println!(
            "{}",
            serde_json::json!({ "steps": rows.len(), "matching": rows.len() - failed })
        );
        return Ok(if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    print_table(&rows);
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

/// A backoff run that must also show that nobody gave up.
async fn none_gave_up(
    report: impl Future<Output = anyhow::Result<Report>>,
) -> anyhow::Result<Report> {
    let report = report.await?;
    let none = report.extra.get("gave_up").and_then(|v| v.as_u64()) == Some(0);
    Ok(report.require(none))
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
                match &r.report.headline {
                    Some(h) => format!("{}, {h}", r.report.check_line()),
                    None => r.report.check_line(),
                },
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
