//! The timeline in a real browser: headless Chromium loads the page,
//! dumps the DOM it built and takes a screenshot.
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
    assert!(dom.contains("OK: no violation"), "{dom}");

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
