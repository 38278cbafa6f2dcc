//! The fault-matrix verifier and the harness.
//!
//! One test binary for several test files (each a module, as it was a
//! binary before): fewer binaries to link, less disk. Each module keeps
//! its own `mod common;`, so each still reads alone and keeps its own
//! shared servers, as when it was a binary.
#![allow(clippy::duplicate_mod)]

#[path = "check.rs"]
mod check;
#[path = "etcd_user.rs"]
mod etcd_user;
#[path = "harness.rs"]
mod harness;
#[path = "leaders.rs"]
mod leaders;
#[path = "report.rs"]
mod report;
#[path = "sqlx_guard.rs"]
mod sqlx_guard;
#[path = "terms.rs"]
mod terms;
#[path = "timeline.rs"]
mod timeline;
#[path = "timeline_chromium.rs"]
mod timeline_chromium;
#[path = "tls_acl.rs"]
mod tls_acl;
#[path = "verdict.rs"]
mod verdict;
