//! The throwaway servers and their faults.
//!
//! One test binary for several test files (each a module, as it was a
//! binary before): fewer binaries to link, less disk. Each module keeps
//! its own `mod common;`, so each still reads alone and keeps its own
//! shared servers, as when it was a binary.
#![allow(clippy::duplicate_mod)]

#[path = "clock.rs"]
mod clock;
#[path = "cluster.rs"]
mod cluster;
#[path = "etcd.rs"]
mod etcd;
#[path = "faults.rs"]
mod faults;
#[path = "postgres.rs"]
mod postgres;
#[path = "proxy.rs"]
mod proxy;
#[path = "redis.rs"]
mod redis;
#[path = "sentinel.rs"]
mod sentinel;
#[path = "tls.rs"]
mod tls;
#[path = "zookeeper.rs"]
mod zookeeper;
