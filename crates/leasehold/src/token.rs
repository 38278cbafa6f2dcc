//! Lease tokens: 128 random bits that name one holder of one lease (see
//! [`LeaseToken`] for where the bits come from).

use std::cell::RefCell;
use std::fmt;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Tokens drawn from one seed before the generator is seeded again.
const RESEED_AFTER: u32 = 4096;

/// One thread's token generator, the process it was seeded in, and when.
struct Source {
    pid: u32,
    rng: StdRng,
    left: u32,
    seeded: Instant,
}

thread_local! {
    static SOURCE: RefCell<Option<Source>> = const { RefCell::new(None) };
}

/// 128 bits for a token: from this thread's generator, seeded (again) from
/// the OS when it is new, used up, or was seeded in another process; from
/// the OS directly when the thread-local is not available (a thread being
/// torn down).
fn draw() -> Result<[u8; 16], getrandom::Error> {
    let pid = std::process::id();
    let drawn = SOURCE.try_with(|cell| {
        let Ok(mut slot) = cell.try_borrow_mut() else {
            return None;
        };
        Some(draw_from(&mut slot, pid))
    });
    match drawn {
        Ok(Some(raw)) => raw,
        _ => {
            let mut raw = [0u8; 16];
            getrandom::fill(&mut raw)?;
            Ok(raw)
        }
    }
}

fn draw_from(slot: &mut Option<Source>, pid: u32) -> Result<[u8; 16], getrandom::Error> {
    let source = match slot {
        Some(source) if source.pid == pid && source.left > 0 => source,
        _ => {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed)?;
            slot.insert(Source {
                pid,
                rng: StdRng::from_seed(seed),
                left: RESEED_AFTER,
                seeded: Instant::now(),
            })
        }
    };
    source.left -= 1;
    let mut raw = [0u8; 16];
    source.rng.fill_bytes(&mut raw);
    // Two copies of one state that share a pid (see `LeaseToken`) draw the
    // same bytes, but never at the same moment of the system-wide
    // monotonic clock: mixing in the time since seeding tells them apart.
    // XOR with a known value keeps the bytes uniformly random.
    let at = source.seeded.elapsed().as_nanos().to_le_bytes();
    for (byte, time) in raw.iter_mut().zip(at) {
        *byte ^= time;
    }
    Ok(raw)
}

/// The random value a holder stores in the lock key, proving ownership.
///
/// 128 bits from a CSPRNG seeded by the operating system, rendered as 32
/// lowercase hex characters. Release and refresh compare it with what the key
/// holds, so a caller whose lease expired can never delete or extend a lease
/// that has since passed to someone else. A token is a capability over one
/// lease: anyone who knows it can release that lease.
///
/// # Where the bits come from
///
/// A token must be unpredictable (whoever knows it can release the lease)
/// and never drawn twice (two holders with one token could each release or
/// refresh the other's lease). Each thread draws tokens from its own
/// ChaCha12 generator (`rand`'s `StdRng`, a CSPRNG), seeded with 256 bits
/// from the operating system (`getrandom`) on the thread's first token,
/// then again after every 4096 tokens (64 KiB of output) and **whenever the
/// process id has changed since the last draw**.
///
/// That last rule is what keeps tokens unique across `fork`: a child
/// process starts with a copy of its parent's memory, generator state
/// included, and without a reseed it would draw the very tokens its parent
/// draws next. The child's pid differs from its parent's (the parent is
/// alive when it forks), so the child's first draw sees a new pid and
/// reseeds from the OS before it draws anything. Reading the pid is one
/// cheap system call per token; it replaces the `getrandom` call per token
/// that the OS source alone costs (which is also one system call, and the
/// kernel's ChaCha20 besides).
///
/// The pid cannot tell apart one case: a grandchild forked by a child that
/// never drew a token, after the original process has exited and its pid
/// has been reused for that grandchild. Its copy of the generator would
/// draw the original's bytes. So each token is also XORed with the
/// nanoseconds between the generator's seeding and the draw, on the
/// system-wide monotonic clock (a vDSO read, no system call): the original
/// drew its tokens before it exited, the grandchild draws after, so a
/// given position of the stream is never drawn at the same moment twice,
/// and the two never repeat a token (a collision of different positions
/// is the ordinary 2^-128 chance). XOR with a known value leaves the bits
/// as unpredictable as they were.
///
/// A snapshot of a whole virtual machine or process (CRIU) restored twice
/// would repeat tokens from any user-space generator, and reseeding every
/// 4096 tokens bounds how long; the OS source is the only defence against
/// that, and the kernel reseeds its own after a VM restore.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseToken([u8; 32]);

impl LeaseToken {
    /// Draws a fresh token (see the type's docs for the source).
    ///
    /// # Errors
    /// Fails only if the OS random source is unavailable when the
    /// generator needs a seed, which on Linux means the kernel refused
    /// `getrandom(2)`.
    pub(crate) fn generate() -> Result<LeaseToken, getrandom::Error> {
        draw().map(LeaseToken::from_bytes)
    }

    fn from_bytes(raw: [u8; 16]) -> LeaseToken {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, b) in raw.iter().enumerate() {
            out[2 * i] = HEX[usize::from(b >> 4)];
            out[2 * i + 1] = HEX[usize::from(b & 0x0f)];
        }
        LeaseToken(out)
    }

    /// A token as Redis or a hand-off message carries it: exactly 32
    /// lowercase hex characters, else `None`.
    #[cfg(feature = "handoff")]
    pub(crate) fn parse(text: &str) -> Option<LeaseToken> {
        let bytes: [u8; 32] = text.as_bytes().try_into().ok()?;
        bytes
            .iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            .then_some(LeaseToken(bytes))
    }

    /// The token as stored in Redis.
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written into the array.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl LeaseToken {
    /// This holder's public name (see [`HolderId`]).
    pub fn holder(&self) -> HolderId {
        HolderId::of(self)
    }
}

/// A public name for one holder of one lock, derived from its secret
/// [`LeaseToken`]: the first 128 bits of the token's SHA-256, as 32
/// lowercase hex characters.
///
/// Safe to log and to store: it cannot release, refresh or pass the
/// lease (only the token can, and the hash cannot be turned back into
/// it). Yet it is a function of the token alone, so whoever sees the token
/// (the lock key in Redis, the holder's own process) can tell which
/// holder a stored `HolderId` names. The `leasehold-pg` fence guard stores
/// it beside the fence it accepted, and accepts the same fence again only
/// from the same holder: a token that Redis issued twice never lets two
/// holders write.
///
/// ```
/// # async fn f(lease: &leasehold::Lease) {
/// let holder = lease.holder();
/// assert_eq!(holder, lease.token().holder());
/// assert_eq!(holder.as_str().len(), 32);
/// # }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderId([u8; 32]);

impl HolderId {
    fn of(token: &LeaseToken) -> HolderId {
        use sha2::Digest;
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let digest = sha2::Sha256::digest(token.0);
        let mut out = [0u8; 32];
        for (i, b) in digest.iter().take(16).enumerate() {
            out[2 * i] = HEX[usize::from(b >> 4)];
            out[2 * i + 1] = HEX[usize::from(b & 0x0f)];
        }
        HolderId(out)
    }

    /// An identifier as [`as_str`](Self::as_str) gives it (read back from
    /// storage, or made up for a test): exactly 32 lowercase hex
    /// characters, else `None`. An identifier is a name, not a capability:
    /// it proves nothing to Redis.
    pub fn parse(text: &str) -> Option<HolderId> {
        let bytes: [u8; 32] = text.as_bytes().try_into().ok()?;
        bytes
            .iter()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            .then_some(HolderId(bytes))
    }

    /// The identifier as stored: 32 lowercase hex characters.
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written into the array.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderId({})", self.as_str())
    }
}

/// The first 8 hex digits and `..`: enough to correlate log lines, not
/// enough to release or refresh someone's lease. The whole token is
/// [`as_str`](LeaseToken::as_str), for code that must send it, never for
/// a log line.
impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..", &self.as_str()[..8])
    }
}

/// As [`Display`](fmt::Display): never the whole token.
impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({self})")
    }
}

impl redis::ToRedisArgs for LeaseToken {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        out.write_arg(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_never_printed_whole() -> Result<(), getrandom::Error> {
        let token = LeaseToken::generate()?;
        let whole = token.as_str();
        for shown in [
            format!("{token}"),
            format!("{token:?}"),
            format!("{token:#?}"),
        ] {
            assert!(!shown.contains(whole), "{shown}");
            assert!(shown.contains(&whole[..8]), "{shown}");
        }
        Ok(())
    }

    #[test]
    fn tokens_are_32_hex_chars_and_distinct() {
        let a = LeaseToken::generate().expect("os rng");
        let b = LeaseToken::generate().expect("os rng");
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[cfg(feature = "handoff")]
    #[test]
    fn parse_takes_back_exactly_what_as_str_gives() -> Result<(), getrandom::Error> {
        let token = LeaseToken::generate()?;
        assert_eq!(LeaseToken::parse(token.as_str()), Some(token.clone()));
        assert_eq!(LeaseToken::parse(&token.as_str()[1..]), None);
        assert!(LeaseToken::parse("0123456789abcdef0123456789abcdef").is_some());
        assert_eq!(LeaseToken::parse("0123456789ABCDEF0123456789abcdef"), None);
        assert_eq!(LeaseToken::parse(&format!("{}0", token.as_str())), None);
        assert_eq!(LeaseToken::parse("g0000000000000000000000000000000"), None);
        Ok(())
    }

    #[test]
    fn a_new_pid_or_a_used_up_seed_reseeds_from_the_os() -> Result<(), getrandom::Error> {
        // Two copies of one state, as a fork leaves them.
        let seeded = Instant::now();
        let state = |pid| {
            Some(Source {
                pid,
                rng: StdRng::from_seed([7; 32]),
                left: RESEED_AFTER,
                seeded,
            })
        };
        let (mut slot, mut copy) = (state(7), state(7));
        // In another process the copy reseeds first.
        let parent = draw_from(&mut slot, 7)?;
        let child = draw_from(&mut copy, 8)?;
        assert_ne!(parent, child);
        assert_eq!(
            copy.as_ref().map(|s| (s.pid, s.left)),
            Some((8, RESEED_AFTER - 1))
        );
        if let Some(source) = slot.as_mut() {
            source.left = 0;
        }
        draw_from(&mut slot, 7)?;
        assert_eq!(slot.as_ref().map(|s| s.left), Some(RESEED_AFTER - 1));
        Ok(())
    }

    #[test]
    fn copies_that_share_a_pid_still_draw_different_tokens() -> Result<(), getrandom::Error> {
        // The case the pid cannot tell: a grandchild that got its ancestor's
        // pid and a copy of its never-used generator. Same stream position,
        // drawn later: a different token.
        let seeded = Instant::now();
        let state = || {
            Some(Source {
                pid: 7,
                rng: StdRng::from_seed([7; 32]),
                left: RESEED_AFTER,
                seeded,
            })
        };
        let (mut ancestor, mut grandchild) = (state(), state());
        let mut earlier = Vec::new();
        for _ in 0..64 {
            earlier.push(draw_from(&mut ancestor, 7)?);
        }
        for position in 0..64 {
            let later = draw_from(&mut grandchild, 7)?;
            assert!(
                !earlier.contains(&later),
                "position {position} repeated a token of the ancestor"
            );
        }
        // Without the time, the stream itself is the same (what the mix is for).
        let (mut a, mut b) = (StdRng::from_seed([7; 32]), StdRng::from_seed([7; 32]));
        let (mut x, mut y) = ([0u8; 16], [0u8; 16]);
        a.fill_bytes(&mut x);
        b.fill_bytes(&mut y);
        assert_eq!(x, y);
        Ok(())
    }

    #[test]
    fn tokens_never_repeat_over_many_draws_and_threads() {
        let drawn: Vec<LeaseToken> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        (0..(2 * RESEED_AFTER))
                            .map(|_| LeaseToken::generate().expect("os rng"))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().expect("thread"))
                .collect()
        });
        let distinct: std::collections::HashSet<_> = drawn.iter().collect();
        assert_eq!(distinct.len(), drawn.len());
    }

    #[test]
    fn a_holder_id_is_the_tokens_hash_not_the_token() {
        // `printf %s 0123456789abcdef0123456789abcdef | sha256sum`, its
        // first 16 bytes.
        let token = LeaseToken(*b"0123456789abcdef0123456789abcdef");
        assert_eq!(token.holder().as_str(), "3eb1bd439947eb762998e566ccc2e099");
        assert_eq!(
            format!("{:?}", token.holder()),
            "HolderId(3eb1bd439947eb762998e566ccc2e099)"
        );
        let a = LeaseToken::generate().expect("os rng");
        let b = LeaseToken::generate().expect("os rng");
        assert_eq!(a.holder(), a.clone().holder());
        assert_ne!(a.holder(), b.holder());
        assert_ne!(a.holder().as_str(), a.as_str());
        assert_eq!(HolderId::parse(a.holder().as_str()), Some(a.holder()));
        assert_eq!(HolderId::parse("3EB1BD439947EB762998E566CCC2E099"), None);
        assert_eq!(HolderId::parse("3eb1bd"), None);
    }

    #[test]
    fn hex_encoding_is_exact() {
        let t =
            LeaseToken::from_bytes([0x00, 0xff, 0x10, 0xab, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(t.as_str(), "00ff10ab000000000000000000000001");
        assert_eq!(format!("{t:?}"), "LeaseToken(00ff10ab..)");
    }
}
