//! Reading a TLS failure out of a client error: a leaf module (no crate
//! imports), so the error type can classify failures without depending on
//! the TLS set-up that produces them.

use std::error::Error as StdError;
use std::io;

use leasehold::CertificateProblem;

/// What a TLS failure inside a client error says.
pub(crate) enum Failure {
    /// We refused the server's certificate.
    Certificate(CertificateProblem),
    /// The server refused our client certificate.
    ClientCertRejected,
    /// TLS was required and the server does not offer it.
    NotSupported,
}

/// The message tokio-postgres gives when the server answers `N` to the
/// TLS request and TLS is required (it has no error kind for it).
const NOT_SUPPORTED: &str = "server does not support TLS";

/// Reads the TLS failure, if any, inside a client error.
pub(crate) fn classify(err: &tokio_postgres::Error) -> Option<Failure> {
    use rustls::{AlertDescription as Alert, CertificateError as Cert};
    if err
        .source()
        .is_some_and(|source| source.to_string() == NOT_SUPPORTED)
    {
        return Some(Failure::NotSupported);
    }
    Some(match find_rustls(err)? {
        rustls::Error::InvalidCertificate(problem) => Failure::Certificate(match problem {
            Cert::UnknownIssuer => CertificateProblem::UnknownIssuer,
            Cert::Expired | Cert::ExpiredContext { .. } => CertificateProblem::Expired,
            Cert::NotValidYet | Cert::NotValidYetContext { .. } => CertificateProblem::NotYetValid,
            Cert::NotValidForName | Cert::NotValidForNameContext { .. } => {
                CertificateProblem::WrongName
            }
            Cert::Revoked => CertificateProblem::Revoked,
            _ => CertificateProblem::Invalid,
        }),
        rustls::Error::AlertReceived(
            Alert::CertificateRequired
            | Alert::BadCertificate
            | Alert::UnsupportedCertificate
            | Alert::CertificateRevoked
            | Alert::CertificateExpired
            | Alert::CertificateUnknown
            | Alert::UnknownCA
            | Alert::AccessDenied,
        ) => Failure::ClientCertRejected,
        _ => return None,
    })
}

/// The rustls error inside `err`, looking through `source()` chains and
/// `io::Error` payloads.
fn find_rustls<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut current = Some(err);
    while let Some(err) = current {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        let inner = err
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
            .map(|inner| inner as &(dyn StdError + 'static));
        if let Some(found) = inner.and_then(find_rustls) {
            return Some(found);
        }
        current = err.source();
    }
    None
}
