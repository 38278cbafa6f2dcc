//! The faults the nemesis injects (their seeded schedule is in
//! `schedule`).
//!
//! Each fault is applied over a *window*: it starts, lasts a few TTLs (so a
//! lease can expire inside it), and ends (resumed, healed, restarted). Faults
//! that are a single action (`DEL` of the lock keys, an early expiry,
//! `SCRIPT FLUSH`) are repeated every few milliseconds through their window,
//! so that they hit leases that are actually held. Windows are separated by
//! quiet gaps, which the liveness check needs to measure recovery.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A fault the nemesis can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Fault {
    /// No fault: the baseline.
    None,
    /// A lock holder paused past its TTL: a worker process stopped with
    /// SIGSTOP (in-process: a caller stalled between acquire and write, as
    /// a long GC pause would).
    HolderPause,
    /// Redis paused (SIGSTOP): every request hangs until it resumes.
    RedisPause,
    /// Redis killed and restarted empty (no persistence): every lock and
    /// fence counter is gone.
    RedisRestart,
    /// Redis killed and restarted from its append-only file.
    RedisRestartAof,
    /// The replica, partitioned from the primary, is promoted and the
    /// primary killed: locks taken during the partition are lost.
    Failover,
    /// Redis Cluster: the slot of every lock key moved to another master
    /// (`CLUSTER SETSLOT ... MIGRATING/IMPORTING` through the window, so
    /// requests meet `ASK` redirects and `TRYAGAIN`, then `MIGRATE` and the
    /// slot reassigned at its end).
    SlotMigration,
    /// Redis Cluster: the replica of the master serving the lock keys
    /// promoted with `CLUSTER FAILOVER` (coordinated: nothing written is
    /// lost); once per run.
    ClusterFailover,
    /// Network latency between the callers and Redis (through the fault
    /// proxy).
    NetLatency,
    /// Every connection between the callers and Redis cut (new ones work).
    NetCut,
    /// The network between the callers and Redis swallows every byte.
    NetBlackhole,
    /// PostgreSQL paused (SIGSTOP).
    PostgresPause,
    /// The lock keys deleted under their holders (`DEL`).
    KeyLoss,
    /// The lock keys expired early (`PEXPIRE key 1`), as a clock jump on the
    /// Redis host would.
    EarlyExpiry,
    /// `SCRIPT FLUSH`: the server forgets every cached Lua script.
    ScriptFlush,
    /// Every caller's connection killed by Redis itself (`CLIENT KILL TYPE
    /// normal`, every 100 ms through the window): the connection drops
    /// mid-request, as a server-side idle or maxclients policy or a
    /// proxy's restart would do; new connections work. Every mode (on a
    /// quorum, the first node's clients); not on a Redis Cluster (a lab
    /// there has no single primary). Mixed in.
    ConnKill,
    /// Redis stops answering while every connection stays open (`CLIENT
    /// PAUSE <window> ALL`: commands queue, replies stop, no connection is
    /// refused or reset), as a server stalled by a slow command or a fork
    /// would; it answers again when the window ends. Every mode (on a
    /// quorum, the first node); not on a Redis Cluster. Mixed in.
    RedisStall,
    /// The callers' ACL user deleted (`ACL DELUSER`, which also closes its
    /// connections) and made again with the same rules at the window's
    /// end, as a restart without the ACL file or an operator's mistake
    /// would: requests and reconnections are refused meanwhile. The
    /// callers connect as the README's minimal lock user for this fault.
    /// Every mode (on a quorum, the first node); throwaway servers only
    /// (not with your own Redis); not mixed in (the mixed lab's callers
    /// use the default user).
    AclReset,
    /// Redis out of memory and evicting: `maxmemory` set just above what
    /// it uses, `maxmemory-policy allkeys-lru`, and a filler writing many
    /// 1 KiB keys every 50 ms through the window, so Redis evicts
    /// (normally the filler's cold keys, a lock or fence key if the LRU
    /// sample picks it); at the end the limit and policy are restored and
    /// the filler's keys deleted. Every mode (on a quorum, the first
    /// node); throwaway servers only (it changes the server's
    /// configuration); not on a Redis Cluster. Mixed in.
    Eviction,
    /// Redis stops serving writes while reads go on (`CLIENT PAUSE <window>
    /// WRITE`, as a failover's coordinated pause or an operator does):
    /// every acquire, refresh and release waits until the window ends.
    /// Every mode (on a quorum, the first node); not on a Redis Cluster;
    /// not mixed in.
    ClientPauseWrite,
    /// Every pub/sub connection killed by Redis (`CLIENT KILL TYPE pubsub`,
    /// every 300 ms through the window): hand-off's subscriber loses its
    /// subscription, reconnects and subscribes again. Every mode (on a
    /// quorum, the first node); not on a Redis Cluster; not mixed in.
    PubsubKill,
    /// Redis out of connections: every caller's connection killed and
    /// `maxclients` set to 1 through the window, so every reconnect is
    /// refused ("max number of clients reached"); restored at its end.
    /// Every mode (on a quorum, the first node); throwaway servers only;
    /// not on a Redis Cluster; not mixed in.
    Maxclients,
    /// Redis demoted: made the replica of an empty server (`REPLICAOF`)
    /// through the window, then promoted back (`REPLICAOF NO ONE`): writes
    /// are refused with `READONLY`, and the full sync from the empty
    /// server wipes every lock, fence counter and queue. Every mode (on a
    /// quorum, the first node); throwaway servers without a password or
    /// TLS only; not on a Redis Cluster; not mixed in.
    Demotion,
    /// Redis full: `maxmemory` set to 1 byte under `noeviction` through the
    /// window, so every write that needs memory is refused with `OOM`
    /// (acquires, grants, passes), while deletes and expiries still work;
    /// restored at its end. Every mode (on a quorum, the first node);
    /// throwaway servers only (it changes the server's configuration); not
    /// on a Redis Cluster; not mixed in.
    Oom,
    /// `FLUSHALL` at the window's start: every lock, fence counter and
    /// hand-off queue gone at once, as a wiped server (an operator's
    /// mistake, a demotion to the replica of an empty server) would leave
    /// them. Every mode (on a quorum, the first node); throwaway servers
    /// only; not on a Redis Cluster; not mixed in.
    Flushall,
    /// The Redis server's wall clock steps 10 s forward ([`CLOCK_JUMP`]):
    /// every lease on it expires at once, while its holders, counting on
    /// their own clocks, believe they hold it. Repeated every 25 ms
    /// through the window, as [`Fault::KeyLoss`] is, so that steps meet
    /// leases actually held (one step a window caught the control in 1 of
    /// 3 runs). The steps are not undone (an NTP step or an operator's
    /// `date -s` forward is not stepped back; a backward step would be
    /// another fault): the clock stays ahead. Every mode (on a quorum, the
    /// first node); a throwaway server whose clock libfaketime can drive
    /// only ([`LabOptions::fake_clock`](crate::LabOptions::fake_clock): a
    /// libc-malloc build such as Valkey's, not Debian's jemalloc-linked
    /// `redis-server`, on which the row says it is unsupported); not on a
    /// Redis Cluster or Sentinel; not mixed in.
    ClockJump,
    /// The Redis server's wall clock runs 3 times as fast as the
    /// holders' ([`CLOCK_RATE`]) through the window: a lease expires on
    /// the server after a third of its TTL, and a watchdog refreshing at
    /// a third of the TTL of its own clock meets a lease at the end of
    /// its life. At the window's end it runs at the real rate again,
    /// keeping the time it gained (twice the window's length). On the
    /// servers [`Fault::ClockJump`] runs on; not mixed in.
    ClockFast,
    /// PostgreSQL restarted: a fast shutdown (every session cut, open
    /// transactions rolled back, what was committed kept) and started again
    /// on its port at the window's end: writes fail meanwhile, and a
    /// commit in flight has an unknown outcome. (An immediate shutdown
    /// would lose acknowledged commits of the throwaway server, which runs
    /// with `synchronous_commit=off`: data loss the lock cannot be judged
    /// on.) Every mode (the lock is untouched). Mixed in.
    PostgresRestart,
    /// Redis Sentinel (a primary, a replica, three sentinels): `SENTINEL
    /// FAILOVER` of the master, once per run. The window lasts until every
    /// sentinel names the new primary and it answers as one (at least the
    /// scheduled length), so it measures the failover. The callers connect
    /// with the `redis+sentinel://` URL and follow the primary. Polling and
    /// hand-off modes (not quorum, not db); throwaway servers only; not
    /// mixed in.
    SentinelFailover,
    /// Redis Sentinel: the primary killed (`SIGKILL`); the sentinels deem
    /// it down after 1 s and promote the replica. Once per run; the window
    /// lasts until every sentinel names the new primary and it answers as
    /// one. As [`Fault::SentinelFailover`] otherwise.
    SentinelKill,
    /// etcd (a throwaway cluster of three members): the leader killed
    /// (`SIGKILL`) at the window's start and started again on its data at
    /// its end; the other two elect a new leader meanwhile. The etcd modes
    /// only, as every `Etcd*` fault.
    EtcdLeaderKill,
    /// etcd: a follower paused (`SIGSTOP`) through the window, its
    /// connections left open: the callers it serves hang (their requests,
    /// their keep-alives, a Lock RPC waiting on it) until it resumes.
    EtcdMemberPause,
    /// etcd: the leader cut off from its peers, both ways, through the
    /// window (a minority of one; its clients still reach it): it steps
    /// down after an election timeout and commits nothing, the other two
    /// elect a leader.
    EtcdMinorityCut,
    /// etcd: two of the three members cut off from their peers through the
    /// window: no majority anywhere, nothing commits, no lease is kept
    /// alive; healed at its end.
    EtcdMajorityCut,
    /// etcd: every member killed at the window's start and all started
    /// again on their data at its end (a whole-cluster restart: the keys
    /// and leases are on disk; etcd renews every lease's TTL when a new
    /// leader takes over).
    EtcdRestart,
    /// etcd: every etcd lease that holds a lock key revoked, as an
    /// operator's `etcdctl lease revoke` would (the keys go with their
    /// leases), every 200 ms through the window: etcd's [`Fault::KeyLoss`].
    EtcdRevoke,
    /// etcd out of space: its `NOSPACE` alarm raised through the window
    /// (as etcd raises it when its backend outgrows its quota) and cleared
    /// at its end, as an operator would after compacting: every write that
    /// stores (a lease grant, a lock key's put) is refused with "database
    /// space exceeded", while reads, deletes, keep-alives and revokes go
    /// on. etcd's [`Fault::Oom`].
    EtcdNoSpace,
    /// ZooKeeper (a throwaway ensemble of three servers): the leader
    /// killed (`SIGKILL`) at the window's start and started again on its
    /// data at its end; the other two elect a new leader meanwhile, and
    /// the sessions it served move to them. The ZooKeeper modes only, as
    /// every `Zookeeper*` fault.
    ZookeeperLeaderKill,
    /// ZooKeeper: a follower paused (`SIGSTOP`) through the window, its
    /// connections left open: the sessions it serves hear nothing until
    /// their client gives up on it and moves to another member (within
    /// the session timeout, or the session expires and its nodes go).
    ZookeeperMemberPause,
    /// ZooKeeper: the leader cut off through the window (a minority of
    /// one), from its peers both ways and from the callers, and healed at
    /// its end: every connection to and from it is closed and every new
    /// one closed as soon as it is accepted, as behind a firewall that
    /// answers with resets (the test kit's
    /// `ZooKeeperEnsemble::cut_off`, a proxy on every path). Its
    /// followers lose it at once and elect one of themselves; it hears
    /// from no quorum and stops serving; the callers it served move to
    /// the other two, their sessions kept by the new leader.
    ZookeeperMinorityCut,
    /// ZooKeeper: two of the three members (the leader and a follower)
    /// cut off through the window, from everyone and from each other, as
    /// [`Fault::ZookeeperMinorityCut`] cuts one: no quorum anywhere, so
    /// no member serves, nothing commits and no session is kept alive; a
    /// caller's client gives its session up once it has reached no
    /// member for its timeout. Healed at its end: the members elect a
    /// leader, which gives every session still on disk a fresh timeout.
    ZookeeperMajorityCut,
    /// ZooKeeper: a full disk on the leader through the window, lifted at
    /// its end. How (the test kit's `ZooKeeperMember::fill_disk`, without
    /// privileges): the leader's JVM gets a file size limit
    /// (`RLIMIT_FSIZE`, set with `prlimit --pid`) at the end of its
    /// transaction log, so its next logged transaction fails with `EFBIG`
    /// ("File too large"; HotSpot ignores `SIGXFSZ`). Unlike `ENOSPC` the
    /// limit is per process and file offset, not per directory: it fails
    /// a write into the log's preallocated zeros too, which a full disk
    /// would let through (a full disk bites when the log grows past its
    /// preallocation, rolls over or a snapshot is taken: later, then the
    /// same way). ZooKeeper 3.8 stops the member on the error ("Severe
    /// unrecoverable error", its JVM exiting), and may elect it again
    /// first (it has the newest transactions), so the whole ensemble may
    /// stop serving for a while. At the window's end the limit is lifted
    /// and the member, if it does not serve again within 5 s, restarted
    /// on its data.
    ZookeeperDiskFull,
    /// ZooKeeper: every server killed at the window's start and all
    /// started again on their data at its end (a whole-ensemble restart:
    /// the sessions and their nodes are on disk, and the new leader gives
    /// every session a fresh timeout).
    ZookeeperRestart,
    /// ZooKeeper: the ensemble rebuilt empty, as after losing every
    /// server's disk: every server killed and its data wiped (its id
    /// kept) at the window's start, all started again at its end (the
    /// test kit's `ZooKeeperEnsemble::rebuild`, split in two). The new
    /// ensemble's zxids start again from epoch 1, below the fences the
    /// guard stored, and the lab does not give the workers the next
    /// generation (`ZkLockerBuilder::generation`, the operator's way
    /// back): the fault shows the refusals, every guarded write after the
    /// rebuild refused as stale for as long as the new czxids stay below
    /// the old fence (the rest of a short run), and sessions and clients
    /// that saw the old ensemble refused by the new one until they
    /// connect afresh.
    ZookeeperRebuild,
    /// ZooKeeper: the lock's node deleted by hand, as an operator's
    /// `delete` or a cleanup script would: in every lock directory under
    /// the modes' root (`/leasehold`), the lowest contender (the holder's
    /// node), every 50 ms through the window. ZooKeeper's
    /// [`Fault::KeyLoss`].
    ZookeeperNodeDelete,
    /// PostgreSQL as the lock service (the pg modes only, as every `Pg*`
    /// fault): every caller's backend ended by the server
    /// (`pg_terminate_backend` of every other client backend of the
    /// database, every 100 ms through the window), as an operator, a
    /// connection reaper or an `idle_session_timeout` would: a statement
    /// in flight fails, its transaction is rolled back, the connection is
    /// gone; new ones work. Through PgBouncer, its server connections go
    /// (it opens others).
    PgBackendKill,
    /// PostgreSQL as the lock service: every lease row of the run's lock
    /// keys deleted by hand (`DELETE FROM leasehold_leases`), every 20 ms
    /// through the window, as an operator's cleanup would: the holder
    /// believes it holds while another takes the lock. PostgreSQL's
    /// [`Fault::KeyLoss`].
    PgRowDelete,
    /// PostgreSQL as the lock service: a long migration on the lease
    /// table, `LOCK TABLE leasehold_leases IN ACCESS EXCLUSIVE MODE` held
    /// in a transaction of the lab's own through the window, rolled back
    /// at its end: every take, refresh and release (and the guard's check
    /// of the lease row) waits behind it.
    PgTableLock,
    /// PostgreSQL as the lock service: the database's wall clock stepped
    /// forward by twice the window's length (6 TTLs) at the window's
    /// start (libfaketime drives the lab's PostgreSQL, started with
    /// `PostgresServer::start_with_fake_clock`): every lease ends early on
    /// the database's clock, while its holder, counting on its own clock,
    /// believes it holds it. Not undone (the clock stays ahead). On a
    /// PostgreSQL on the machine's clock the row says unsupported.
    PgClockStep,
    /// PostgreSQL crashed: an immediate shutdown (`SIGQUIT`, as `pg_ctl
    /// stop -m immediate`: nothing written out, every session cut) at the
    /// window's start, started again through crash recovery at its end.
    /// [`Fault::PostgresRestart`] is the fast shutdown. The pg lab sets
    /// `synchronous_commit = on` for the whole server (`ALTER SYSTEM`)
    /// first, so that what a commit acknowledged survives the crash (the
    /// test kit's server runs with it off); the lease table's writes pin
    /// it themselves. The pg modes only.
    PgCrash,
    /// PostgreSQL as the lock service: `statement_timeout` hit. The
    /// callers' role is given a tiny one (`ALTER ROLE ... SET
    /// statement_timeout = '1ms'`, [`PG_TINY_TIMEOUT`]) and every
    /// caller's backend ended at the window's start, so that the sessions
    /// they open again take it (a role's setting reaches new sessions
    /// only); at its end the setting is reset and the backends ended
    /// again. Meanwhile a statement that runs longer than that (one on a
    /// loaded machine, one that waits for a row) is cancelled (`57014`).
    PgStatementTimeout,
    /// PostgreSQL as the lock service: `lock_timeout` hit, as
    /// [`Fault::PgStatementTimeout`] with `lock_timeout`: a statement that
    /// waits longer than [`PG_TINY_TIMEOUT`] for a lock (a row another
    /// transaction holds, the guard's fence row) fails (`55P03`).
    PgLockTimeout,
    /// PgBouncer (the pg-pgbouncer mode's, in transaction mode) killed at
    /// the window's start and started again on its port at its end: every
    /// client connection through it is cut, and none opens meanwhile.
    PgbouncerRestart,
    /// A seeded mix of the faults above.
    Mixed,
}

impl Fault {
    /// Every fault, in the order the matrix shows them.
    pub const ALL: [Fault; 54] = [
        Fault::None,
        Fault::HolderPause,
        Fault::RedisPause,
        Fault::RedisRestart,
        Fault::RedisRestartAof,
        Fault::Failover,
        Fault::SlotMigration,
        Fault::ClusterFailover,
        Fault::NetLatency,
        Fault::NetCut,
        Fault::NetBlackhole,
        Fault::PostgresPause,
        Fault::KeyLoss,
        Fault::EarlyExpiry,
        Fault::ScriptFlush,
        Fault::ConnKill,
        Fault::RedisStall,
        Fault::AclReset,
        Fault::Eviction,
        Fault::ClientPauseWrite,
        Fault::PubsubKill,
        Fault::Maxclients,
        Fault::Demotion,
        Fault::Oom,
        Fault::Flushall,
        Fault::ClockJump,
        Fault::ClockFast,
        Fault::PostgresRestart,
        Fault::SentinelFailover,
        Fault::SentinelKill,
        Fault::EtcdLeaderKill,
        Fault::EtcdMemberPause,
        Fault::EtcdMinorityCut,
        Fault::EtcdMajorityCut,
        Fault::EtcdRestart,
        Fault::EtcdRevoke,
        Fault::EtcdNoSpace,
        Fault::ZookeeperLeaderKill,
        Fault::ZookeeperMemberPause,
        Fault::ZookeeperMinorityCut,
        Fault::ZookeeperMajorityCut,
        Fault::ZookeeperDiskFull,
        Fault::ZookeeperRestart,
        Fault::ZookeeperRebuild,
        Fault::ZookeeperNodeDelete,
        Fault::PgBackendKill,
        Fault::PgRowDelete,
        Fault::PgTableLock,
        Fault::PgClockStep,
        Fault::PgCrash,
        Fault::PgStatementTimeout,
        Fault::PgLockTimeout,
        Fault::PgbouncerRestart,
        Fault::Mixed,
    ];

    /// The faults a [`Fault::Mixed`] schedule draws from: those that run on
    /// the mixed run's lab (one primary behind the proxy, with an
    /// append-only file) as it is, and leave it as they found it. Not mixed
    /// in: a failover (it changes the topology for good), the cluster
    /// faults (they need a cluster), an ACL reset (the mixed run's callers
    /// connect as the default user).
    pub const MIXABLE: [Fault; 15] = [
        Fault::HolderPause,
        Fault::RedisPause,
        Fault::RedisRestart,
        Fault::RedisRestartAof,
        Fault::NetLatency,
        Fault::NetCut,
        Fault::NetBlackhole,
        Fault::PostgresPause,
        Fault::KeyLoss,
        Fault::EarlyExpiry,
        Fault::ScriptFlush,
        Fault::ConnKill,
        Fault::RedisStall,
        Fault::Eviction,
        Fault::PostgresRestart,
    ];

    /// The fault's name on the command line and in histories.
    pub const fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::HolderPause => "holder-pause",
            Fault::RedisPause => "redis-pause",
            Fault::RedisRestart => "redis-restart",
            Fault::RedisRestartAof => "redis-restart-aof",
            Fault::Failover => "failover",
            Fault::SlotMigration => "slot-migration",
            Fault::ClusterFailover => "cluster-failover",
            Fault::NetLatency => "net-latency",
            Fault::NetCut => "net-cut",
            Fault::NetBlackhole => "net-blackhole",
            Fault::PostgresPause => "postgres-pause",
            Fault::KeyLoss => "key-loss",
            Fault::EarlyExpiry => "early-expiry",
            Fault::ScriptFlush => "script-flush",
            Fault::ConnKill => "conn-kill",
            Fault::RedisStall => "redis-stall",
            Fault::AclReset => "acl-reset",
            Fault::Eviction => "eviction",
            Fault::ClientPauseWrite => "client-pause-write",
            Fault::PubsubKill => "pubsub-kill",
            Fault::Maxclients => "maxclients",
            Fault::Demotion => "demotion",
            Fault::Oom => "oom",
            Fault::Flushall => "flushall",
            Fault::ClockJump => "clock-jump",
            Fault::ClockFast => "clock-fast",
            Fault::PostgresRestart => "postgres-restart",
            Fault::SentinelFailover => "sentinel-failover",
            Fault::SentinelKill => "sentinel-kill",
            Fault::EtcdLeaderKill => "etcd-leader-kill",
            Fault::EtcdMemberPause => "etcd-member-pause",
            Fault::EtcdMinorityCut => "etcd-minority-cut",
            Fault::EtcdMajorityCut => "etcd-majority-cut",
            Fault::EtcdRestart => "etcd-restart",
            Fault::EtcdRevoke => "etcd-revoke",
            Fault::EtcdNoSpace => "etcd-no-space",
            Fault::ZookeeperLeaderKill => "zookeeper-leader-kill",
            Fault::ZookeeperMemberPause => "zookeeper-member-pause",
            Fault::ZookeeperMinorityCut => "zookeeper-minority-cut",
            Fault::ZookeeperMajorityCut => "zookeeper-majority-cut",
            Fault::ZookeeperDiskFull => "zookeeper-disk-full",
            Fault::ZookeeperRestart => "zookeeper-restart",
            Fault::ZookeeperRebuild => "zookeeper-rebuild",
            Fault::ZookeeperNodeDelete => "zookeeper-node-delete",
            Fault::PgBackendKill => "pg-backend-kill",
            Fault::PgRowDelete => "pg-row-delete",
            Fault::PgTableLock => "pg-table-lock",
            Fault::PgClockStep => "pg-clock-step",
            Fault::PgCrash => "pg-crash",
            Fault::PgStatementTimeout => "pg-statement-timeout",
            Fault::PgLockTimeout => "pg-lock-timeout",
            Fault::PgbouncerRestart => "pgbouncer-restart",
            Fault::Mixed => "mixed",
        }
    }

    /// True when the fault, in every window, makes two callers believe they
    /// hold the same lock at once, so that a lock *without* a database
    /// check (the negative control) must lose a debit under it.
    ///
    /// A restart or a failover loses the lock too, but only a holder whose
    /// critical section spans the server's absence can then meet a second
    /// holder: with critical sections shorter than a restart, that rarely
    /// happens, so they are not counted here (their runs are reported). A
    /// mixed schedule may draw none of the faults that do.
    pub const fn breaks_the_lock(self) -> bool {
        matches!(
            self,
            Fault::HolderPause
                | Fault::KeyLoss
                | Fault::EarlyExpiry
                | Fault::ClockJump
                | Fault::EtcdRevoke
                | Fault::ZookeeperNodeDelete
                | Fault::PgRowDelete
        )
    }

    /// True when the fault can make two holders at once at all (see
    /// [`breaks_the_lock`](Self::breaks_the_lock) for the ones that always
    /// do).
    pub const fn can_break_the_lock(self) -> bool {
        self.breaks_the_lock()
            || matches!(
                self,
                Fault::RedisRestart
                    | Fault::Flushall
                    | Fault::Demotion
                    | Fault::Failover
                    | Fault::SentinelFailover
                    | Fault::SentinelKill
                    | Fault::Eviction
                    | Fault::Mixed
                    | Fault::NetLatency
                    | Fault::PostgresPause
                    | Fault::ClockFast
                    | Fault::ZookeeperMemberPause
                    | Fault::PgClockStep
                    | Fault::PgTableLock
            )
    }

    /// True when the fault needs control of the Redis process (pause, kill,
    /// restart, promote) or its users (an ACL user the lab made), so it
    /// cannot run against a user's own server. A mixed schedule does (it
    /// draws such faults too).
    pub const fn needs_redis_process(self) -> bool {
        matches!(
            self,
            Fault::RedisPause
                | Fault::AclReset
                | Fault::Eviction
                | Fault::Oom
                | Fault::Flushall
                | Fault::ClockJump
                | Fault::ClockFast
                | Fault::Demotion
                | Fault::Maxclients
                | Fault::RedisRestart
                | Fault::RedisRestartAof
                | Fault::Failover
                | Fault::SlotMigration
                | Fault::ClusterFailover
                | Fault::SentinelFailover
                | Fault::SentinelKill
                | Fault::Mixed
        )
    }

    /// True for the faults of Redis Sentinel, which run on a throwaway
    /// primary, replica and three sentinels; the callers connect with the
    /// `redis+sentinel://` URL.
    pub const fn needs_sentinel(self) -> bool {
        matches!(self, Fault::SentinelFailover | Fault::SentinelKill)
    }

    /// True for the faults of the server's clock, which run on a throwaway
    /// server whose clock libfaketime can drive
    /// ([`LabOptions::fake_clock`](crate::LabOptions::fake_clock)).
    pub const fn needs_fake_clock(self) -> bool {
        matches!(self, Fault::ClockJump | Fault::ClockFast)
    }

    /// True for the faults of etcd, which run on a throwaway etcd cluster
    /// of three members ([`LabOptions::etcd`](crate::LabOptions::etcd)).
    pub const fn needs_etcd(self) -> bool {
        matches!(
            self,
            Fault::EtcdLeaderKill
                | Fault::EtcdMemberPause
                | Fault::EtcdMinorityCut
                | Fault::EtcdMajorityCut
                | Fault::EtcdRestart
                | Fault::EtcdRevoke
                | Fault::EtcdNoSpace
        )
    }

    /// True for the etcd faults that need control of the etcd members (a
    /// process killed or paused, its network cut, the whole cluster
    /// restarted, its `NOSPACE` alarm raised), so they cannot run against
    /// a user's own cluster ([`LabOptions::etcd_endpoints`]). Only
    /// [`Fault::EtcdRevoke`] of the etcd faults does not: it needs the
    /// lock keys' leases and etcd's API alone.
    ///
    /// [`LabOptions::etcd_endpoints`]: crate::LabOptions::etcd_endpoints
    pub const fn needs_etcd_process(self) -> bool {
        self.needs_etcd() && !matches!(self, Fault::EtcdRevoke)
    }

    /// True for the faults of ZooKeeper, which run on a throwaway
    /// ensemble of three servers
    /// ([`LabOptions::zookeeper`](crate::LabOptions::zookeeper)).
    pub const fn needs_zookeeper(self) -> bool {
        matches!(
            self,
            Fault::ZookeeperLeaderKill
                | Fault::ZookeeperMemberPause
                | Fault::ZookeeperMinorityCut
                | Fault::ZookeeperMajorityCut
                | Fault::ZookeeperDiskFull
                | Fault::ZookeeperRestart
                | Fault::ZookeeperRebuild
                | Fault::ZookeeperNodeDelete
        )
    }

    /// True for the faults of PostgreSQL as the lock service, which run on
    /// a pg lab ([`LabOptions::pg`](crate::LabOptions::pg): the lease
    /// table in the lab's PostgreSQL, no Redis), for the pg modes only.
    pub const fn needs_pg(self) -> bool {
        matches!(
            self,
            Fault::PgBackendKill
                | Fault::PgRowDelete
                | Fault::PgTableLock
                | Fault::PgClockStep
                | Fault::PgCrash
                | Fault::PgStatementTimeout
                | Fault::PgLockTimeout
                | Fault::PgbouncerRestart
        )
    }

    /// True for the faults of PgBouncer, which run on a pg lab with
    /// PgBouncer in front of its PostgreSQL
    /// ([`LabOptions::pgbouncer`](crate::LabOptions::pgbouncer)).
    pub const fn needs_pgbouncer(self) -> bool {
        matches!(self, Fault::PgbouncerRestart)
    }

    /// True for the faults of a Redis Cluster, which run on a throwaway
    /// cluster of three masters with a replica each.
    pub const fn needs_cluster(self) -> bool {
        matches!(self, Fault::SlotMigration | Fault::ClusterFailover)
    }

    /// True when Redis keeps answering the callers through the fault (or
    /// answers again at once: a cut connection is opened anew), so that a
    /// held lease can be refreshed before it runs out. Not so for a
    /// paused, restarting or swallowed Redis, nor under latency of the
    /// order of a TTL: a lease cannot outlive such an outage (it would be
    /// a lease Redis did not confirm). Nor through a Sentinel failover:
    /// until the new primary is named and found, no node confirms a
    /// refresh (a killed primary takes seconds). The chaos check judges the
    /// watchdog's refresh errors only under these faults (see
    /// [`mod@crate::check`]); a mixed schedule is judged by the faults it
    /// drew.
    pub const fn keeps_redis_answering(self) -> bool {
        !matches!(
            self,
            Fault::RedisPause
                | Fault::RedisStall
                | Fault::ClientPauseWrite
                | Fault::Demotion
                | Fault::Maxclients
                | Fault::AclReset
                | Fault::RedisRestart
                | Fault::RedisRestartAof
                | Fault::NetLatency
                | Fault::NetBlackhole
                | Fault::SentinelFailover
                | Fault::SentinelKill
                | Fault::EtcdLeaderKill
                | Fault::EtcdMemberPause
                | Fault::EtcdMinorityCut
                | Fault::EtcdMajorityCut
                | Fault::EtcdRestart
                | Fault::ZookeeperLeaderKill
                | Fault::ZookeeperMemberPause
                | Fault::ZookeeperMinorityCut
                | Fault::ZookeeperMajorityCut
                | Fault::ZookeeperDiskFull
                | Fault::ZookeeperRestart
                | Fault::ZookeeperRebuild
                | Fault::PgTableLock
                | Fault::PgCrash
                | Fault::PgStatementTimeout
                | Fault::PgLockTimeout
                | Fault::PgbouncerRestart
                | Fault::Mixed
        )
    }

    /// True for a single action repeated through its window.
    pub const fn is_repeated(self) -> bool {
        matches!(
            self,
            Fault::KeyLoss
                | Fault::EarlyExpiry
                | Fault::ScriptFlush
                | Fault::ConnKill
                | Fault::PubsubKill
                | Fault::Eviction
                | Fault::ClockJump
                | Fault::EtcdRevoke
                | Fault::ZookeeperNodeDelete
                | Fault::PgBackendKill
                | Fault::PgRowDelete
        )
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How far [`Fault::ClockJump`] steps the server's clock forward: far
/// past any lease the matrix or the harness takes.
pub const CLOCK_JUMP: Duration = Duration::from_secs(10);

/// The `statement_timeout` of [`Fault::PgStatementTimeout`] and the
/// `lock_timeout` of [`Fault::PgLockTimeout`]: 1 ms.
pub const PG_TINY_TIMEOUT: Duration = Duration::from_millis(1);

/// How many times as fast as the holders' the server's clock runs under
/// [`Fault::ClockFast`].
pub const CLOCK_RATE: f64 = 3.0;

/// A fault name that is not one of [`Fault::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault {0:?} (known: {known})", known = known_faults())]
pub struct UnknownFault(pub String);

fn known_faults() -> String {
    Fault::ALL.map(Fault::name).join(", ")
}

impl FromStr for Fault {
    type Err = UnknownFault;

    fn from_str(s: &str) -> Result<Fault, UnknownFault> {
        Fault::ALL
            .into_iter()
            .find(|fault| fault.name() == s)
            .ok_or_else(|| UnknownFault(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_parses_from_its_name() {
        for fault in Fault::ALL {
            assert_eq!(fault.name().parse::<Fault>(), Ok(fault));
        }
        let err = "reboot"
            .parse::<Fault>()
            .expect_err("an unknown fault name");
        assert!(err.to_string().contains("key-loss"), "{err}");
    }
}
