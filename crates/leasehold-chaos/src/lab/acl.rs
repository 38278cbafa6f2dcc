//! The lock user's ACL: [`ACL_USER`] and the README's minimal
//! [`ACL_RULES`], set on the lab's throwaway servers.

use leasehold_testkit::RedisServer;

use super::LabError;
use super::error::server_err;

/// The ACL user the callers connect as with [`LabOptions::acl_user`].
///
/// [`LabOptions::acl_user`]: super::LabOptions::acl_user
pub const ACL_USER: &str = "locker";

/// The README's minimal rules for a lock user, every mode's commands (its
/// "Redis ACL" section), after `ACL SETUSER locker on >PASSWORD`
/// (leasehold's `tests/acl.rs` checks that the two stay the same).
pub const ACL_RULES: &[&str] = leasehold_testkit::LOCK_USER_ACL;

/// Makes (or resets) [`ACL_USER`] on `server` with the minimal rules.
pub(super) fn set_acl_user(server: &RedisServer, password: &str) -> Result<(), LabError> {
    let secret = format!(">{password}");
    let mut args = vec!["ACL", "SETUSER", ACL_USER, "reset", "on", secret.as_str()];
    args.extend(ACL_RULES.iter().copied());
    server
        .command(&args)
        .map(drop)
        .map_err(server_err("making the lock's acl user"))
}
