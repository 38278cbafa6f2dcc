//! The Lua scripts, one atomic step each, embedded from `scripts/*.lua`.
//!
//! `redis::Script` sends `EVALSHA` and falls back to loading the script when
//! the server answers `NOSCRIPT` (after a restart or failover emptied the
//! script cache). The token-checked steps of `compare.rs` build the same
//! `EVALSHA` themselves (falling back to `EVAL` of the source), so that the
//! exact commands can be unit-tested.
//!
//! Every script starts with `scripts/prelude.lua`, whose `call()` the
//! scripts use instead of `redis.call()`: inside a script, Redis reports a
//! command the ACL refuses without the `NOPERM` code (and Redis 7.0 without
//! the command's name), and `call()` gives the refusal the shape a direct
//! one has, so that it maps to [`Error::NoPermission`] naming the command.
//! The fence counter is written there once too: every script that issues
//! a fencing token, votes for one, checks a counter or raises one calls the
//! prelude's functions (`issue_fence`, `fence_vote`, `fence_issuer`,
//! `raise_fence_to`); each script's header still states its KEYS and ARGV.
//!
//! [`Error::NoPermission`]: crate::Error::NoPermission

use std::sync::LazyLock;

use redis::Script;

/// The source of `scripts/<file>`, after `scripts/prelude.lua`.
macro_rules! source {
    ($file:literal) => {
        concat!(
            include_str!("scripts/prelude.lua"),
            include_str!(concat!("scripts/", $file))
        )
    };
}

/// The source of `scripts/release.lua`.
pub(crate) const RELEASE_LUA: &str = source!("release.lua");

/// Compare-and-delete: see `scripts/release.lua`.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));

/// The source of `scripts/refresh.lua`.
pub(crate) const REFRESH_LUA: &str = source!("refresh.lua");

/// Compare-and-extend: see `scripts/refresh.lua`.
pub(crate) static REFRESH: LazyLock<Script> = LazyLock::new(|| Script::new(REFRESH_LUA));

/// One node's vote: see `scripts/quorum_acquire.lua`.
#[cfg(feature = "quorum")]
pub(crate) static QUORUM_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(source!("quorum_acquire.lua")));

/// Records a quorum lease's fence on one node: see `scripts/quorum_fence.lua`.
#[cfg(feature = "quorum")]
pub(crate) static QUORUM_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(source!("quorum_fence.lua")));

/// Lock plus fencing token in one step: see `scripts/acquire_fenced.lua`.
pub(crate) static ACQUIRE_FENCED: LazyLock<Script> =
    LazyLock::new(|| Script::new(source!("acquire_fenced.lua")));

/// Hand-off mode, try-or-enqueue: see `scripts/handoff_acquire.lua`.
#[cfg(feature = "handoff")]
pub(crate) static HANDOFF_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(source!("handoff_acquire.lua")));

/// Hand-off mode, release to the next waiter: see `scripts/handoff_release.lua`.
#[cfg(feature = "handoff")]
pub(crate) static HANDOFF_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(source!("handoff_release.lua")));

/// One token-checked in-process pass: see `scripts/relay.lua`.
#[cfg(feature = "handoff")]
pub(crate) static RELAY: LazyLock<Script> = LazyLock::new(|| Script::new(source!("relay.lua")));

/// Raise a fence counter, never lowering it: see `scripts/raise_fence.lua`.
pub(crate) static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(source!("raise_fence.lua")));

/// A leader names itself: see `scripts/announce.lua`.
pub(crate) static ANNOUNCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(source!("announce.lua")));

/// Who leads an election: see `scripts/leader.lua`.
pub(crate) static LEADER: LazyLock<Script> = LazyLock::new(|| Script::new(source!("leader.lua")));
