//! A budget of time, resolved once where it comes in.
//!
//! An acquire's wait ([`AcquireOptions::wait`] or
//! [`deadline`](crate::AcquireOptions::deadline)) becomes one [`Budget`] at
//! the entry of every way of taking a lease (the door of the acquire
//! path, `acquire::door`), as tower's `Timeout` turns a duration into one
//! deadline where the request enters; every layer below sees only that
//! budget, and the command timeout caps it for one request in one place,
//! [`Budget::for_request`]. An election's fault budget ("faults may keep
//! every round from winning this long") is the same type, started when
//! the first fault in a row is seen.
//!
//! [`AcquireOptions::wait`]: crate::AcquireOptions::wait

use std::time::Duration;

use tokio::time::Instant;

/// A span of time with a start and a deadline, on tokio's monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    start: Instant,
    deadline: Instant,
}

impl Budget {
    /// The budget from `start` until `deadline`.
    pub(crate) fn until(start: Instant, deadline: Instant) -> Budget {
        Budget { start, deadline }
    }

    /// `span` from now.
    pub(crate) fn from_now(span: Duration) -> Budget {
        let start = Instant::now();
        Budget::until(start, start + span)
    }

    /// What is left of this budget, counted from now: the same deadline, a
    /// new start (each key of `acquire_all` reports its own wait).
    pub(crate) fn rest(self) -> Budget {
        Budget::until(Instant::now(), self.deadline)
    }

    /// When it started.
    pub(crate) fn start(self) -> Instant {
        self.start
    }

    /// When it runs out.
    pub(crate) fn deadline(self) -> Instant {
        self.deadline
    }

    /// Whether it has run out.
    pub(crate) fn is_spent(self) -> bool {
        Instant::now() >= self.deadline
    }

    /// The deadline of one request sent at `sent_at` under this budget:
    /// the budget's, capped by `command_timeout` (the one place an
    /// acquire's wait meets the bound on a request); and whether the cap
    /// left the request less than the command timeout (the budget cut it
    /// short).
    pub(crate) fn for_request(
        self,
        sent_at: Instant,
        command_timeout: Duration,
    ) -> (Instant, bool) {
        let full = sent_at + command_timeout;
        (self.deadline.min(full), self.deadline < full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn a_request_gets_the_command_timeout_or_what_is_left() {
        let budget = Budget::from_now(100 * MS);
        let now = Instant::now();
        assert_eq!(budget.for_request(now, 30 * MS), (now + 30 * MS, false));
        assert_eq!(budget.for_request(now, 300 * MS), (now + 100 * MS, true));
        tokio::time::sleep(40 * MS).await;
        let rest = budget.rest();
        assert_eq!(rest.deadline(), budget.deadline());
        assert_eq!(rest.start(), Instant::now());
        assert!(!rest.is_spent());
        tokio::time::sleep(60 * MS).await;
        assert!(budget.is_spent());
    }
}
