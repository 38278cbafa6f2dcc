//! A server on a fake clock (libfaketime): its `TIME` steps forward and
//! runs fast, and its keys expire by it. Judged on the server's `TIME`
//! and keys, bracketed by this machine's clock, never on how long a step
//! took.
//!
//! The server must be one libfaketime can drive: `scripts/test.sh` runs
//! this file with `LEASEHOLD_REDIS_SERVER` set to Valkey's libc-malloc
//! build. With no server named there (Debian's `redis-server`, linked
//! with jemalloc, hangs under libfaketime), the start must say so with
//! `Error::ClockNotDriven`, or follow.

use std::time::{Duration, SystemTime};

use leasehold_testkit::{Error as TestkitError, RedisOptions, RedisServer, SERVER_ENV};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A server on a fake clock, or `None` where the default server cannot
/// be driven and says so.
fn driven_server() -> Result<Option<RedisServer>, Box<dyn std::error::Error>> {
    match RedisServer::start_with(RedisOptions::default().fake_clock()) {
        Ok(server) => Ok(Some(server)),
        Err(err @ TestkitError::ClockNotDriven { .. }) => {
            // A server named in the variable is there to be driven.
            if std::env::var_os(SERVER_ENV).is_some_and(|path| !path.is_empty()) {
                return Err(err.into());
            }
            assert!(
                err.to_string()
                    .contains("does not follow libfaketime's clock"),
                "{err}"
            );
            eprintln!("the default server cannot be driven, as it says: {err}");
            Ok(None)
        }
        Err(err) => Err(err.into()),
    }
}

/// `gained` is within `rate` times the shortest and the longest real time
/// that can have passed between two `TIME` readings, the first taken
/// between `a0` and `a1`, the second between `b0` and `b1` (both clocks
/// read `CLOCK_REALTIME`; 2 ms for the microsecond and millisecond
/// truncations).
fn assert_rate(gained: Duration, rate: u32, [a0, a1, b0, b1]: [SystemTime; 4]) -> TestResult {
    let slack = Duration::from_millis(2);
    let shortest = b0.duration_since(a1)?;
    let longest = b1.duration_since(a0)?;
    assert!(
        gained + slack >= shortest * rate && gained <= longest * rate + slack,
        "the server's clock gained {gained:?} in {shortest:?} to {longest:?} at rate {rate}"
    );
    Ok(())
}

/// Two `TIME` readings at least 300 ms of this machine's time apart
/// (polled, not slept through), and the local times around each.
fn readings(
    server: &RedisServer,
) -> Result<(Duration, [SystemTime; 4]), Box<dyn std::error::Error>> {
    let a0 = SystemTime::now();
    let first = server.time()?;
    let a1 = SystemTime::now();
    loop {
        let b0 = SystemTime::now();
        let second = server.time()?;
        let b1 = SystemTime::now();
        if b0.duration_since(a1)? >= Duration::from_millis(300) {
            return Ok((second.duration_since(first)?, [a0, a1, b0, b1]));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_fake_clock_steps_forward_runs_fast_and_expires_keys_by_its_time() -> TestResult {
    let Some(server) = driven_server()? else {
        return Ok(());
    };
    assert_eq!(server.clock_rate(), Some(1.0));
    // The real time, as the start check left it.
    let before = SystemTime::now();
    let now = server.time()?;
    let after = SystemTime::now();
    assert!(
        now + Duration::from_secs(1) >= before && now <= after + Duration::from_secs(1),
        "{now:?} outside {before:?}..{after:?}"
    );

    server.redis_cli(&["SET", "short", "lease", "PX", "5000"])?;
    server.redis_cli(&["SET", "long", "lease", "PX", "60000"])?;
    server.jump_clock(Duration::from_secs(10))?;
    let before = SystemTime::now();
    let jumped = server.time()?;
    let after = SystemTime::now();
    assert!(
        jumped >= before + Duration::from_secs(9) && jumped <= after + Duration::from_secs(11),
        "{jumped:?} is not 10 s past {before:?}..{after:?}"
    );
    // The 5 s key fell in the step; the 60 s one lost 10 s of its life.
    assert_eq!(server.redis_cli(&["GET", "short"])?, "(nil)");
    let left: i64 = server.redis_cli(&["PTTL", "long"])?.parse()?;
    assert!((1..=50_000).contains(&left), "PTTL {left}");
    // At rate 1 after the step.
    let (gained, bounds) = readings(&server)?;
    assert_rate(gained, 1, bounds)?;

    server.set_clock_rate(3.0)?;
    assert_eq!(server.clock_rate(), Some(3.0));
    let refused = server.jump_clock(Duration::from_secs(1));
    assert!(
        matches!(refused, Err(TestkitError::FakeClock { .. })),
        "{refused:?}"
    );
    let (gained, bounds) = readings(&server)?;
    assert_rate(gained, 3, bounds)?;
    let fast = server.time()?;

    // Back to rate 1: what it gained stays, no step back.
    server.set_clock_rate(1.0)?;
    let slowed = server.time()?;
    assert!(slowed >= fast, "{slowed:?} stepped back from {fast:?}");
    let (gained, bounds) = readings(&server)?;
    assert_rate(gained, 1, bounds)?;

    let refused = server.set_clock_rate(0.0);
    assert!(
        matches!(refused, Err(TestkitError::FakeClock { .. })),
        "{refused:?}"
    );
    Ok(())
}

#[test]
fn the_machines_clock_cannot_be_moved() -> TestResult {
    let server = RedisServer::start()?;
    assert_eq!(server.clock_rate(), None);
    let refused = server.jump_clock(Duration::from_secs(10));
    match refused {
        Err(TestkitError::FakeClock { reason, .. }) => {
            assert!(reason.contains("RedisOptions::fake_clock"), "{reason}")
        }
        other => panic!("expected Error::FakeClock, got {other:?}"),
    }
    assert!(matches!(
        server.set_clock_rate(3.0),
        Err(TestkitError::FakeClock { .. })
    ));
    Ok(())
}
