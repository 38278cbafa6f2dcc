//! Leases on etcd: [`EtcdLocker`], the way to take a
//! lease for a team that outgrows what Redis promises (a failover that
//! grants one lock twice, fence counters lost with the data): the same
//! [`Lease`](leasehold::Lease), the same calls and the same guard, on a consensus store.
//! Verified by the fault matrix like the Redis ways (`leasehold chaos
//! --modes etcd`, and the side-by-side table in the repository's
//! `docs/history/chaos-results.md`): a lease on etcd, too, is lost by a
//! holder paused past its TTL, so the lock is an efficiency lock there as
//! well, and the fencing token checked by the database is what keeps the
//! data right.
//!
//! # The recipe, and why each step is safe
//!
//! Built on etcd's KV transactions and leases, not on its Lock RPC (which,
//! on the 3.4 releases, returns to a waiter whose session had expired:
//! Jepsen's etcd 3.4.3 analysis; fixed in 3.5.0):
//!
//! 1. **Join the queue.** Grant an etcd lease of the TTL (its ID chosen by
//!    the client, so a grant whose answer was lost is safe to send again),
//!    then create the waiter key `PREFIX/lock/<lock key>/<lease ID in
//!    hex>` under it, only if absent (`create_revision == 0`). The key's
//!    creation revision is its place in the queue: revisions only grow, so
//!    no later key can get ahead of ours. The same transaction reads the
//!    queue's two newest keys (after our put: ours, and the one just ahead
//!    of it), so an uncontended acquire knows it is first, and a contended
//!    one what to watch, without another request. A create whose outcome
//!    is unknown is sent again by the next step (created only if absent:
//!    the key it finds carries our lease, or it creates it).
//! 2. **Wait by watch, in FIFO order.** The owner is the key with the
//!    lowest creation revision under the lock's prefix. Behind another
//!    key, we watch the key just before ours for its delete (from the
//!    revision after the read that saw it: nothing is missed), and read
//!    again when it goes (a waiter ahead may have given up without being
//!    the owner). Each read asks for our key and the newest key created
//!    before it (`max_create_revision`, newest first, limit 1), so it
//!    answers with two keys at most however long the queue is. No
//!    polling; our etcd lease is kept alive every `ttl / 3` meanwhile. A
//!    fault that may pass (an election, a member gone: the watch resumes
//!    on another member from its next revision; a cluster out of space)
//!    is ridden out within the wait, and returned if the wait runs out
//!    during it. A waiter whose etcd lease ends (its keep-alives
//!    failed for a whole TTL, or an operator revoked it) has lost its
//!    place: it joins again, at the back, within the same wait.
//! 3. **Confirm by the key itself.** After a wait, a keep-alive of our
//!    etcd lease goes with the linearizable read of the queue: the lock
//!    is ours when both answer and the read finds our key (still there,
//!    at our revision, under our lease) with no key created before it,
//!    before the lease is handed over; it counts from the step's start,
//!    before the keep-alive was sent. First in line at once, the step's
//!    start counts too, before the grant (the key was created under it, so
//!    the etcd lease was alive then and lasts its TTL from the grant on).
//! 4. **Give up cleanly.** On the deadline, an error or cancellation (or
//!    the acquire's future dropped) our etcd lease is revoked, so our key
//!    goes with it and is not left to become owner after we gave up (if
//!    etcd cannot be reached, the etcd lease's TTL ends it). The revoke
//!    runs in the background, so giving up never makes the caller wait
//!    for it.
//!
//! Each of these is a step of the crate's one retry loop (the
//! [`LockService`](leasehold::LockService) seam every service implements): the acquire's place in
//! the queue is the step's entry, kept from one step to the next; a busy
//! step's wake-up is the watch of step 2, which also keeps our etcd lease
//! alive; the step after it is the read of step 3.
//!
//! A **refresh** is a keep-alive of the etcd lease *and* a read of the key,
//! sent together (one round trip's wait):
//! a keep-alive's success alone proves nothing (etcd before 3.4.38, the
//! 3.4.23 Debian ships among them, may report a lease renewed after it was
//! revoked, and an operator may have deleted the key). A **release** deletes
//! the key only if it is still ours (one transaction comparing its
//! creation revision and lease), writing in the same transaction a
//! *released* key (`PREFIX/released/<lease ID in hex>`) under our etcd
//! lease, then revokes the etcd lease (which takes the released key too;
//! awaited within the release's deadline, finished in the background past
//! it): [`Error::NotHeld`](leasehold::Error::NotHeld) when the key was not ours any more. A delete
//! whose answer is lost (its member paused, or lost its leader
//! mid-request) gets half the release's time; then the same transaction
//! is sent again on another member (it acts only while the key is ours,
//! so resending is safe): applied then, or found applied by the lost try
//! (its released key is there), the release is a success it knows.
//! Found not applied with no released key left, the lost try may still
//! have deleted the key before our etcd lease ended (an operator revoked
//! it, or it ran out): an unknown outcome
//! ([`ServiceFault::Unknown`](leasehold::backend::ServiceFault::Unknown),
//! the [`EtcdError`] inside), which the lease core reports as
//! [`Error::Timeout`](leasehold::Error::Timeout) while the lease is valid
//! and [`Error::LeaseLost`](leasehold::Error::LeaseLost) once it ran out
//! (as on Redis), never a success (or a `NotHeld`) the release cannot
//! know. The etcd
//! lease is revoked in every case, so the lock is free at once. A cluster
//! out of space (etcd's `NOSPACE` alarm) refuses the released key's put,
//! and so the whole transaction: the release then sends the guarded
//! delete alone (etcd goes on deleting and revoking while full), so a
//! full cluster still gets its locks back. An acquire rides it out within
//! its wait, as it rides out a full Redis (etcd grants no lease until an
//! operator frees space), and returns the refusal if the wait runs out
//! during it
//! ([`EtcdError::is_no_space`](crate::EtcdError::is_no_space)).
//! Every request of an acquire is bounded by its deadline (and the command
//! timeout), every refresh and release by the lease's bounds, as on Redis.
//!
//! The TTL is granted in whole seconds, rounded up (and etcd may raise a
//! small one to its minimum): the holder counts the TTL it asked for, so
//! its idea of the lease is never longer than etcd's, but a holder that
//! dies blocks the lock for up to the granted TTL. A refresh cannot
//! lengthen an etcd lease past the TTL it was granted with (it is refused,
//! [`Error::InvalidOptions`](leasehold::Error::InvalidOptions)).
//!
//! # One slow member
//!
//! The locker talks to one member at a time (the first endpoint, to begin
//! with). A member that stops answering (paused, overloaded, cut off from
//! its clients) while the cluster keeps its leader costs a held lease
//! nothing:
//!
//! - **A refresh moves within its own budget.** Its keep-alive and its
//!   read are both safe to send again on another member (a keep-alive only
//!   renews our etcd lease to its granted TTL again, a read changes
//!   nothing), so each is split into attempts of at most half the
//!   refresh's budget (`ttl / 3`, the watchdog's period and its bound on a
//!   refresh) and at most a third of the command timeout: the first
//!   attempt waits on the silent member, the next goes to another member
//!   and is answered before the next refresh is due. A 2 s lease with the
//!   default 1 s command timeout waits 333 ms at most on a paused member.
//!   A waiter's keep-alives (every `ttl / 3`) are split the same way, so a
//!   waiter keeps its etcd lease, and its place in the queue. A waiter's
//!   watch on a member its keep-alive found silent is opened again on
//!   another member (from the revision after the last one it saw, so it
//!   misses nothing) at once, not when the connection's own ping gives up
//!   (up to 10 s later).
//! - **The next requests start where the answer came from.** A member that
//!   timed out (or lost its connection, or could not be reached) is
//!   demoted until it answers again: the client passes over it whenever it
//!   moves on, and tries it again only when every other member has failed
//!   too. A member paused again later costs nothing while the client talks
//!   to another.
//! - **What counts stays the same.** A refresh is confirmed only when etcd
//!   answered both the keep-alive (with a TTL) and the read (our key,
//!   ours); the new validity counts from before its first attempt, so never
//!   from later than the keep-alive that landed. A keep-alive left on the
//!   paused member may still renew our etcd lease when the member wakes:
//!   that only lengthens the lease on etcd's side (a holder that died
//!   meanwhile blocks the lock for up to one more TTL), never the holder's
//!   idea of it.
//!
//! Writes do not move mid-request: a waiter's create, a release's delete
//! and the leader record wait on their member until their deadline (cut
//! short, a write's outcome would be unknown), then are settled on another
//! member by reading the key, as above. Measured with an `Election` (TTL
//! 2 s, 3 members, the first endpoint's member paused 10 s, twice per run):
//! see `docs/operations.md`.
//!
//! # Fencing tokens
//!
//! The fencing token of a lease taken with [`FencedKeys`](leasehold::FencedKeys)
//! is its key's creation revision: strictly increasing across the whole
//! cluster, so across the holders of one lock (it is what etcd's docs call
//! the token). It is **not comparable with a Redis fence counter** for the
//! same resource (those are about 1.8 x 10^15, revisions are small), and it
//! cannot be raised ([`Lease::raise_fence`](leasehold::Lease::raise_fence)
//! fails). So an etcd lease names its resource in a fence table
//! differently: its [`fence_key_for`](leasehold::Lease::fence_key_for) is the
//! fence key with `etcd:` in front (`etcd:fence:{wallet:42}`), a row of its
//! own in the `leasehold-pg` fences table, never compared with the Redis
//! row. **Moving a resource from Redis to etcd**: stop every Redis holder
//! of it (and wait out their TTL) before the first etcd holder writes; the
//! two rows never guard each other, so the guard cannot be confused by the
//! switch, but it cannot order a Redis holder against an etcd one either.
//!
//! # etcd 3.4 and 3.5
//!
//! The recipe uses only calls that 3.4 and 3.5 answer alike (KV range, put,
//! delete and transactions; lease grant, keep-alive and revoke; watch), and
//! its tests run on both: on Debian bookworm's 3.4.23 and on a 3.5 release
//! (`scripts/test.sh` fetches Debian trixie's, 3.5.16). What 3.5 changed
//! does not change what this lock promises, because the recipe never
//! trusts what those fixes repair:
//!
//! - 3.5.0 fixed the Lock RPC handing the lock to a waiter whose session
//!   had expired; the recipe does not use the Lock RPC, and a waiter
//!   checks its own key before it is given the lease (step 3).
//! - Later releases of both lines fixed leases revoked by a deposed leader
//!   (3.4.31) and a keep-alive reported successful after its lease was
//!   revoked (3.4.38); 3.4.23 has neither fix. A refresh
//!   reads the key as well as renewing the lease, so on 3.4.23 either fault
//!   is a lost lease, found by the next refresh (within `ttl / 3`) and
//!   reported to the watchdog, as an expiry is. Until that refresh, the
//!   holder may still believe it holds the lock: as on Redis, the lock is
//!   an efficiency lock, and the fencing token checked by the database
//!   ([`leasehold_pg`'s guard](https://docs.rs/leasehold-pg)) is what keeps
//!   the data right.
//! - The test kit passes `--unsafe-no-fsync` to 3.5 members (3.4 has no
//!   such switch), which makes the tests faster, not different.
//!
//! # TLS and authentication
//!
//! `https://` endpoints (with the `tls` feature) are verified as Redis's
//! `rediss://` URLs are, with the same [`TlsFiles`](leasehold::tls::TlsFiles)
//! ([`EtcdLockerBuilder::tls`]); a refused certificate, our certificate
//! refused and a plain port are named at [`connect`](EtcdLockerBuilder::connect)
//! ([`EtcdError::tls_failure`](crate::EtcdError::tls_failure)).
//! etcd's users and passwords: [`EtcdLockerBuilder::credentials`]; the
//! password never appears in a log or an error.
//!
//! # Options that differ from Redis
//!
//! A waiter is woken by watch, not by polling: each wake-up counts as one
//! of the retry strategy's waits (so
//! [`RetryStrategy::none`](leasehold::RetryStrategy::none) is one look, no
//! wait, and a strategy's number of attempts bounds the steps), and the
//! strategy's waits pace the steps after a fault.
//! [`AcquireOptions::wait_replicas`](leasehold::AcquireOptions::wait_replicas)
//! is refused (etcd commits on a majority before it answers).
//!
//! # Moving from `leasehold`'s `etcd` feature
//!
//! `EtcdLocker` lived in `leasehold` behind the feature `etcd`; it is this
//! crate now: depend on `leasehold-etcd` (its `tls` feature for
//! `https://` endpoints) and import `leasehold_etcd::EtcdLocker`. Its
//! errors are [`leasehold::Error::Service`] naming etcd, with the
//! [`EtcdError`] inside ([`etcd_error`] finds it), where they were
//! `Error::Etcd`. The lease, the calls ([`leasehold::Lessor`]) and the
//! guard are the same.
//!
//! # The gRPC client
//!
//! etcd's v3 API over gRPC is this crate's own small client (module
//! `client`), not part of its API: the feature `client` makes it public
//! for leasehold's own chaos lab and CLI, with no promise of stability.

mod backend;
#[cfg(feature = "client")]
pub mod client;
#[cfg(not(feature = "client"))]
mod client;
mod error;
mod locker;
mod take;

pub use client::{Credentials, EtcdError};
pub use error::etcd_error;
pub use locker::{DEFAULT_ETCD_PREFIX, EtcdLocker, EtcdLockerBuilder};

/// The README's example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
