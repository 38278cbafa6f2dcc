//! The API as a user meets it: the README's examples, options, diagnostics, and the model-checked lease.
//!
//! One test binary for several test files (each a module, as it was a
//! binary before): fewer binaries to link, less disk. Each module keeps
//! its own `mod common;`, so each still reads alone and keeps its own
//! shared servers, as when it was a binary.
#![allow(clippy::duplicate_mod)]

#[path = "diagnostics.rs"]
mod diagnostics;
#[path = "memory_locker.rs"]
mod memory_locker;
#[path = "model.rs"]
mod model;
#[path = "options.rs"]
mod options;
#[path = "readme.rs"]
mod readme;
