//! A broken invariant: [`Violation`], and how it reads.

use std::fmt;

use serde::Serialize;

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Violation {
    /// The history has no [`Kind::Run`] header: nothing can be checked.
    ///
    /// [`Kind::Run`]: crate::history::Kind::Run
    MissingHeader,
    /// The balance is not the initial balance minus the accepted debits
    /// (minus any subset of the debits of unknown outcome).
    LostUpdate {
        /// The resource.
        resource: String,
        /// Its initial balance.
        initial: i64,
        /// The sum of its accepted debits.
        accepted: i64,
        /// How many writes of unknown outcome it had.
        unknown_writes: u64,
        /// The sum of their amounts.
        unknown_sum: i64,
        /// Its final balance.
        balance: i64,
        /// `initial - accepted`.
        expected: i64,
    },
    /// More ledger rows than accepted debits (plus debits of unknown
    /// outcome): a debit was applied twice.
    DuplicatedDebit {
        /// The resource.
        resource: String,
        /// Its ledger rows.
        ledger_rows: u64,
        /// Its accepted debits.
        accepted: u64,
        /// Its debits of unknown outcome.
        unknown: u64,
    },
    /// Fewer ledger rows than accepted debits: an acknowledged debit is not
    /// in the ledger.
    LostDebit {
        /// The resource.
        resource: String,
        /// Its ledger rows.
        ledger_rows: u64,
        /// Its accepted debits.
        accepted: u64,
    },
    /// The balance is not the initial balance minus the ledger's sum.
    LedgerMismatch {
        /// The resource.
        resource: String,
        /// Its initial balance.
        initial: i64,
        /// Its final balance.
        balance: i64,
        /// The sum of its ledger's amounts.
        ledger_sum: i64,
    },
    /// The final balance is below zero.
    NegativeBalance {
        /// The resource.
        resource: String,
        /// Its final balance.
        balance: i64,
    },
    /// A user-supplied invariant check said the state is wrong.
    InvariantFailed {
        /// Who ran the check.
        actor: String,
        /// What it said.
        detail: String,
    },
    /// A resource of the header has no [`Kind::Final`] state.
    ///
    /// [`Kind::Final`]: crate::history::Kind::Final
    MissingFinal {
        /// The resource.
        resource: String,
    },
    /// A resource is written or read but not in the header, so it cannot
    /// be checked.
    UnknownResource {
        /// The resource.
        resource: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::MissingHeader => {
                write!(
                    f,
                    "the history has no run header, so no resource was checked"
                )
            }
            Violation::LostUpdate {
                resource,
                initial,
                accepted,
                unknown_writes,
                unknown_sum,
                balance,
                expected,
            } => {
                write!(
                    f,
                    "lost: {resource} is {balance}, but {initial} less its committed writes \
                     ({accepted}) is {expected}"
                )?;
                if *unknown_writes > 0 {
                    write!(
                        f,
                        ", and no subset of its {unknown_writes} writes of unknown outcome \
                         (totalling {unknown_sum}) explains the difference"
                    )?;
                }
                f.write_str(": a committed write is missing from the final state")
            }
            Violation::DuplicatedDebit {
                resource,
                ledger_rows,
                accepted,
                unknown,
            } => write!(
                f,
                "duplicate: {resource} records {ledger_rows} writes for {accepted} committed \
                 and {unknown} of unknown outcome: a write applied twice"
            ),
            Violation::LostDebit {
                resource,
                ledger_rows,
                accepted,
            } => write!(
                f,
                "missing: {resource} records {ledger_rows} writes for {accepted} committed: \
                 {} committed writes missing from the final state",
                accepted.saturating_sub(*ledger_rows)
            ),
            Violation::LedgerMismatch {
                resource,
                initial,
                balance,
                ledger_sum,
            } => write!(
                f,
                "mismatch: {resource} is {balance}, but {initial} less the writes it records \
                 ({ledger_sum}) is {}",
                initial.saturating_sub(*ledger_sum)
            ),
            Violation::NegativeBalance { resource, balance } => {
                write!(f, "below zero: {resource} is {balance}")
            }
            Violation::InvariantFailed { actor, detail } => {
                write!(f, "invariant failed (checked by {actor}): {detail}")
            }
            Violation::MissingFinal { resource } => write!(
                f,
                "{resource} has no final state in the history, so it was not checked"
            ),
            Violation::UnknownResource { resource } => write!(
                f,
                "{resource} is written or read but not in the run header, so it was not checked"
            ),
        }
    }
}
