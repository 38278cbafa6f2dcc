//! TLS for [`connect`](crate::connect()): libpq's `sslmode`,
//! `sslrootcert`, `sslcert` and `sslkey` (their meaning is in `connect`'s
//! docs), taken out of the connection string in URL or `key=value` form
//! before tokio-postgres parses it, and turned into rustls settings; and
//! the TLS failures read back out of client errors.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use leasehold::TlsFileRole;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
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

    /// What tokio-postgres is told: whether to ask for TLS and whether to
    /// give up without it.
    pub(crate) fn ssl_mode(&self) -> SslMode {
        match self.mode() {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }

    /// The rustls settings these parameters ask for; files are read and
    /// checked here.
    ///
    /// # Errors
    /// [`Error::TlsFile`] for a file that cannot be used,
    /// [`Error::InvalidTls`] for a certificate without its key (or the
    /// other way round).
    pub(crate) fn client_config(&self) -> Result<ClientConfig> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|_| Error::InvalidTls("no tls protocol version available"))?;
        if self.mode() == Mode::Disable {
            // Never used (no TLS is asked for), so no file is read.
            return Ok(builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth());
        }
        let verify = match self.mode() {
            Mode::Disable | Mode::Prefer => None,
            Mode::Require => self.root_cert.as_ref().map(|_| false),
            Mode::VerifyCa => Some(false),
            Mode::VerifyFull => Some(true),
        };
        let builder = match verify {
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider.clone()))),
            Some(check_name) => {
                let roots = Arc::new(self.roots()?);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|_| Error::InvalidTls("sslrootcert holds no usable ca certificate"))?;
                if check_name {
                    builder.with_webpki_verifier(webpki)
                } else {
                    builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(AnyName(webpki)))
                }
            }
        };
        match (&self.cert, &self.key) {
            (None, None) => Ok(builder.with_no_client_auth()),
            (Some(_), None) => Err(Error::InvalidTls("sslcert needs sslkey")),
            (None, Some(_)) => Err(Error::InvalidTls("sslkey needs sslcert")),
            (Some(cert), Some(key)) => {
                let (cert, key) = (Path::new(cert), Path::new(key));
                let chain = certificates(TlsFileRole::Cert, cert)?;
                let key_pem = read(TlsFileRole::Key, key)?;
                let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
                    .map_err(|_| file_err(TlsFileRole::Key, key, "holds no PEM private key"))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|err| match err {
                        rustls::Error::InconsistentKeys(_) => file_err(
                            TlsFileRole::Key,
                            key,
                            "does not match the client certificate",
                        ),
                        _ => file_err(TlsFileRole::Key, key, "holds a key of an unsupported kind"),
                    })
            }
        }
    }

    /// The CAs to verify the server against: `sslrootcert`, the system's
    /// roots for `system`, or `~/.postgresql/root.crt`.
    fn roots(&self) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        if self.root_cert.as_deref() == Some("system") {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            return Ok(roots);
        }
        let path = match &self.root_cert {
            Some(path) => PathBuf::from(path),
            None => std::env::home_dir()
                .unwrap_or_default()
                .join(".postgresql/root.crt"),
        };
        for cert in certificates(TlsFileRole::Ca, &path)? {
            roots.add(cert).map_err(|_| {
                file_err(
                    TlsFileRole::Ca,
                    &path,
                    "holds a certificate that does not parse",
                )
            })?;
        }
        Ok(roots)
    }
}

fn read(role: TlsFileRole, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::TlsFile {
        role,
        path: path.to_owned(),
        problem: "cannot be read",
        source: Some(source),
    })
}

/// The PEM certificates in the file at `path`: at least one.
fn certificates(role: TlsFileRole, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read(role, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| file_err(role, path, "holds a PEM block that does not parse"))?;
    if certs.is_empty() {
        return Err(file_err(role, path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn file_err(role: TlsFileRole, path: &Path, problem: &'static str) -> Error {
    Error::TlsFile {
        role,
        path: path.to_owned(),
        problem,
        source: None,
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

/// `prefer` and `require` without a CA, as libpq: any certificate is
/// accepted (the connection is encrypted, the server not authenticated);
/// the handshake's signatures are still checked against it.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain, validity and usage are checked as for
/// `verify-full`, the host name is not. webpki checks the name last, so a
/// name error means everything else passed.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError as Cert;
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                Cert::NotValidForName | Cert::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
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
        assert_eq!(params.ssl_mode(), SslMode::Require);
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
}
