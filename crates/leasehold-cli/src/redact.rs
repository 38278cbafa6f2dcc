//! Keeps passwords in connection strings out of everything we print:
//!
//! - URL userinfo, any scheme (`redis://`, `rediss://`, `postgres://`,
//!   `postgresql://`, ...): `scheme://user:secret@host` becomes
//!   `scheme://user:***@host`. The userinfo runs to the last `@` of the URL,
//!   so a password holding an unencoded `/`, `?` or `@` is hidden whole (an
//!   `@` later in the URL can hide more than the password, never less);
//! - key=value strings (PostgreSQL's): `password=secret`,
//!   `password = 'sec ret'`, `password="sec ret"`, and any key ending in
//!   `password` (`sslpassword=`, `PGPASSWORD=`), any case;
//! - URL query parameters: `?password=secret`, `&sslpassword=secret`, and
//!   `?pass=secret` (redis-rs's `redis+unix://` URLs).

/// `scheme://user:secret@host/...` becomes `scheme://user:***@host/...`.
pub(crate) fn redact_url(url: &str) -> String {
    redact_text(url)
}

/// Redacts every password found in `text`: in URLs, and as the value of a
/// key named `pass` or ending in `password` (key=value strings and query
/// parameters, any case, quoted or not).
pub(crate) fn redact_text(text: &str) -> String {
    redact_key_values(&redact_urls(text))
}

/// Replaces the value of every secret key with `***`.
fn redact_key_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    // text[..copied] is in `out`; the search for '=' resumes at `from`.
    let (mut copied, mut from) = (0, 0);
    while let Some(found) = text[from..].find('=') {
        let eq = from + found;
        from = eq + 1;
        let before = text[..eq].trim_end_matches([' ', '\t']);
        let key_start = before
            .char_indices()
            .rev()
            .find(|&(_, c)| !is_key_char(c))
            .map_or(0, |(at, c)| at + c.len_utf8());
        let key = before[key_start..].to_ascii_lowercase();
        if !(key == "pass" || key.ends_with("password")) {
            continue;
        }
        let in_query = before[..key_start].ends_with(['?', '&']);
        let after = &text[eq + 1..];
        let value_start = eq + 1 + (after.len() - after.trim_start_matches([' ', '\t']).len());
        let value_end = value_start + value_len(&text[value_start..], in_query);
        out.push_str(&text[copied..value_start]);
        out.push_str("***");
        copied = value_end;
        from = value_end.max(from);
    }
    out.push_str(&text[copied..]);
    out
}

/// Characters of a key in `key=value`.
fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// The length of the value at the start of `rest`: a single- or
/// double-quoted string with `\` escapes (to the end if unterminated), or
/// everything up to white space or a quote, and in a URL query also up to
/// the next `&` or `#`.
fn value_len(rest: &str, in_query: bool) -> usize {
    match rest.chars().next() {
        Some(quote @ ('\'' | '"')) => {
            let mut escaped = false;
            for (at, c) in rest.char_indices().skip(1) {
                match c {
                    '\\' if !escaped => escaped = true,
                    c if c == quote && !escaped => return at + 1,
                    _ => escaped = false,
                }
            }
            rest.len()
        }
        _ => rest
            .find(|c: char| {
                c.is_whitespace() || c == '\'' || c == '"' || (in_query && (c == '&' || c == '#'))
            })
            .unwrap_or(rest.len()),
    }
}

/// Redacts the password of every URL found in `text`.
fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        let (head, tail) = rest.split_at(pos + 3);
        out.push_str(head);
        let url_end = tail
            .find(|c: char| c.is_whitespace() || c == '"' || c == '\'')
            .unwrap_or(tail.len());
        match tail[..url_end].rfind('@') {
            Some(at) => {
                let userinfo = &tail[..at];
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(&userinfo[..colon]);
                        out.push_str(":***");
                    }
                    None => out.push_str(userinfo),
                }
                rest = &tail[at..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_passwords_keeps_the_rest() {
        assert_eq!(
            redact_url("redis://:s3cret@127.0.0.1:6379/0"),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact_url("postgres://app:pa:ss@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379/"),
            "redis://127.0.0.1:6379/"
        );
        assert_eq!(
            redact_url("redis+sentinel://u:s3cret@10.0.0.1:26379,10.0.0.2/mymaster/1"),
            "redis+sentinel://u:***@10.0.0.1:26379,10.0.0.2/mymaster/1"
        );
        assert_eq!(
            redact_text("failed to reach redis://u:x@h:1 and postgres://p:y@q/db"),
            "failed to reach redis://u:***@h:1 and postgres://p:***@q/db"
        );
    }

    #[test]
    fn hides_key_value_and_query_passwords() {
        assert_eq!(
            redact_text("host=db user=app password=topsecret dbname=app"),
            "host=db user=app password=*** dbname=app"
        );
        assert_eq!(
            redact_text(r"host=db PASSWORD='top secret \' still' port=5432"),
            "host=db PASSWORD=*** port=5432"
        );
        assert_eq!(
            redact_text("postgres://db/app?user=app&password=topsecret&sslmode=require"),
            "postgres://db/app?user=app&password=***&sslmode=require"
        );
        assert_eq!(redact_text("password="), "password=***");
        assert!(!redact_text("password='unterminated").contains("unterminated"));
    }

    #[test]
    fn hides_url_passwords_of_every_scheme() {
        for (url, shown) in [
            ("rediss://u:s3cret@h:6380/0", "rediss://u:***@h:6380/0"),
            (
                "postgresql://app:s3cret@db/app",
                "postgresql://app:***@db/app",
            ),
            (
                "redis+unix:///tmp/r.sock?db=1&pass=s3cret",
                "redis+unix:///tmp/r.sock?db=1&pass=***",
            ),
            (
                "unix:///tmp/r.sock?pass=s3cret&db=1",
                "unix:///tmp/r.sock?pass=***&db=1",
            ),
            // Unencoded '/', '?' and '@' in the password.
            ("redis://u:pa/ss@h:1/0", "redis://u:***@h:1/0"),
            ("redis://u:pa?ss@h:1", "redis://u:***@h:1"),
            ("redis://u:p@ss@h:1", "redis://u:***@h:1"),
            // No password: nothing to hide.
            ("redis://user@h:1/", "redis://user@h:1/"),
            ("redis://h:1/0?x=1", "redis://h:1/0?x=1"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
        let json = r#"{"url":"postgres://a:s3cret@h/db","n":1}"#;
        assert_eq!(
            redact_text(json),
            r#"{"url":"postgres://a:***@h/db","n":1}"#
        );
    }

    #[test]
    fn hides_every_key_value_form() {
        for (text, shown) in [
            (
                "host=db password = s3cret user=app",
                "host=db password = *** user=app",
            ),
            (
                r#"host=db password="top s3cret" user=app"#,
                "host=db password=*** user=app",
            ),
            (r#"password="a \" s3cret" port=1"#, "password=*** port=1"),
            (
                "host=db sslpassword=s3cret sslmode=verify-full",
                "host=db sslpassword=*** sslmode=verify-full",
            ),
            ("PGPASSWORD=s3cret psql", "PGPASSWORD=*** psql"),
            // In a key=value string '&' is part of the value; in a query
            // it ends it.
            (
                "host=db password=s3&cret user=app",
                "host=db password=*** user=app",
            ),
            (
                "postgres://h/db?sslpassword=s3cret&user=app",
                "postgres://h/db?sslpassword=***&user=app",
            ),
            (
                "postgres://h/db?password=s3cret#frag",
                "postgres://h/db?password=***#frag",
            ),
            // Keys that only look alike, and free text, are kept.
            (
                "bypass=1 passes=2 password authentication failed",
                "bypass=1 passes=2 password authentication failed",
            ),
            ("héllo password=s3crét wörld", "héllo password=*** wörld"),
        ] {
            assert_eq!(redact_text(text), shown, "{text}");
            assert!(!redact_text(text).contains("s3c"), "{text}");
        }
    }
}
