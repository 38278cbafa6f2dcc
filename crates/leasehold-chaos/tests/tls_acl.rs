//! The harness on the user's own infrastructure: a Redis over TLS that
//! requires client certificates, reached by `rediss://` as an ACL user with
//! exactly the harness's documented rules; a user without a fault's
//! command; a chosen proxy port and host, no proxy; throwaway servers
//! with the user's configuration (an AOF restart, a failover over TLS).

use std::sync::Arc;
use std::time::Duration;

use leasehold::Locker;
use leasehold::tls::TlsFiles;
use leasehold_chaos::{
    ACL_RULES, Call, ControlVerdict, Fault, Harness, HarnessError, Kind, Lab, LabError, LabOptions,
    Lock, NegativeControl, Outcome, RunReport, WriteOutcome, Writes,
};
use leasehold_testkit::{ClientAuth, RedisOptions, RedisServer, TestCerts};

mod common;
use common::account::{account, account_path, final_state};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const HARNESS_USER: &str = "harness";
const HARNESS_PASSWORD: &str = "harness-secret";

/// A Redis that speaks TLS only and requires a client certificate.
fn tls_redis(certs: &TestCerts) -> Result<RedisServer, leasehold_testkit::Error> {
    RedisServer::start_with(
        RedisOptions::default().tls(certs.server().client_auth(ClientAuth::Required)),
    )
}

/// The callers' (and the lab's) TLS files: the CA and the client pair.
fn files(certs: &TestCerts) -> TlsFiles {
    TlsFiles::new()
        .ca(certs.ca())
        .cert(certs.client_cert())
        .key(certs.client_key())
}

/// Makes `user` on `server` with the lock user's rules and `extra`.
fn make_user(server: &RedisServer, user: &str, extra: &[&str]) -> TestResult {
    let rules: Vec<&str> = ACL_RULES.iter().chain(extra).copied().collect();
    server.set_acl_user(user, HARNESS_PASSWORD, &rules)?;
    Ok(())
}

fn url_as(server: &RedisServer, user: &str) -> String {
    format!(
        "rediss://{user}:{HARNESS_PASSWORD}@127.0.0.1:{}/",
        server.port()
    )
}

/// The commands the server's ACL refused (`ACL LOG`'s `object`s).
fn refused_commands(server: &RedisServer) -> Result<Vec<String>, leasehold_testkit::Error> {
    Ok(server.acl_log()?.into_iter().map(|e| e.object).collect())
}

async fn start(options: LabOptions) -> Result<Lab, Box<dyn std::error::Error>> {
    Ok(tokio::task::spawn_blocking(move || Lab::start(&options)).await??)
}

async fn fenced_lock(lab: &Lab) -> Result<Lock, Box<dyn std::error::Error>> {
    let locker = Locker::builder()
        .command_timeout(Duration::from_millis(500))
        .connect(&lab.client()?)
        .await?;
    Ok(Lock::new(locker, true))
}

/// 6 callers debit one account for 2 s (one fault window) under `fault` with a check-and-set
/// on the fence and the value read (a 30 ms read, then the pause point,
/// then the write), the watchdog on, `control` first.
async fn run_checked(
    lab: &Lab,
    lock: &Lock,
    fault: Fault,
    control: NegativeControl,
) -> Result<RunReport, HarnessError> {
    let account = account();
    let write = account_path(account.clone(), true, Duration::from_millis(30));
    let check = async |_: &Writes| final_state(&account);
    Harness::new("tls-acl")
        .seed(3)
        .callers(6)
        .ttl(Duration::from_millis(40))
        .duration(Duration::from_secs(2))
        .watchdog(true)
        .fault(fault)
        .negative_control(control)
        .run(lab, lock, write, check)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_tls_with_client_certs_as_the_harness_acl_user_holds_and_catches_its_control()
-> TestResult {
    let certs = TestCerts::generate()?;
    let server = tls_redis(&certs)?;
    make_user(&server, HARNESS_USER, &leasehold_chaos::HARNESS_ACL_RULES)?;
    let lab = start(
        LabOptions::default()
            .redis_url(url_as(&server, HARNESS_USER))
            .tls(files(&certs)),
    )
    .await?;
    let url = lab.redis_url();
    assert!(url.starts_with("rediss://harness:"), "not tls as the user");
    // Every fault the lab can inject on a Redis it does not own passes the
    // access check under exactly that user.
    for fault in [
        Fault::KeyLoss,
        Fault::EarlyExpiry,
        Fault::ScriptFlush,
        Fault::ConnKill,
        Fault::RedisStall,
    ] {
        let (lab, keys) = (lab.clone(), vec![leasehold_chaos::lock_key("account:1")]);
        tokio::task::spawn_blocking(move || lab.check_fault(fault, &keys)).await??;
    }
    let lock = fenced_lock(&lab).await?;
    let report = run_checked(&lab, &lock, Fault::KeyLoss, NegativeControl::Builtin).await?;
    assert!(
        matches!(report.control, ControlVerdict::Caught { .. }),
        "{}",
        report.summary()
    );
    assert!(report.holds(), "{}", report.summary());
    assert!(
        report.check.counts.writes.accepted > 0,
        "{}",
        report.summary()
    );
    // Nothing outside the harness's ACL was sent: the server's ACL log
    // holds no refusal but the library's own optional INFO probe (the
    // README's "optional: Redis 8.4 native release/refresh").
    let refused = refused_commands(&server)?;
    assert!(
        refused.iter().all(|command| command == "info"),
        "{refused:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_a_faults_command_gets_a_typed_error_naming_it() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = tls_redis(&certs)?;
    // The lock user's rules only: no +script|flush, +client|kill,
    // +client|pause.
    make_user(&server, "locker", &[])?;
    let lab = start(
        LabOptions::default()
            .redis_url(url_as(&server, "locker"))
            .tls(files(&certs)),
    )
    .await?;
    let lock = fenced_lock(&lab).await?;
    let err = run_checked(&lab, &lock, Fault::ScriptFlush, NegativeControl::Builtin)
        .await
        .err()
        .ok_or("a run without +script|flush did not fail")?;
    assert!(
        matches!(
            err,
            HarnessError::Lab(LabError::Permission {
                fault: Fault::ScriptFlush,
                command: "script|flush"
            })
        ),
        "{err:?}"
    );
    let keys = vec![leasehold_chaos::lock_key("account:1")];
    let checked = tokio::task::spawn_blocking(move || {
        [
            Fault::ConnKill,
            Fault::RedisStall,
            Fault::KeyLoss,
            Fault::NetCut,
        ]
        .map(|fault| lab.check_fault(fault, &keys))
    })
    .await?;
    let [kill, pause, key_loss, net_cut] = checked;
    assert!(
        matches!(
            kill,
            Err(LabError::Permission {
                command: "client|kill",
                ..
            })
        ),
        "{kill:?}"
    );
    let message = pause.err().ok_or("client|pause allowed")?.to_string();
    assert!(message.contains("+client|pause"), "{message}");
    // The lock rules grant DEL on the lock keys; the network faults need
    // no command.
    key_loss?;
    net_cut?;
    // The refusals were the probes, nothing else.
    let refused = refused_commands(&server)?;
    for command in ["script|flush", "client|kill", "client|pause"] {
        assert!(refused.iter().any(|r| r == command), "{refused:?}");
    }
    assert!(
        refused
            .iter()
            .all(|r| ["script|flush", "client|kill", "client|pause", "info"].contains(&r.as_str())),
        "{refused:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_listens_on_the_chosen_port_and_a_taken_one_is_a_typed_error() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = tls_redis(&certs)?;
    make_user(&server, HARNESS_USER, &leasehold_chaos::HARNESS_ACL_RULES)?;
    let port = leasehold_testkit::free_port()?;
    let options = LabOptions::default()
        .redis_url(url_as(&server, HARNESS_USER))
        .tls(files(&certs))
        .proxy_port(port)
        .proxy_host("localhost");
    let lab = start(options.clone()).await?;
    assert!(
        lab.redis_url().contains(&format!("@localhost:{port}/")),
        "the callers do not use the chosen port and host"
    );
    // The certificate names localhost: TLS verifies through the proxy.
    let lock = fenced_lock(&lab).await?;
    drop(lock);
    let taken = start(options).await.err().ok_or("a taken port was bound")?;
    assert!(
        matches!(taken.downcast_ref::<LabError>(), Some(LabError::ProxyPort { port: p, .. }) if *p == port),
        "{taken:?}"
    );
    // Without the proxy the callers use the URL as given, and the faults
    // that need the proxy are refused before a run.
    let direct = start(
        LabOptions::default()
            .redis_url(url_as(&server, HARNESS_USER))
            .tls(files(&certs))
            .proxy(false),
    )
    .await?;
    assert_eq!(direct.redis_url(), url_as(&server, HARNESS_USER));
    let refused = direct.check_fault(Fault::NetCut, &[]);
    assert!(
        matches!(
            refused,
            Err(LabError::Unsupported {
                fault: Fault::NetCut,
                ..
            })
        ),
        "{refused:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throwaway_servers_take_the_users_configuration() -> TestResult {
    let certs = TestCerts::generate()?;
    let tls = certs.server().client_auth(ClientAuth::Required);
    let user = RedisOptions::default()
        .tls(tls.clone())
        .password("their-password")
        .appendonly();
    let lab = start(
        LabOptions::default()
            .redis_options(user.clone())
            .tls(files(&certs))
            .acl_user(true)
            .nodes(2),
    )
    .await?;
    let urls = lab.node_urls();
    assert_eq!(urls.len(), 2);
    assert!(
        urls.iter()
            .all(|url| url.starts_with(&format!("rediss://{}:", leasehold_chaos::ACL_USER))),
        "the callers are not tls as the acl user"
    );
    // The callers lock over TLS with the client certificate, and the
    // restart fault (process control) brings the server back with the
    // same configuration and the same ACL user.
    let lock = fenced_lock(&lab).await?;
    let counter = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let written = counter.clone();
    let report = Harness::new("tls-restart")
        .callers(2)
        .ttl(Duration::from_millis(100))
        .duration(Duration::from_secs(2))
        .fault(Fault::RedisRestartAof)
        .negative_control(NegativeControl::Off)
        .run(
            &lab,
            &lock,
            async move |_: Call<'_>| {
                written.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Outcome::Committed
            },
            async |writes: &Writes| {
                let value = counter.load(std::sync::atomic::Ordering::SeqCst);
                vec![writes.check_counter("account:1", 0, value)]
            },
        )
        .await?;
    assert!(
        report.check.counts.writes.accepted > 0,
        "{}",
        report.summary()
    );
    assert!(report.check.holds(), "{}", report.summary());
    let restarts = report
        .events
        .iter()
        .filter(|event| matches!(&event.kind, Kind::FaultEnd { fault, .. } if fault == "redis-restart-aof"))
        .count();
    assert_eq!(restarts, 1, "no restart happened");
    // Writes went on after the restart: the server came back with TLS, the
    // client certificate required and the lab's ACL user.
    let restarted_at = report
        .events
        .iter()
        .find(|event| matches!(&event.kind, Kind::FaultEnd { .. }))
        .map(|event| event.at_us)
        .ok_or("no restart")?;
    assert!(
        report.events.iter().any(|event| event.at_us > restarted_at
            && matches!(
                &event.kind,
                Kind::Write {
                    outcome: WriteOutcome::Accepted,
                    ..
                }
            )),
        "no write after the restart: {}",
        report.summary()
    );
    // Options that cannot apply are refused, not ignored.
    for (options, why) in [
        (
            LabOptions::default().redis_options(user.clone()),
            "LabOptions::tls",
        ),
        (
            LabOptions::default().redis_options(RedisOptions::default().replica_of("127.0.0.1", 1)),
            "replica_of",
        ),
        (
            LabOptions::default().redis_options(user).cluster(true),
            "cluster",
        ),
    ] {
        let err = start(options).await.err().ok_or(why)?;
        assert!(
            matches!(err.downcast_ref::<LabError>(), Some(LabError::Options(m)) if m.contains(why)),
            "{why}: {err}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_runs_on_a_tls_primary_and_replica_with_client_certs_required() -> TestResult {
    let certs = TestCerts::generate()?;
    let lab = start(
        LabOptions::default()
            .redis_options(
                RedisOptions::default()
                    .tls(certs.server().client_auth(ClientAuth::Required))
                    .password("their-password"),
            )
            .tls(files(&certs))
            .for_fault(Fault::Failover),
    )
    .await?;
    let lock = fenced_lock(&lab).await?;
    // A failover uses the lab's replica up: no control run before it.
    let report = run_checked(&lab, &lock, Fault::Failover, NegativeControl::Off).await?;
    let ended = report
        .events
        .iter()
        .find(|event| matches!(&event.kind, Kind::FaultEnd { fault, .. } if fault == "failover"))
        .map(|event| event.at_us)
        .ok_or("no failover")?;
    // The promoted replica (TLS, client certificates required, the same
    // password) takes writes after the failover.
    assert!(
        report.events.iter().any(|event| event.at_us > ended
            && matches!(
                &event.kind,
                Kind::Write {
                    outcome: WriteOutcome::Accepted,
                    ..
                }
            )),
        "no write after the failover: {}",
        report.summary()
    );
    assert!(report.check.holds(), "{}", report.summary());
    // The replica had replicated over TLS before it was promoted.
    assert!(
        lab.logs()
            .contains("MASTER <-> REPLICA sync: Finished with success"),
        "the replica never synced"
    );
    Ok(())
}

#[test]
fn the_harness_acl_is_the_crate_readmes() -> TestResult {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"),
    )?;
    let prefix = "ACL SETUSER harness on >password ";
    let line = readme
        .lines()
        .find(|line| line.starts_with(prefix))
        .ok_or("the README's harness ACL SETUSER line")?;
    let rules: Vec<&str> = line[prefix.len()..].split_whitespace().collect();
    let expected: Vec<&str> = ACL_RULES
        .iter()
        .chain(&leasehold_chaos::HARNESS_ACL_RULES)
        .copied()
        .collect();
    assert_eq!(rules, expected);
    Ok(())
}
