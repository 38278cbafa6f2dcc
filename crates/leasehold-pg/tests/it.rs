//! The fence guard, fenced and check-and-set writes, against a throwaway PostgreSQL.
//!
//! One test binary for several test files (each a module, as it was a
//! binary before): fewer binaries to link, less disk. Each module keeps
//! its own `mod common;`, so each still reads alone and keeps its own
//! shared servers, as when it was a binary.
#![allow(clippy::duplicate_mod)]

#[path = "clock.rs"]
mod clock;
#[path = "guard.rs"]
mod guard;
#[path = "guarded.rs"]
mod guarded;
#[path = "lease_row.rs"]
mod lease_row;
#[path = "locker.rs"]
mod locker;
#[path = "locker_durable.rs"]
mod locker_durable;
#[path = "pg.rs"]
mod pg;
#[path = "recommended.rs"]
mod recommended;
#[path = "restart.rs"]
mod restart;
#[path = "sqlx.rs"]
mod sqlx;
#[path = "standby.rs"]
mod standby;
#[path = "tls.rs"]
mod tls;
#[path = "tokens.rs"]
mod tokens;
