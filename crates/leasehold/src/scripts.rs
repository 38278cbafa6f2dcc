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

/// One node's vote: see `scripts/quorum_acquire.lua`.
pub(crate) static QUORUM_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/quorum_acquire.lua")));

/// Records a quorum lease's fence on one node: see `scripts/quorum_fence.lua`.
pub(crate) static QUORUM_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/quorum_fence.lua")));
