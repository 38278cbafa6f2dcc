//! The TLS parameters of a libpq connection string: `sslmode`,
//! `sslrootcert`, `sslcert` and `sslkey` (their meaning is in
//! [`connect`](crate::connect())'s docs), taken out of the string in URL or
//! `key=value` form before tokio-postgres parses it (its parser knows none
//! of them but `sslmode`, and not all its values), and what they ask of a
//! build with or without the `tls` feature. Parsing only: the rustls
//! settings they make are in `tls` (feature `tls`).

use tokio_postgres::config::SslMode;

use crate::error::{Error, Result};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The TLS parameters taken out of a connection string.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Params {
    mode: Option<Mode>,
    root_cert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

/// The parameter names handled here.
const NAMES: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

impl Params {
    fn set(&mut self, key: &str, value: String) -> Result<()> {
        match key {
            "sslmode" => {
                self.mode = Some(match value.as_str() {
                    "disable" => Mode::Disable,
                    "prefer" => Mode::Prefer,
                    "require" => Mode::Require,
                    "verify-ca" => Mode::VerifyCa,
                    "verify-full" => Mode::VerifyFull,
                    // allow: libpq's other modes are about servers without
                    // TLS, which tokio-postgres handles as prefer.
                    "allow" => Mode::Prefer,
                    _ => {
                        return Err(Error::InvalidTls(
                            "sslmode must be disable, allow, prefer, require, verify-ca or verify-full",
                        ));
                    }
                })
            }
            "sslrootcert" => self.root_cert = Some(value),
            "sslcert" => self.cert = Some(value),
            _ => self.key = Some(value),
        }
        Ok(())
    }

    /// The mode, `prefer` when none is given (libpq's default).
    pub(crate) fn mode(&self) -> Mode {
        self.mode.unwrap_or(Mode::Prefer)
    }

    /// The CA file (`sslrootcert`), if given.
    #[cfg(feature = "tls")]
    pub(crate) fn root_cert(&self) -> Option<&str> {
        self.root_cert.as_deref()
    }

    /// The client certificate and key files (`sslcert`, `sslkey`), each if
    /// given.
    #[cfg(feature = "tls")]
    pub(crate) fn client_files(&self) -> (Option<&str>, Option<&str>) {
        (self.cert.as_deref(), self.key.as_deref())
    }

    /// What tokio-postgres is told, by a build with TLS (`tls_built`) or
    /// without: whether to ask for TLS and whether to give up without it.
    /// Without TLS, as libpq built without SSL: `disable`, `allow` and
    /// `prefer` (the default) connect in plain text, and anything that
    /// needs TLS is refused.
    ///
    /// # Errors
    /// [`Error::TlsNotEnabled`], without TLS, for `sslmode=require`,
    /// `verify-ca` or `verify-full`, or any of `sslrootcert`, `sslcert`,
    /// `sslkey`.
    pub(crate) fn ssl_mode(&self, tls_built: bool) -> Result<SslMode> {
        if !tls_built {
            if let Some(setting) = self.needs_tls() {
                return Err(Error::TlsNotEnabled { setting });
            }
            return Ok(SslMode::Disable);
        }
        Ok(match self.mode() {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        })
    }

    /// The first setting that asks for TLS, as the error names it.
    fn needs_tls(&self) -> Option<&'static str> {
        match self.mode() {
            Mode::Require => return Some("sslmode=require"),
            Mode::VerifyCa => return Some("sslmode=verify-ca"),
            Mode::VerifyFull => return Some("sslmode=verify-full"),
            Mode::Disable | Mode::Prefer => {}
        }
        if self.root_cert.is_some() {
            Some("sslrootcert")
        } else if self.cert.is_some() {
            Some("sslcert")
        } else if self.key.is_some() {
            Some("sslkey")
        } else {
            None
        }
    }
}

/// Takes `sslmode`, `sslrootcert`, `sslcert` and `sslkey` out of a
/// connection string (`postgres://...?...` or `key=value ...`), returning
/// the rest, for tokio-postgres to parse, and the parameters.
///
/// # Errors
/// [`Error::InvalidUrl`] when the string does not tokenize (the message
/// never quotes it), [`Error::InvalidTls`] for an unknown `sslmode`.
pub(crate) fn split(url: &str) -> Result<(String, Params)> {
    let mut params = Params::default();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        // As tokio-postgres reads it: the credentials run to the first
        // '@', the parameters start at the first '?' after them.
        let after_credentials = url.find('@').map_or(0, |at| at + 1);
        let Some(question) = url[after_credentials..].find('?') else {
            return Ok((url.to_owned(), params));
        };
        let (head, query) = url.split_at(after_credentials + question);
        let mut kept = Vec::new();
        for pair in query[1..].split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').ok_or(Error::InvalidUrl)?;
            let key_text = decode(key)?;
            if NAMES.contains(&key_text.as_str()) {
                params.set(&key_text, decode(value)?)?;
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            head.to_owned()
        } else {
            format!("{head}?{}", kept.join("&"))
        };
        return Ok((rest, params));
    }
    let mut kept = Vec::new();
    for (key, value) in key_values(url)? {
        if NAMES.contains(&key.as_str()) {
            params.set(&key, value)?;
        } else {
            let quoted = value.replace('\\', "\\\\").replace('\'', "\\'");
            kept.push(format!("{key}='{quoted}'"));
        }
    }
    Ok((kept.join(" "), params))
}

/// Percent-decodes a URL component as UTF-8.
fn decode(text: &str) -> Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = text.get(index + 1..index + 3).ok_or(Error::InvalidUrl)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| Error::InvalidUrl)?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).map_err(|_| Error::InvalidUrl)
}

/// The `key = value` pairs of a libpq connection string, as tokio-postgres
/// reads them: values bare or in single quotes, `\` escaping any
/// character.
fn key_values(text: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        if key.is_empty() {
            if chars.peek().is_some() {
                return Err(Error::InvalidUrl);
            }
            return Ok(pairs);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(Error::InvalidUrl);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let quoted = chars.next_if_eq(&'\'').is_some();
        let mut value = String::new();
        loop {
            match chars.peek().copied() {
                None if quoted => return Err(Error::InvalidUrl),
                None => break,
                Some('\'') if quoted => {
                    chars.next();
                    break;
                }
                Some(c) if c.is_whitespace() && !quoted => break,
                Some('\\') => {
                    chars.next();
                    if let Some(escaped) = chars.next() {
                        value.push(escaped);
                    }
                }
                Some(c) => {
                    chars.next();
                    value.push(c);
                }
            }
        }
        if value.is_empty() && !quoted {
            return Err(Error::InvalidUrl);
        }
        pairs.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_params_are_taken_out_and_the_rest_kept() -> Result<()> {
        let (rest, params) = split(
            "postgres://u:p%3Fw@h:5432/db?sslmode=verify-full&application_name=x&sslrootcert=%2Fca.pem",
        )?;
        assert_eq!(rest, "postgres://u:p%3Fw@h:5432/db?application_name=x");
        assert_eq!(params.mode(), Mode::VerifyFull);
        assert_eq!(params.root_cert.as_deref(), Some("/ca.pem"));
        let (rest, params) = split("postgresql://u@h/db?sslmode=require")?;
        assert_eq!(rest, "postgresql://u@h/db");
        assert_eq!(params.ssl_mode(true)?, SslMode::Require);
        let (rest, params) = split("postgres://u:pw@h/db")?;
        assert_eq!(rest, "postgres://u:pw@h/db");
        assert_eq!(params.mode(), Mode::Prefer);
        Ok(())
    }

    #[test]
    fn key_value_params_are_taken_out_and_the_rest_requoted() -> Result<()> {
        let (rest, params) = split(
            r"host=h  password='a b\'c' sslmode = verify-ca sslcert=/c.pem sslkey='/k.pem' dbname=d\ x",
        )?;
        assert_eq!(rest, r"host='h' password='a b\'c' dbname='d x'");
        assert_eq!(params.mode(), Mode::VerifyCa);
        assert_eq!(params.cert.as_deref(), Some("/c.pem"));
        assert_eq!(params.key.as_deref(), Some("/k.pem"));
        let config: tokio_postgres::Config = rest.parse().map_err(|_| Error::InvalidUrl)?;
        assert_eq!(config.get_password(), Some(&b"a b'c"[..]));
        assert_eq!(config.get_dbname(), Some("d x"));
        Ok(())
    }

    #[test]
    fn bad_strings_are_refused_without_quoting_them() {
        for bad in [
            "host=h password='unterminated",
            "host",
            "postgres://u:pw@h/db?sslmode",
            "postgres://u:pw@h/db?sslrootcert=%zz",
        ] {
            assert!(matches!(split(bad), Err(Error::InvalidUrl)), "{bad}");
        }
        let err =
            split("postgres://u:secret@h/db?sslmode=verify-everything").expect_err("unknown mode");
        assert!(matches!(err, Error::InvalidTls(_)), "{err:?}");
        assert!(!err.to_string().contains("secret"));
    }

    /// A build without the `tls` feature, as libpq without SSL: plain text
    /// for the modes that allow it, [`Error::TlsNotEnabled`] naming the
    /// setting for anything that needs TLS, and never the password. Runs
    /// in every build (the choice is an argument).
    #[test]
    fn without_tls_plain_modes_connect_plain_and_the_rest_are_refused() -> Result<()> {
        for url in [
            "postgres://u:secret@h/db",
            "postgres://u:secret@h/db?sslmode=prefer",
            "postgres://u:secret@h/db?sslmode=allow",
            "host=h password=secret sslmode=disable",
        ] {
            let (_, params) = split(url)?;
            assert_eq!(params.ssl_mode(false)?, SslMode::Disable, "{url}");
        }
        for (url, setting) in [
            (
                "postgres://u:secret@h/db?sslmode=require",
                "sslmode=require",
            ),
            (
                "postgres://u:secret@h/db?sslmode=verify-ca",
                "sslmode=verify-ca",
            ),
            (
                "host=h password=secret sslmode=verify-full",
                "sslmode=verify-full",
            ),
            ("postgres://u:secret@h/db?sslrootcert=system", "sslrootcert"),
            (
                "postgres://u:secret@h/db?sslmode=prefer&sslcert=/c.pem&sslkey=/k.pem",
                "sslcert",
            ),
        ] {
            let (_, params) = split(url)?;
            let err = params.ssl_mode(false).expect_err(url);
            assert!(
                matches!(err, Error::TlsNotEnabled { setting: named } if named == setting),
                "{url}: {err:?}"
            );
            let text = format!("{err} {err:?}");
            assert!(
                text.contains("tls feature") && !text.contains("secret"),
                "{text}"
            );
            params.ssl_mode(true)?;
        }
        let (_, params) = split("postgres://u@h/db?sslmode=prefer")?;
        assert_eq!(params.ssl_mode(true)?, SslMode::Prefer);
        Ok(())
    }
}
