//! Throwaway `redis-server` and PostgreSQL processes for tests and demos.
//!
//! Each server runs as a child process on a free loopback port, keeps its
//! files in a temporary directory, and is killed (and the directory removed)
//! when the handle is dropped. Faults can be injected while it runs:
//! [`RedisServer::pause`] / [`PostgresServer::pause`] freeze the process with
//! `SIGSTOP`, [`RedisServer::kill`] and [`RedisServer::restart`] simulate a
//! crash and a recovery (with the data if [`RedisOptions::appendonly`] kept
//! it; [`RedisServer::restart_empty`] loses it), and [`RedisServer::promote`]
//! a failover; [`RedisOptions::fake_clock`] starts a server whose wall
//! clock [`RedisServer::jump_clock`] steps forward and
//! [`RedisServer::set_clock_rate`] runs fast (libfaketime);
//! [`RedisSentinel`] is a primary, a replica and three
//! sentinels, with `SENTINEL FAILOVER` and a killed primary. [`FaultProxy`] puts latency, partitions and cut connections
//! between clients and a server, and [`pause_process`] freezes any process,
//! such as a worker holding a lease. [`connection`] opens an async
//! connection for a test's own commands.
//!
//! ```no_run
//! use leasehold_testkit::RedisServer;
//!
//! let server = RedisServer::start()?;
//! assert_eq!(server.redis_cli(&["PING"])?, "PONG");
//! server.pause()?; // requests now hang
//! server.resume()?;
//! # Ok::<(), leasehold_testkit::Error>(())
//! ```
//!
//! The binaries are looked up on `PATH` (the Redis server may be another
//! one: [`SERVER_ENV`], `LEASEHOLD_REDIS_SERVER`, names a Redis-compatible
//! server binary such as Valkey's `valkey-server`); PostgreSQL's also in
//! `/usr/lib/postgresql/<version>/bin` (newest first), where Debian installs
//! them. PostgreSQL refuses to run as root, so when this process is root it
//! runs `initdb` and `postgres` as the `postgres` system user.
//!
//! [`EtcdCluster`] starts a real etcd cluster (three members, or one) on
//! free loopback ports with small raft timers (a 50 ms heartbeat, a 500 ms
//! election timeout, so a lost leader is replaced within about a second),
//! and waits until it has a leader. Any member, or the
//! [leader](EtcdCluster::leader), can be stopped and restarted on its data
//! ([`EtcdMember::stop`], [`EtcdMember::start`]), paused, or
//! [cut off](EtcdMember::cut_off) from its peers in both directions (and
//! from its clients) and healed: each member's peer and client ports sit
//! behind small gates that know which member dialled. `etcd` comes from
//! `PATH` (Debian's `etcd-server`, 3.4.23) unless [`ETCD_ENV`],
//! `LEASEHOLD_ETCD`, names another binary.
//!
//! [`ZooKeeperEnsemble`] starts a real ZooKeeper ensemble (three servers,
//! or one) as JVMs on Debian's jars (`zookeeper` 3.8.0), on free loopback
//! ports with a small tick ([`ZOOKEEPER_TICK_TIME`], 200 ms, so sessions
//! of 0.4 to 4 s; [`ZooKeeperEnsemble::start_with`] chooses another), and
//! waits until it has a leader. Members can be stopped, restarted on
//! their data, paused, or cut off from their peers and from clients that
//! come through the kit's proxies (each JVM resolves its peers' names in
//! a hosts file of its own, to a proxy per pair of members).
//!
//! When a test panics while a server handle is alive, the server's log is
//! printed to stderr as the handle is dropped.

mod acl;
mod certs;
mod clock;
mod cluster;
mod connection;
mod error;
mod etcd;
mod faults;
mod pgbouncer;
mod postgres;
mod process;
mod proxy;
mod redis;
mod resp;
mod sentinel;
mod zookeeper;

pub use acl::LOCK_USER_ACL;
pub use certs::{ClientAuth, ServerTls, TestCerts};
pub use cluster::{CLUSTER_SLOTS, Failover, RedisCluster};
pub use connection::connection;
pub use error::Error;
pub use etcd::{
    ETCD_ELECTION_TIMEOUT, ETCD_ENV, ETCD_HEARTBEAT_INTERVAL, EtcdCluster, EtcdMember,
    EtcdMemberStatus,
};
pub use faults::{
    descendants, is_process_paused, pause_process, resume_process, stop_this_process,
};
pub use pgbouncer::PgBouncer;
pub use postgres::PostgresServer;
pub use postgres::standby::Replication;
pub use process::free_port;
pub use proxy::{Direction, FaultProxy, Faults};
pub use redis::{AclRefusal, RedisOptions, RedisServer, SERVER_ENV};
pub use resp::Reply;
pub use sentinel::{RedisSentinel, SENTINEL_DOWN_AFTER, SENTINEL_FAILOVER_TIMEOUT};
pub use zookeeper::{
    ZOOKEEPER_CLASSPATH_ENV, ZOOKEEPER_SYNC_LIMIT, ZOOKEEPER_TICK_TIME, ZooKeeperEnsemble,
    ZooKeeperMember, ZooKeeperMode,
};
