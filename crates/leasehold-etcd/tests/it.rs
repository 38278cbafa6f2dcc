//! etcd: the gRPC client, leases on etcd (TLS too) and leadership under a
//! paused member, on real etcd clusters from the test kit.
//!
//! One test binary for several test files (each a module): fewer binaries
//! to link, less disk.
#![allow(clippy::duplicate_mod)]

#[path = "client.rs"]
mod client;
#[path = "etcd_lease.rs"]
mod etcd_lease;
#[path = "etcd_pause.rs"]
mod etcd_pause;
#[path = "etcd_tls.rs"]
mod etcd_tls;
