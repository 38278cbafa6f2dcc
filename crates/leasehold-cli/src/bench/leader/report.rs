//! What the bench reports: each way's figures over rounds (medians with
//! their spread), against issue 27's targets, as text or JSON.

use serde_json::json;

use super::CANDIDATES;
use super::rounds::{Fault, FaultRound, Handover};
use super::team::Team;
use crate::bench::{median, round3};
use crate::cli::{LeaderArgs, LeaderWay};

/// Issue 27's targets.
const RESIGN_TARGET_MS: f64 = 50.0;
const STOP_TARGET_EXCESS_MS: f64 = 100.0;

/// A figure over rounds.
#[derive(Debug, Clone, Copy)]
struct Spread {
    min: f64,
    p10: f64,
    median: f64,
    p90: f64,
    max: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Spread {
        Spread {
            min: quantile(values, 0.0),
            p10: quantile(values, 0.1),
            median: median(values),
            p90: quantile(values, 0.9),
            max: quantile(values, 1.0),
        }
    }

    fn json(self) -> serde_json::Value {
        json!({
            "min": round3(self.min),
            "p10": round3(self.p10),
            "median": round3(self.median),
            "p90": round3(self.p90),
            "max": round3(self.max),
        })
    }

    fn text(self) -> String {
        format!("{:.1} ({:.1}..{:.1})", self.median, self.p10, self.p90)
    }
}

/// The `q` quantile of `values`, interpolated between the nearest two.
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let at = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (low, high) = (at.floor() as usize, at.ceil() as usize);
    v[low] + (v[high] - v[low]) * (at - low as f64)
}

/// A way's figures, in milliseconds.
struct Figures {
    resign: Spread,
    stop_excess: Spread,
    stop: Spread,
    expiry: Spread,
}

impl Team {
    fn figures(&self) -> Figures {
        let ttl_ms = self.ttl.as_secs_f64() * 1e3;
        let excess: Vec<f64> = self.stop_ms.iter().map(|ms| ms - ttl_ms).collect();
        Figures {
            resign: Spread::of(&self.resign_ms),
            stop_excess: Spread::of(&excess),
            stop: Spread::of(&self.stop_ms),
            expiry: Spread::of(&self.expiry_ms),
        }
    }
}

/// A way's figures under one fault, over rounds.
struct FaultFigures {
    fault: Fault,
    rounds: usize,
    errors: usize,
    lost_terms: usize,
    kept: usize,
    to_elected: Spread,
}

impl Team {
    fn fault_figures(&self) -> Vec<FaultFigures> {
        Fault::ALL
            .iter()
            .map(|&fault| {
                let rounds: Vec<&FaultRound> =
                    self.faults.iter().filter(|r| r.fault == fault).collect();
                let elected: Vec<f64> = rounds.iter().filter_map(|r| r.to_elected_ms).collect();
                FaultFigures {
                    fault,
                    rounds: rounds.len(),
                    errors: rounds.iter().map(|r| r.errors).sum(),
                    lost_terms: rounds.iter().map(|r| r.lost.len()).sum(),
                    kept: rounds.len() - elected.len(),
                    to_elected: Spread::of(&elected),
                }
            })
            .filter(|f| f.rounds > 0)
            .collect()
    }
}

impl FaultFigures {
    fn json(&self) -> serde_json::Value {
        json!({
            "rounds": self.rounds,
            "errors": self.errors,
            "lost_terms": self.lost_terms,
            "kept": self.kept,
            "fault_end_to_elected_ms": self.to_elected.json(),
        })
    }
}

fn met(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

pub(super) fn report(teams: &[Team], args: &LeaderArgs) {
    let ttl_ms = args.ttl.as_secs_f64() * 1e3;
    let figures: Vec<Figures> = teams.iter().map(Team::figures).collect();
    let by_way = |way| teams.iter().position(|t| t.way == way).map(|i| &figures[i]);
    let ratios = by_way(LeaderWay::Poll)
        .zip(by_way(LeaderWay::Handoff))
        .map(|(poll, handoff)| {
            (
                handoff.resign.median / poll.resign.median,
                handoff.stop.median / poll.stop.median,
                handoff.expiry.median / poll.expiry.median,
            )
        });
    if args.json {
        for (team, f) in teams.iter().zip(&figures) {
            println!(
                "{}",
                json!({
                    "bench": "leader",
                    "way": team.way.name(),
                    "candidates": CANDIDATES,
                    "rounds": args.rounds,
                    "ttl_ms": ttl_ms,
                    "resign_ms": f.resign.json(),
                    "stop_excess_ms": f.stop_excess.json(),
                    "expiry_to_elected_ms": f.expiry.json(),
                    "resign_target_met": f.resign.median <= RESIGN_TARGET_MS,
                    "stop_target_met": f.stop_excess.median <= STOP_TARGET_EXCESS_MS,
                    "redone": team.redone,
                    "fences": team.fences,
                    "handovers": team.handovers.iter().map(Handover::json).collect::<Vec<_>>(),
                    "errors": team.errors.len(),
                    "error_texts": team.errors,
                    "errors_target_met": team.errors.is_empty(),
                    "lost_terms": team.lost.len(),
                    "faults": team
                        .fault_figures()
                        .iter()
                        .map(|f| (f.fault.name().to_owned(), f.json()))
                        .collect::<serde_json::Map<_, _>>(),
                    "fault_rounds": team.faults.iter().map(FaultRound::json).collect::<Vec<_>>(),
                })
            );
        }
        if let Some((resign, stop, expiry)) = ratios {
            println!(
                "{}",
                json!({
                    "bench": "leader",
                    "ratio": "handoff/poll",
                    "resign": round3(resign),
                    "stop": round3(stop),
                    "expiry_to_elected": round3(expiry),
                })
            );
        }
        return;
    }
    println!(
        "bench leader: {CANDIDATES} candidate processes per way, term TTL {}, {} rounds (ms: median (p10..p90))",
        humantime::format_duration(args.ttl),
        args.rounds
    );
    println!(
        "{:<8} {:>22} {:>26} {:>22}",
        "way", "resigned -> elected", "stopped -> elected - TTL", "expiry -> elected"
    );
    for (team, f) in teams.iter().zip(&figures) {
        println!(
            "{:<8} {:>22} {:>26} {:>22}",
            team.way.name(),
            f.resign.text(),
            f.stop_excess.text(),
            f.expiry.text()
        );
    }
    if let Some((resign, stop, expiry)) = ratios {
        println!(
            "handoff / poll (of the medians): resigned {resign:.3}, stopped {stop:.3}, expiry -> elected {expiry:.3}"
        );
    }
    if teams.iter().any(|t| !t.faults.is_empty()) {
        println!(
            "{:<8} {:<12} {:>6} {:>6} {:>10} {:>5} {:>26}",
            "way", "fault", "rounds", "errors", "lost terms", "kept", "fault end -> elected"
        );
        for team in teams {
            for f in team.fault_figures() {
                println!(
                    "{:<8} {:<12} {:>6} {:>6} {:>10} {:>5} {:>26}",
                    team.way.name(),
                    f.fault.name(),
                    f.rounds,
                    f.errors,
                    f.lost_terms,
                    f.kept,
                    if f.kept == f.rounds {
                        "- (term kept)".to_owned()
                    } else {
                        f.to_elected.text()
                    }
                );
            }
        }
    }
    for (team, f) in teams.iter().zip(&figures) {
        println!(
            "{}: resigned leader replaced in {:.1} ms (target 50 ms: {}); stopped leader in TTL {:+.1} ms (target TTL + 100 ms: {})",
            team.way.name(),
            f.resign.median,
            met(f.resign.median <= RESIGN_TARGET_MS),
            f.stop_excess.median,
            met(f.stop_excess.median <= STOP_TARGET_EXCESS_MS)
        );
        println!(
            "{}: {} errors returned to the candidates in the whole run (target 0: {}); {} terms lost",
            team.way.name(),
            team.errors.len(),
            met(team.errors.is_empty()),
            team.lost.len()
        );
        for error in &team.errors {
            println!("{}: error: {error}", team.way.name());
        }
        if team.redone > 0 {
            println!(
                "{}: {} measurements redone (the leader lost its term on its own first)",
                team.way.name(),
                team.redone
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        let v = [3.0, 1.0, 2.0, 4.0, 5.0];
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 1.0), 5.0);
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert!((quantile(&v, 0.1) - 1.4).abs() < 1e-9);
        assert!(quantile(&[], 0.5).is_nan());
        assert_eq!(quantile(&[7.0], 0.9), 7.0);
    }
}
