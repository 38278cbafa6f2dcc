//! `leasehold chaos`: the fault matrix. Every lock mode under every fault,
//! several worker processes doing read-modify-write debits on a few
//! wallets, each run's history checked and, with `--report`, saved with its
//! timeline.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use leasehold_chaos::{
    ControlVerdict, Fault, Lab, LabError, RunCheck, RunReport, lock_key, report,
};
use leasehold_testkit::PostgresServer;

mod curator;
mod etcd;
mod lock_rpc;
mod marks;
mod modes;
mod run;
mod worker;

use run::{Plan, Proxy};

use crate::cli::{ChaosAction, ChaosArgs, ChaosMode, MatrixArgs};
use crate::progress::{Progress, note};

/// Runs `chaos` (or its `check` / `worker` action).
pub(crate) async fn run(args: &ChaosArgs) -> anyhow::Result<ExitCode> {
    match &args.action {
        Some(ChaosAction::Worker) => {
            worker::run().await?;
            Ok(ExitCode::SUCCESS)
        }
        Some(ChaosAction::Check {
            file,
            json,
            fault_marks,
        }) => check(file, *json, fault_marks.as_deref()),
        Some(ChaosAction::Mark { edge, name, file }) => {
            marks::append(*edge, name, file)?;
            Ok(ExitCode::SUCCESS)
        }
        None => matrix(&args.matrix).await,
    }
}

/// `chaos check FILE`: the run's line and its violations, then the
/// verdict `chaos` would have given a matrix of this one run, which is
/// also the exit status (a violation, a control that caught nothing, a
/// judged error returned to a caller: 1). With `--fault-marks`, under the
/// windows marked there.
fn check(file: &Path, json: bool, fault_marks: Option<&Path>) -> anyhow::Result<ExitCode> {
    let mut events = leasehold_chaos::report::read_history(file)
        .with_context(|| format!("checking {}", file.display()))?;
    if let Some(marks_file) = fault_marks {
        let marked = marks::apply(&mut events, marks_file).with_context(|| {
            format!(
                "placing the fault marks of {} in {}",
                marks_file.display(),
                file.display()
            )
        })?;
        note_marked(&file.display().to_string(), &marked);
    }
    let report = leasehold_chaos::check(&events);
    let verdict = leasehold_chaos::verdict(&leasehold_chaos::rows(std::slice::from_ref(&report)));
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{}", one_line(&report, &ControlVerdict::NotRun));
        for violation in &report.violations {
            println!("  violation: {violation}");
        }
        println!("{verdict}");
    }
    Ok(if verdict.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::BROKEN)
    })
}

async fn matrix(args: &MatrixArgs) -> anyhow::Result<ExitCode> {
    let (runs, json) = (args.runs, args.json);
    anyhow::ensure!(
        !args.ttl.is_zero(),
        crate::exit::Usage("--ttl must be above zero".to_owned())
    );
    let modes = if args.modes.is_empty() {
        ChaosMode::ALL.to_vec()
    } else {
        args.modes.clone()
    };
    let faults = if args.faults.is_empty() {
        Fault::ALL.to_vec()
    } else {
        args.faults.clone()
    };
    let seeds: Vec<String> = match &args.redis_url {
        Some(urls) if args.cluster => urls.split(',').map(str::to_owned).collect(),
        Some(url) => vec![url.clone()],
        None => Vec::new(),
    };
    check_urls(args, &seeds)?;
    let etcd = etcd::EtcdTarget::from_flags(args)?;
    if modes.iter().any(|mode| mode.is_zookeeper()) {
        check_zookeeper_ttl(args.ttl)?;
    }
    // A fault that would never happen must not pass for one that held.
    if let Some(fault) = faults.iter().find(|&&fault| {
        fault != Fault::None
            && leasehold_chaos::schedule(fault, args.seed, args.duration, args.ttl, args.workers)
                .is_empty()
    }) {
        return Err(crate::exit::Usage(format!(
            "--duration {} leaves no room for a {fault} window at --ttl {} (a quarter of the run to warm up, the window, then a quiet gap of max(4 x ttl, 1s)); make it longer",
            humantime::format_duration(args.duration),
            humantime::format_duration(args.ttl),
        ))
        .into());
    }
    let plan = Plan {
        duration: args.duration,
        workers: args.workers,
        tasks: args.tasks,
        wallets: args.wallets,
        initial: 1_000_000_000,
        ttl: args.ttl,
        wait: args.wait,
        work: args.work,
        watchdog: args.watchdog,
        quorum_nodes: args.nodes,
        redis_url: args.redis_url.clone().filter(|_| !args.cluster),
        cluster_urls: if args.cluster { seeds } else { Vec::new() },
        tls: args.tls.clone(),
        proxy: Proxy {
            off: args.no_proxy,
            port: args.proxy_port,
            host: args.proxy_host.clone(),
        },
        etcd,
    };
    if let Some(dir) = &args.report {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the report directory {}", dir.display()))?;
    }
    if let Some(file) = &args.fault_marks {
        // The injector appends to it as the runs go.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .with_context(|| format!("opening the fault marks file {}", file.display()))?;
    }
    let mut marked_runs = 0;

    let mut cells: Vec<(ChaosMode, Fault)> = modes
        .iter()
        .flat_map(|&mode| faults.iter().map(move |&fault| (mode, fault)))
        .filter(|(mode, fault)| mode.supports(*fault))
        .collect();
    // The negative controls first, as the harness runs its own: each run's
    // line then says whether the control under its fault was caught.
    cells.sort_by_key(|(mode, fault)| mode.expect(*fault) != modes::Expect::Breaks);
    if args.redis_url.is_some() {
        let (run, skipped): (Vec<_>, Vec<_>) = cells.into_iter().partition(|(mode, fault)| {
            if mode.is_etcd() && plan.etcd.is_some() {
                // On the user's etcd: set aside below, if at all.
                return true;
            }
            // On a cluster the callers reach the nodes directly (no proxy),
            // and a command to "the" primary has no one node to go to.
            let proxied = !matches!(
                fault,
                Fault::NetLatency
                    | Fault::NetCut
                    | Fault::NetBlackhole
                    | Fault::ConnKill
                    | Fault::RedisStall
            );
            // A quorum needs throwaway nodes; the etcd modes, etcd; the
            // ZooKeeper modes, their own ensemble.
            let on_one_redis = *mode != ChaosMode::Quorum
                && !mode.is_etcd()
                && !mode.is_zookeeper()
                && !mode.is_pg();
            on_one_redis
                && !fault.needs_redis_process()
                && (!args.cluster || proxied)
                && !(args.no_proxy && fault.needs_proxy())
        });
        if !skipped.is_empty() {
            let names: Vec<String> = skipped
                .iter()
                .map(|(mode, fault)| format!("{} x {fault}", mode.name()))
                .collect();
            note!(
                "chaos: skipped with --redis-url (they need throwaway servers, the fault proxy, or a topology yours is not): {}",
                names.join(", ")
            );
        }
        anyhow::ensure!(
            !run.is_empty(),
            crate::exit::Usage(
                "with --redis-url, none of the chosen modes and faults can run".to_owned()
            )
        );
        cells = run;
        check_access(&plan, &cells).await?;
    }
    if let Some(target) = &plan.etcd {
        cells = etcd::keep_runnable(cells)?;
        etcd::check_access(target, &cells).await?;
    }
    // On libfaketime when a pg mode meets pg-clock-step (the shared
    // server's clock is what it steps); without libfaketime the server
    // starts on the machine's clock and that row says unsupported.
    let fake_clock = cells
        .iter()
        .any(|&(mode, fault)| mode.is_pg() && fault == Fault::PgClockStep);
    let postgres = Arc::new(
        tokio::task::spawn_blocking(move || {
            if fake_clock && let Ok(server) = PostgresServer::start_with_fake_clock() {
                return Ok(server);
            }
            PostgresServer::start()
        })
        .await
        .context("starting a throwaway postgres")?
        .context("starting a throwaway postgres")?,
    );
    let pool = pool(&postgres).await?;
    let progress = Progress::new("chaos", cells.len() as u64 * u64::from(runs));
    let mut results = Vec::new();
    let mut unsupported = Vec::new();
    let mut expired_grants: Vec<ExpiredGrants> = Vec::new();
    for &(mode, fault) in &cells {
        for i in 0..runs {
            let seed = args.seed.wrapping_add(u64::from(i));
            progress.start(format!("{} x {fault} seed {seed}", mode.name()));
            let report = match run::run_one(&plan, mode, fault, seed, &postgres, &pool).await {
                Ok(report) => report,
                Err(err) => match err.downcast_ref::<LabError>() {
                    Some(LabError::Unsupported { needs, .. }) => {
                        // Said in its row, never skipped in silence.
                        if !json {
                            note!("chaos: {} x {fault}: unsupported: {err}", mode.name());
                        }
                        unsupported.push(Unsupported {
                            mode: mode.name(),
                            fault: fault.name(),
                            status: "unsupported",
                            needs,
                        });
                        break;
                    }
                    _ => {
                        return Err(
                            err.context(format!("run {mode:?} under {fault} (seed {seed})"))
                        );
                    }
                },
            };
            let report = match &args.fault_marks {
                None => report,
                Some(file) => {
                    let mut events = report.events.clone();
                    match marks::apply(&mut events, file) {
                        Ok(marked) => {
                            let run = format!("{} x {fault} seed {seed}", mode.name());
                            note_marked(&run, &marked);
                            marked_runs += usize::from(!marked.windows.is_empty());
                            RunReport::new(events)
                        }
                        Err(err) => {
                            // Nothing of the run is lost: its history is
                            // saved as recorded, to be re-checked once the
                            // file is fixed.
                            let dir = args.report.clone().unwrap_or_else(|| {
                                file.parent().unwrap_or(Path::new(".")).to_owned()
                            });
                            save(&dir, mode, fault, seed, &report)?;
                            return Err(anyhow::Error::new(err).context(format!(
                                "placing the fault marks of {} in run {} x {fault} seed {seed} (its history is saved unmarked in {}: fix the file, then `leasehold chaos check HISTORY --fault-marks {}`)",
                                file.display(),
                                mode.name(),
                                dir.display(),
                                file.display(),
                            )));
                        }
                    }
                }
            };
            if let Some(dir) = &args.report {
                save(dir, mode, fault, seed, &report)?;
            }
            let expired =
                (mode == ChaosMode::EtcdLockRpc).then(|| lock_rpc::expired_grants(&report.events));
            if let Some(grants) = expired {
                match expired_grants
                    .iter_mut()
                    .find(|cell| cell.fault == fault.name())
                {
                    Some(cell) => cell.add(grants),
                    None => expired_grants.push(ExpiredGrants::new(fault.name(), grants)),
                }
            }
            if !json {
                // The run's fault, renamed after the windows marked in it.
                let named = report
                    .check
                    .header
                    .as_ref()
                    .map_or(fault.name(), |h| h.fault.as_str());
                let control = report::control_for(&leasehold_chaos::rows(&results), named);
                let grants = expired.map_or_else(String::new, |grants| {
                    format!("; lock rpc grants whose key was already gone {grants}")
                });
                note!(
                    "chaos: {} x {named} seed {seed}: {}{grants}",
                    mode.name(),
                    one_line(&report.check, &control)
                );
            }
            results.push(report.check);
        }
    }
    drop(progress);
    if let Some(file) = &args.fault_marks
        && marked_runs == 0
    {
        note!(
            "chaos: no window marked in {} fell in any run: the runs are judged as under their own faults alone",
            file.display()
        );
    }
    let rows = leasehold_chaos::rows(&results);
    if json {
        for row in &rows {
            println!("{}", serde_json::to_string(row)?);
        }
        for cell in &unsupported {
            println!("{}", serde_json::to_string(cell)?);
        }
        for cell in &expired_grants {
            println!("{}", serde_json::to_string(cell)?);
        }
    } else {
        print!("{}", report::render_table(&rows));
        for cell in &unsupported {
            println!(
                "{} x {}: unsupported, not run: needs {}",
                cell.mode, cell.fault, cell.needs
            );
        }
        for cell in &expired_grants {
            println!(
                "etcd-lock-rpc x {}: {} grants whose key was already gone when read right after (the session's lease ended before or just after the grant), in {} of {} runs",
                cell.fault, cell.grants, cell.runs_with, cell.runs
            );
        }
    }
    let verdict = leasehold_chaos::verdict(&rows);
    if !json {
        println!("{verdict}");
    }
    Ok(if verdict.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::BROKEN)
    })
}

/// A cell of the matrix that could not run: its fault needs a server the
/// lab does not have (a clock libfaketime can drive). Printed after the
/// table, and in JSON as a row whose status is `unsupported`.
#[derive(serde::Serialize)]
struct Unsupported {
    mode: &'static str,
    fault: &'static str,
    status: &'static str,
    needs: &'static str,
}

/// The etcd Lock RPC control's grants whose key was already gone when
/// read right after the grant, per fault: Jepsen's etcd 3.4.3 finding (a
/// waiter whose session lease ended while it waited is given the lock),
/// or a lease that ended just after a rightful grant (see the
/// `lock_rpc` module). In JSON a row of its own (`key_gone_grants`).
#[derive(serde::Serialize)]
struct ExpiredGrants {
    mode: &'static str,
    fault: &'static str,
    #[serde(rename = "key_gone_grants")]
    grants: usize,
    runs_with: u32,
    runs: u32,
}

impl ExpiredGrants {
    fn new(fault: &'static str, grants: usize) -> ExpiredGrants {
        let mut cell = ExpiredGrants {
            mode: ChaosMode::EtcdLockRpc.name(),
            fault,
            grants: 0,
            runs_with: 0,
            runs: 0,
        };
        cell.add(grants);
        cell
    }

    fn add(&mut self, grants: usize) {
        self.grants += grants;
        self.runs += 1;
        self.runs_with += u32::from(grants > 0);
    }
}

/// The ZooKeeper modes ask for a session as long as the TTL, and the
/// lab's ensemble grants sessions of 2 to 20 ticks: a longer TTL would be
/// refused by every acquire (a lease may not outlive its session), a
/// shorter one would sit in a longer session, which a holder pause (3
/// TTLs) would not outlast. Either is a usage error (exit 2).
fn check_zookeeper_ttl(ttl: std::time::Duration) -> anyhow::Result<()> {
    let tick = leasehold_testkit::ZOOKEEPER_TICK_TIME;
    let (shortest, longest) = (tick * 2, tick * 20);
    anyhow::ensure!(
        (shortest..=longest).contains(&ttl),
        crate::exit::Usage(format!(
            "the zookeeper modes need --ttl between {} and {} (the sessions their throwaway ensemble grants: 2 to 20 ticks of {}); try --ttl 1s",
            humantime::format_duration(shortest),
            humantime::format_duration(longest),
            humantime::format_duration(tick),
        ))
    );
    Ok(())
}

/// Checks the flags that say how to reach the user's Redis (`seeds`: its
/// URL, or its cluster's seed URLs): usage errors (exit 2) before anything
/// starts. The messages never quote a URL (it may hold a password).
fn check_urls(args: &MatrixArgs, seeds: &[String]) -> anyhow::Result<()> {
    let Some(url) = &args.redis_url else {
        anyhow::ensure!(
            !args.tls.is_set(),
            crate::exit::Usage(
                "--tls-ca, --tls-cert and --tls-key need a rediss:// --redis-url (the throwaway servers are plain tcp)".to_owned()
            )
        );
        return Ok(());
    };
    if args.cluster {
        anyhow::ensure!(
            !args.tls.is_set(),
            crate::exit::Usage(
                "--tls-ca, --tls-cert and --tls-key do not go with --cluster (a cluster is reached over plain redis:// here)".to_owned()
            )
        );
        for seed in seeds {
            let client = redis::Client::open(seed.as_str()).map_err(|_| {
                crate::exit::Usage("a --redis-url seed does not parse as a redis:// URL".to_owned())
            })?;
            anyhow::ensure!(
                matches!(
                    client.get_connection_info().addr(),
                    redis::ConnectionAddr::Tcp(..)
                ),
                crate::exit::Usage(
                    "with --cluster, --redis-url must be plain redis:// seeds over TCP".to_owned()
                )
            );
        }
        return Ok(());
    }
    args.tls.check(url)?;
    // Parses the URL and reads the TLS files (a file that cannot be used
    // is a usage error too).
    let client = leasehold::tls::client(url, &args.tls.files())?;
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(..)
        | redis::ConnectionAddr::TcpTls {
            insecure: false, ..
        } => Ok(()),
        redis::ConnectionAddr::TcpTls { insecure: true, .. } => Err(crate::exit::Usage(
            "--redis-url with #insecure turns certificate verification off, which leasehold never does".to_owned(),
        )
        .into()),
        _ => Err(crate::exit::Usage(
            "--redis-url must be redis:// or rediss:// over TCP (not a unix socket)".to_owned(),
        )
        .into()),
    }
}

/// Before any run: the user's Redis answers (over TLS, as the URL's user),
/// the proxy can listen as asked, and the user may run every command the
/// chosen faults send ([`Lab::check_fault`]); a fault whose command the
/// ACL does not grant is the lab's `Permission` error, naming it.
async fn check_access(plan: &Plan, cells: &[(ChaosMode, Fault)]) -> anyhow::Result<()> {
    let mut faults: Vec<Fault> = Vec::new();
    // The etcd, ZooKeeper and pg modes run on their own, never on
    // --redis-url.
    for &(_, fault) in cells
        .iter()
        .filter(|(mode, _)| !mode.is_etcd() && !mode.is_zookeeper() && !mode.is_pg())
    {
        if !faults.contains(&fault) {
            faults.push(fault);
        }
    }
    let keys: Vec<String> = plan.resources().iter().map(|(r, _)| lock_key(r)).collect();
    let options = plan.lab_options();
    let single = plan.redis_url.is_some();
    tokio::task::spawn_blocking(move || {
        let lab = Lab::start(&options).context("reaching --redis-url")?;
        if single {
            callers_reach(&lab).context(
                "connecting as the workers will, through the fault proxy (over rediss:// the server's certificate must name the host they dial: --proxy-host, 127.0.0.1 by default; or --no-proxy)",
            )?;
        }
        faults
            .into_iter()
            .try_for_each(|fault| lab.check_fault(fault, &keys))
            .context(
                "checking that --redis-url's user may run what the chosen faults send (the harness's acl: README.md, \"Redis ACL\", written out in crates/leasehold-chaos/README.md)",
            )
    })
    .await
    .context("checking --redis-url")?
}

/// Opens one connection as the workers' will (the lab's callers' URL and
/// TLS files) and reads `TIME`, so that a certificate that does not name
/// the proxy's host fails here, once, rather than in every worker.
/// Without redis-rs's `CLIENT SETINFO`, which the harness's ACL does not
/// grant.
fn callers_reach(lab: &Lab) -> anyhow::Result<()> {
    let info = lab.client()?.get_connection_info().clone();
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    let client = redis::Client::open(info.set_redis_settings(settings))?;
    let mut conn = client.get_connection_with_timeout(CALLERS_TIMEOUT)?;
    conn.set_read_timeout(Some(CALLERS_TIMEOUT))?;
    redis::cmd("TIME").query::<redis::Value>(&mut conn)?;
    Ok(())
}

/// How long [`callers_reach`] waits for the connection and for `TIME`.
const CALLERS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

fn save(
    dir: &Path,
    mode: ChaosMode,
    fault: Fault,
    seed: u64,
    report: &RunReport,
) -> anyhow::Result<()> {
    let stem = dir.join(format!("{}-{}-{seed}", mode.name(), fault.name()));
    let history = stem.with_extension("jsonl");
    let file = std::fs::File::create(&history)
        .with_context(|| format!("writing {}", history.display()))?;
    report.write_history(std::io::BufWriter::new(file))?;
    let html = stem.with_extension("html");
    std::fs::write(&html, report.timeline_html())
        .with_context(|| format!("writing {}", html.display()))?;
    Ok(())
}

async fn pool(postgres: &PostgresServer) -> anyhow::Result<deadpool_postgres::Pool> {
    let pool = crate::env::pg_pool(&postgres.url(), 4)?;
    let mut db = crate::env::pg_connection(&pool).await?;
    let client: &mut deadpool_postgres::tokio_postgres::Client = &mut db;
    leasehold_pg::setup(client).await?;
    leasehold_pg::setup_wallets(client).await?;
    drop(db);
    // The pg modes' lease and counter tables.
    leasehold_pg::PgLocker::builder()
        .listen(false)
        .connect(&postgres.url())
        .await?
        .setup()
        .await?;
    Ok(pool)
}

/// Says which marked windows `run` got, and what was cut of them.
fn note_marked(run: &str, marked: &leasehold_chaos::marks::Marked) {
    for window in &marked.windows {
        note!("chaos: {run}: marked fault {window}");
    }
}

/// One run in a line: its writes, double holders, its verdict given what
/// the control under its fault showed, and the errors returned to its
/// callers.
fn one_line(check: &RunCheck, control: &ControlVerdict) -> String {
    let writes = &check.counts.writes;
    format!(
        "{} accepted, {} refused stale, {} unknown, {} double holders: {}; {}",
        writes.accepted,
        writes.refused_stale,
        writes.unknown,
        check.overlaps.len(),
        check.verdict_with(control),
        check.errors,
    )
}
