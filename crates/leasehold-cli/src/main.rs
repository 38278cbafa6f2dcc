//! `leasehold`: reproduces the tutorial's experiments against real servers.
//!
//! `main` parses the flags (`cli`) and runs the subcommand they name: it is
//! the one place that knows every subcommand. The subcommands (`demo`,
//! `experiments`, `bench`, `chaos`) take `cli`'s types and share the
//! modules below them (`env`, `waiting`, `wallet`, `report`, ...), which
//! import neither `cli` nor a subcommand.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

use crate::cli::{Cli, Command, RunFlags};
use crate::env::{Database, Env};
use crate::progress::note;
use crate::report::Report;

mod bench;
mod cause;
mod chaos;
mod child;
mod cli;
mod demo;
mod env;
mod exit;
mod experiments;
mod holds;
mod interrupt;
mod ledger;
mod metrics;
mod progress;
mod redact;
mod report;
mod server;
mod waiting;
mod wallet;

fn main() -> ExitCode {
    let cli = Cli::parse();
    progress::init(cli.json());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // The experiments break leases on purpose: the library's
                // warnings for stale releases and refused writes are what
                // they count and print, not news. RUST_LOG shows them.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new(
                        "warn,leasehold::lease=error,leasehold_pg=error",
                    )
                }),
        )
        .with_writer(progress::LogWriter)
        // No colour codes in a captured log.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the tokio runtime: {err}");
            return ExitCode::from(exit::SERVER_ERROR);
        }
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            // First, so the handlers are in place before any server starts.
            biased;
            signal = interrupt::signalled() => Err(signal),
            outcome = run(cli) => Ok(outcome),
        }
    });
    // The run is gone, and the servers it held with it; this drops the
    // tasks it spawned (and theirs) and waits for servers still starting.
    runtime.shutdown_timeout(interrupt::SHUTDOWN);
    match outcome {
        Err(signal) => {
            let left = interrupt::still_running();
            if left.is_empty() {
                eprintln!(
                    "leasehold: interrupted by {signal}; the throwaway servers and processes it started are stopped"
                );
            } else {
                let pids: Vec<String> = left.iter().map(u32::to_string).collect();
                eprintln!(
                    "leasehold: interrupted by {signal}; {} processes it started still run (pids {}): stop them by hand",
                    left.len(),
                    pids.join(", ")
                );
            }
            ExitCode::from(exit::INTERRUPTED)
        }
        Ok(Ok(code)) => code,
        Ok(Err(err)) => {
            eprintln!("error: {}", redact::redact_text(&cause::describe(&err)));
            if is_usage(&err) {
                ExitCode::from(exit::USAGE)
            } else {
                ExitCode::from(exit::SERVER_ERROR)
            }
        }
    }
}

/// Runs the command; the exit code says whether it showed what it should.
async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let output = cli.output();
    // A benchmark measures the library without a recorder unless asked.
    // chaos takes its leases in worker processes, whose metrics it does not
    // gather.
    let unmeasured = matches!(cli.command, Command::Bench(_) | Command::Chaos(_));
    let summary = if output.metrics_addr.is_some() || !unmeasured {
        Some(metrics::install(output.metrics_addr)?)
    } else {
        None
    };
    let started = Instant::now();
    let code = run_command(cli).await?;
    if let Some(summary) = summary
        && started.elapsed() >= LONG_RUN
    {
        summary.print();
    }
    Ok(code)
}

/// How long a run lasts before it ends with a metrics summary (on stderr).
const LONG_RUN: Duration = Duration::from_secs(2);

async fn run_command(cli: Cli) -> anyhow::Result<ExitCode> {
    use experiments::{backoff, failover, fencing, lock, race, redlock, ttl, verify};
    match cli.command {
        Command::Race(e) => {
            let env = Env::connect(&e.servers).await?;
            repeat(&e.run, || race::run(&env, &e.workload)).await
        }
        Command::Lock(e) => {
            let env = Env::connect(&e.servers).await?;
            repeat(&e.run, || lock::run(&env, &e.workload)).await
        }
        Command::Ttl(e) => {
            let env = Env::connect(&e.servers).await?;
            repeat(&e.run, || ttl::run(&env, &e.workload)).await
        }
        Command::Backoff(e) => {
            let env = Env::connect(&e.servers).await?;
            repeat(&e.run, || backoff::run(&env, &e.workload)).await
        }
        Command::Fencing(e) => {
            let env = Env::connect(&e.servers.redis).await?;
            let db = Database::new(&e.servers.database);
            repeat(&e.run, || fencing::run(&env, &db, &e.workload)).await
        }
        Command::Verify(e) => {
            e.workload.mode()?;
            let env = Env::connect(&e.servers.redis).await?;
            let db = Database::new(&e.servers.database);
            repeat(&e.run, || verify::run(&env, &db, &e.workload)).await
        }
        Command::Failover(e) => {
            e.servers.warn_ignored_redis_url();
            let db = Database::new(&e.servers.database);
            repeat(&e.run, || failover::run(&db, &e.workload)).await
        }
        Command::Redlock(e) => {
            e.servers.warn_ignored_redis_url();
            let db = Database::new(&e.servers.database);
            repeat(&e.run, || redlock::run(&db, &e.workload)).await
        }
        Command::Bench(which) => bench::run(which).await,
        Command::Demo(args) => {
            let env = Env::connect(&args.servers.redis).await?;
            let db = Database::new(&args.servers.database);
            demo::run(&env, &db, args.output.json).await
        }
        Command::Chaos(args) => chaos::run(&args).await,
    }
}

/// Runs one experiment `--runs` times, printing each run as it ends.
async fn repeat<F, Fut>(flags: &RunFlags, mut once: F) -> anyhow::Result<ExitCode>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Report>>,
{
    let (runs, json) = (flags.runs, flags.output.json);
    let (mut ok, mut errors) = (0, 0);
    for run in 1..=runs {
        let report = once().await?.with_run(run);
        ok += u32::from(report.ok);
        errors += report.errors;
        report.print(json);
    }
    if runs > 1 && !json {
        println!("runs={} OK={} BROKEN={}", runs, ok, runs - ok);
    }
    if errors > 0 {
        note!(
            "leasehold: {errors} callers failed with an error; the check above is not trustworthy"
        );
        return Ok(ExitCode::from(exit::SERVER_ERROR));
    }
    if ok < runs {
        return Ok(ExitCode::from(exit::BROKEN));
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `err` is the caller's to fix before anything runs (exit 2): a
/// usage error, a URL that does not parse, a TLS file that cannot be used.
fn is_usage(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<exit::Usage>().is_some()
            || matches!(
                cause.downcast_ref::<leasehold::Error>(),
                Some(leasehold::Error::InvalidUrl(_) | leasehold::Error::TlsFile { .. })
            )
            // A marks file or history to fix (one that cannot be read is
            // an i/o error, as a history's is).
            || cause
                .downcast_ref::<leasehold_chaos::MarksError>()
                .is_some_and(|err| !matches!(err, leasehold_chaos::MarksError::Read { .. }))
            || matches!(
                cause.downcast_ref::<leasehold_pg::Error>(),
                Some(
                    leasehold_pg::Error::InvalidUrl
                        | leasehold_pg::Error::InvalidTls { .. }
                        | leasehold_pg::Error::TlsFile { .. }
                )
            )
    })
}
