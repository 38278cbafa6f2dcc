//! The guard that knows its lock: for a lease a [`PgLocker`] took on the
//! database the transaction writes to, the lease's own rows checked in
//! the transaction ([`GuardOptions::check_lease_row`]).
//!
//! The fence guard refuses a holder once a newer one has written; it
//! cannot see a holder whose lease ended while nobody took the lock since
//! (it froze after its guard and thawed past its lease's end). The lease
//! row can: with the option, the guard reads each of the lease's rows
//! (ours, unexpired on the database's clock) after the fence check, and
//! [`guarded`](crate::guarded()) checks them again right before the
//! `COMMIT`:
//!
//! - on tokio-postgres in the same batch as the `COMMIT` (no round trip of
//!   its own): a `DO` block that locks each row `FOR SHARE` and raises
//!   SQLSTATE `LH001` when one is gone, taken or expired, so the batch
//!   stops before the `COMMIT` and the transaction is rolled back;
//! - on sqlx in place of the `SELECT 1` it sends before the `COMMIT` (sqlx
//!   sends the `COMMIT` itself).
//!
//! The `FOR SHARE` lock is taken only there, for the commit's round trip:
//! no lock on the lease row is held during the work (it would block the
//! holder's own refresh, and a take-over). From the check to the end of
//! the `COMMIT` the row cannot change hands (a taker's update waits for
//! it), so a commit that passed it committed while the lease was ours on
//! the database's clock. Either check failing is
//! [`Guarded::Lost`](crate::Guarded::Lost) with
//! [`leasehold::LostCause::Expired`]: nothing written.
//!
//! [`PgLocker`]: crate::PgLocker
//! [`GuardOptions::check_lease_row`]: crate::GuardOptions::check_lease_row

use leasehold::{Lease, LostCause, Service};

use crate::error::{Error, Result};
use crate::statements::Statements;

/// The SQLSTATE the commit's check raises when a lease row is not ours
/// any more.
pub(crate) const LEASE_ENDED: &str = "LH001";

/// Whether the lease row of `$1` is held by `$2` and unexpired on the
/// database's clock.
const LEASE_HELD: &str = "SELECT EXISTS (SELECT 1 FROM leasehold_leases \
     WHERE resource = $1 AND holder = $2 AND expires_at > clock_timestamp())";

/// The lease's rows to check: each lock key with its token, as a
/// [`PgLocker`](crate::PgLocker) stores them.
///
/// # Errors
/// [`Error::Lease`] with [`leasehold::Error::InvalidOptions`] for a lease
/// another service granted: it has no rows here to check.
pub(crate) fn rows(lease: &Lease) -> Result<Vec<(String, String)>> {
    if lease.service() != Service::named("postgresql") {
        return Err(Error::Lease(leasehold::Error::InvalidOptions(
            "check_lease_row needs a lease a PgLocker took on this database",
        )));
    }
    Ok(lease
        .keys()
        .filter_map(|key| {
            let token = lease.token_for(key)?;
            Some((key.to_owned(), token.as_str().to_owned()))
        })
        .collect())
}

/// The error that says the lease ended before the commit.
pub(crate) fn ended(lease: &Lease, key: &str) -> Error {
    Error::Lease(leasehold::Error::LeaseLost {
        key: key.to_owned(),
        service: lease.service(),
        cause: LostCause::Expired,
    })
}

/// The guard's check: each of `rows` ours and unexpired, read without a
/// lock; the first that is not.
pub(crate) async fn first_ended<'r, S: Statements>(
    tx: &mut S,
    rows: &'r [(String, String)],
) -> Result<Option<&'r str>> {
    for (key, token) in rows {
        if !tx.flag(LEASE_HELD, &[key, token]).await? {
            return Ok(Some(key));
        }
    }
    Ok(None)
}

/// A dollar-quoting tag (`$lh0$`, `$lh1$`, ...) that occurs in none of
/// `texts`, so that any text between two of them is quoted exactly,
/// whatever the server's `standard_conforming_strings`.
fn tag(texts: &[&str]) -> String {
    (0..)
        .map(|n| format!("$lh{n}$"))
        .find(|tag| texts.iter().all(|text| !text.contains(tag.as_str())))
        .unwrap_or_default()
}

/// The commit's check, one statement with no parameters (it goes in the
/// `COMMIT`'s batch): locks each of `rows` `FOR SHARE` if it is ours and
/// unexpired on the database's clock, and raises [`LEASE_ENDED`] (naming
/// the key) for the first that is not. Keys are quoted with a
/// dollar-quoting tag none of them contains; tokens are hex.
pub(crate) fn commit_check(rows: &[(String, String)]) -> String {
    let keys: Vec<&str> = rows.iter().map(|(key, _)| key.as_str()).collect();
    let inner = tag(&keys);
    let mut body = String::from("BEGIN ");
    for (key, token) in rows {
        let token: String = token.chars().filter(char::is_ascii_hexdigit).collect();
        body.push_str(&format!(
            "PERFORM 1 FROM leasehold_leases WHERE resource = {inner}{key}{inner} \
             AND holder = '{token}' AND expires_at > clock_timestamp() FOR SHARE; \
             IF NOT FOUND THEN RAISE EXCEPTION 'the lease on % has ended', {inner}{key}{inner} \
             USING ERRCODE = '{LEASE_ENDED}'; END IF; "
        ));
    }
    body.push_str("END");
    let outer = tag(&[keys.as_slice(), &[inner.as_str(), body.as_str()]].concat());
    format!("DO {outer}{body}{outer}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_that_holds_a_tag_is_quoted_with_another() {
        let rows = [("a$lh0$b".to_owned(), "00ff".to_owned())];
        let sql = commit_check(&rows);
        assert!(sql.contains("$lh1$a$lh0$b$lh1$"), "{sql}");
        assert!(sql.starts_with("DO $lh2$"), "{sql}");
        assert!(sql.ends_with("$lh2$"), "{sql}");
    }

    #[test]
    fn a_token_is_hex_alone() {
        let rows = [("k".to_owned(), "ab'; DROP".to_owned())];
        assert!(commit_check(&rows).contains("holder = 'abD'"));
    }
}
