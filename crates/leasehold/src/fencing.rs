//! Fencing tokens, the Cluster-safe key pair, and what an acquire locks.

use std::fmt;

use crate::error::{Error, Result};

/// A number that increases with every acquisition of one lock: the highest
/// accepted one wins, lower ones are stale.
///
/// Issued by every acquire given [`FencedKeys`] and read from
/// [`Lease::fence`](crate::Lease::fence). Compare tokens with `<` / `>`; store the highest
/// accepted one next to the data it guards and refuse writes at or below it.
///
/// # Why fencing
///
/// A lease can end while its holder is still working: a garbage-collection
/// pause, a slow network or a stopped VM outlasts the TTL, someone else takes
/// the lock, and the first holder wakes up still believing it holds it.
/// Nothing the holder checks *before* writing can rule this out, because the
/// pause can fall between the check and the write. Only the storage, which
/// sees every write in order, can refuse it. A fenced acquire therefore
/// hands out, with every lease, a [`FencingToken`] higher than the
/// previous one; the write carries it, and the storage refuses a token at
/// or below the highest it has accepted (`... WHERE fence < $token`, see the
/// `leasehold-pg` crate).
///
/// # What fencing does not do
///
/// Fencing orders *writes*; it says nothing about what the writer *read*.
/// Two overlapping holders with tokens 33 and 34 can both read balance 100:
/// 33 writes 90 (legal), then 34 writes 90 (also legal, its token is
/// higher), and one debit is lost. The fix is check-and-set: the write also
/// requires the fence it read to be unchanged (`... AND fence = $read`).
/// Because every accepted write raises the fence, a version never repeats.
///
/// # Where the counter lives, and why a lost one does not repeat tokens
///
/// The counter is a plain Redis key, so it is only as durable as Redis: a
/// restart without persistence, `FLUSHALL`, an evicted or expired key or a
/// failover to a replica that missed the last increments loses it or sets
/// it back. So a token is not `counter + 1` alone: it is
///
/// ```text
/// token = max(counter + 1, the Redis server's clock in microseconds)
/// ```
///
/// issued and stored back in one script (on a quorum, each node votes
/// `max(counter, clock)` and the token is one more than the highest vote).
/// A counter that survives only grows. A counter that is lost or behind
/// restarts at the server's clock, which is above every token issued
/// before, **as long as** the server that issues next does not read its
/// clock earlier than the one that issued the lost tokens read its own
/// (its clock is not behind by more than the time between the two, a
/// failover's seconds in practice), and one resource gets fewer than one
/// token per microsecond on average. Tokens are therefore large numbers
/// (about 1.8 x 10^15 in 2026) and grow by at least one per lease; they
/// stay below [`FencingToken::MAX`] (2^53 - 1: exact in a Lua number and in
/// PostgreSQL's `bigint`) until the year 2255.
///
/// What still rests on that clock assumption is covered where the write
/// happens: a token that went backwards is refused by the strict
/// `fence < $token`, and the `leasehold-pg` fence guard accepts a token
/// equal to the stored one only from the holder that wrote it (see
/// [`HolderId`](crate::HolderId)), so even a repeated token never lets two
/// holders write.
///
/// **Healing.** When the storage refuses a write because it has seen a
/// fence at least as high as ours, [`Lease::raise_fence`](crate::Lease::raise_fence)
/// raises the counter to it, so the next lease's token (above the counter
/// and the clock) wins: a counter set back past the clock's floor costs at
/// most one refused write per resource. The `leasehold-pg` fence guard
/// does it for you. A counter lives
/// [`DEFAULT_FENCE_TTL`](crate::DEFAULT_FENCE_TTL) (30 days,
/// [configurable](crate::LockerBuilder::fence_ttl)) after the last lease
/// that took or refreshed it, so idle resources do not keep a key each
/// forever; its expiry costs nothing, the clock takes over. An
/// `allkeys-*` eviction policy can still evict a *lock* key under a
/// holder: keep such policies off any Redis that holds locks.
///
/// # Keys and Redis Cluster
///
/// The acquire script touches two keys, and Redis Cluster requires every key
/// of a script to live in one hash slot. [`FencedKeys::for_resource`]
/// derives both names from the resource with a shared hash tag
/// (`lock:{wallet:42}`, `fence:{wallet:42}`); a pair given by hand with
/// [`FencedKeys::new`] is checked before any I/O and refused with
/// [`Error::KeysInDifferentSlots`] when the slots differ.
///
/// # In SQL
///
/// A token fits PostgreSQL's `bigint`: `i64::try_from(token)` and
/// `FencingToken::try_from(value)` check the range both ways
/// ([`TokenRange`]). With the feature `postgres` (on in `leasehold-pg`) a
/// token binds and reads as a `bigint` in tokio-postgres
/// (`ToSql` / `FromSql`, range checked, `bigint` only), so a fenced write
/// needs no cast: `tx.execute("... WHERE fence < $1", &[&token])`. With
/// the feature `sqlx` (on in `leasehold-pg`'s `sqlx`) the same in sqlx 0.8
/// (`Type`, `Encode`, `Decode` for `Postgres`, `INT8` only, range checked):
/// `sqlx::query("... WHERE fence < $1").bind(token)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// The highest token Redis issues: 2^53 - 1, exact in a Lua number (a
    /// double) and within PostgreSQL's `bigint`. An acquire refuses to
    /// issue a token beyond it ([`Error::InvalidFence`]).
    pub const MAX: FencingToken = FencingToken((1 << 53) - 1);

    /// A token with the given value, for tests and for tokens read back from
    /// storage.
    pub const fn new(value: u64) -> FencingToken {
        FencingToken(value)
    }

    /// The token's value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// A fencing token that does not fit the other integer type (0 is not a
/// token; PostgreSQL's `bigint` stops at `i64::MAX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fencing token out of range: {0}")]
pub struct TokenRange(pub i128);

impl TryFrom<FencingToken> for i64 {
    type Error = TokenRange;

    /// The token as PostgreSQL's `bigint`.
    fn try_from(token: FencingToken) -> std::result::Result<i64, TokenRange> {
        i64::try_from(token.0).map_err(|_| TokenRange(i128::from(token.0)))
    }
}

impl TryFrom<i64> for FencingToken {
    type Error = TokenRange;

    /// A token read back from a `bigint` column: positive, or refused.
    fn try_from(value: i64) -> std::result::Result<FencingToken, TokenRange> {
        match u64::try_from(value) {
            Ok(v) if v > 0 => Ok(FencingToken(v)),
            _ => Err(TokenRange(i128::from(value))),
        }
    }
}

impl From<u64> for FencingToken {
    fn from(value: u64) -> Self {
        FencingToken(value)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The two keys a fenced lock uses: the lock key and the fence counter,
/// guaranteed to live in the same Redis Cluster hash slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FencedKeys {
    lock: String,
    fence: String,
}

impl FencedKeys {
    /// `lock:{resource}` and `fence:{resource}`: the braces make `resource`
    /// the hash tag of both, so they share a slot. No I/O.
    ///
    /// ```
    /// let keys = leasehold::FencedKeys::for_resource("wallet:42")?;
    /// assert_eq!(keys.lock(), "lock:{wallet:42}");
    /// assert_eq!(keys.fence(), "fence:{wallet:42}");
    /// # Ok::<(), leasehold::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when `resource` is empty;
    /// [`Error::KeysInDifferentSlots`] when `resource` starts with `}`
    /// (the hash tag would be empty, so Redis would hash the whole keys).
    pub fn for_resource(resource: &str) -> Result<FencedKeys> {
        if resource.is_empty() {
            return Err(Error::InvalidKey {
                key: String::new(),
                reason: "resource name is empty",
            });
        }
        FencedKeys::new(
            format!("lock:{{{resource}}}"),
            format!("fence:{{{resource}}}"),
        )
    }

    /// A lock key and a fence key chosen by the caller. No I/O.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when a key is empty or both are the same key;
    /// [`Error::KeysInDifferentSlots`] when they hash to different Redis
    /// Cluster slots (give both the same hash tag, `{...}`).
    pub fn new(lock: impl Into<String>, fence: impl Into<String>) -> Result<FencedKeys> {
        let (lock, fence) = (lock.into(), fence.into());
        check_key(&lock)?;
        if fence.is_empty() {
            return Err(Error::InvalidKey {
                key: fence,
                reason: "fence key is empty",
            });
        }
        if lock == fence {
            return Err(Error::InvalidKey {
                key: fence,
                reason: "the fence key must differ from the lock key",
            });
        }
        let (lock_slot, fence_slot) = (hash_slot(&lock), hash_slot(&fence));
        if lock_slot != fence_slot {
            return Err(Error::KeysInDifferentSlots {
                lock,
                fence,
                lock_slot,
                fence_slot,
            });
        }
        Ok(FencedKeys { lock, fence })
    }

    /// The lock key.
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// The fence counter's key.
    pub fn fence(&self) -> &str {
        &self.fence
    }
}

/// The Redis Cluster hash slot of `key`: CRC16/XMODEM of its hash tag (the
/// text between the first `{` and the next `}`, if not empty) or of the
/// whole key, modulo 16384.
pub(crate) fn hash_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(bytes);
    crc16_xmodem(tagged) % 16384
}

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), as Redis Cluster uses.
fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// What to lock: a plain lock key (`&str`, `String`) or a lock key with its
/// fence counter ([`FencedKeys`]). Passing [`FencedKeys`] to any acquire
/// call is how you ask for a [`FencingToken`]; the lease's
/// [`fence`](crate::Lease::fence) then holds it.
///
/// Sealed: implemented for `str`, `String`, [`FencedKeys`] and references
/// to them.
pub trait LockKeys: sealed::Sealed + Send + Sync {
    /// The lock key.
    fn lock_key(&self) -> &str;
    /// The fence counter's key, for a fenced lock.
    fn fence_key(&self) -> Option<&str>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for str {}
    impl Sealed for String {}
    impl Sealed for super::FencedKeys {}
    impl<T: Sealed + ?Sized> Sealed for &T {}
}

impl LockKeys for str {
    fn lock_key(&self) -> &str {
        self
    }
    fn fence_key(&self) -> Option<&str> {
        None
    }
}

impl LockKeys for String {
    fn lock_key(&self) -> &str {
        self
    }
    fn fence_key(&self) -> Option<&str> {
        None
    }
}

impl LockKeys for FencedKeys {
    fn lock_key(&self) -> &str {
        &self.lock
    }
    fn fence_key(&self) -> Option<&str> {
        Some(&self.fence)
    }
}

impl<T: LockKeys + ?Sized> LockKeys for &T {
    fn lock_key(&self) -> &str {
        (**self).lock_key()
    }
    fn fence_key(&self) -> Option<&str> {
        (**self).fence_key()
    }
}

/// One lock to take: its key and, if fenced, its counter. Checked (no
/// I/O): a non-empty lock key, and a fence pair that shares a slot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Target {
    pub(crate) lock: String,
    pub(crate) fence: Option<String>,
}

impl Target {
    pub(crate) fn of(keys: &(impl LockKeys + ?Sized)) -> Result<Target> {
        let lock = keys.lock_key();
        check_key(lock)?;
        Ok(Target {
            lock: lock.to_owned(),
            fence: keys.fence_key().map(str::to_owned),
        })
    }

    /// The pair as [`FencedKeys`], for a fenced target.
    #[cfg(feature = "quorum")]
    pub(crate) fn fenced(&self) -> Option<FencedKeys> {
        self.fence.as_ref().map(|fence| FencedKeys {
            lock: self.lock.clone(),
            fence: fence.clone(),
        })
    }
}

/// Rejects keys that cannot name a lock. No I/O.
pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::InvalidKey {
            key: key.to_owned(),
            reason: "key is empty",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_convert_to_and_from_bigint_within_range() {
        assert_eq!(i64::try_from(FencingToken::new(42)), Ok(42));
        assert!(i64::try_from(FencingToken::new(u64::MAX)).is_err());
        assert_eq!(FencingToken::try_from(7_i64), Ok(FencingToken::new(7)));
        assert!(FencingToken::try_from(0_i64).is_err());
        assert!(FencingToken::try_from(-3_i64).is_err());
    }

    #[test]
    fn crc16_matches_the_cluster_spec() {
        // The check value of CRC16/XMODEM, and the examples of the Redis
        // Cluster specification.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31c3);
        assert_eq!(hash_slot("foo"), 12182);
        assert_eq!(hash_slot("{user1000}.following"), hash_slot("user1000"));
        assert_eq!(hash_slot("foo{}{bar}"), crc16_xmodem(b"foo{}{bar}") % 16384);
        assert_eq!(hash_slot("foo{{bar}}zap"), hash_slot("{bar"));
        assert_eq!(hash_slot("foo{bar}{zap}"), hash_slot("bar"));
    }

    #[test]
    #[cfg(feature = "cluster")]
    fn slots_agree_with_redis_rs() {
        use redis::cluster_routing::Slot;
        for key in [
            "lock:{wallet:42}",
            "fence:wallet:42",
            "a{b}c",
            "{}",
            "x{",
            "",
            "héllo{wörld}",
        ] {
            assert_eq!(Slot::new(hash_slot(key)), Some(Slot::for_key(key)), "{key}");
        }
    }

    #[test]
    fn derived_keys_share_a_tag() -> Result<()> {
        let keys = FencedKeys::for_resource("wallet:42")?;
        assert_eq!(keys.lock(), "lock:{wallet:42}");
        assert_eq!(keys.fence(), "fence:{wallet:42}");
        for odd in ["a}b", "{x}", "{", "x}"] {
            let keys = FencedKeys::for_resource(odd)?;
            assert_eq!(hash_slot(keys.lock()), hash_slot(keys.fence()), "{odd}");
        }
        assert!(matches!(
            FencedKeys::for_resource(""),
            Err(Error::InvalidKey { .. })
        ));
        assert!(matches!(
            FencedKeys::for_resource("}x"),
            Err(Error::KeysInDifferentSlots { .. })
        ));
        Ok(())
    }

    #[test]
    fn mismatched_slots_are_refused() {
        let err = FencedKeys::new("lock:wallet:42", "fence:wallet:42").err();
        let Some(Error::KeysInDifferentSlots {
            lock_slot,
            fence_slot,
            ..
        }) = err
        else {
            panic!("expected KeysInDifferentSlots, got {err:?}");
        };
        assert_ne!(lock_slot, fence_slot);
        assert!(FencedKeys::new("lock:{w}", "fence:{w}").is_ok());
        assert!(matches!(
            FencedKeys::new("same", "same"),
            Err(Error::InvalidKey { .. })
        ));
    }

    #[test]
    fn tokens_order_and_print_as_numbers() {
        let (a, b) = (FencingToken::new(33), FencingToken::from(34));
        assert!(a < b);
        assert_eq!(a.to_string(), "33");
        assert_eq!(u64::from(b), 34);
        assert_eq!(b.get(), 34);
    }
}
