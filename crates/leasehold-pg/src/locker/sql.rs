//! A `PgLocker`'s statements, each one request: the tables' setup, a
//! take (plain or fenced, with its counter's increment), its undo, a
//! refresh, a release, a raised fence, the leader record, and the
//! release's notification. Every write that confirms something to its
//! caller carries the `synchronous_commit` pin (`durable!`).

pub(super) const SETUP: &str = "\
CREATE TABLE IF NOT EXISTS leasehold_leases (
    resource text PRIMARY KEY,
    holder text NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS leasehold_lease_counters (
    fence_key text PRIMARY KEY,
    last bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS leasehold_leader_records (
    record_key text PRIMARY KEY,
    holder text NOT NULL,
    body text NOT NULL
);";

/// The condition every write that confirms something carries (the module
/// docs, "Durable whatever the role's default"): `synchronous_commit` for
/// the statement's own transaction, `on` unless `remote_apply` (stronger)
/// is in force already. Always true.
macro_rules! durable {
    () => {
        "set_config('synchronous_commit',
    CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END,
    true) IS NOT NULL"
    };
}

/// The least token the server may issue now: its timeline (the first
/// eight hex digits of its current WAL file's name) times 2^40. A
/// promotion (a failover, a point-in-time restore) starts a new timeline,
/// so a promoted standby that lacks the last increments of the counter
/// (an asynchronous one) still issues every token above every token of
/// the timeline before (which never reaches 2^40 tokens per fence key).
/// Always at least 1.
macro_rules! timeline_floor {
    () => {
        "greatest(1, ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint << 40)"
    };
}

/// A take's first look, without a lock: no live lease on `$1`. A take
/// that finds the lock held then writes nothing (no row lock, no
/// transaction id, no commit to flush): a waiter's failed take costs the
/// database a read. Whether it wins is still decided by the conflict
/// clause below, under the row's lock (a lease may have been taken or
/// given back since this look).
macro_rules! live_elsewhere {
    () => {
        "NOT EXISTS (
        SELECT 1 FROM leasehold_leases
        WHERE resource = $1 AND expires_at > clock_timestamp()
    )"
    };
}

pub(super) const TAKE: &str = concat!(
    "\
INSERT INTO leasehold_leases AS l (resource, holder, expires_at)
SELECT $1, $2, clock_timestamp() + $3 * interval '1 millisecond'
WHERE ",
    live_elsewhere!(),
    " AND ",
    durable!(),
    "
ON CONFLICT (resource) DO UPDATE
    SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
    WHERE l.expires_at <= clock_timestamp()
RETURNING 0::bigint"
);

pub(super) const TAKE_FENCED: &str = concat!(
    "\
WITH won AS (
    INSERT INTO leasehold_leases AS l (resource, holder, expires_at)
    SELECT $1, $2, clock_timestamp() + $3 * interval '1 millisecond'
    WHERE ",
    live_elsewhere!(),
    " AND ",
    durable!(),
    "
    ON CONFLICT (resource) DO UPDATE
        SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
        WHERE l.expires_at <= clock_timestamp()
    RETURNING 1
)
INSERT INTO leasehold_lease_counters AS c (fence_key, last)
SELECT $4, ",
    timeline_floor!(),
    " FROM won
ON CONFLICT (fence_key) DO UPDATE SET last = greatest(c.last + 1, EXCLUDED.last)
RETURNING last"
);

pub(super) const REFRESH: &str = concat!(
    "\
UPDATE leasehold_leases
SET expires_at = clock_timestamp() + $3 * interval '1 millisecond'
WHERE resource = $1 AND holder = $2 AND expires_at > clock_timestamp()
    AND ",
    durable!()
);

pub(super) const RELEASE: &str = concat!(
    "\
DELETE FROM leasehold_leases
WHERE resource = $1 AND holder = $2 AND expires_at > clock_timestamp()
    AND ",
    durable!()
);

pub(super) const UNDO: &str = "DELETE FROM leasehold_leases WHERE resource = $1 AND holder = $2";

pub(super) const ANNOUNCE: &str = concat!(
    "\
INSERT INTO leasehold_leader_records AS r (record_key, holder, body)
SELECT $3, $2, $4
WHERE ",
    durable!(),
    " AND EXISTS (
    SELECT 1 FROM leasehold_leases
    WHERE resource = $1 AND holder = $2 AND expires_at > clock_timestamp()
)
ON CONFLICT (record_key) DO UPDATE SET holder = EXCLUDED.holder, body = EXCLUDED.body"
);

pub(super) const LEADER: &str = "\
SELECT r.body,
       ceil(extract(epoch FROM (l.expires_at - clock_timestamp())) * 1000)::bigint
FROM leasehold_leases l
JOIN leasehold_leader_records r ON r.record_key = $2 AND r.holder = l.holder
WHERE l.resource = $1 AND l.expires_at > clock_timestamp()";

pub(super) const LISTEN: &str = "LISTEN leasehold_leases";

pub(super) const NOTIFY: &str = "SELECT pg_notify('leasehold_leases', $1)";

pub(super) const RAISE: &str = concat!(
    "\
INSERT INTO leasehold_lease_counters AS c (fence_key, last)
SELECT $1, $2 WHERE ",
    durable!(),
    "
ON CONFLICT (fence_key) DO UPDATE SET last = greatest(c.last, EXCLUDED.last)"
);
