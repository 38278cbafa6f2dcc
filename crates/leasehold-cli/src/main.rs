//! `leasehold`: reproduces the tutorial's experiments against real servers.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

mod bench;
mod chaos;
mod cli;
mod demo;
mod env;
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
    let cli = cli::Cli::parse();
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
            return ExitCode::from(cli::SERVER_ERROR);
        }
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            // First, so the handlers are in place before any server starts.
            biased;
            signal = interrupt::signalled() => Err(signal),
            outcome = cli::run(cli) => Ok(outcome),
        }
    });
    // The run is gone, and the servers it held with it; this drops the
    // tasks it spawned (and theirs) and waits for servers still starting.
    runtime.shutdown_timeout(interrupt::SHUTDOWN);
    match outcome {
        Err(signal) => {
            eprintln!(
                "leasehold: interrupted by {signal}; the throwaway servers it started are stopped"
            );
            ExitCode::from(cli::INTERRUPTED)
        }
        Ok(Ok(code)) => code,
        Ok(Err(err)) => {
            eprintln!("error: {}", redact::redact_text(&report::chain(&err)));
            if is_usage(&err) {
                ExitCode::from(cli::USAGE)
            } else {
                ExitCode::from(cli::SERVER_ERROR)
            }
        }
    }
}

/// Whether `err` is the caller's to fix before anything runs (exit 2): a
/// usage error, a URL that does not parse, a TLS file that cannot be used.
fn is_usage(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause.downcast_ref::<cli::Usage>().is_some()
            || matches!(
                cause.downcast_ref::<leasehold::Error>(),
                Some(leasehold::Error::InvalidUrl(_) | leasehold::Error::TlsFile { .. })
            )
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
