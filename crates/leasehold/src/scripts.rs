//! The Lua scripts, one atomic step each, embedded from `scripts/*.lua`.
//!
//! `redis::Script` sends `EVALSHA` and falls back to loading the script when
//! the server answers `NOSCRIPT` (after a restart or failover emptied the
//! script cache).

use std::sync::LazyLock;

use redis::Script;

/// Compare-and-delete: see `scripts/release.lua`.
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));

/// Lock plus fencing token in one step: see `scripts/acquire_fenced.lua`.
pub(crate) static ACQUIRE_FENCED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire_fenced.lua")));
