//! The timeline page holds the elements a reader (and a test) looks for.

mod common;

use common::{History, KEY, WALLET, fifteen_seconds_ten_faults, sample};
use leasehold_chaos::check::check;
use leasehold_chaos::timeline::render_html_between;
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
        html.contains("id=\"verdict\">held: 1 double holders absorbed; no control ran</p>"),
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
    // Self-contained: one inline script, nothing fetched.
    assert_eq!(count(&html, "<script"), 1);
    assert_eq!(count(&html, "<script>"), 1);
    assert!(!html.contains(" src="), "{html}");
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
    assert!(html.contains("<li class=\"violation\">lost: wallet:1 is 90"));
}

#[test]
fn a_control_that_broke_says_so_and_one_that_did_not_fails() {
    let mut h = History::wallet("none", "process-pause", true);
    h.final_state(1_000, WALLET, 90, 0, 0);
    let html = render_html(&h.events, &check(&h.events));
    assert!(html.contains("control caught: 2 violations"), "{html}");
    let mut h = History::wallet("none", "process-pause", true);
    h.final_state(1_000, WALLET, 100, 0, 0);
    let html = render_html(&h.events, &check(&h.events));
    assert!(
        html.contains("FAILED: control missed (its writes broke no invariant"),
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
    // The page's own script, and no other.
    assert_eq!(count(&html, "<script"), 1, "{html}");
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
    if let Some(path) = std::env::var_os("LEASEHOLD_KEEP_LONG_RUN") {
        std::fs::write(path, &html).expect("write the page");
    }
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

/// The opening tags of `tag` elements whose class list starts with `class`.
fn tags<'a>(html: &'a str, tag: &str, class: &str) -> Vec<&'a str> {
    let open = format!("<{tag} class=\"{class}");
    html.match_indices(&open)
        .map(|(at, _)| {
            let rest = &html[at..];
            &rest[..rest.find('>').map_or(rest.len(), |end| end + 1)]
        })
        .collect()
}

/// The number in attribute `name` of an opening tag.
fn attr(tag: &str, name: &str) -> f64 {
    let key = format!(" {name}=\"");
    let start = tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + key.len();
    let end = start + tag[start..].find('"').expect("closing quote");
    tag[start..end]
        .parse()
        .unwrap_or_else(|e| panic!("{name} in {tag}: {e}"))
}

/// The text right after an opening tag, up to the next tag.
fn text_after<'a>(html: &'a str, tag: &str) -> &'a str {
    let at = html.find(tag).expect("the tag") + tag.len();
    let rest = &html[at..];
    &rest[..rest.find('<').unwrap_or(rest.len())]
}

/// A box: left, right, top, bottom.
type Box4 = (f64, f64, f64, f64);

fn assert_disjoint(what: &str, boxes: &[(String, Box4)]) {
    for (i, (a, ba)) in boxes.iter().enumerate() {
        for (b, bb) in &boxes[i + 1..] {
            let apart = ba.1 <= bb.0 || bb.1 <= ba.0 || ba.3 <= bb.2 || bb.3 <= ba.2;
            assert!(apart, "{what}: {a:?} {ba:?} overlaps {b:?} {bb:?}");
        }
    }
}

#[test]
fn labels_of_ten_fault_windows_in_fifteen_seconds_never_overlap() {
    let h = fifteen_seconds_ten_faults();
    let run = check(&h.events);
    assert!(run.holds(), "{:?}", run.violations);
    let html = render_html(&h.events, &run);
    assert_eq!(count(&html, "<rect class=\"fault\""), 10);

    let labels = tags(&html, "text", "fault-label");
    assert_eq!(labels.len(), 10);
    let (plot_x, plot_w) = (120.0, 1160.0);
    let boxes: Vec<(String, Box4)> = labels
        .iter()
        .map(|tag| {
            let (x, y, w) = (attr(tag, "x"), attr(tag, "y"), attr(tag, "data-w"));
            assert!(w > 0.0, "{tag}");
            assert!(
                x >= plot_x && x + w <= plot_x + plot_w,
                "{tag} leaves the plot"
            );
            let text = text_after(&html, tag).to_owned();
            // The estimated width is the drawn text's, at no less than
            // 7 px a character (12 px bold sans).
            assert!(w >= 7.0 * text.chars().count() as f64, "{tag}: {text}");
            (text, (x, x + w, y - 11.0, y + 4.0))
        })
        .collect();
    assert_disjoint("fault labels", &boxes);
    // Every window is named: a full label, or its number with the full
    // text in its tooltip and in the list under the chart.
    let mut shortened = 0;
    for (n, (text, _)) in boxes.iter().enumerate() {
        let number = format!("#{}", n + 1);
        if text == &number {
            shortened += 1;
        } else {
            assert!(text.starts_with(&format!("{number} ")), "{text}");
        }
    }
    assert!(
        shortened < 10,
        "every label was shortened: the packing gave up"
    );
    assert!(
        html.contains(
            "<li data-window=\"2\" value=\"2\">#2 redis-pause (redis): 1250.0 ms to 1500.0 ms</li>"
        ),
        "{html}"
    );
    // The first three windows start within 400 ms (35 px): the packing
    // needs more than one row, and the lanes start under the last one.
    let rows: std::collections::BTreeSet<i64> = boxes.iter().map(|(_, b)| b.2 as i64).collect();
    assert!(rows.len() >= 2, "{rows:?}");
    let svg = tags(&html, "svg", "")
        .into_iter()
        .chain(html.match_indices("<svg id=\"timeline\"").map(|(at, _)| {
            let rest = &html[at..];
            &rest[..rest.find('>').map_or(rest.len(), |e| e + 1)]
        }))
        .last()
        .expect("the svg");
    let top = attr(svg, "data-top");
    assert!(boxes.iter().all(|(_, b)| b.3 <= top), "labels below {top}");

    // Tick labels: centred, spaced for their width.
    let ticks: Vec<(String, Box4)> = tags(&html, "text", "tick-label")
        .iter()
        .filter(|tag| tag.contains("text-anchor=\"middle\""))
        .map(|tag| {
            let text = text_after(&html, tag).to_owned();
            let (x, y) = (attr(tag, "x"), attr(tag, "y"));
            let half = 3.5 * text.len() as f64;
            (text, (x - half, x + half, y - 11.0, y + 4.0))
        })
        .collect();
    assert!(ticks.len() >= 5, "{ticks:?}");
    assert_disjoint("tick labels", &ticks);

    // Lane labels fit their column: the long name is cut, in full in its
    // tooltip.
    for tag in tags(&html, "text", "lane-label") {
        let text = text_after(&html, tag);
        assert!(7.3 * text.chars().count() as f64 <= plot_x - 6.0, "{text}");
    }
    assert!(html.contains("w1.longer-cal\u{2026}<title>w1.longer-caller-name</title>"));
}

#[test]
fn every_lease_and_write_shows_its_token_fence_and_outcome_on_hover() {
    let h = History::saved_by_the_fence();
    let html = render_html(&h.events, &check(&h.events));
    // The leases.
    assert!(
        html.contains("<title>w0.t0 held lock:{wallet:1}\ntoken aaaa, fence 1\nfrom 0.1 ms"),
        "{html}"
    );
    assert!(html.contains("<title>w1.t0 held lock:{wallet:1}\ntoken bbbb, fence 2\n"));
    // The refused write names the lease it was made under.
    assert!(html.contains(
        "stale write refused by the database: w0.t0 debit 10 on wallet:1\n\
         lock lock:{wallet:1}, token aaaa, fence 1\nstarted 5.1 ms, answered 5.1 ms"
    ));
    // The accepted write, drawn in one path, has a hover target.
    let hits = tags(&html, "rect", "hit accepted");
    assert_eq!(hits.len(), 1, "{html}");
    assert!(html.contains(
        "<title>write accepted: w1.t0 debit 10 on wallet:1\nlock lock:{wallet:1}, token bbbb, \
         fence 2\nstarted 1.2 ms, answered 1.2 ms</title>"
    ));
    // The lost lease.
    assert!(
        html.contains("w0.t0 lost its lease on lock:{wallet:1} (token aaaa, fence 1) at 5.2 ms")
    );
    // Each lease and mark on a lane has its own title.
    for class in ["lease", "hit accepted"] {
        for tag in tags(&html, "rect", class) {
            let after = &html[html.find(tag).expect("tag") + tag.len()..];
            assert!(after.starts_with("<title>"), "{tag} has no title");
        }
    }
    for tag in tags(&html, "path", "refused")
        .into_iter()
        .chain(tags(&html, "path", "lost"))
    {
        let after = &html[html.find(tag).expect("tag") + tag.len()..];
        assert!(after.starts_with("<title>"), "{tag} has no title");
    }
}

#[test]
fn the_page_carries_what_the_zoom_needs_and_works_without_it() {
    let h = fifteen_seconds_ten_faults();
    let html = render_html(&h.events, &check(&h.events));
    // What the script reads.
    assert!(
        html.contains("data-duration-us=\"15000000\" data-plot-x=\"120\" data-plot-w=\"1160\"")
    );
    for n in 1..=10 {
        assert!(html.contains(&format!("<g class=\"fault-window\" data-window=\"{n}\">")));
        assert!(html.contains(&format!("<text class=\"fault-label\" data-window=\"{n}\"")));
        assert!(html.contains(&format!("<li data-window=\"{n}\"")));
    }
    // The plot groups the script rescales, clipped to the plot.
    assert_eq!(
        count(&html, "class=\"marks zoom\" clip-path=\"url(#plot-clip)\""),
        4
    );
    assert_eq!(
        count(&html, "class=\"faults zoom\" clip-path=\"url(#plot-clip)\""),
        1
    );
    assert!(html.contains("<g class=\"ticks\">"));
    // The controls are hidden until the script shows them; the chart is
    // whole without it.
    assert!(html.contains("<div id=\"zoom-controls\" hidden>"));
    assert!(html.contains("<div id=\"tip\" hidden></div>"));
    assert!(html.contains("data-zoom=\"reset\""));
    assert_eq!(count(&html, "<rect class=\"lease\""), 150);
}

#[test]
fn a_close_up_draws_only_its_range_at_full_width() {
    let h = fifteen_seconds_ten_faults();
    let run = check(&h.events);
    let html = render_html_between(&h.events, &run, 1_000_000..2_300_000);
    assert!(html.contains("data-from-us=\"1000000\" data-duration-us=\"1300000\""));
    assert!(html.contains(
        "<p class=\"summary\" id=\"range\">The chart shows 1000.0 ms to 2300.0 ms of the run"
    ));
    // The windows in the range keep their numbers; the others are left
    // out.
    for n in 1..=4 {
        assert!(html.contains(&format!("<g class=\"fault-window\" data-window=\"{n}\">")));
    }
    assert_eq!(count(&html, "<rect class=\"fault\""), 4);
    // The lease taken at 0.9 s (lost at 1.66 s) and the thirteen taken
    // from 1 s to 2.2 s (the next one is granted 10 µs past the range),
    // each wide enough to draw on its own.
    assert_eq!(count(&html, "<rect class=\"lease\""), 14);
    assert!(!html.contains("class=\"lease merged\""));
    assert_eq!(count(&html, "<path class=\"refused\""), 1);
    let ticks: Vec<f64> = tags(&html, "text", "tick-label")
        .iter()
        .filter(|tag| tag.contains("text-anchor=\"middle\""))
        .map(|tag| text_after(&html, tag).parse().expect("a number"))
        .collect();
    assert!(ticks.len() >= 5, "{ticks:?}");
    assert!(
        ticks.iter().all(|t| (1000.0..=2300.0).contains(t)),
        "{ticks:?}"
    );
    // The lease taken before the range is cut at its left edge.
    let first = tags(&html, "rect", "lease")
        .into_iter()
        .find(|tag| tag.contains("data-token=\"t009\""))
        .expect("the lease taken at 0.9 s");
    assert_eq!(attr(first, "x"), 120.0, "{first}");
    // The counts are the whole run's.
    assert!(html.contains("writes: 149 accepted"));
    // A reversed range is the whole run.
    assert_eq!(
        render_html_between(&h.events, &run, 5..5),
        render_html(&h.events, &run)
    );
}

/// A saved history under `docs/` (the holder pause of the real harness
/// run the docs pictures were drawn from, cut to 0.7 s to 1.2 s), its
/// close-up page, and the paused holder's write: the one sent before the
/// pause and answered after it.
fn docs_history(name: &str) -> (Vec<leasehold_chaos::Event>, String, leasehold_chaos::Event) {
    let path = format!("{}/../../docs/{name}", env!("CARGO_MANIFEST_DIR"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let events = leasehold_chaos::history::read_jsonl(std::io::BufReader::new(file))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    // The cut keeps no final state: the checker can only say so.
    let run = check(&events);
    assert!(
        run.violations
            .iter()
            .all(|v| matches!(v, leasehold_chaos::Violation::MissingFinal { .. })),
        "{name}: {:?}",
        run.violations
    );
    let windows = leasehold_chaos::check::fault_windows(&events);
    assert_eq!(windows.len(), 1, "{name}");
    let (from, to) = (
        windows[0].from_us.expect("a start"),
        windows[0].to_us.expect("an end"),
    );
    let html = render_html_between(&events, &run, from - 60_000..to + 60_000);
    let paused = events
        .iter()
        .find(|e| match e.kind {
            Kind::Write { started_us, .. } => started_us < from && e.at_us > to,
            _ => false,
        })
        .cloned()
        .unwrap_or_else(|| panic!("{name}: no write spans the pause"));
    (events, html, paused)
}

#[test]
fn the_check_and_set_picture_shows_the_woken_holders_write_refused() {
    let (events, html, paused) = docs_history("pause-point-check-and-set.jsonl");
    // Paused between its read and its write, the holder wakes past its
    // lease and writes: the check refuses it.
    assert!(
        matches!(
            paused.kind,
            Kind::Write {
                outcome: WriteOutcome::RefusedStale,
                ..
            }
        ),
        "{paused:?}"
    );
    let refused = events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                Kind::Write {
                    outcome: WriteOutcome::RefusedStale,
                    ..
                }
            )
        })
        .count();
    assert_eq!(refused, 1);
    assert_eq!(count(&html, "<path class=\"refused\""), 1);
    assert!(count(&html, "<path class=\"in-flight\"") >= 1);
    assert!(count(&html, "<rect class=\"overlap\"") >= 2);
}

#[test]
fn the_guard_picture_shows_the_newer_holder_waiting_for_the_paused_commit() {
    let (events, html, paused) = docs_history("pause-point-guard.jsonl");
    // Paused just before its commit (inside the shield), the holder keeps
    // the guard's row lock: its commit lands when it wakes, and the newer
    // holder's write, sent during the pause with a higher fence, waits
    // for it and then commits. Nothing is refused.
    let Kind::Write {
        outcome: WriteOutcome::Accepted,
        fence: Some(paused_fence),
        ref resource,
        ..
    } = paused.kind
    else {
        panic!("{paused:?}");
    };
    let newer = events
        .iter()
        .find(|e| match &e.kind {
            Kind::Write {
                started_us,
                fence: Some(f),
                resource: r,
                outcome: WriteOutcome::Accepted,
                ..
            } => {
                r == resource
                    && *f > paused_fence
                    && *started_us < paused.at_us
                    && e.at_us > paused.at_us
            }
            _ => false,
        })
        .unwrap_or_else(|| panic!("no newer holder waited for {paused:?}"));
    assert_ne!(newer.actor, paused.actor);
    assert!(!events.iter().any(|e| matches!(
        e.kind,
        Kind::Write {
            outcome: WriteOutcome::RefusedStale,
            ..
        }
    )));
    assert_eq!(count(&html, "<path class=\"refused\""), 0);
    assert!(count(&html, "<path class=\"in-flight\"") >= 2);
}
