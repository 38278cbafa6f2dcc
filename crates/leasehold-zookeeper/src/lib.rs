//! ZooKeeper as a leasehold lock service (docs to come).

mod fault;
mod layout;
mod locker;
mod service;

pub use locker::{
    DEFAULT_ROOT, DEFAULT_SESSION_TIMEOUT, DEFAULT_ZK_COMMAND_TIMEOUT, ZkLocker, ZkLockerBuilder,
};
