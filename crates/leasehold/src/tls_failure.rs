//! What a TLS failure inside a client's error says: a leaf module (no
//! dependency on the rest of the crate), so that [`crate::error`] can name
//! the failure and [`crate::tls`] can build on both (and publish the
//! classification, which `leasehold-pg` uses for PostgreSQL's errors).

/// Why a server's TLS certificate was refused ([`Error::TlsCertificate`](crate::Error::TlsCertificate)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CertificateProblem {
    /// It does not chain to a CA we trust: the wrong CA file, or none
    /// given for a private CA.
    UnknownIssuer,
    /// Its validity period has ended.
    Expired,
    /// Its validity period has not begun (or our clock is wrong).
    NotYetValid,
    /// It is not issued for the host (name or IP address) in the URL.
    WrongName,
    /// Its issuer revoked it.
    Revoked,
    /// Anything else: a bad signature, an unsupported algorithm, a
    /// malformed certificate.
    Invalid,
}

impl std::fmt::Display for CertificateProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CertificateProblem::UnknownIssuer => "not signed by a trusted ca",
            CertificateProblem::Expired => "expired",
            CertificateProblem::NotYetValid => "not valid yet",
            CertificateProblem::WrongName => "not issued for this host",
            CertificateProblem::Revoked => "revoked",
            CertificateProblem::Invalid => "invalid",
        })
    }
}

#[cfg(feature = "tls")]
mod classify {
    use std::error::Error as StdError;
    use std::io;
    use std::sync::Arc;

    use super::CertificateProblem;

    /// What a TLS failure inside a client's error says: read by
    /// [`classify`](crate::tls::classify), for Redis and PostgreSQL alike.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    #[non_exhaustive]
    pub enum TlsFailure {
        /// We refused the server's certificate.
        Certificate(CertificateProblem),
        /// The server answered our TLS handshake with something that is not
        /// TLS (a plain port).
        NotTls,
        /// The server refused our client certificate, or wanted one we did
        /// not send.
        ClientCertRejected,
    }

    impl std::fmt::Display for TlsFailure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                TlsFailure::Certificate(problem) => {
                    write!(f, "the server's certificate was refused: {problem}")
                }
                TlsFailure::NotTls => f.write_str("the server does not speak tls on this port"),
                TlsFailure::ClientCertRejected => {
                    f.write_str("the server refused our client certificate, or needs one")
                }
            }
        }
    }

    /// The TLS failure, if any, inside `err`: a client's error (redis-rs's,
    /// tokio-postgres's, ...) whose cause is a rustls error, found through
    /// `source()` chains, `io::Error` payloads and the `Arc` redis-rs
    /// keeps its causes in. `None` for anything else (a refused
    /// connection, a timeout, a TLS failure none of these name).
    pub fn classify(err: &(dyn StdError + 'static)) -> Option<TlsFailure> {
        use rustls::{AlertDescription as Alert, CertificateError as Cert};
        Some(match find_rustls(err)? {
            rustls::Error::InvalidCertificate(problem) => TlsFailure::Certificate(match problem {
                Cert::UnknownIssuer => CertificateProblem::UnknownIssuer,
                Cert::Expired | Cert::ExpiredContext { .. } => CertificateProblem::Expired,
                Cert::NotValidYet | Cert::NotValidYetContext { .. } => {
                    CertificateProblem::NotYetValid
                }
                Cert::NotValidForName | Cert::NotValidForNameContext { .. } => {
                    CertificateProblem::WrongName
                }
                Cert::Revoked => CertificateProblem::Revoked,
                _ => CertificateProblem::Invalid,
            }),
            rustls::Error::InvalidMessage(_) => TlsFailure::NotTls,
            rustls::Error::AlertReceived(
                Alert::CertificateRequired
                | Alert::BadCertificate
                | Alert::UnsupportedCertificate
                | Alert::CertificateRevoked
                | Alert::CertificateExpired
                | Alert::CertificateUnknown
                | Alert::UnknownCA
                | Alert::AccessDenied,
            ) => TlsFailure::ClientCertRejected,
            _ => return None,
        })
    }

    /// The rustls error inside `err`, looking through `source()` chains,
    /// `io::Error` payloads and the `Arc` redis-rs keeps its causes in.
    fn find_rustls<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
        let mut current = Some(err);
        while let Some(err) = current {
            if let Some(tls) = err.downcast_ref::<rustls::Error>() {
                return Some(tls);
            }
            let inner: Option<&(dyn StdError + 'static)> = match err.downcast_ref::<io::Error>() {
                Some(io) => io.get_ref().map(|inner| inner as _),
                None => err
                    .downcast_ref::<Arc<dyn StdError + Send + Sync>>()
                    .map(|shared| shared.as_ref() as _),
            };
            if let Some(found) = inner.and_then(find_rustls) {
                return Some(found);
            }
            current = err.source();
        }
        None
    }
}

#[cfg(feature = "tls")]
pub use classify::{TlsFailure, classify};
