//! `bench leader`: a short run prints a row per way and the ratios, and
//! every measured round handed the election to another process, whose term
//! has a greater fencing token; under the fault rounds (a Redis restart,
//! killed connections) no error reaches a candidate. No timing is
//! asserted: only that each figure is there.

mod common;
use common::leasehold;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `bench leader` with `args`, required to exit 0; its stdout.
fn bench_leader(args: &[&str]) -> Result<String, Box<dyn std::error::Error>> {
    let mut all = vec!["bench", "leader", "--rounds", "2", "--ttl", "500ms"];
    all.extend_from_slice(args);
    let out = leasehold(&all)?;
    let stdout = String::from_utf8(out.stdout)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    Ok(stdout)
}

fn number(row: &serde_json::Value, field: &str) -> f64 {
    row[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number: {row}"))
}

#[test]
fn every_round_hands_over_to_another_candidate_with_a_greater_fence() -> TestResult {
    let stdout = bench_leader(&["--json"])?;
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let ways: Vec<&str> = rows.iter().filter_map(|r| r["way"].as_str()).collect();
    assert_eq!(ways, ["poll", "handoff", "quorum"], "{stdout}");
    for row in rows.iter().filter(|r| r["way"].is_string()) {
        assert_eq!(row["bench"], "leader", "{row}");
        assert_eq!(row["rounds"], 2, "{row}");
        assert_eq!(row["candidates"], 3, "{row}");
        for figure in ["resign_ms", "stop_excess_ms", "expiry_to_elected_ms"] {
            let spread = &row[figure];
            let (min, p10, median, p90, max) = (
                number(spread, "min"),
                number(spread, "p10"),
                number(spread, "median"),
                number(spread, "p90"),
                number(spread, "max"),
            );
            assert!(
                min <= p10 && p10 <= median && median <= p90 && p90 <= max,
                "{figure}: {row}"
            );
        }
        assert!(row["resign_target_met"].is_boolean(), "{row}");
        assert!(row["stop_target_met"].is_boolean(), "{row}");
        // Every term, measured or not, above the one before.
        let fences: Vec<u64> = row["fences"]
            .as_array()
            .ok_or("no fences")?
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .collect();
        assert!(fences.len() >= 5, "{row}");
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "{row}");
        // Each round: a resign and a stop, each to another candidate.
        let handovers = row["handovers"].as_array().ok_or("no handovers")?;
        let kinds: Vec<(u64, &str)> = handovers
            .iter()
            .filter_map(|h| Some((h["round"].as_u64()?, h["kind"].as_str()?)))
            .collect();
        assert_eq!(
            kinds,
            [(1, "resign"), (1, "stop"), (2, "resign"), (2, "stop")],
            "{row}"
        );
        let mut last = 0;
        for handover in handovers {
            assert_ne!(handover["from"], handover["to"], "{handover}");
            let from = handover["from_fence"].as_u64().ok_or("from_fence")?;
            let to = handover["to_fence"].as_u64().ok_or("to_fence")?;
            assert!(last <= from && from < to, "{handover} after fence {last}");
            last = to;
        }
        // Faults shorter than the budget: no error returned to a candidate,
        // in any round (a lost term is not an error).
        assert_eq!(row["errors"], 0, "{row}");
        assert_eq!(row["errors_target_met"], true, "{row}");
        let rounds = row["fault_rounds"].as_array().ok_or("no fault_rounds")?;
        let faults: Vec<(u64, &str)> = rounds
            .iter()
            .filter_map(|r| Some((r["round"].as_u64()?, r["fault"].as_str()?)))
            .collect();
        assert_eq!(
            faults,
            [
                (1, "restart"),
                (1, "connections"),
                (2, "restart"),
                (2, "connections")
            ],
            "{row}"
        );
        for round in rounds {
            assert_eq!(round["errors"], 0, "{round}");
            assert!(round["lost_terms"].is_u64(), "{round}");
        }
        for fault in ["restart", "connections"] {
            let figures = &row["faults"][fault];
            assert_eq!(figures["rounds"], 2, "{row}");
            assert_eq!(figures["errors"], 0, "{row}");
        }
    }
    let ratio = rows
        .iter()
        .find(|r| r["ratio"] == "handoff/poll")
        .ok_or_else(|| format!("no ratio row: {stdout}"))?;
    for field in ["resign", "stop", "expiry_to_elected"] {
        number(ratio, field);
    }
    Ok(())
}

#[test]
fn text_shows_the_table_the_ratios_and_the_targets() -> TestResult {
    let stdout = bench_leader(&["--ways", "handoff,poll"])?;
    assert!(
        stdout.starts_with("bench leader: 3 candidate processes per way, term TTL 500ms, 2 rounds"),
        "{stdout}"
    );
    for line in [
        "resigned -> elected",
        "stopped -> elected - TTL",
        "handoff / poll (of the medians): resigned ",
        "handoff: resigned leader replaced in ",
        "poll: resigned leader replaced in ",
        "(target TTL + 100 ms: ",
        "fault end -> elected",
        "poll: 0 errors returned to the candidates in the whole run (target 0: met)",
        "handoff: 0 errors returned to the candidates in the whole run (target 0: met)",
    ] {
        assert!(stdout.contains(line), "{line}: {stdout}");
    }
    assert!(!stdout.contains("quorum"), "{stdout}");
    Ok(())
}
