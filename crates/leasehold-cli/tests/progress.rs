//! Progress bars: drawn on a terminal's stderr for a long run, never into a
//! pipe, never with `--json`.

use std::process::{Command, Output, Stdio};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Runs the CLI on a terminal: script(1) gives it a pseudo-terminal and
/// copies what it writes there (stdout and stderr both) to its stdout.
fn on_a_terminal(args: &[&str]) -> Result<Output, std::io::Error> {
    let command = format!("{} {}", env!("CARGO_BIN_EXE_leasehold"), args.join(" "));
    Command::new("script")
        .args(["--quiet", "--return", "--command", &command, "/dev/null"])
        .env("TERM", "xterm")
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .output()
}

/// What a drawn bar leaves in the output: the bar itself, or the escape
/// sequences that redraw and clear it.
fn has_bar(text: &str, what: &str) -> bool {
    text.contains(&format!("{what} [")) || text.contains("\x1b[")
}

/// Four measurements of 1 s: the bar (drawn after 2 s) is up for the last
/// two.
const LONG_BENCH: &[&str] = &[
    "bench",
    "uncontended",
    "--duration",
    "1s",
    "--rounds",
    "1",
    "--tasks",
    "2",
];

#[test]
fn a_terminal_gets_a_bar_on_a_long_run() -> TestResult {
    let out = on_a_terminal(LONG_BENCH)?;
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{screen}");
    assert!(has_bar(&screen, "bench uncontended"), "{screen}");
    assert!(screen.contains("/4 round 1/1: "), "{screen}");
    // The results are there too, and the bar was cleared at the end.
    assert!(screen.contains("throughput ratio"), "{screen}");
    Ok(())
}

#[test]
fn json_on_a_terminal_gets_no_bar() -> TestResult {
    let mut args = LONG_BENCH.to_vec();
    args.push("--json");
    let out = on_a_terminal(&args)?;
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{screen}");
    assert!(!has_bar(&screen, "bench uncontended"), "{screen}");
    assert!(screen.contains("\"bench\":\"uncontended\""), "{screen}");
    Ok(())
}

#[test]
fn a_pipe_gets_no_bar_but_the_measurement_lines() -> TestResult {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(LONG_BENCH)
        .env_remove("REDIS_URL")
        .output()?;
    let (stdout, stderr) = (
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    );
    assert!(out.status.success(), "{stderr}");
    assert!(!has_bar(&stdout, "bench uncontended"), "{stdout}");
    assert!(!has_bar(&stderr, "bench uncontended"), "{stderr}");
    assert!(!stderr.contains('\r'), "{stderr:?}");
    assert!(
        stderr.contains("round 1/1: floor, many tasks\n"),
        "{stderr}"
    );
    assert!(stdout.contains("throughput ratio"), "{stdout}");
    Ok(())
}
