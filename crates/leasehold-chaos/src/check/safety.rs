//! Safety, what the database must show (the module docs' "Safety"): each
//! resource's final balance and ledger against its accepted debits, any
//! subset of the unknown ones allowed.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Event, Kind, WriteOutcome};

use super::findings::RunHeader;
use super::violation::Violation;

/// Past this many distinct subset sums of unknown writes, the lost-update
/// check falls back to a range.
const MAX_SUBSET_SUMS: usize = 1 << 16;

#[derive(Default)]
struct Tally {
    accepted_sum: i64,
    accepted: u64,
    unknown: Vec<i64>,
}

struct Final {
    balance: i64,
    ledger_sum: i64,
    ledger_rows: u64,
}

pub(super) fn safety(events: &[&Event], header: Option<&RunHeader>) -> Vec<Violation> {
    let mut tallies: BTreeMap<&str, Tally> = BTreeMap::new();
    let mut finals: BTreeMap<&str, Final> = BTreeMap::new();
    let mut invariants = Vec::new();
    let mut judged: BTreeSet<&str> = BTreeSet::new();
    for event in events {
        match &event.kind {
            Kind::Write {
                resource,
                amount,
                outcome,
                ..
            } => {
                let tally = tallies.entry(resource).or_default();
                match outcome {
                    WriteOutcome::Accepted => {
                        tally.accepted += 1;
                        tally.accepted_sum = tally.accepted_sum.saturating_add(*amount);
                    }
                    WriteOutcome::Unknown => tally.unknown.push(*amount),
                    WriteOutcome::RefusedStale
                    | WriteOutcome::Insufficient
                    | WriteOutcome::Failed => {}
                }
            }
            Kind::Final {
                resource,
                balance,
                ledger_sum,
                ledger_rows,
            } => {
                finals.insert(
                    resource,
                    Final {
                        balance: *balance,
                        ledger_sum: *ledger_sum,
                        ledger_rows: *ledger_rows,
                    },
                );
            }
            Kind::ResourceCheck {
                resource,
                ok,
                detail,
            } => {
                judged.insert(resource);
                if !ok {
                    invariants.push(Violation::InvariantFailed {
                        actor: event.actor.clone(),
                        detail: format!("{resource}: {detail}"),
                    });
                }
            }
            Kind::Invariant { ok: false, detail } => invariants.push(Violation::InvariantFailed {
                actor: event.actor.clone(),
                detail: detail.clone(),
            }),
            _ => {}
        }
    }

    let mut violations = Vec::new();
    let Some(header) = header else {
        violations.push(Violation::MissingHeader);
        violations.extend(invariants);
        return violations;
    };
    let empty = Tally::default();
    for (resource, initial) in &header.initial {
        let Some(state) = finals.get(resource.as_str()) else {
            if judged.contains(resource.as_str()) {
                continue;
            }
            violations.push(Violation::MissingFinal {
                resource: resource.clone(),
            });
            continue;
        };
        let tally = tallies.get(resource.as_str()).unwrap_or(&empty);
        resource_violations(resource, *initial, tally, state, &mut violations);
    }
    let known: BTreeSet<&str> = header.initial.iter().map(|(r, _)| r.as_str()).collect();
    let seen: BTreeSet<&str> = tallies
        .keys()
        .chain(finals.keys())
        .chain(judged.iter())
        .copied()
        .collect();
    for resource in seen.difference(&known) {
        violations.push(Violation::UnknownResource {
            resource: (*resource).to_owned(),
        });
    }
    violations.extend(invariants);
    violations
}

fn resource_violations(
    resource: &str,
    initial: i64,
    tally: &Tally,
    state: &Final,
    violations: &mut Vec<Violation>,
) {
    let expected = initial.saturating_sub(tally.accepted_sum);
    let unexplained = expected.saturating_sub(state.balance);
    if !subset_sum_reaches(&tally.unknown, unexplained) {
        violations.push(Violation::LostUpdate {
            resource: resource.to_owned(),
            initial,
            accepted: tally.accepted_sum,
            unknown_writes: tally.unknown.len() as u64,
            unknown_sum: tally.unknown.iter().fold(0i64, |s, a| s.saturating_add(*a)),
            balance: state.balance,
            expected,
        });
    }
    let unknown = tally.unknown.len() as u64;
    if state.ledger_rows > tally.accepted + unknown {
        violations.push(Violation::DuplicatedDebit {
            resource: resource.to_owned(),
            ledger_rows: state.ledger_rows,
            accepted: tally.accepted,
            unknown,
        });
    } else if state.ledger_rows < tally.accepted {
        violations.push(Violation::LostDebit {
            resource: resource.to_owned(),
            ledger_rows: state.ledger_rows,
            accepted: tally.accepted,
        });
    }
    if state.balance != initial.saturating_sub(state.ledger_sum) {
        violations.push(Violation::LedgerMismatch {
            resource: resource.to_owned(),
            initial,
            balance: state.balance,
            ledger_sum: state.ledger_sum,
        });
    }
    if state.balance < 0 {
        violations.push(Violation::NegativeBalance {
            resource: resource.to_owned(),
            balance: state.balance,
        });
    }
}

/// Whether some subset of `amounts` (the empty one included) sums to
/// `target`; past [`MAX_SUBSET_SUMS`] distinct sums, whether `target` lies
/// in the range of all subset sums.
fn subset_sum_reaches(amounts: &[i64], target: i64) -> bool {
    let mut sums = BTreeSet::from([0i64]);
    for amount in amounts {
        let next: Vec<i64> = sums.iter().map(|s| s.saturating_add(*amount)).collect();
        sums.extend(next);
        if sums.len() > MAX_SUBSET_SUMS {
            let low = amounts
                .iter()
                .filter(|a| **a < 0)
                .fold(0i64, |s, a| s.saturating_add(*a));
            let high = amounts
                .iter()
                .filter(|a| **a > 0)
                .fold(0i64, |s, a| s.saturating_add(*a));
            return (low..=high).contains(&target);
        }
    }
    sums.contains(&target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_sums_are_exact_while_few() {
        assert!(subset_sum_reaches(&[], 0));
        assert!(!subset_sum_reaches(&[], 10));
        assert!(subset_sum_reaches(&[10, 25], 35));
        assert!(!subset_sum_reaches(&[10, 25], 15));
        assert!(subset_sum_reaches(&[10, -5], 5));
    }

    #[test]
    fn subset_sums_fall_back_to_a_range_when_too_many() {
        // 17 distinct powers of two: 131,072 sums, past the cap.
        let amounts: Vec<i64> = (0..17).map(|i| 1i64 << i).chain([-3]).collect();
        assert!(subset_sum_reaches(&amounts, (1 << 17) - 1));
        assert!(subset_sum_reaches(&amounts, -3));
        assert!(!subset_sum_reaches(&amounts, 1 << 17));
        assert!(!subset_sum_reaches(&amounts, -4));
    }
}
