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

/// Hand-off mode, try-or-enqueue: see `scripts/handoff_acquire.lua`.
pub(crate) static HANDOFF_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/handoff_acquire.lua")));

/// Hand-off mode, release to the next waiter: see `scripts/handoff_release.lua`.
pub(crate) static HANDOFF_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/handoff_release.lua")));
