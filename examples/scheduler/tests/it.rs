//! The scheduler: its service and its write path under faults.
//!
//! One test binary for several test files (each a module, as it was a
//! binary before): fewer binaries to link, less disk. Each module keeps
//! its own `mod common;`, so each still reads alone and keeps its own
//! shared servers, as when it was a binary.
#![allow(clippy::duplicate_mod)]

#[path = "chaos.rs"]
mod chaos;
#[path = "serve.rs"]
mod serve;
