//! A server's [fake clock](super::RedisOptions::fake_clock) (libfaketime):
//! reading it, stepping it, speeding it up, and checking at start that
//! the server follows it.

use std::time::{Duration, SystemTime};

use super::RedisServer;
use crate::Error;
use crate::clock::FakeClock;
use crate::resp::Reply;

/// The offset a [fake clock](RedisOptions::fake_clock)'s start check sets
/// for a moment: one day, in milliseconds.
const PROBE_OFFSET_MS: i64 = 86_400_000;

/// How far the server's `TIME` may land from what the start check set (a
/// round trip, and a loaded machine's stalls, are far below).
const PROBE_SLACK_MS: i64 = 60_000;

/// A [fake clock](super::RedisOptions::fake_clock): reading it, stepping it,
/// speeding it up.
impl RedisServer {
    /// The server's wall clock, as its `TIME` says.
    ///
    /// # Errors
    ///
    /// As for [`command`](Self::command); [`Error::Resp`] if the reply is
    /// not two integers.
    pub fn time(&self) -> Result<SystemTime, Error> {
        let reply = self.command(&["TIME"])?;
        parse_time(&reply).ok_or_else(|| Error::Resp {
            addr: self.addr().to_string(),
            source: std::io::Error::other(format!("TIME answered {reply}")),
        })
    }

    /// Steps the server's wall clock `by` forward, from where it is now
    /// (measured with `TIME`, to within half a round trip): every key whose
    /// deadline falls in the step expires. The clock goes on at its rate
    /// from there; the step is not undone.
    ///
    /// # Errors
    ///
    /// [`Error::FakeClock`] if the server was not started with
    /// [`RedisOptions::fake_clock`], or while its clock runs at another
    /// rate than 1 ([`set_clock_rate`](Self::set_clock_rate) it back
    /// first); as for [`time`](Self::time); [`Error::Io`] if the file
    /// cannot be written.
    ///
    /// [`RedisOptions::fake_clock`]: super::RedisOptions::fake_clock
    pub fn jump_clock(&self, by: Duration) -> Result<(), Error> {
        let clock = self.fake_clock()?;
        if clock.setting().rate != 1.0 {
            return Err(Error::FakeClock {
                server: self.name(),
                reason: "a jump while it runs at another rate than 1 (libfaketime would ignore it)",
            });
        }
        let offset_ms = self.clock_offset_ms()?;
        let by_ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        clock.set_offset(offset_ms.saturating_add(by_ms))
    }

    /// Makes the server's wall clock run `rate` times as fast as this
    /// machine's (`3.0`: three seconds a second; `1.0`: at its rate again),
    /// from the time it shows now: no step. Time a fast clock gained stays
    /// when it slows down.
    ///
    /// # Errors
    ///
    /// [`Error::FakeClock`] if the server was not started with
    /// [`RedisOptions::fake_clock`] or `rate` is not a positive number;
    /// [`Error::Io`] if the file cannot be written.
    ///
    /// [`RedisOptions::fake_clock`]: super::RedisOptions::fake_clock
    pub fn set_clock_rate(&self, rate: f64) -> Result<(), Error> {
        let clock = self.fake_clock()?;
        if !(rate.is_finite() && rate > 0.0) {
            return Err(Error::FakeClock {
                server: self.name(),
                reason: "its rate must be a positive number",
            });
        }
        if clock.setting().rate == rate {
            return Ok(());
        }
        clock.set_rate(rate)
    }

    /// The rate of the server's [fake clock](super::RedisOptions::fake_clock)
    /// (1.0 unless [`set_clock_rate`](Self::set_clock_rate) changed it);
    /// `None` on the machine's clock.
    pub fn clock_rate(&self) -> Option<f64> {
        self.clock.as_ref().map(|clock| clock.setting().rate)
    }

    fn fake_clock(&self) -> Result<&FakeClock, Error> {
        self.clock.as_ref().ok_or_else(|| Error::FakeClock {
            server: self.name(),
            reason: "it runs on the machine's clock (start it with RedisOptions::fake_clock)",
        })
    }

    /// How far the server's clock is ahead of this machine's, in
    /// milliseconds (negative: behind): its `TIME` against the middle of
    /// the round trip.
    fn clock_offset_ms(&self) -> Result<i64, Error> {
        let before = SystemTime::now();
        let server = self.time()?;
        let after = SystemTime::now();
        let middle = before + after.duration_since(before).unwrap_or_default() / 2;
        Ok(match server.duration_since(middle) {
            Ok(ahead) => i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX),
            Err(behind) => -i64::try_from(behind.duration().as_millis()).unwrap_or(i64::MAX),
        })
    }

    /// The start check of a fake clock: its `TIME` follows a one-day
    /// offset, then comes back to the real time.
    pub(super) fn check_clock(&self) -> Result<(), Error> {
        let clock = self.fake_clock()?;
        for mark in [PROBE_OFFSET_MS, 0] {
            clock.set_offset(mark)?;
            let seen = self.clock_offset_ms()?;
            if (seen - mark).abs() > PROBE_SLACK_MS {
                return Err(self.not_driven(format!(
                    "with an offset of {mark} ms set, its TIME was {seen} ms from this machine's"
                )));
            }
        }
        Ok(())
    }

    pub(super) fn not_driven(&self, detail: String) -> Error {
        Error::ClockNotDriven {
            server: self.name(),
            binary: self.binary.clone(),
            detail,
        }
    }
}

/// `TIME`'s reply (seconds and microseconds) as a point in time.
fn parse_time(reply: &Reply) -> Option<SystemTime> {
    let Reply::Array(parts) = reply else {
        return None;
    };
    let [seconds, micros] = parts.as_slice() else {
        return None;
    };
    let number = |part: &Reply| match part {
        Reply::Bulk(bytes) => std::str::from_utf8(bytes).ok()?.parse::<u64>().ok(),
        Reply::Integer(n) => u64::try_from(*n).ok(),
        _ => None,
    };
    Some(
        SystemTime::UNIX_EPOCH
            + Duration::from_secs(number(seconds)?)
            + Duration::from_micros(number(micros)?),
    )
}
