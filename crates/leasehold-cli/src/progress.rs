//! Progress bars on stderr for the runs that take a while (`demo`, the
//! `bench` subcommands, `redlock`; anything long that comes later can use
//! [`Progress`] the same way).
//!
//! Why bars are so shy: stdout carries the results, and people pipe it, so
//! a bar is drawn on stderr only, only when stderr is a terminal, and never
//! with `--json`. A bar appears once its run has gone on for [`DELAY`], so
//! a quick run does not flicker. While a bar is on screen, every other line
//! the CLI writes to stderr goes through [`suspend`] (the [`note!`] macro
//! and the log writer, [`LogWriter`], do), so lines do not tear through the
//! bar.

use std::borrow::Cow;
use std::io::{self, IsTerminal, Write};
use std::sync::OnceLock;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long a run goes on before its bar is drawn.
const DELAY: Duration = Duration::from_secs(2);

/// How often a drawn bar's spinner and clock move.
const TICK: Duration = Duration::from_millis(100);

/// The bars of this process; unset when bars are off.
static BARS: OnceLock<MultiProgress> = OnceLock::new();

/// Turns bars on for this process when stderr is a terminal and the output
/// is not JSON. Call once, before the first [`Progress`]; without it bars
/// stay off.
pub(crate) fn init(json: bool) {
    if !json && io::stderr().is_terminal() {
        let _ = BARS.set(MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
    }
}

/// Whether bars are drawn in this process.
pub(crate) fn enabled() -> bool {
    BARS.get().is_some()
}

/// Runs `f` (which writes to stderr) with the bars wiped, and redraws them
/// after.
pub(crate) fn suspend<R>(f: impl FnOnce() -> R) -> R {
    match BARS.get() {
        Some(bars) => bars.suspend(f),
        None => f(),
    }
}

/// `eprintln!` that keeps the progress bars intact.
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::progress::suspend(|| eprintln!($($arg)*))
    };
}
pub(crate) use note;

/// One bar: `len` items, the current one named. Cleared when dropped (so an
/// interrupted or failed run leaves no bar behind).
pub(crate) struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar `what [=====>    ] 3/18 message 4s`, drawn once the run has
    /// taken [`DELAY`] (if bars are on at all).
    pub(crate) fn new(what: &'static str, len: u64) -> Progress {
        let style = ProgressStyle::with_template(
            "{spinner} {prefix} [{bar:24}] {pos}/{len} {wide_msg} {elapsed}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden())
            .with_style(style)
            .with_prefix(what);
        if let (Some(bars), Ok(runtime)) = (BARS.get(), tokio::runtime::Handle::try_current()) {
            let later = bar.downgrade();
            runtime.spawn(async move {
                tokio::time::sleep(DELAY).await;
                if let Some(bar) = later.upgrade().filter(|bar| !bar.is_finished()) {
                    bars.add(bar).enable_steady_tick(TICK);
                }
            });
        }
        Progress { bar }
    }

    /// Moves on to the next item, named `what`: the bar then shows its
    /// number, e.g. `3/18 what`.
    pub(crate) fn start(&self, what: impl Into<Cow<'static, str>>) {
        self.bar.inc(1);
        self.bar.set_message(what);
    }

    /// A handle for tasks that count items as they finish.
    pub(crate) fn ticker(&self) -> Ticker {
        Ticker(self.bar.clone())
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Counts finished items on a [`Progress`] bar from any task.
#[derive(Clone)]
pub(crate) struct Ticker(ProgressBar);

impl Ticker {
    /// One more item finished.
    pub(crate) fn done(&self) {
        self.0.inc(1);
    }

    /// Says what is going on, after the count.
    pub(crate) fn message(&self, what: impl Into<Cow<'static, str>>) {
        self.0.set_message(what);
    }
}

/// The log's writer: stderr, with the bars wiped while a line is written.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LogWriter;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> LogWriter {
        LogWriter
    }
}

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        suspend(|| io::stderr().write(buf))
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        suspend(|| io::stderr().write_all(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_init_a_bar_counts_but_draws_nothing() {
        let progress = Progress::new("test", 3);
        progress.start("one");
        progress.ticker().done();
        assert_eq!(progress.bar.position(), 2);
        assert!(progress.bar.is_hidden());
        assert!(!enabled());
        assert_eq!(suspend(|| 7), 7);
        drop(progress);
    }
}
