//! Beyond one server: Redlock, Redis Cluster, Sentinel, replicas, recovery after a restart,
//! TLS.
//!
//! One test binary for several test files (each a module, as it was a
//! binary before): fewer binaries to link, less disk. Each module keeps
//! its own `mod common;`, so each still reads alone and keeps its own
//! shared servers, as when it was a binary.
#![allow(clippy::duplicate_mod)]

#[path = "cluster.rs"]
mod cluster;
#[path = "handoff_cluster.rs"]
mod handoff_cluster;
#[path = "quorum.rs"]
mod quorum;
#[path = "recovery.rs"]
mod recovery;
#[path = "replicas.rs"]
mod replicas;
#[path = "sentinel.rs"]
mod sentinel;
#[path = "tls.rs"]
mod tls;
