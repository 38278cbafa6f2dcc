//! The checker on hand-made histories, each built so that it can fail.

mod common;

use common::{History, KEY, WALLET, dip};
use leasehold_chaos::check::{Overlap, check};
use leasehold_chaos::{Kind, Violation, WriteOutcome};

#[test]
fn a_clean_run_holds_and_is_counted() {
    let run = check(&History::clean().events);
    assert!(run.holds(), "{:?}", run.violations);
    assert!(run.overlaps.is_empty(), "{:?}", run.overlaps);
    let header = run.header.as_ref().expect("a header");
    assert_eq!(
        (header.mode.as_str(), header.fault.as_str()),
        ("fenced-cas", "none")
    );
    assert_eq!(
        (header.seed, header.ttl_ms, header.control),
        (7, 100, false)
    );
    assert_eq!(run.counts.acquires, 2);
    assert_eq!(run.counts.acquired, 2);
    assert_eq!(run.counts.writes.accepted, 2);
    assert_eq!(run.counts.writes.total(), 2);
    assert_eq!(run.counts.releases, 2);
    assert_eq!(run.counts.operations(), 4);
    assert_eq!(run.duration_us, 1000);
}

#[test]
fn two_holders_writing_blind_lose_an_update() {
    // No fence: w0.t0 pauses past its TTL, w1.t0 takes the lock; both read
    // 100 and write back 90. Two accepted debits, one visible in the balance.
    let mut h = History::wallet("none", "process-pause", true);
    h.acquired(100, "w0.t0", "aaaa", 1)
        .fault(150, 5_000, "process-pause", "w0")
        .acquired(1_000, "w1.t0", "bbbb", 2)
        .write(1_200, "w1.t0", 10, 2, WriteOutcome::Accepted)
        .released(1_300, "w1.t0", "bbbb")
        .write(5_100, "w0.t0", 10, 1, WriteOutcome::Accepted)
        .released(5_200, "w0.t0", "aaaa")
        .final_state(6_000, WALLET, 90, 20, 2);
    let run = check(&h.events);
    assert!(!run.holds());
    assert!(run.is_control());
    let lost = Violation::LostUpdate {
        resource: WALLET.into(),
        initial: 100,
        accepted: 20,
        unknown_writes: 0,
        unknown_sum: 0,
        balance: 90,
        expected: 80,
    };
    assert!(run.violations.contains(&lost), "{:?}", run.violations);
    assert!(
        run.violations
            .iter()
            .any(|v| matches!(v, Violation::LedgerMismatch { .. })),
        "{:?}",
        run.violations
    );
    assert_eq!(
        lost.to_string(),
        "lost: wallet:1 is 90, but 100 less its committed writes (20) is 80: a committed write \
         is missing from the final state"
    );
    assert_eq!(run.overlaps.len(), 1);
}

#[test]
fn more_ledger_rows_than_debits_is_a_duplicated_debit() {
    let mut h = History::wallet("fenced-cas", "none", false);
    h.acquired(100, "w0.t0", "aaaa", 1)
        .write(200, "w0.t0", 10, 1, WriteOutcome::Accepted)
        .released(300, "w0.t0", "aaaa")
        .final_state(1_000, WALLET, 80, 20, 2);
    let run = check(&h.events);
    let duplicated = Violation::DuplicatedDebit {
        resource: WALLET.into(),
        ledger_rows: 2,
        accepted: 1,
        unknown: 0,
    };
    assert!(run.violations.contains(&duplicated), "{:?}", run.violations);
    assert!(
        duplicated
            .to_string()
            .starts_with("duplicate: wallet:1 records 2 writes for 1 committed")
    );
    // The balance follows the ledger, so it is also off the accepted debits.
    assert!(
        run.violations.iter().any(|v| matches!(
            v,
            Violation::LostUpdate {
                balance: 80,
                expected: 90,
                ..
            }
        )),
        "{:?}",
        run.violations
    );
}

#[test]
fn fewer_ledger_rows_than_debits_is_a_lost_debit() {
    let mut h = History::clean();
    h.events.pop();
    h.final_state(1_000, WALLET, 80, 20, 1);
    let run = check(&h.events);
    assert_eq!(
        run.violations,
        [Violation::LostDebit {
            resource: WALLET.into(),
            ledger_rows: 1,
            accepted: 2
        }]
    );
}

#[test]
fn an_overlap_the_database_absorbed_is_counted_but_holds() {
    let run = check(&History::saved_by_the_fence().events);
    assert!(run.holds(), "{:?}", run.violations);
    assert_eq!(run.overlaps.len(), 1, "{:?}", run.overlaps);
    let Overlap {
        key,
        a,
        b,
        from_us,
        to_us,
        ..
    } = &run.overlaps[0];
    assert_eq!(key, KEY);
    assert_eq!((a.actor.as_str(), a.token.as_str()), ("w0.t0", "aaaa"));
    assert_eq!((b.actor.as_str(), b.token.as_str()), ("w1.t0", "bbbb"));
    // w1.t0 acquired at 1_010 and released at 1_300; w0.t0 held from 110.
    assert_eq!((*from_us, *to_us), (1_010, 1_300));
    assert_eq!(run.counts.writes.refused_stale, 1);
    assert_eq!(run.counts.leases_lost, 1);
}

#[test]
fn a_lease_never_released_is_held_to_the_end_of_the_history() {
    let mut h = History::wallet("fenced-cas", "process-pause", false);
    h.acquired(100, "w0.t0", "aaaa", 1)
        .acquired(2_000, "w1.t0", "bbbb", 2)
        .released(2_500, "w1.t0", "bbbb")
        .final_state(3_000, WALLET, 100, 0, 0);
    let run = check(&h.events);
    assert_eq!(run.overlaps.len(), 1);
    assert_eq!(
        (run.overlaps[0].from_us, run.overlaps[0].to_us),
        (2_010, 2_500)
    );
}

#[test]
fn the_history_need_not_be_sorted() {
    let events = History::saved_by_the_fence().events;
    let mut reversed = events.clone();
    reversed.reverse();
    assert_eq!(check(&reversed), check(&events));
}

#[test]
fn unknown_writes_count_either_way_but_nothing_else() {
    // Accepted 10; unknown 10 and 25: any of 0, 10, 25, 35 may have landed.
    let with = |balance: i64, rows: u64| {
        let mut h = History::wallet("fenced-cas", "pg-pause", false);
        h.acquired(100, "w0.t0", "aaaa", 1)
            .write(200, "w0.t0", 10, 1, WriteOutcome::Accepted)
            .write(300, "w0.t0", 10, 1, WriteOutcome::Unknown)
            .write(400, "w0.t0", 25, 1, WriteOutcome::Unknown)
            .released(500, "w0.t0", "aaaa")
            .final_state(1_000, WALLET, balance, 100 - balance, rows);
        check(&h.events)
    };
    for (balance, rows) in [(90, 1), (80, 2), (65, 2), (55, 3)] {
        let run = with(balance, rows);
        assert!(run.holds(), "balance {balance}: {:?}", run.violations);
        assert_eq!(run.counts.writes.unknown, 2);
    }
    let run = with(75, 2);
    assert_eq!(
        run.violations,
        [Violation::LostUpdate {
            resource: WALLET.into(),
            initial: 100,
            accepted: 10,
            unknown_writes: 2,
            unknown_sum: 35,
            balance: 75,
            expected: 90,
        }]
    );
    assert!(
        run.violations[0]
            .to_string()
            .contains("no subset of its 2 writes of unknown outcome")
    );
    let run = with(55, 4);
    assert!(
        run.violations.iter().any(|v| matches!(
            v,
            Violation::DuplicatedDebit {
                ledger_rows: 4,
                accepted: 1,
                unknown: 2,
                ..
            }
        )),
        "{:?}",
        run.violations
    );
}

#[test]
fn a_resource_without_a_final_state_is_not_passed() {
    let mut h = History::new(
        "fenced-cas",
        "none",
        false,
        &[(WALLET, 100), ("wallet:2", 50)],
    );
    h.final_state(1_000, WALLET, 100, 0, 0);
    let run = check(&h.events);
    assert_eq!(
        run.violations,
        [Violation::MissingFinal {
            resource: "wallet:2".into()
        }]
    );
    assert_eq!(
        run.violations[0].to_string(),
        "wallet:2 has no final state in the history, so it was not checked"
    );
}

#[test]
fn a_history_without_a_header_is_not_passed() {
    let mut h = History::headless();
    h.acquired(100, "w0.t0", "aaaa", 1)
        .final_state(1_000, WALLET, 100, 0, 0);
    let run = check(&h.events);
    assert!(run.header.is_none());
    assert_eq!(run.violations, [Violation::MissingHeader]);
    assert!(!run.holds());
    assert!(check(&[]).violations.contains(&Violation::MissingHeader));
}

#[test]
fn a_resource_outside_the_header_is_not_passed() {
    let mut h = History::clean();
    h.final_state(1_000, "wallet:9", 5, 0, 0);
    assert_eq!(
        check(&h.events).violations,
        [Violation::UnknownResource {
            resource: "wallet:9".into()
        }]
    );
}

#[test]
fn negative_balances_and_failed_invariants_are_violations() {
    let mut h = History::wallet("for-update", "none", false);
    h.acquired(100, "w0.t0", "aaaa", 1)
        .write(200, "w0.t0", 110, 1, WriteOutcome::Accepted)
        .push(
            900,
            "harness",
            Kind::Invariant {
                ok: true,
                detail: "fine".into(),
            },
        )
        .push(
            950,
            "harness",
            Kind::Invariant {
                ok: false,
                detail: "<sum> & 1 off".into(),
            },
        )
        .final_state(1_000, WALLET, -10, 110, 1);
    let run = check(&h.events);
    assert_eq!(
        run.violations,
        [
            Violation::NegativeBalance {
                resource: WALLET.into(),
                balance: -10
            },
            Violation::InvariantFailed {
                actor: "harness".into(),
                detail: "<sum> & 1 off".into()
            },
        ]
    );
}

#[test]
fn violations_serialize_with_their_type() -> Result<(), serde_json::Error> {
    let json = serde_json::to_value(Violation::MissingFinal {
        resource: WALLET.into(),
    })?;
    assert_eq!(
        json,
        serde_json::json!({"type": "missing_final", "resource": "wallet:1"})
    );
    let run = serde_json::to_value(check(&History::saved_by_the_fence().events))?;
    assert_eq!(run["overlaps"][0]["a"]["actor"], "w0.t0");
    assert_eq!(run["counts"]["writes"]["refused_stale"], 1);
    Ok(())
}

#[test]
fn recovery_is_measured_on_a_throughput_dip() {
    let run = check(&dip(400_000).events);
    assert!(run.holds(), "{:?}", run.violations);
    assert_eq!(run.recovery.len(), 1);
    let r = &run.recovery[0];
    assert_eq!(
        (r.fault.as_str(), r.target.as_str()),
        ("redis-pause", "redis")
    );
    assert_eq!((r.started_us, r.ended_us), (Some(2_000_000), 2_500_000));
    // The window starts with the workload (the first write started at
    // 9_995 µs): 199 writes in 1.990005 s.
    assert!(
        (r.pre_rate - 199.0 / 1.990_005).abs() < 1e-9,
        "{}",
        r.pre_rate
    );
    assert_eq!(r.window_us, 250_000);
    assert!(r.measurable);
    assert_eq!(r.recovered_after_us, Some(400_000));
    assert!(run.recovered_within(400_000));
    assert!(!run.recovered_within(399_999));
}

#[test]
fn a_slow_restart_recovers_only_once_the_rate_is_back() {
    // After the fault, writes trickle at 50/s for 500 ms, then 100/s: 20
    // writes within 250 ms first happen from the write at 2.88 s (six at
    // 50/s to 2.98 s, then fourteen from 2.99 s to 3.12 s: 240 ms; from
    // 2.86 s the twentieth is at 3.11 s, 250 ms later, one window).
    let mut h = History::new("fenced-cas", "redis-restart", false, &[(WALLET, 1_000_000)]);
    let mut t = 10_000;
    while t < 2_000_000 {
        h.write(t, "w0.t0", 1, 1, WriteOutcome::Accepted);
        t += 10_000;
    }
    h.fault(2_000_000, 2_500_000, "redis-restart", "redis");
    let mut t = 2_500_000;
    while t < 3_000_000 {
        h.write(t, "w0.t0", 1, 1, WriteOutcome::Accepted);
        t += 20_000;
    }
    let mut t = 2_990_000;
    while t < 4_000_000 {
        h.write(t, "w0.t0", 1, 1, WriteOutcome::Accepted);
        t += 10_000;
    }
    let run = check(&h.events);
    assert_eq!(run.recovery[0].recovered_after_us, Some(380_000));
}

#[test]
fn no_writes_after_a_fault_is_never_recovered() {
    let mut h = dip(400_000);
    h.events.retain(|e| e.at_us <= 2_500_000);
    let run = check(&h.events);
    assert!(run.recovery[0].measurable);
    assert_eq!(run.recovery[0].recovered_after_us, None);
    assert!(!run.recovered_within(u64::MAX));
    assert!(
        run.recovery[0].to_string().contains("never back"),
        "{}",
        run.recovery[0]
    );
}

#[test]
fn a_fault_before_any_write_is_not_measurable() {
    let mut h = History::clean();
    h.fault(0, 50, "redis-pause", "redis");
    let run = check(&h.events);
    assert!(!run.recovery[0].measurable);
    assert_eq!(run.recovery[0].recovered_after_us, None);
    assert!(run.recovered_within(0));
    assert!(run.recovery[0].to_string().contains("not measurable"));
}

#[test]
fn the_pre_fault_window_starts_after_an_earlier_fault() {
    // A first fault from 1.5 s to 1.9 s removes the writes in between; the
    // second fault's pre-rate is measured from 1.9 s only.
    let mut h = dip(0);
    h.events
        .retain(|e| !(1_500_000..1_900_000).contains(&e.at_us));
    h.fault(1_500_000, 1_900_000, "process-pause", "w0");
    let run = check(&h.events);
    let second = run
        .recovery
        .iter()
        .find(|r| r.fault == "redis-pause")
        .expect("recovery");
    // Writes at 1.90, 1.91, ..., 1.99 s: 10 in 100 ms.
    assert!(
        (second.pre_rate - 100.0).abs() < 1e-9,
        "{}",
        second.pre_rate
    );
}
