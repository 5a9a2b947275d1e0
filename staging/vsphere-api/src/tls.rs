//! TLS for vCenter connections: verification on by default (system roots), or a CA bundle
//! (`ca-file`), or a pinned certificate thumbprint (`thumbprint`, SHA-1 as vCenter shows it or
//! SHA-256, hex with or without colons), or — only when explicitly asked — no verification
//! (`insecure-flag`).

use std::sync::Arc;

use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    pki_types::{CertificateDer, ServerName, UnixTime},
};
use sha1::Digest as _;

use crate::Error;

/// How to verify the server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// Accept any certificate (`insecure-flag`). Never the default.
    pub insecure: bool,
    /// PEM CA bundle to trust instead of the system roots (`ca-file`).
    pub ca_pem: Option<Vec<u8>>,
    /// Pinned certificate thumbprint (`thumbprint`).
    pub thumbprint: Option<String>,
}

fn normalize(thumbprint: &str) -> String {
    thumbprint
        .chars()
        .filter(|c| c.is_ascii_hexdigit())
        .collect::<String>()
        .to_ascii_uppercase()
}

/// Hex thumbprints (SHA-1, SHA-256) of a DER certificate.
pub fn thumbprints(der: &[u8]) -> (String, String) {
    (
        hex::encode_upper(sha1::Sha1::digest(der)),
        hex::encode_upper(sha2::Sha256::digest(der)),
    )
}

#[derive(Debug)]
struct ThumbprintVerifier {
    expected: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for ThumbprintVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let (s1, s256) = thumbprints(end_entity.as_ref());
        if self.expected == s1 || self.expected == s256 {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "server certificate thumbprint {s1} (SHA-1) does not match the configured thumbprint"
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Builds the HTTP client for one vCenter (with a cookie store for the SOAP session).
pub fn http_client(opts: &TlsOptions, timeout: std::time::Duration) -> Result<reqwest::Client, Error> {
    let mut builder = reqwest::Client::builder()
        .cookie_store(true)
        .timeout(timeout)
        .connect_timeout(std::time::Duration::from_secs(10))
        .user_agent("k8s-cloud-provider-vsphere");
    if let Some(t) = &opts.thumbprint {
        let expected = normalize(t);
        if expected.len() != 40 && expected.len() != 64 {
            return Err(Error::Config(format!(
                "thumbprint {t:?} is neither a SHA-1 (40 hex digits) nor a SHA-256 (64 hex digits) fingerprint"
            )));
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ThumbprintVerifier { expected, provider }))
            .with_no_client_auth();
        builder = builder.tls_backend_preconfigured(config);
    } else if opts.insecure {
        builder = builder.tls_danger_accept_invalid_certs(true);
    } else if let Some(pem) = &opts.ca_pem {
        let certs =
            reqwest::Certificate::from_pem_bundle(pem).map_err(|e| Error::Config(format!("ca-file: {e}")))?;
        if certs.is_empty() {
            return Err(Error::Config("ca-file holds no certificate".into()));
        }
        builder = builder.tls_certs_only(certs);
    }
    builder
        .build()
        .map_err(|e| Error::Config(format!("building the HTTP client: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbprint_formats() {
        assert_eq!(normalize("ab:cd:0f"), "ABCD0F");
        let (s1, s256) = thumbprints(b"certificate");
        assert_eq!(s1.len(), 40);
        assert_eq!(s256.len(), 64);
        let e = http_client(
            &TlsOptions {
                thumbprint: Some("AB:CD".into()),
                ..Default::default()
            },
            std::time::Duration::from_secs(1),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("neither a SHA-1"), "{e}");
    }
}
