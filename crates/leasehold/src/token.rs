//! Lease tokens: 128 random bits that name one holder of one lease.

use std::fmt;

/// The random value a holder stores in the lock key, proving ownership.
///
/// 128 bits from the operating system's CSPRNG (`getrandom`), rendered as 32
/// lowercase hex characters. Release and refresh compare it with what the key
/// holds, so a caller whose lease expired can never delete or extend a lease
/// that has since passed to someone else. A token is a capability over one
/// lease: anyone who knows it can release that lease.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseToken([u8; 32]);

impl LeaseToken {
    /// Draws a fresh token from the operating system's random source.
    ///
    /// # Errors
    /// Fails only if the OS random source is unavailable, which on Linux
    /// means the kernel refused `getrandom(2)`.
    pub(crate) fn generate() -> Result<LeaseToken, getrandom::Error> {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw)?;
        Ok(LeaseToken::from_bytes(raw))
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

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Enough to correlate log lines, not enough to release someone's lease.
        write!(f, "LeaseToken({}..)", &self.as_str()[..8])
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
    fn hex_encoding_is_exact() {
        let t =
            LeaseToken::from_bytes([0x00, 0xff, 0x10, 0xab, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(t.as_str(), "00ff10ab000000000000000000000001");
        assert_eq!(format!("{t:?}"), "LeaseToken(00ff10ab..)");
    }
}
