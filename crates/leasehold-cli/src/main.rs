//! `leasehold`: reproduces the tutorial's experiments against real servers.

use std::process::ExitCode;

use clap::Parser;

mod bench;
mod chaos;
mod cli;
mod demo;
mod env;
mod experiments;
mod holds;
mod ledger;
mod redact;
mod report;
mod server;
mod waiting;
mod wallet;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
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
        .with_writer(std::io::stderr)
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
    match runtime.block_on(cli::run(cli)) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", redact::redact_text(&report::chain(&err)));
            if err.downcast_ref::<cli::Usage>().is_some() {
                ExitCode::from(cli::USAGE)
            } else {
                ExitCode::from(cli::SERVER_ERROR)
            }
        }
    }
}
