//! The README's examples are files in `examples/`, shown whole (no hidden
//! lines): this checks that each block is its file, byte for byte, and
//! runs each against throwaway servers.
#![cfg(all(feature = "quorum", feature = "handoff"))]

use leasehold_testkit::{PostgresServer, RedisServer};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const README: &str = include_str!("../../../README.md");

// Each example, as a module: its `pub` items are what the tests call.
#[allow(dead_code, unreachable_pub)]
#[path = "../examples/plain.rs"]
mod plain;
#[allow(dead_code, unreachable_pub)]
#[path = "../examples/recommended.rs"]
mod recommended;
// Its test module runs here: the README's unit test of a user's function.
#[allow(dead_code, unreachable_pub)]
#[path = "../examples/tested.rs"]
mod tested;

/// Whether the README shows `source` whole, as one `rust,no_run` block.
fn shown_whole(source: &str) -> bool {
    README.contains(&format!("```rust,no_run\n{source}```\n"))
}

#[test]
fn every_rust_block_of_the_readme_is_an_example_shown_whole() {
    let examples = [
        include_str!("../examples/plain.rs"),
        include_str!("../examples/recommended.rs"),
        include_str!("../examples/leader.rs"),
        include_str!("../examples/tested.rs"),
    ];
    for example in examples {
        assert!(
            shown_whole(example),
            "not in the README as it is:\n{example}"
        );
    }
    // No other Rust block, and no hidden line in any.
    assert_eq!(README.matches("```rust").count(), examples.len());
    assert!(
        !README
            .lines()
            .any(|line| line.starts_with("# ") && line.contains(';')),
        "a rustdoc-hidden line in the README"
    );
}

#[test]
fn the_ten_line_lock_runs() -> TestResult {
    use plain::report;
    let redis = RedisServer::start()?;
    tokio::runtime::Runtime::new()?.block_on(report(&redis.url()))?;
    Ok(())
}

/// The README's claim that on etcd only the connect line differs: the
/// same `debit`, given an `EtcdLocker`, debits once, fenced by the key's
/// revision in a row of its own.
#[test]
fn the_recommended_debit_runs_unchanged_on_etcd() -> TestResult {
    use recommended::{Debit, debit};
    let (etcd, pg) = (
        leasehold_testkit::EtcdCluster::start(1)?,
        PostgresServer::start()?,
    );
    tokio::runtime::Runtime::new()?.block_on(async {
        let locker = leasehold_etcd::EtcdLocker::connect(etcd.endpoints()).await?;
        let mut db = leasehold_pg::connect(&pg.url()).await?;
        leasehold_pg::setup(&mut db).await?;
        db.batch_execute(
            "CREATE TABLE accounts (name text PRIMARY KEY, balance bigint NOT NULL);
             INSERT INTO accounts VALUES ('alice', 100)",
        )
        .await?;
        assert_eq!(debit(&locker, &mut db, "alice", 30).await?, Debit::Done(70));
        assert_eq!(debit(&locker, &mut db, "alice", 30).await?, Debit::Done(40));
        let rows = db
            .query(
                "SELECT resource FROM leasehold_fences WHERE resource = 'etcd:fence:{account:alice}'",
                &[],
            )
            .await?;
        assert_eq!(rows.len(), 1);
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}

#[test]
fn the_recommended_path_debits_once() -> TestResult {
    use recommended::{Debit, run};
    let (redis, pg) = (RedisServer::start()?, PostgresServer::start()?);
    let runtime = tokio::runtime::Runtime::new()?;
    assert_eq!(
        runtime.block_on(run(&redis.url(), &pg.url()))?,
        Debit::Done(70)
    );
    assert_eq!(
        runtime.block_on(run(&redis.url(), &pg.url()))?,
        Debit::Done(40)
    );
    Ok(())
}
