//! The minimal Redis ACL of a lock user, said once for every test and the
//! chaos lab.

/// The minimal rules the README documents for a lock user (its "Redis ACL"
/// section), as `ACL SETUSER` arguments after `on >PASSWORD`: every way of
/// taking a lease (polling, fenced, hand-off, waiting for replicas) works
/// under them. leasehold's tests check that the README says the same, and
/// that each rule is needed.
pub const LOCK_USER_ACL: &[&str] = &[
    "resetkeys",
    "~lock:*",
    "~fence:*",
    "resetchannels",
    "&leasehold:handoff:*",
    "-@all",
    "+set",
    "+get",
    "+del",
    "+pexpire",
    "+pttl",
    "+type",
    "+time",
    "+zadd",
    "+zrange",
    "+zrem",
    "+zpopmin",
    "+hget",
    "+hset",
    "+hdel",
    "+spublish",
    "+pubsub|shardnumsub",
    "+ssubscribe",
    "+evalsha",
    "+eval",
    "+script|load",
    "+wait",
];
