//! One run's outcome: the tutorial's check line, or one JSON object.

use std::time::Duration;

use serde_json::{Map, Value, json};

/// What one run of an experiment observed.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub(crate) experiment: &'static str,
    pub(crate) run: u32,
    pub(crate) accepted: u64,
    pub(crate) balance: i64,
    pub(crate) expected: i64,
    /// The balance matches what was accepted, is not negative, and every
    /// extra condition of the experiment held.
    pub(crate) ok: bool,
    pub(crate) elapsed: Duration,
    /// Callers whose attempt failed with an error (not a refusal).
    pub(crate) errors: u64,
    /// Experiment-specific figures, printed after the check line.
    pub(crate) extra: Map<String, Value>,
    /// The keys of `extra` in the order they were added, with the label the
    /// human format prints instead of the key, if any.
    shown: Vec<(String, Option<&'static str>)>,
    /// Figures the tutorial also shows held (`demo` requires them on top of
    /// the verdict; they do not change `ok`).
    pub(crate) tutorial_also: bool,
    /// Lines the experiment printed along the way (the human format only).
    pub(crate) notes: Vec<String>,
    /// Lines printed right after the check line (the human format only).
    pub(crate) after: Vec<String>,
    /// Printed first on the figures line, in the tutorial's words (the human
    /// format only), e.g. `gave up=5`.
    pub(crate) headline: Option<String>,
}

/// How the note of a caller's error starts.
const ERROR_NOTE: &str = "error: ";

impl Report {
    /// The tutorial's check: the balance must equal the initial balance
    /// minus what the accepted spends took, and must not be negative.
    pub(crate) fn check(
        experiment: &'static str,
        initial: i64,
        amount: i64,
        accepted: u64,
        balance: i64,
        elapsed: Duration,
    ) -> Report {
        let spent = i64::try_from(accepted)
            .unwrap_or(i64::MAX)
            .saturating_mul(amount);
        let expected = initial.saturating_sub(spent);
        Report {
            experiment,
            run: 1,
            accepted,
            balance,
            expected,
            ok: balance == expected && balance >= 0,
            elapsed,
            errors: 0,
            extra: Map::new(),
            shown: Vec::new(),
            tutorial_also: true,
            notes: Vec::new(),
            after: Vec::new(),
            headline: None,
        }
    }

    /// Records the callers that failed with an error, and their first messages.
    pub(crate) fn errors(mut self, tally: &crate::wallet::Tally) -> Report {
        self.errors = tally.errors;
        for message in &tally.first_errors {
            self.notes.push(format!("{ERROR_NOTE}{message}"));
        }
        self
    }

    pub(crate) fn with_run(mut self, run: u32) -> Report {
        self.run = run;
        self
    }

    /// Adds an experiment-specific figure.
    pub(crate) fn extra(self, key: &str, value: impl Into<Value>) -> Report {
        self.add_extra(key, None, value.into())
    }

    /// Adds a figure that the human format prints as `label=value` (the
    /// tutorial's wording) and JSON as `key`.
    pub(crate) fn extra_as(
        self,
        key: &str,
        label: &'static str,
        value: impl Into<Value>,
    ) -> Report {
        self.add_extra(key, Some(label), value.into())
    }

    fn add_extra(mut self, key: &str, label: Option<&'static str>, value: Value) -> Report {
        if self.extra.insert(key.to_owned(), value).is_none() {
            self.shown.push((key.to_owned(), label));
        }
        self
    }

    /// Adds a figure the tutorial shows for this run that `demo` must also
    /// see (the verdict is unaffected).
    pub(crate) fn tutorial_also(mut self, holds: bool) -> Report {
        self.tutorial_also &= holds;
        self
    }

    /// Adds a line the experiment printed along the way.
    pub(crate) fn note(mut self, line: impl Into<String>) -> Report {
        self.notes.push(line.into());
        self
    }

    /// Adds a line to print right after the check line.
    pub(crate) fn after(mut self, line: impl Into<String>) -> Report {
        self.after.push(line.into());
        self
    }

    /// Starts the figures line with `text` (the human format only).
    pub(crate) fn headline(mut self, text: String) -> Report {
        self.headline = Some(text);
        self
    }

    /// Adds a condition the run must meet to be OK.
    pub(crate) fn require(mut self, holds: bool) -> Report {
        self.ok &= holds;
        self
    }

    pub(crate) fn verdict(&self) -> &'static str {
        if self.ok { "OK" } else { "BROKEN" }
    }

    /// `accepted=10 balance=0 expected=0 OK`
    pub(crate) fn check_line(&self) -> String {
        format!(
            "accepted={} balance={} expected={} {}",
            self.accepted,
            self.balance,
            self.expected,
            self.verdict()
        )
    }

    pub(crate) fn to_json(&self) -> Value {
        let mut object = Map::new();
        object.insert("experiment".into(), json!(self.experiment));
        object.insert("run".into(), json!(self.run));
        object.insert("accepted".into(), json!(self.accepted));
        object.insert("balance".into(), json!(self.balance));
        object.insert("expected".into(), json!(self.expected));
        object.insert("ok".into(), json!(self.ok));
        object.insert(
            "elapsed_ms".into(),
            json!(u64::try_from(self.elapsed.as_millis()).unwrap_or(u64::MAX)),
        );
        object.insert("errors".into(), json!(self.errors));
        for (key, value) in &self.extra {
            object.insert(key.clone(), value.clone());
        }
        Value::Object(object)
    }

    /// The first callers' errors, for stderr beside the JSON line:
    /// `leasehold: run 3: error: ...`.
    fn error_lines(&self) -> Vec<String> {
        self.notes
            .iter()
            .filter(|line| line.starts_with(ERROR_NOTE))
            .map(|line| format!("leasehold: run {}: {line}", self.run))
            .collect()
    }

    /// Prints the run: the check line and its figures, or one JSON line.
    pub(crate) fn print(&self, json: bool) {
        if json {
            // Stdout is the JSON line alone; the first errors' causes go
            // to stderr, where the human format's notes would be of no use.
            for line in self.error_lines() {
                crate::progress::note!("{line}");
            }
            println!("{}", self.to_json());
            return;
        }
        for line in &self.notes {
            println!("{line}");
        }
        println!("{}", self.check_line());
        for line in &self.after {
            println!("{line}");
        }
        let figures: Vec<String> = self
            .headline
            .iter()
            .cloned()
            .chain(self.shown.iter().filter_map(|(key, label)| {
                let value = self.extra.get(key)?;
                let name = label.unwrap_or(key);
                Some(match value {
                    Value::String(s) => format!("{name}={s}"),
                    other => format!("{name}={other}"),
                })
            }))
            .chain((self.errors > 0).then(|| format!("errors={}", self.errors)))
            .chain(std::iter::once(format!(
                "elapsed={}",
                humantime::format_duration(round_ms(self.elapsed))
            )))
            .collect();
        println!("{}", figures.join(" "));
    }
}

/// Rounds to whole milliseconds so durations print as `740ms`, not `740.123456ms`.
pub(crate) fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_line_matches_the_tutorial() {
        let r = Report::check("race", 100, 10, 50, 80, Duration::ZERO);
        assert_eq!(
            r.check_line(),
            "accepted=50 balance=80 expected=-400 BROKEN"
        );
        let r = Report::check("lock", 100, 10, 10, 0, Duration::ZERO);
        assert_eq!(r.check_line(), "accepted=10 balance=0 expected=0 OK");
        assert!(!r.clone().require(false).ok);
    }

    #[test]
    fn negative_balance_is_broken_even_when_it_adds_up() {
        let r = Report::check("x", 0, 10, 1, -10, Duration::ZERO);
        assert_eq!(r.expected, -10);
        assert!(!r.ok);
    }

    #[test]
    fn the_callers_errors_are_told_beside_the_json_line() {
        let tally = crate::wallet::Tally {
            accepted: 1,
            errors: 2,
            first_errors: vec!["connecting to postgresql: refused".into()],
        };
        let r = Report::check("verify", 100, 10, 1, 90, Duration::ZERO)
            .note("started")
            .errors(&tally)
            .with_run(3);
        assert_eq!(
            r.error_lines(),
            ["leasehold: run 3: error: connecting to postgresql: refused"]
        );
        assert_eq!(r.to_json()["errors"], 2);
        assert!(
            Report::check("x", 1, 1, 0, 1, Duration::ZERO)
                .error_lines()
                .is_empty()
        );
    }

    #[test]
    fn json_has_the_required_fields() {
        let v = Report::check("race", 100, 10, 50, 80, Duration::from_millis(12)).to_json();
        for key in [
            "experiment",
            "accepted",
            "balance",
            "expected",
            "ok",
            "elapsed_ms",
            "errors",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["ok"], false);
        assert_eq!(v["elapsed_ms"], 12);
    }

    #[test]
    fn figures_keep_their_order_and_labels() {
        let r = Report::check("ttl", 100, 10, 5, 80, Duration::ZERO)
            .extra_as("stale_releases", "refused stale releases", 5)
            .extra("lost", 0);
        let keys: Vec<&str> = r.shown.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["stale_releases", "lost"]);
        assert_eq!(r.to_json()["stale_releases"], 5);
        assert!(r.tutorial_also);
        assert!(!r.tutorial_also(false).tutorial_also);
    }
}
