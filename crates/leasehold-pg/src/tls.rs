//! TLS for [`connect`](crate::connect()) (feature `tls`): the rustls
//! settings a connection string's TLS parameters ([`Params`]) ask for, as
//! libpq reads them. The files are read and checked, and TLS failures
//! named, by `leasehold`'s [`tls`](leasehold::tls) module, the one place
//! both crates load certificates.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use leasehold::tls::{self as shared, rustls};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::{Error, Result};
use crate::params::{Mode, Params};

/// The rustls settings `params` ask for; files are read and checked here.
///
/// # Errors
/// [`Error::TlsFile`] for a file that cannot be used,
/// [`Error::InvalidTls`] for a certificate without its key (or the other
/// way round).
pub(crate) fn client_config(params: &Params) -> Result<ClientConfig> {
    let provider = shared::provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|_| Error::InvalidTls("no tls protocol version available"))?;
    if params.mode() == Mode::Disable {
        // Never used (no TLS is asked for), so no file is read.
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth());
    }
    let verify = match params.mode() {
        Mode::Disable | Mode::Prefer => None,
        Mode::Require => params.root_cert().map(|_| false),
        Mode::VerifyCa => Some(false),
        Mode::VerifyFull => Some(true),
    };
    let builder = match verify {
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider.clone()))),
        Some(check_name) => {
            let roots = Arc::new(roots(params)?);
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
    match params.client_files() {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(_), None) => Err(Error::InvalidTls("sslcert needs sslkey")),
        (None, Some(_)) => Err(Error::InvalidTls("sslkey needs sslcert")),
        (Some(cert), Some(key)) => {
            let (chain, key) = shared::client_identity(Path::new(cert), Path::new(key))
                .map_err(Error::from_tls_file)?
                .into_parts();
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|_| Error::InvalidTls("the client certificate and key cannot be used"))
        }
    }
}

/// The CAs to verify the server against: `sslrootcert`, the system's
/// roots for `system`, or `~/.postgresql/root.crt`.
fn roots(params: &Params) -> Result<RootCertStore> {
    if params.root_cert() == Some("system") {
        return Ok(shared::system_roots());
    }
    let path = match params.root_cert() {
        Some(path) => PathBuf::from(path),
        None => std::env::home_dir()
            .unwrap_or_default()
            .join(".postgresql/root.crt"),
    };
    shared::ca_roots(&path).map_err(Error::from_tls_file)
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
