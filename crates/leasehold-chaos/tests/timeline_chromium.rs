//! The timeline in a real browser: headless Chromium loads the page,
//! dumps the DOM it built and takes a screenshot; on a 15 s run with ten
//! fault windows it measures the labels it drew (no two overlap, before
//! and after a zoom) and drives the zoom and the tooltip.
//!
//! Needs `chromium` on `PATH` (or its path in `LEASEHOLD_CHROMIUM`):
//! `scripts/install-deps.sh` installs it (`apt-get install chromium` on
//! Debian). Not finding it fails the test, with that advice.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use leasehold_chaos::check::check;
use leasehold_chaos::render_html;

/// How long one Chromium run may take before `timeout` kills it.
const CHROMIUM_DEADLINE: &str = "120";

fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("LEASEHOLD_CHROMIUM") {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in [
            "chromium",
            "chromium-browser",
            "google-chrome",
            "google-chrome-stable",
        ] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "chromium not found on PATH: run scripts/install-deps.sh (on Debian/Ubuntu it runs \
         `apt-get install chromium`), or set LEASEHOLD_CHROMIUM to a Chromium or Chrome binary"
    );
}

/// Runs headless Chromium on `page` with `extra` flags, under a deadline.
fn run_chromium(profile: &Path, page: &Path, extra: &[String]) -> Output {
    let binary = chromium();
    let output = Command::new("timeout")
        .arg("--kill-after=5")
        .arg(CHROMIUM_DEADLINE)
        .arg(&binary)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1400,900",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} under timeout: {e}", binary.display()));
    assert!(
        output.status.success(),
        "{} failed ({}; 124 is the {CHROMIUM_DEADLINE} s deadline):\n{}",
        binary.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn the_timeline_renders_in_headless_chromium() -> Result<(), Box<dyn std::error::Error>> {
    let history = common::sample();
    let run = check(&history.events);
    let html = render_html(&history.events, &run);
    let dir = tempfile::tempdir()?;
    let page = dir.path().join("run.html");
    std::fs::write(&page, &html)?;

    let dom = run_chromium(
        &dir.path().join("profile-dom"),
        &page,
        &["--dump-dom".into()],
    );
    let dom = String::from_utf8(dom.stdout)?;
    let count = |needle: &str| dom.matches(needle).count();
    assert_eq!(count("<svg id=\"timeline\""), 1, "{dom}");
    assert_eq!(count("class=\"lane\""), 4, "{dom}");
    assert_eq!(count("<rect class=\"fault\""), 2, "{dom}");
    assert!(count("<rect class=\"lease\"") >= 40, "{dom}");
    assert!(count("<rect class=\"overlap\"") >= 2, "{dom}");
    assert_eq!(count("<path class=\"refused\""), 1, "{dom}");
    assert_eq!(count("<circle class=\"unknown\""), 1, "{dom}");
    assert!(
        dom.contains("double holders absorbed; no control ran"),
        "{dom}"
    );

    let shot = dir.path().join("shot.png");
    run_chromium(
        &dir.path().join("profile-shot"),
        &page,
        &[format!("--screenshot={}", shot.display())],
    );
    let png = std::fs::read(&shot)
        .map_err(|e| format!("chromium wrote no screenshot at {}: {e}", shot.display()))?;
    assert_eq!(png.get(..8), Some(&b"\x89PNG\r\n\x1a\n"[..]), "not a PNG");
    // The IHDR chunk: width and height, big-endian, after its length and
    // type.
    let dimension = |at: usize| {
        png.get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    assert_eq!((dimension(16), dimension(20)), (Some(1400), Some(900)));
    // A blank 1400x900 page compresses to a few kilobytes; the chart does not.
    assert!(
        png.len() > 20_000,
        "a {} byte screenshot is nearly blank",
        png.len()
    );
    if let Some(keep) = std::env::var_os("LEASEHOLD_KEEP_SCREENSHOT") {
        std::fs::copy(&shot, keep)?;
    }
    Ok(())
}

/// Run by Chromium after the page's own script: measures every visible
/// label, zooms (a fault window from the list, a drag, reset), hovers a
/// lease, and writes what it saw as JSON into `pre#check`.
const PROBE: &str = r##"<pre id="check"></pre><script>
(function () {
  var svg = document.getElementById("timeline");
  function boxes(sel) {
    return Array.prototype.filter.call(document.querySelectorAll(sel), function (e) {
      return e.getAttribute("display") !== "none";
    }).map(function (e) {
      var b = e.getBBox();
      return { text: e.textContent, x0: b.x, x1: b.x + b.width, y0: b.y, y1: b.y + b.height };
    });
  }
  function overlaps(bs) {
    var out = [];
    for (var i = 0; i < bs.length; i++) for (var j = i + 1; j < bs.length; j++) {
      var a = bs[i], b = bs[j];
      if (!(a.x1 <= b.x0 || b.x1 <= a.x0 || a.y1 <= b.y0 || b.y1 <= a.y0)) out.push(a.text + " / " + b.text);
    }
    return out;
  }
  function look() {
    var labels = boxes("text.fault-label"), ticks = boxes("g.ticks text.tick-label");
    var lanes = boxes("text.lane-label");
    return {
      overlaps: overlaps(labels).concat(overlaps(ticks)).concat(overlaps(labels.concat(lanes))),
      labels: labels.map(function (l) { return l.text; }),
      outside: labels.filter(function (l) { return l.x0 < 119.5 || l.x1 > 1280.5; }).map(function (l) { return l.text; }),
      lanes_too_wide: lanes.filter(function (l) { return l.x1 > 118; }).map(function (l) { return l.text; }),
      ticks: ticks.map(function (t) { return +t.text; }),
      range: document.getElementById("zoom-range").textContent,
      lanes_top: +svg.getAttribute("data-top"),
      labels_bottom: Math.max.apply(null, labels.map(function (l) { return l.y1; })),
      band2: +document.querySelector("g.fault-window[data-window='2'] rect.fault").getAttribute("width")
    };
  }
  var out = { controls_hidden: document.getElementById("zoom-controls").hidden,
    titles_left: svg.querySelectorAll("title").length };
  out.whole = look();
  if (out.controls_hidden) {
    // The page without its script: the static layout alone.
    document.getElementById("check").textContent = JSON.stringify(out);
    return;
  }
  document.querySelector("#faults li[data-window='2']").click();
  out.window2 = look();
  document.querySelector("[data-zoom=reset]").click();
  var left = svg.getBoundingClientRect().left, top = svg.getBoundingClientRect().top;
  function mouse(type, target, x) {
    target.dispatchEvent(new MouseEvent(type, { bubbles: true, button: 0, clientX: left + x, clientY: top + 60 }));
  }
  mouse("mousedown", svg, 120 + 1160 * 4 / 15);
  mouse("mousemove", window, 120 + 1160 * 6 / 15);
  mouse("mouseup", window, 120 + 1160 * 6 / 15);
  out.dragged = look();
  document.querySelector("[data-zoom=reset]").click();
  out.reset = look();
  var lease = svg.querySelector("rect.lease[data-token='t020']");
  var b = lease.getBoundingClientRect();
  lease.dispatchEvent(new MouseEvent("mousemove", { bubbles: true, clientX: b.left + 2, clientY: b.top + 2 }));
  var tip = document.getElementById("tip");
  out.tip = tip.hidden ? "" : tip.textContent;
  document.getElementById("check").textContent = JSON.stringify(out);
})();
</script>
</body>"##;

/// Loads `html` with [`PROBE`] in Chromium and returns what it saw.
fn probe(dir: &Path, html: &str) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let page = dir.join("run.html");
    std::fs::write(&page, html.replace("</body>", PROBE))?;
    let dom = run_chromium(&dir.join("profile-dom"), &page, &["--dump-dom".into()]);
    let dom = String::from_utf8(dom.stdout)?;
    let start = dom
        .find("<pre id=\"check\">")
        .ok_or("no probe in the DOM")?
        + 16;
    let end = start + dom[start..].find("</pre>").ok_or("no probe end")?;
    let json = dom[start..end]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    Ok(serde_json::from_str(&json)?)
}

#[test]
fn labels_zoom_and_tooltips_work_in_headless_chromium() -> Result<(), Box<dyn std::error::Error>> {
    let history = common::fifteen_seconds_ten_faults();
    let run = check(&history.events);
    let html = render_html(&history.events, &run);

    // Without the script, the labels as the page lays them out (estimated
    // widths), measured in the browser's fonts.
    let script = html.find("<script>").ok_or("no script")?;
    let script_end = html.find("</script>").ok_or("no script end")? + "</script>".len();
    let mut static_page = html.clone();
    static_page.replace_range(script..script_end, "");
    let dir = tempfile::tempdir()?;
    let seen = probe(dir.path(), &static_page)?;
    let at = |path: &str| seen.pointer(path).cloned().unwrap_or_default();
    assert_eq!(at("/controls_hidden"), true, "{seen:#}");
    assert_eq!(
        at("/titles_left").as_u64().map(|n| n > 300),
        Some(true),
        "{seen:#}"
    );
    assert_eq!(at("/whole/overlaps"), serde_json::json!([]), "{seen:#}");
    assert_eq!(at("/whole/outside"), serde_json::json!([]), "{seen:#}");
    assert_eq!(
        at("/whole/lanes_too_wide"),
        serde_json::json!([]),
        "{seen:#}"
    );
    assert_eq!(
        at("/whole/labels").as_array().map(Vec::len),
        Some(10),
        "{seen:#}"
    );
    assert!(
        at("/whole/labels_bottom").as_f64() <= at("/whole/lanes_top").as_f64(),
        "{seen:#}"
    );

    let dir = tempfile::tempdir()?;
    let seen = probe(dir.path(), &html)?;
    let at = |path: &str| seen.pointer(path).cloned().unwrap_or_default();
    assert_eq!(at("/controls_hidden"), false, "{seen:#}");
    assert_eq!(at("/titles_left"), 0, "{seen:#}");
    for view in ["whole", "window2", "dragged", "reset"] {
        assert_eq!(
            at(&format!("/{view}/overlaps")),
            serde_json::json!([]),
            "{view}: {seen:#}"
        );
        assert_eq!(
            at(&format!("/{view}/outside")),
            serde_json::json!([]),
            "{view}: {seen:#}"
        );
        assert_eq!(
            at(&format!("/{view}/lanes_too_wide")),
            serde_json::json!([]),
            "{view}: {seen:#}"
        );
    }
    assert_eq!(
        at("/whole/labels").as_array().map(Vec::len),
        Some(10),
        "{seen:#}"
    );
    assert_eq!(at("/whole/range"), "the whole chart", "{seen:#}");
    // Zoomed to window 2 (1250 ms to 1500 ms): its band fills most of the
    // plot, its label is whole, and the ticks are re-drawn inside it.
    let band = at("/window2/band2").as_f64().unwrap_or_default();
    assert!(band > 700.0 && band < 1160.0, "{seen:#}");
    let labels = at("/window2/labels");
    assert!(
        labels
            .as_array()
            .into_iter()
            .flatten()
            .any(|l| l == "#2 redis-pause (redis)"),
        "{seen:#}"
    );
    let ticks: Vec<f64> = at("/window2/ticks")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_f64)
        .collect();
    assert!(ticks.len() >= 4, "{seen:#}");
    assert!(
        ticks.iter().all(|t| (1200.0..=1550.0).contains(t)),
        "{seen:#}"
    );
    assert!(
        at("/window2/range")
            .as_str()
            .unwrap_or_default()
            .starts_with("showing 12"),
        "{seen:#}"
    );
    // The drag from 4 s to 6 s.
    let ticks: Vec<f64> = at("/dragged/ticks")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_f64)
        .collect();
    assert!(
        ticks.iter().all(|t| (3990.0..=6010.0).contains(t)) && ticks.len() >= 4,
        "{seen:#}"
    );
    assert_eq!(at("/reset/range"), "the whole chart", "{seen:#}");
    // The tooltip shows the lease's details.
    let tip = at("/tip");
    let tip = tip.as_str().unwrap_or_default();
    assert!(tip.contains("token t020, fence 21"), "{seen:#}");
    Ok(())
}

#[test]
fn the_script_runs_to_the_end_on_pages_without_faults_or_lanes()
-> Result<(), Box<dyn std::error::Error>> {
    let clean = common::History::clean();
    let pages = [
        ("empty", render_html(&[], &check(&[]))),
        ("clean", render_html(&clean.events, &check(&clean.events))),
        (
            "close-up",
            leasehold_chaos::timeline::render_html_between(
                &clean.events,
                &check(&clean.events),
                250..450,
            ),
        ),
    ];
    for (name, html) in pages {
        let dir = tempfile::tempdir()?;
        let page = dir.path().join("run.html");
        std::fs::write(&page, &html)?;
        let dom = run_chromium(&dir.path().join("profile"), &page, &["--dump-dom".into()]);
        let dom = String::from_utf8(dom.stdout)?;
        // The script's last steps: the controls shown, the range named.
        assert!(dom.contains("<div id=\"zoom-controls\">"), "{name}: {dom}");
        assert!(
            dom.contains("<span id=\"zoom-range\">the whole chart</span>"),
            "{name}: {dom}"
        );
    }
    Ok(())
}
