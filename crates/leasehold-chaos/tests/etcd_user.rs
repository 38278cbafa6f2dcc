//! The etcd lab on the user's own etcd cluster
//! (`LabOptions::etcd_endpoints`): a cluster the test kit starts as if it
//! were the user's, over TLS with client certificates required and etcd's
//! authentication on. The run uses those endpoints and that user, the
//! faults that need the members' processes are refused before the run,
//! the revoke runs through etcd's API, and a wrong password or a user
//! without write permission is a typed error before anything runs.

use std::time::Duration;

use leasehold::tls::TlsFiles;
use leasehold::{FencedKeys, Lessor};
use leasehold_chaos::{Fault, Harness, Kind, Lab, LabError, LabOptions, Lock, NegativeControl};
use leasehold_etcd::EtcdLocker;
use leasehold_etcd::client::{Credentials, EtcdClient, Range, TlsSettings};
use leasehold_testkit::{ClientAuth, EtcdCluster, TestCerts};

mod common;
use common::account::{account, account_path, final_state};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const ROOT_PASSWORD: &str = "root-secret-horse";
const PASSWORD: &str = "locker-secret-staple";
const WRONG: &str = "wrong-secret-battery";

/// A one-member cluster over TLS (client certificates required) with
/// authentication on: `locker` may read and write under `leasehold`,
/// `reader` only read.
fn users_etcd(certs: &TestCerts) -> Result<EtcdCluster, leasehold_testkit::Error> {
    let cluster = EtcdCluster::start_tls(1, &certs.server().client_auth(ClientAuth::Required))?;
    let member = cluster.member(0);
    member.add_user("locker", PASSWORD, "leasehold", true)?;
    member.add_user("reader", PASSWORD, "leasehold", false)?;
    member.enable_auth(ROOT_PASSWORD)?;
    Ok(cluster)
}

fn files(certs: &TestCerts) -> TlsFiles {
    TlsFiles::new()
        .ca(certs.ca())
        .cert(certs.client_cert())
        .key(certs.client_key())
}

fn options(cluster: &EtcdCluster, certs: &TestCerts, user: &str, password: &str) -> LabOptions {
    LabOptions::default()
        .etcd_endpoints(cluster.endpoints())
        .etcd_tls(files(certs))
        .etcd_credentials(Credentials::new(user, password))
}

async fn start(options: LabOptions) -> Result<Lab, LabError> {
    tokio::task::spawn_blocking(move || Lab::start(&options))
        .await
        .expect("the lab's thread")
}

/// An etcd client of the lab's cluster as its user.
fn client(lab: &Lab) -> Result<EtcdClient, Box<dyn std::error::Error>> {
    let files = lab.etcd_tls_files().ok_or("no tls files")?;
    Ok(EtcdClient::builder(lab.node_urls())
        .tls(TlsSettings::new(leasehold::tls::client_config(&files)?))
        .credentials(lab.etcd_credentials().ok_or("no credentials")?)
        .build()?)
}

/// The error's text, its `Debug` and every source's.
fn all_text(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = format!("{err} {err:?}");
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!(" {cause} {cause:?}"));
        source = cause.source();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_the_users_etcd_uses_it_as_its_user_and_refuses_the_process_faults() -> TestResult
{
    let certs = TestCerts::generate()?;
    let cluster = users_etcd(&certs)?;
    let lab = start(options(&cluster, &certs, "locker", PASSWORD)).await?;
    assert!(lab.is_etcd() && lab.is_external_etcd());
    // The callers dial the user's endpoints: no cluster of the lab's own.
    assert_eq!(lab.node_urls(), cluster.endpoints());
    assert!(lab.logs().contains("etcd: yours"), "{}", lab.logs());

    let keys = vec![leasehold_chaos::lock_key("account:1")];
    let checked = {
        let (lab, keys) = (lab.clone(), keys.clone());
        tokio::task::spawn_blocking(move || {
            Fault::ALL
                .into_iter()
                .filter(|fault| fault.needs_etcd() || *fault == Fault::HolderPause)
                .map(|fault| (fault, lab.check_fault(fault, &keys)))
                .collect::<Vec<_>>()
        })
        .await?
    };
    for (fault, checked) in checked {
        if fault.needs_etcd_process() {
            assert!(
                matches!(checked, Err(LabError::Unsupported { fault: f, .. }) if f == fault),
                "{fault}: {checked:?}"
            );
            let message = checked.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(message.contains(fault.name()), "{message}");
        } else {
            assert!(checked.is_ok(), "{fault}: {checked:?}");
        }
    }

    // A lease of someone else's under the lock prefix: the revoke, an
    // operator's on the user's cluster, takes it too.
    let locker = EtcdLocker::builder(lab.node_urls())
        .tls(files(&certs))
        .credentials(lab.etcd_credentials().ok_or("no credentials")?)
        .connect()
        .await?;
    let bystander = locker
        .acquire(
            FencedKeys::for_resource("bystander")?,
            Duration::from_secs(30),
        )
        .await?;
    let etcd = client(&lab)?;
    let deadline = || tokio::time::Instant::now() + Duration::from_secs(5);
    let before = etcd.range(&Range::prefix("leasehold/"), deadline()).await?;
    assert_eq!(before.kvs.len(), 1, "{:?}", before.kvs);

    let account = account();
    let write = account_path(account.clone(), true, Duration::from_millis(30));
    let check = async |_: &leasehold_chaos::Writes| final_state(&account);
    let report = Harness::new("etcd-user")
        .seed(5)
        .callers(4)
        .ttl(Duration::from_millis(40))
        .duration(Duration::from_secs(2))
        .fault(Fault::EtcdRevoke)
        .negative_control(NegativeControl::Off)
        .run(&lab, &Lock::new(locker.clone(), true), write, check)
        .await?;
    assert!(report.holds(), "{}", report.summary());
    assert!(
        report.check.counts.writes.accepted > 0,
        "{}",
        report.summary()
    );
    assert!(
        report.events.iter().any(|e| matches!(
            &e.kind,
            Kind::FaultStart { fault, .. } if fault == "etcd-revoke"
        )),
        "no revoke window: {}",
        report.summary()
    );
    // The run wrote to that cluster (its revision moved on by far more
    // than the bystander's one write), and the revoke took the
    // bystander's key there.
    let after = etcd.range(&Range::prefix("leasehold/"), deadline()).await?;
    assert!(
        after.header.revision > before.header.revision + 2,
        "{:?} then {:?}",
        before.header,
        after.header
    );
    assert!(
        after
            .kvs
            .iter()
            .all(|kv| !String::from_utf8_lossy(&kv.key).contains("bystander")),
        "{:?}",
        after.kvs
    );
    drop(bystander);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_or_a_missing_permission_is_a_typed_error_before_the_run() -> TestResult {
    let certs = TestCerts::generate()?;
    let cluster = users_etcd(&certs)?;
    let endpoint = cluster.endpoints().remove(0);

    let wrong = start(options(&cluster, &certs, "locker", WRONG))
        .await
        .err()
        .ok_or("a wrong password was let in")?;
    assert!(
        matches!(&wrong, LabError::EtcdAuth { endpoint: e, user: Some(user), .. }
            if *e == endpoint && user == "locker"),
        "{wrong:?}"
    );
    let text = all_text(&wrong);
    assert!(text.contains(&endpoint), "{text}");
    for secret in [WRONG, PASSWORD, ROOT_PASSWORD] {
        assert!(!text.contains(secret), "{text}");
    }

    let read_only = start(options(&cluster, &certs, "reader", PASSWORD))
        .await
        .err()
        .ok_or("a read-only user passed the access check")?;
    assert!(
        matches!(
            &read_only,
            LabError::EtcdPermission {
                needs: "readwrite",
                prefix: "leasehold",
                ..
            }
        ),
        "{read_only:?}"
    );
    let text = all_text(&read_only);
    assert!(
        text.contains("reader") && text.contains(&endpoint),
        "{text}"
    );
    assert!(!text.contains(PASSWORD), "{text}");

    // Credentials in an endpoint are refused, never shown.
    let in_url = start(
        LabOptions::default()
            .etcd_endpoints([endpoint.replace("https://", &format!("https://locker:{PASSWORD}@"))])
            .etcd_tls(files(&certs)),
    )
    .await
    .err()
    .ok_or("credentials in an endpoint were taken")?;
    assert!(matches!(in_url, LabError::Options(_)), "{in_url:?}");
    assert!(!all_text(&in_url).contains(PASSWORD));
    Ok(())
}
