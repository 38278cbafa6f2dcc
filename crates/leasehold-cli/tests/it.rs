//! The `leasehold` binary, run as a user runs it.
//!
//! One test binary for several test files (each a module, as it was a
//! binary before): fewer binaries to link, less disk. Each module keeps
//! its own `mod common;`, so each still reads alone and keeps its own
//! shared servers, as when it was a binary.
#![allow(clippy::duplicate_mod)]

#[path = "acl.rs"]
mod acl;
#[path = "bench_leader.rs"]
mod bench_leader;
#[path = "chaos.rs"]
mod chaos;
#[path = "chaos_etcd.rs"]
mod chaos_etcd;
#[path = "chaos_etcd_user.rs"]
mod chaos_etcd_user;
#[path = "chaos_marks.rs"]
mod chaos_marks;
#[path = "chaos_pg.rs"]
mod chaos_pg;
#[path = "chaos_tls.rs"]
mod chaos_tls;
#[path = "chaos_zookeeper.rs"]
mod chaos_zookeeper;
#[path = "cli.rs"]
mod cli;
#[path = "help.rs"]
mod help;
#[path = "interrupt.rs"]
mod interrupt;
#[path = "metrics.rs"]
mod metrics;
#[path = "progress.rs"]
mod progress;
#[path = "sentinel.rs"]
mod sentinel;
#[path = "tls.rs"]
mod tls;
