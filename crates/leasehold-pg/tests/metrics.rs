//! The `metrics` feature: fenced and guarded writes counted by outcome,
//! and every write refused as stale counted once, through a debugging
//! recorder. Enabled for every `cargo test` by the crate's dev-dependency
//! on itself with the feature.
//!
//! The test runs on a current-thread runtime inside
//! `metrics::with_local_recorder`, so what the library records reaches its
//! recorder and no other.

use leasehold::FencingToken;
use leasehold_pg::metrics::{
    FENCED_WRITES_TOTAL, GUARDED_WRITES_TOTAL, STALE_WRITES_REFUSED_TOTAL,
};
use leasehold_pg::{Guard, Outcome};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

mod common;
use common::server;

type TestResult = Result<(), Box<dyn std::error::Error>>;
/// A counter: its name, labels and value.
type Counter = (String, Vec<(String, String)>, u64);

/// The value of counter `name` with at least the labels `wanted`, summed.
fn counter(snapshot: &[Counter], name: &str, wanted: &[(&str, &str)]) -> u64 {
    snapshot
        .iter()
        .filter(|(n, labels, _)| {
            n == name
                && wanted
                    .iter()
                    .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, value)| value)
        .sum()
}

/// Every counter seen, once (a snapshot resets them).
fn counters(snapshotter: &Snapshotter) -> Vec<Counter> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => {
                let key = key.key();
                let labels = key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                Some((key.name().to_owned(), labels, n))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn writes_are_counted_by_outcome_and_stale_ones_refused_once() -> TestResult {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let pg = server()?;
            let mut db = leasehold_pg::connect(&pg.url()).await?;
            leasehold_pg::setup(&mut db).await?;
            leasehold_pg::setup_wallets(&mut db).await?;
            let id = 8_001;
            leasehold_pg::reset_wallet(&db, id, 15).await?;
            let token = FencingToken::new;
            let holder =
                leasehold::HolderId::parse("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa").ok_or("holder")?;

            let before = leasehold_pg::read_wallet(&db, id).await?;
            let debit = leasehold_pg::debit_check_and_set(&db, &before, 10, token(2)).await?;
            assert_eq!(debit, Outcome::Applied { balance: 5 });
            let debit = leasehold_pg::debit_fenced(&db, &before, 1, token(1)).await?;
            assert_eq!(debit, Outcome::StaleToken { fence: 2 });
            let debit = leasehold_pg::debit_check_and_set(&db, &before, 1, token(3)).await?;
            assert_eq!(debit, Outcome::StaleRead { fence: 2 });
            let now = leasehold_pg::read_wallet(&db, id).await?;
            let debit = leasehold_pg::debit_fenced(&db, &now, 10, token(4)).await?;
            assert_eq!(debit, Outcome::InsufficientFunds { balance: 5 });
            assert!(
                leasehold_pg::debit_fenced(&db, &now, 0, token(4))
                    .await
                    .is_err()
            );

            let tx = db.transaction().await?;
            assert_eq!(
                leasehold_pg::guard_token(&tx, "metrics:r", token(9), &holder).await?,
                Guard::Accepted
            );
            tx.commit().await?;
            let tx = db.transaction().await?;
            let refused = leasehold_pg::guard_token(&tx, "metrics:r", token(8), &holder).await?;
            assert!(!refused.is_accepted());
            tx.rollback().await?;
            let tx = db.transaction().await?;
            assert!(
                leasehold_pg::guard_token(&tx, "", token(8), &holder)
                    .await
                    .is_err()
            );
            Ok::<_, Box<dyn std::error::Error>>(())
        })
    })?;

    let seen = counters(&snapshotter);
    let fenced = |check, outcome| {
        counter(
            &seen,
            FENCED_WRITES_TOTAL,
            &[("check", check), ("outcome", outcome)],
        )
    };
    assert_eq!(fenced("token_and_version", "applied"), 1);
    assert_eq!(fenced("token", "stale_token"), 1);
    assert_eq!(fenced("token_and_version", "stale_read"), 1);
    assert_eq!(fenced("token", "insufficient_funds"), 1);
    assert_eq!(fenced("token", "error"), 1);
    let guarded = |outcome| counter(&seen, GUARDED_WRITES_TOTAL, &[("outcome", outcome)]);
    assert_eq!(
        (guarded("accepted"), guarded("refused"), guarded("error")),
        (1, 1, 1)
    );
    assert_eq!(
        counter(&seen, STALE_WRITES_REFUSED_TOTAL, &[("kind", "fenced")]),
        2
    );
    assert_eq!(
        counter(&seen, STALE_WRITES_REFUSED_TOTAL, &[("kind", "guarded")]),
        1
    );
    // Nothing is labelled by wallet, resource or token.
    for (_, labels, _) in &seen {
        for (_, value) in labels {
            assert!(
                !value.contains("metrics:r") && value.parse::<i64>().is_err(),
                "{labels:?}"
            );
        }
    }
    Ok(())
}
