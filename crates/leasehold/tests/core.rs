//! The lease on one server, every way: the suites CI also runs on Valkey.
//!
//! One test binary for several test files (each a module, as it was a
//! binary before): fewer binaries to link, less disk. Each module keeps
//! its own `mod common;`, so each still reads alone and keeps its own
//! shared servers, as when it was a binary.
#![allow(clippy::duplicate_mod)]

#[path = "acl.rs"]
mod acl;
#[path = "conformance.rs"]
mod conformance;
#[path = "election.rs"]
mod election;
#[path = "faults.rs"]
mod faults;
#[path = "fencing.rs"]
mod fencing;
#[path = "handoff.rs"]
mod handoff;
#[path = "lease.rs"]
mod lease;
#[path = "memory.rs"]
mod memory;
#[path = "paths.rs"]
mod paths;
#[path = "tokens.rs"]
mod tokens;
#[path = "watchdog.rs"]
mod watchdog;
