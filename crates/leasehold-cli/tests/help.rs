//! Each subcommand's `--help` lists the flags it uses and only those, says
//! what it changes on the servers, and gives the exit codes.

use std::process::Command;

mod common;
use common::leasehold;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn help(subcommand: &[&str]) -> Result<String, Box<dyn std::error::Error>> {
    let mut args = subcommand.to_vec();
    args.push("--help");
    let out = leasehold(&args)?;
    assert!(out.status.success(), "{args:?}");
    Ok(String::from_utf8(out.stdout)?)
}

/// A subcommand, the connection and run flags it uses, and what its
/// `--help` must name as changed.
struct Expect {
    subcommand: &'static [&'static str],
    uses: &'static [&'static str],
    changes: &'static [&'static str],
}

const REDIS_RUN: &[&str] = &["--redis-url", "--tls-ca", "--runs", "--json"];
const BOTH_RUN: &[&str] = &[
    "--redis-url",
    "--tls-ca",
    "--database-url",
    "--runs",
    "--json",
];
const DATABASE_RUN: &[&str] = &["--database-url", "--runs", "--json"];
const TABLES: &[&str] = &["wallets", "wallet_ledger", "leasehold_fences", "wallet 42"];

/// Every flag some subcommand takes that another may ignore.
const SHARED_FLAGS: &[&str] = &[
    "--redis-url",
    "--tls-ca",
    "--database-url",
    "--runs",
    "--json",
    "--metrics-addr",
];

/// What `bench consensus` and `bench etcd` (the same bench) change.
const CONSENSUS_CHANGES: &[&str] = &[
    "lock:bench:etcd:*",
    "lock:bench:contention",
    "wallet:42:balance",
    "none of yours",
];

const EXPECTED: &[Expect] = &[
    Expect {
        subcommand: &["race"],
        uses: REDIS_RUN,
        changes: &["wallet:42:balance"],
    },
    Expect {
        subcommand: &["lock"],
        uses: REDIS_RUN,
        changes: &["wallet:42:balance", "lock:wallet:42"],
    },
    Expect {
        subcommand: &["ttl"],
        uses: REDIS_RUN,
        changes: &["wallet:42:balance", "lock:wallet:42"],
    },
    Expect {
        subcommand: &["backoff"],
        uses: REDIS_RUN,
        changes: &[
            "wallet:42:balance",
            "lock:wallet:42,",
            "lock:wallet:42:waitq",
            "lock:wallet:42:waiters",
        ],
    },
    Expect {
        subcommand: &["fencing"],
        uses: BOTH_RUN,
        changes: &["fence:{wallet:42}", "lock:{wallet:42}"],
    },
    Expect {
        subcommand: &["verify"],
        uses: BOTH_RUN,
        changes: &[
            "fence:{wallet:42}",
            "lock:{wallet:42}",
            "leasehold_fences row fence:{wallet:42}",
        ],
    },
    Expect {
        subcommand: &["failover"],
        uses: DATABASE_RUN,
        changes: &["none of yours"],
    },
    Expect {
        subcommand: &["redlock"],
        uses: DATABASE_RUN,
        changes: &["none of yours"],
    },
    Expect {
        subcommand: &["demo"],
        uses: &["--redis-url", "--tls-ca", "--database-url", "--json"],
        changes: &[
            "wallet:42:balance",
            "lock:wallet:42",
            "lock:{wallet:42}",
            "fence:{wallet:42}",
        ],
    },
    Expect {
        subcommand: &["chaos"],
        uses: &[
            "--redis-url",
            "--tls-ca",
            "--etcd-endpoints",
            "--etcd-tls-ca",
            "--etcd-user",
            "--runs",
            "--json",
        ],
        changes: &[
            "none of yours",
            "leasehold/",
            "/leasehold",
            ".jsonl",
            ".html",
        ],
    },
    Expect {
        subcommand: &["bench", "contention"],
        uses: &["--redis-url", "--tls-ca", "--cluster-url", "--json"],
        changes: &[
            "wallet:42:balance",
            "lock:bench:contention",
            "lock:{bench:contention}",
        ],
    },
    Expect {
        subcommand: &["bench", "uncontended"],
        uses: &["--redis-url", "--tls-ca", "--json"],
        changes: &["lock:bench:u:lib:*", "lock:bench:u:floor:*"],
    },
    Expect {
        subcommand: &["bench", "etcd"],
        uses: &["--redis-url", "--tls-ca", "--json"],
        changes: CONSENSUS_CHANGES,
    },
    Expect {
        subcommand: &["bench", "consensus"],
        uses: &["--redis-url", "--tls-ca", "--json"],
        changes: CONSENSUS_CHANGES,
    },
    Expect {
        subcommand: &["bench", "pg"],
        uses: &["--redis-url", "--tls-ca", "--json"],
        changes: &[
            "lock:bench:pg:*",
            "lock:bench:contention",
            "wallet:42:balance",
            "none of yours",
        ],
    },
    Expect {
        subcommand: &["bench", "guard"],
        uses: &["--database-url", "--json"],
        changes: &["bench_accounts", "leasehold_fences", "bench:<id>"],
    },
    Expect {
        subcommand: &["bench", "leader"],
        uses: &["--json"],
        changes: &["none of yours", "lock:{leader:bench-<way>}", "SIGSTOP"],
    },
];

/// The subcommand names a `--help` lists under `Commands:`.
fn listed_subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_subcommand_is_checked() -> TestResult {
    let mut listed = listed_subcommands(&help(&[])?);
    for bench in listed_subcommands(&help(&["bench"])?) {
        listed.push(format!("bench {bench}"));
    }
    listed.retain(|name| name != "bench");
    let mut checked: Vec<String> = EXPECTED.iter().map(|e| e.subcommand.join(" ")).collect();
    listed.sort();
    checked.sort();
    assert_eq!(listed, checked);
    Ok(())
}

#[test]
fn each_subcommand_lists_only_the_flags_it_uses() -> TestResult {
    for expect in EXPECTED {
        let help = help(expect.subcommand)?;
        for flag in SHARED_FLAGS {
            // Every subcommand but chaos and bench leader (whose leases are
            // taken in processes of their own) can serve its metrics.
            let own_processes = [&["chaos"][..], &["bench", "leader"]].contains(&expect.subcommand);
            let uses = expect.uses.contains(flag) || (*flag == "--metrics-addr" && !own_processes);
            let listed = help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n"));
            assert_eq!(
                listed, uses,
                "{:?} --help and {flag}:\n{help}",
                expect.subcommand
            );
        }
    }
    // The flags a subcommand does not list, it refuses (a usage error)...
    for args in [
        &["race", "--database-url", "postgres://h/db"][..],
        &["lock", "--database-url", "postgres://h/db"],
        &["bench", "guard", "--redis-url", "redis://h/"],
        &["bench", "guard", "--tls-ca", "ca.pem"],
        &["failover", "--tls-ca", "ca.pem"],
        &["bench", "uncontended", "--runs", "2"],
        &["demo", "--runs", "2"],
    ] {
        let out = leasehold(args)?;
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(out.stderr)?;
        assert!(stderr.contains("unexpected argument"), "{args:?}: {stderr}");
    }
    // ...and their environment variables are not read: nothing here would
    // reach this PostgreSQL.
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["race", "-n", "1", "--json"])
        .env_remove("REDIS_URL")
        .env("DATABASE_URL", "postgres://nobody:x@127.0.0.1:1/none")
        .output()?;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    Ok(())
}

#[test]
fn each_subcommand_says_what_it_changes_and_how_it_exits() -> TestResult {
    for expect in EXPECTED {
        let help = help(expect.subcommand)?;
        let changes = help
            .split("What it changes")
            .nth(1)
            .and_then(|rest| rest.split("Exit codes:").next())
            .ok_or_else(|| format!("{:?} --help says nothing of changes", expect.subcommand))?;
        for name in expect.changes {
            assert!(
                changes.contains(name),
                "{:?} --help does not name {name}:\n{help}",
                expect.subcommand
            );
        }
        let uses_database = expect.uses.contains(&"--database-url");
        let subcommand = expect.subcommand.join(" ");
        if uses_database && subcommand != "bench guard" {
            for table in TABLES {
                assert!(changes.contains(table), "{subcommand}: {table}\n{help}");
            }
        }
        if !uses_database {
            assert!(!changes.contains("PostgreSQL"), "{subcommand}\n{help}");
        }
        assert!(help.contains("Exit codes:"), "{subcommand}");
        assert!(help.contains("  130  interrupted"), "{subcommand}");
    }
    let top = help(&[])?;
    assert!(top.contains("  130  interrupted"), "{top}");
    Ok(())
}
