//! An error as one line for a person: its causes, each said once, with
//! the PostgreSQL server's code where the text hides it.

/// An error and its causes, `a: b: c`, without a cause that only repeats
/// the message before it (redis-rs wraps an I/O error whose text is its
/// own: `broken pipe: broken pipe`).
pub(crate) fn chain(err: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if parts.last().is_some_and(|last| last.ends_with(&text)) {
            continue;
        }
        parts.push(text);
    }
    parts.join(": ")
}

/// [`chain`], with the SQLSTATE of an error the PostgreSQL server answered
/// with where the text does not say it yet: tokio-postgres's `db error`
/// hides the server's words in its source, a [`DbError`], whose message
/// says neither its code nor (never) a password.
///
/// [`DbError`]: leasehold_pg::tokio_postgres::error::DbError
pub(crate) fn describe(err: &anyhow::Error) -> String {
    let mut text = chain(err);
    let codes = err.chain().filter_map(|cause| {
        cause
            .downcast_ref::<leasehold_pg::tokio_postgres::error::DbError>()
            .map(|db| db.code().code())
    });
    for code in codes {
        if !text.contains(code) {
            text.push_str(&format!(" (sqlstate {code})"));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_description_without_a_server_error_is_the_chain() {
        let err = anyhow::anyhow!("refused").context("connecting to postgresql");
        assert_eq!(describe(&err), "connecting to postgresql: refused");
    }

    #[test]
    fn an_error_chain_says_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
        let err = anyhow::Error::new(io)
            .context("broken pipe")
            .context("redis unreachable during acquire");
        assert_eq!(chain(&err), "redis unreachable during acquire: broken pipe");
        let distinct = anyhow::anyhow!("refused").context("connecting to postgresql");
        assert_eq!(chain(&distinct), "connecting to postgresql: refused");
    }
}
