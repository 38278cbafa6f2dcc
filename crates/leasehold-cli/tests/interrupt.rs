//! Ctrl-C (SIGINT) and SIGTERM: the CLI stops the throwaway servers it
//! started, a paused one included, and exits 130.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// How long a step may take before the test gives up (servers start
/// slowly on a loaded machine); never reached when things work.
const PATIENCE: Duration = Duration::from_secs(120);

/// The CLI running as a child, its stderr lines arriving on a channel.
struct Running {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(args: &[&str]) -> Result<Running, std::io::Error> {
        Running::start_in(args, &std::env::temp_dir())
    }

    /// As [`start`](Self::start), with `tmp` as the CLI's temporary
    /// directory (`TMPDIR`), where its servers make theirs.
    fn start_in(args: &[&str], tmp: &std::path::Path) -> Result<Running, std::io::Error> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(args)
            .env("TMPDIR", tmp)
            .env_remove("REDIS_URL")
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().ok_or(std::io::ErrorKind::BrokenPipe)?;
        let (send, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Running {
            child,
            lines,
            seen: Vec::new(),
        })
    }

    /// Waits for a stderr line containing `text`.
    fn wait_for(&mut self, text: &str) -> Result<(), Box<dyn std::error::Error>> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .map_err(|err| format!("no line with {text:?} ({err}): {:#?}", self.seen))?;
            let found = line.contains(text);
            self.seen.push(line);
            if found {
                return Ok(());
            }
        }
    }

    fn signal(&self, signal: Signal) -> nix::Result<()> {
        kill(
            Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX)),
            signal,
        )
    }

    /// Waits for the CLI to exit (its stderr closing first), and returns
    /// its status and the rest of its stderr.
    fn finish(mut self) -> Result<(ExitStatus, Vec<String>), Box<dyn std::error::Error>> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(err) => {
                    let _ = self.child.kill();
                    return Err(format!("the CLI did not exit ({err}): {:#?}", self.seen).into());
                }
            }
        }
        Ok((self.child.wait()?, self.seen))
    }
}

/// The pids in lines like `... (pid 123) ...`, `(pids 1, 2, 3)` and
/// `redis-server pid 123`.
fn pids(lines: &[String]) -> Vec<u32> {
    let mut pids = Vec::new();
    for line in lines {
        for part in line.split("pid").skip(1) {
            let list = part.trim_start_matches('s').trim_start();
            for number in list.split(", ") {
                let digits: String = number.chars().take_while(char::is_ascii_digit).collect();
                match digits.parse() {
                    Ok(pid) => pids.push(pid),
                    Err(_) => break,
                }
                if digits.len() != number.len() {
                    break;
                }
            }
        }
    }
    pids
}

/// The state letter of `pid` in /proc (`T` for stopped), if it exists.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// No process with these pids is left: not running, not stopped, not a
/// zombie.
fn assert_all_gone(pids: &[u32], lines: &[String]) {
    for &pid in pids {
        assert_eq!(state(pid), None, "pid {pid} is still there: {lines:#?}");
    }
}

#[test]
fn ctrl_c_stops_the_throwaway_servers_a_paused_one_too_and_exits_130() -> TestResult {
    // One spender holds its quorum lease for an hour (the run never ends
    // by itself); node 1 is paused with the first acquisition.
    let mut cli = Running::start(&[
        "redlock",
        "--fault",
        "pause",
        "--fault-after",
        "1",
        "-n",
        "2",
        "--work",
        "1h",
    ])?;
    cli.wait_for("paused node 1")?;
    let started = pids(&cli.seen);
    // A postgres, three redis-servers, and node 1 again in the pause line.
    assert_eq!(started.len(), 5, "{:#?}", cli.seen);
    let paused = started[started.len() - 1];
    assert_eq!(state(paused), Some('T'), "node 1 is not stopped");

    cli.signal(Signal::SIGINT)?;
    let (status, lines) = cli.finish()?;
    assert_eq!(status.code(), Some(130), "{lines:#?}");
    assert!(
        lines.iter().any(|l| l.contains("interrupted by SIGINT")),
        "{lines:#?}"
    );
    assert_all_gone(&started, &lines);
    Ok(())
}

#[test]
fn sigterm_stops_the_throwaway_servers_and_exits_130() -> TestResult {
    let mut cli = Running::start(&["verify", "-n", "1", "--work", "1h"])?;
    cli.wait_for("started a throwaway postgres")?;
    let started = pids(&cli.seen);
    assert_eq!(
        started.len(),
        2,
        "a redis-server and a postgres: {:#?}",
        cli.seen
    );
    for &pid in &started {
        assert!(state(pid).is_some(), "pid {pid} is not running");
    }

    cli.signal(Signal::SIGTERM)?;
    let (status, lines) = cli.finish()?;
    assert_eq!(status.code(), Some(130), "{lines:#?}");
    assert!(
        lines.iter().any(|l| l.contains("interrupted by SIGTERM")),
        "{lines:#?}"
    );
    assert_all_gone(&started, &lines);
    Ok(())
}

/// The command line of `pid`, its arguments joined by spaces.
fn command_line(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .unwrap_or_default()
}

/// `chaos` stopped mid-run (worker processes connected, the nemesis
/// injecting): every process it started (its PostgreSQL, its per-run
/// redis-servers, its workers) is gone after the signal, and so is every
/// temporary directory it made. The report: it said so and left a
/// PostgreSQL and two redis-servers behind, reparented to init.
#[test]
fn sigterm_mid_chaos_run_stops_every_process_it_started_and_removes_its_temp_dirs() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let mut cli = Running::start_in(
        &[
            "chaos",
            "--modes",
            "cas",
            "--faults",
            "failover",
            "--duration",
            "20s",
            "--ttl",
            "1s",
            "--workers",
            "2",
            "--tasks",
            "2",
        ],
        tmp.path(),
    )?;
    let cli_pid = cli.child.id();
    // Mid-run and mid-fault: the failover's partition has paused the
    // replica (for 3 x ttl = 3 s), so the workers are running and the
    // nemesis is injecting. There is no line to wait for (the matrix prints
    // a run when it ends), so the process tree is watched.
    let deadline = Instant::now() + PATIENCE;
    let started = loop {
        let started = leasehold_testkit::descendants(cli_pid);
        if started
            .iter()
            .any(|&pid| command_line(pid).contains("redis-server") && state(pid) == Some('T'))
        {
            break started;
        }
        assert!(
            Instant::now() < deadline && cli.child.try_wait()?.is_none(),
            "the chaos run did not reach its fault: {:#?}",
            cli.seen
        );
        thread::sleep(Duration::from_millis(50));
    };
    let names: Vec<String> = started.iter().map(|&pid| command_line(pid)).collect();
    assert_eq!(
        names
            .iter()
            .filter(|name| name.contains("chaos worker"))
            .count(),
        2,
        "{names:#?}"
    );
    for program in ["postgres", "redis-server"] {
        assert!(
            names.iter().any(|name| name.contains(program)),
            "no {program} among the processes it started: {names:#?}"
        );
    }
    assert!(
        names
            .iter()
            .filter(|name| name.contains("redis-server"))
            .count()
            >= 2,
        "a primary and its replica: {names:#?}"
    );

    cli.signal(Signal::SIGTERM)?;
    let (status, lines) = cli.finish()?;
    assert_eq!(status.code(), Some(130), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("interrupted by SIGTERM") && l.contains("stopped")),
        "{lines:#?}"
    );
    for (pid, name) in started.iter().zip(&names) {
        // A worker killed as the CLI exits may be a zombie for an instant,
        // until init reaps it: it runs nothing any more.
        let left = state(*pid);
        assert!(
            left.is_none() || left == Some('Z'),
            "pid {pid} ({name}) is still there ({left:?}): {lines:#?}"
        );
    }
    let dirs: Vec<_> = std::fs::read_dir(tmp.path())?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    assert!(dirs.is_empty(), "temporary directories left: {dirs:?}");
    Ok(())
}

#[test]
fn pids_are_read_from_every_form() {
    let lines = [
        "started a throwaway postgres at postgres://u:***@h:1/db (pid 12); pass".to_owned(),
        "started 3 throwaway redis-servers at :1, :2, :3 (pids 4, 5, 6)".to_owned(),
        "paused node 1 (redis-server pid 5) after 1 acquisitions".to_owned(),
    ];
    assert_eq!(pids(&lines), [12, 4, 5, 6, 5]);
}
