//! Fencing tokens: the fenced acquire script and the Cluster-safe key pair.

use std::fmt;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::locker::{Attempt, Locker, check_key, check_ttl, ttl_millis};
use crate::options::AcquireOptions;
use crate::token::LeaseToken;
use crate::{RedisConnection, call};

/// A number that increases with every acquisition of one lock: the highest
/// accepted one wins, lower ones are stale.
///
/// Issued by [`Locker::acquire_fenced`] and read from
/// [`Lease::fence`]. Compare tokens with `<` / `>`; store the highest
/// accepted one next to the data it guards and refuse writes at or below it.
///
/// # Why fencing
///
/// A lease can end while its holder is still working: a garbage-collection
/// pause, a slow network or a stopped VM outlasts the TTL, someone else takes
/// the lock, and the first holder wakes up still believing it holds it.
/// Nothing the holder checks *before* writing can rule this out, because the
/// pause can fall between the check and the write. Only the storage, which
/// sees every write in order, can refuse it. [`Locker::acquire_fenced`]
/// therefore hands out, with every lease, a [`FencingToken`] one higher than
/// the previous one; the write carries it, and the storage refuses a token at
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
/// # Where the counter lives, and what that costs
///
/// The counter is a plain Redis key (`INCR`), so it is only as durable as
/// Redis: a failover to a replica that missed recent increments, or a restart
/// without `appendfsync always`, can lose increments and **reissue tokens**.
/// The strict `fence < $token` limits the damage: a reissued token can win
/// at most once, and every token at or below the stored fence is refused
/// until the counter passes it again. Those refusals are errors the caller
/// can retry, never a wrong balance, *provided* the write also checks the
/// version it read (`fence = $read`): that check is what keeps the balance
/// right when two holders reuse a token or overlap.
///
/// The fence key has no TTL, so an `allkeys-*` eviction policy could evict
/// it and restart the counter at 1: keep such policies off any Redis that
/// holds locks (`noeviction` or `volatile-*`).
///
/// # Keys and Redis Cluster
///
/// The acquire script touches two keys, and Redis Cluster requires every key
/// of a script to live in one hash slot. [`FencedKeys::for_resource`]
/// derives both names from the resource with a shared hash tag
/// (`lock:{wallet:42}`, `fence:{wallet:42}`); a pair given by hand with
/// [`FencedKeys::new`] is checked before any I/O and refused with
/// [`Error::KeysInDifferentSlots`] when the slots differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
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

impl<C: RedisConnection> Locker<C> {
    /// Takes the fenced lease on `keys` for `ttl`, waiting with the default
    /// [`AcquireOptions`]; the lease's [`fence`](Lease::fence) is set.
    ///
    /// See [`acquire_fenced_with`](Self::acquire_fenced_with) for errors and
    /// cancel safety.
    pub async fn acquire_fenced(&self, keys: &FencedKeys, ttl: Duration) -> Result<Lease<C>> {
        self.acquire_fenced_with(keys, ttl, &AcquireOptions::default())
            .await
    }

    /// Takes the lease on `keys.lock()` and, in the same atomic script and
    /// only if that worked, increments `keys.fence()`: the new value is the
    /// lease's [`FencingToken`]. Retried while the lock is busy, as `opts`
    /// says. Only a caller that got the lock gets a token. Every
    /// [`AcquireOptions`] field applies as in
    /// [`acquire_with`](Self::acquire_with), the watchdog included.
    ///
    /// # Errors
    /// - [`Error::InvalidTtl`] before any I/O;
    /// - [`Error::NotAcquired`] when the lock stayed busy;
    /// - [`Error::InvalidFence`] when the fence key holds anything but a
    ///   positive integer counter (the lock is not left taken);
    /// - [`Error::WrongType`] when the lock key holds a non-string value;
    /// - [`Error::Timeout`], [`Error::Unreachable`], [`Error::Auth`],
    ///   [`Error::NotReplicated`] and [`Error::InvalidOptions`] as for
    ///   [`acquire_with`](Self::acquire_with) (a lock given back for want of
    ///   replicas leaves its fencing token unused, which is harmless).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire_with`](Self::acquire_with): an abandoned
    /// in-flight attempt that may have landed is released in the background
    /// (the token it consumed is simply never used, which is harmless).
    pub async fn acquire_fenced_with(
        &self,
        keys: &FencedKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease<C>> {
        check_ttl(ttl)?;
        crate::replicas::check(opts)?;
        let token = LeaseToken::generate()?;
        let px = ttl_millis(ttl);
        let deadline = opts.deadline_from(Instant::now());
        let (fence, sent_at) = self
            .acquire_loop(keys.lock(), &token, opts, |deadline| {
                self.fenced_attempt(keys, &token, px, deadline)
            })
            .await?;
        let lease =
            Lease::new(self.clone(), keys.lock().to_owned(), token, ttl, sent_at).with_fence(fence);
        let mut lease = self.confirm_replicated(lease, opts, deadline).await?;
        if opts.watchdog {
            lease.watch()?;
        }
        Ok(lease)
    }

    /// One run of `scripts/acquire_fenced.lua`.
    async fn fenced_attempt(
        &self,
        keys: &FencedKeys,
        token: &LeaseToken,
        px: u64,
        deadline: Instant,
    ) -> Result<Attempt<FencingToken>> {
        let mut conn = self.inner.conn.clone();
        let mut invocation = crate::scripts::ACQUIRE_FENCED.key(keys.lock());
        invocation.key(keys.fence()).arg(token).arg(px);
        let reply = call::bounded(
            "acquire",
            keys.lock(),
            deadline,
            invocation.invoke_async::<Value>(&mut conn),
        )
        .await;
        match reply {
            Ok(Value::Int(fence)) => match u64::try_from(fence) {
                Ok(fence) if fence > 0 => Ok(Attempt::Won(FencingToken(fence))),
                _ => Err(Error::UnexpectedReply { op: "acquire" }),
            },
            Ok(Value::Nil) => Ok(Attempt::Busy),
            Ok(_) => Err(Error::UnexpectedReply { op: "acquire" }),
            Err(Error::Redis { source, .. }) if source.code() == Some("NOTFENCE") => {
                Err(Error::InvalidFence {
                    key: keys.fence().to_owned(),
                    source,
                })
            }
            Err(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
