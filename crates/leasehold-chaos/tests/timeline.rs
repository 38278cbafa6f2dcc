//! The timeline page holds the elements a reader (and a test) looks for.

mod common;

use common::{History, KEY, WALLET, sample};
use leasehold_chaos::check::check;
use leasehold_chaos::{Kind, WriteOutcome, render_html};

fn count(html: &str, needle: &str) -> usize {
    html.matches(needle).count()
}

#[test]
fn a_small_history_draws_lanes_leases_faults_overlaps_and_refusals() {
    let h = History::saved_by_the_fence();
    let run = check(&h.events);
    let html = render_html(&h.events, &run);
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(html.trim_end().ends_with("</html>"));
    assert_eq!(count(&html, "<svg id=\"timeline\""), 1);
    assert!(
        html.contains("<title>leasehold chaos: fenced-cas under process-pause, seed 7</title>")
    );
    assert!(
        html.contains("id=\"verdict\">OK: no violation</p>"),
        "{html}"
    );
    assert!(html.contains("id=\"legend\""));
    // Two callers, two leases, one fault, the overlap on both holders'
    // lanes, one refused write, one lost lease, one accepted write.
    assert_eq!(count(&html, "class=\"lane\""), 2);
    assert!(html.contains("data-actor=\"w0.t0\""));
    assert!(html.contains("data-actor=\"w1.t0\""));
    assert_eq!(count(&html, "<rect class=\"lease\""), 2);
    assert!(html.contains("data-token=\"aaaa\""));
    assert_eq!(count(&html, "<rect class=\"fault\""), 1);
    assert!(html.contains("process-pause (w0)"));
    assert_eq!(count(&html, "<rect class=\"overlap\""), 2);
    assert_eq!(count(&html, "<path class=\"refused\""), 1);
    assert!(html.contains("stale write refused by the database"));
    assert_eq!(count(&html, "<path class=\"lost\""), 1);
    assert_eq!(count(&html, "<path class=\"accepted\""), 1);
    assert!(html.contains("<p id=\"violations\" class=\"none\">"));
    assert!(html.contains("<ul id=\"overlaps\">"));
    // Self-contained: nothing fetched, nothing run.
    assert!(!html.contains("<script"));
    let without_svg_namespace = html.replace("http://www.w3.org/2000/svg", "");
    assert!(!without_svg_namespace.contains("http"), "{html}");
}

#[test]
fn violations_are_listed_under_the_chart() {
    let mut h = History::clean();
    h.events.pop();
    h.final_state(1_000, WALLET, 90, 20, 2);
    let run = check(&h.events);
    let html = render_html(&h.events, &run);
    assert!(html.contains("BROKEN: 2 violations"), "{html}");
    assert_eq!(count(&html, "<li class=\"violation\">"), 2);
    assert!(html.contains("<li class=\"violation\">lost update on wallet:1: the balance is 90"));
}

#[test]
fn a_control_that_broke_says_so_and_one_that_did_not_fails() {
    let mut h = History::wallet("none", "process-pause", true);
    h.final_state(1_000, WALLET, 90, 0, 0);
    let html = render_html(&h.events, &check(&h.events));
    assert!(
        html.contains("BROKEN, as a negative control should be"),
        "{html}"
    );
    let mut h = History::wallet("none", "process-pause", true);
    h.final_state(1_000, WALLET, 100, 0, 0);
    let html = render_html(&h.events, &check(&h.events));
    assert!(
        html.contains("FAILED: a negative control with no violation"),
        "{html}"
    );
}

#[test]
fn text_from_the_history_is_escaped() {
    let mut h = History::new("<b>mode</b>", "a&b", false, &[(WALLET, 100)]);
    h.acquired(100, "<img src=x>", "\"tok\"", 1).push(
        200,
        "<img src=x>",
        Kind::Write {
            op: 9,
            started_us: 150,
            key: KEY.into(),
            resource: WALLET.into(),
            amount: 10,
            fence: Some(1),
            outcome: WriteOutcome::Unknown,
            detail: Some("<script>alert(1)</script>".into()),
        },
    );
    h.push(
        300,
        "harness",
        Kind::Invariant {
            ok: false,
            detail: "</li><li>x".into(),
        },
    );
    let html = render_html(&h.events, &check(&h.events));
    assert!(!html.contains("<img"), "{html}");
    assert!(!html.contains("<script"), "{html}");
    assert!(!html.contains("<b>mode"), "{html}");
    assert!(!html.contains("</li><li>x"), "{html}");
    assert!(html.contains("&lt;img src=x&gt;"));
    assert!(html.contains("data-token=\"&quot;tok&quot;\""));
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(html.contains("a&amp;b"));
}

#[test]
fn a_long_run_stays_small() {
    // 20,000 one-millisecond leases with a write each on four lanes over
    // 20 s: far more than the chart's pixels.
    let mut h = History::wallet("fenced-cas", "none", false);
    let callers = ["w0.t0", "w0.t1", "w1.t0", "w1.t1"];
    for i in 0..20_000u64 {
        let actor = callers[(i % 4) as usize];
        let t = i * 1_000;
        let token = format!("k{i}");
        h.acquired(t, actor, &token, i)
            .write(t + 500, actor, 0, i, WriteOutcome::Accepted)
            .write(t + 600, actor, 0, i, WriteOutcome::RefusedStale)
            .released(t + 900, actor, &token);
    }
    h.final_state(20_000_000, WALLET, 100, 0, 20_000);
    let run = check(&h.events);
    let html = render_html(&h.events, &run);
    assert!(html.len() < 400_000, "{} bytes", html.len());
    assert!(html.contains("class=\"lease merged\""));
    assert!(html.contains("more here"));
}

#[test]
fn the_sample_run_shows_its_story() {
    let h = sample();
    let run = check(&h.events);
    assert!(run.holds(), "{:?}", run.violations);
    assert!(!run.overlaps.is_empty());
    assert_eq!(run.counts.writes.refused_stale, 1);
    assert_eq!(run.counts.writes.unknown, 1);
    let html = render_html(&h.events, &run);
    assert_eq!(count(&html, "class=\"lane\""), 4);
    assert_eq!(count(&html, "<rect class=\"fault\""), 2);
    assert_eq!(count(&html, "<circle class=\"unknown\""), 1);
    assert_eq!(count(&html, "<path class=\"refused\""), 1);
}
