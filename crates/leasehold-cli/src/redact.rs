//! Keeps passwords in connection strings out of everything we print: URLs
//! (`scheme://user:secret@host`), PostgreSQL key=value strings
//! (`host=db password=secret`, `password='sec ret'`) and URL query
//! parameters (`?password=secret`).

/// `scheme://user:secret@host/...` becomes `scheme://user:***@host/...`.
pub(crate) fn redact_url(url: &str) -> String {
    redact_text(url)
}

/// Redacts every password found in `text`: in URLs, and as `password=...`
/// (key=value strings and query parameters, any case, quoted or not).
pub(crate) fn redact_text(text: &str) -> String {
    redact_key_values(&redact_urls(text))
}

/// `password=VALUE` becomes `password=***`, where VALUE runs to the next
/// white space, `&` or quote, or is a single-quoted string with `\'`
/// escapes.
fn redact_key_values(text: &str) -> String {
    const KEY: &str = "password=";
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(found) = lower[at..].find(KEY) {
        let start = at + found + KEY.len();
        out.push_str(&text[at..start]);
        out.push_str("***");
        let rest = &text[start..];
        let len = if let Some(quoted) = rest.strip_prefix('\'') {
            let mut escaped = false;
            let mut end = quoted.len();
            for (i, c) in quoted.char_indices() {
                match c {
                    '\\' if !escaped => escaped = true,
                    '\'' if !escaped => {
                        end = i + 1;
                        break;
                    }
                    _ => escaped = false,
                }
            }
            1 + end
        } else {
            rest.find(|c: char| c.is_whitespace() || c == '&' || c == '"' || c == '\'')
                .unwrap_or(rest.len())
        };
        at = start + len;
    }
    out.push_str(&text[at..]);
    out
}

/// Redacts the password of every URL found in `text`.
fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        let (head, tail) = rest.split_at(pos + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || c == '/' || c == '"' || c == '\'')
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(&userinfo[..colon]);
                        out.push_str(":***");
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
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
}
