//! A fault-matrix verifier for lease locks.
//!
//! A Redis lock is a lease: it can expire under a slow holder, vanish in a
//! failover or a restart, or be paused away. What keeps money right is the
//! write path's own check. This crate runs real workloads against real
//! servers under injected faults, records every operation as a
//! [`history`], checks the invariants on that history, and draws a timeline
//! of who held the lock when.
//!
//! The history is the contract between the parts: the runner (the CLI's
//! worker processes, or a user's own write path) appends [`Event`]s, the
//! checker reads nothing else, so a saved history can be re-checked and
//! shared.
//!
//! To test your own write path, start a [`Lab`], pick a [`Lock`], and give
//! [`Harness::run`] your write (an async closure of a [`Call`] answering an
//! [`Outcome`], with [`Call::pause_point`] between its read and its write
//! and its work under [`Call::run`]) and your invariant over your own
//! final state ([`Kind::Final`] for a balance and its ledger, or
//! [`Kind::ResourceCheck`], e.g. [`Writes::check_counter`]);
//! [`Harness::run_with`] also gives each caller state of its own (its
//! database connection), set up before the run; [`Harness::term`] makes
//! each lease a leader's term of many writes. The harness
//! runs a negative control first, and its [`Verdict`] says what was
//! exercised: held (double holders absorbed, the control caught), never
//! broke, inconclusive (the control caught nothing) or broken, in the
//! words `leasehold chaos` prints (the [`verdicts`] module; the [`harness`] module: an honest
//! verdict, where the pause point goes, your own TLS Redis and ACL user); see
//! `examples/own_write_path.rs`. The `leasehold chaos` command is this
//! crate driven from worker processes, one run per mode and fault.

pub mod check;
pub mod history;
pub mod marks;
pub mod report;
pub mod timeline;
pub mod verdicts;

mod access;
mod callers;
mod fault;
pub mod harness;
mod isolated;
mod lab;
pub mod leaders;
mod outcome;
mod recorder;
mod schedule;

pub use access::HARNESS_ACL_RULES;
pub use callers::{Call, Callers, Lock, Stall, Written, label, lock_key};
pub use check::{CallerErrors, RunCheck, Violation, check};
pub use fault::{CLOCK_JUMP, CLOCK_RATE, Fault, PG_TINY_TIMEOUT, UnknownFault};
pub use harness::{Harness, HarnessError, NegativeControl, RunReport};
pub use history::{Event, Kind, WriteOutcome};
pub use lab::{ACL_RULES, ACL_USER, Lab, LabError, LabOptions, Pauser, run_nemesis};
pub use leaders::{Candidate, TermRecord};
pub use marks::{MarkedWindow, MarksError};
pub use outcome::{Outcome, Stopped, Tally, Writes};
pub use recorder::{Recorder, start_from_micros, start_to_micros};
pub use report::{MatrixVerdict, Row, check_file, rows, verdict};
pub use schedule::{Window, schedule};
pub use timeline::render_html;
pub use verdicts::{ControlVerdict, Verdict};
