//! TLS for vCenter connections, with govmomi's semantics: the certificate chain is verified
//! (system roots, or the `ca-file` bundle instead); a configured `thumbprint` (SHA-1 as vCenter
//! shows it, or SHA-256, hex with or without colons) is consulted only when that verification
//! fails, and accepts the certificate it names; `insecure-flag` — only when explicitly asked —
//! skips verification altogether, thumbprint included.

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

/// Chain verification first; the pinned thumbprint only when it fails (govmomi).
#[derive(Debug)]
struct ChainThenThumbprint {
    chain: Arc<dyn ServerCertVerifier>,
    expected: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for ChainThenThumbprint {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let chain_error =
            match self
                .chain
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
            {
                Ok(ok) => return Ok(ok),
                Err(e) => e,
            };
        let (s1, s256) = thumbprints(end_entity.as_ref());
        if self.expected == s1 || self.expected == s256 {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "server certificate not trusted ({chain_error}) and its thumbprint {s1} (SHA-1) does not match the configured thumbprint"
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
    if opts.insecure {
        // govmomi: insecure skips every check, the thumbprint too.
        builder = builder.tls_danger_accept_invalid_certs(true);
    } else if let Some(t) = &opts.thumbprint {
        let expected = normalize(t);
        if expected.len() != 40 && expected.len() != 64 {
            return Err(Error::Config(
                "thumbprint is neither a SHA-1 (40 hex digits) nor a SHA-256 (64 hex digits) fingerprint"
                    .into(),
            ));
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let chain: Arc<dyn ServerCertVerifier> = match &opts.ca_pem {
            Some(pem) => {
                use rustls::pki_types::pem::PemObject;
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| Error::Config(format!("ca-file: {e}")))?;
                    roots
                        .add(cert)
                        .map_err(|e| Error::Config(format!("ca-file: {e}")))?;
                }
                if roots.is_empty() {
                    return Err(Error::Config("ca-file holds no certificate".into()));
                }
                rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| Error::Config(format!("ca-file: {e}")))?
            }
            None => Arc::new(
                rustls_platform_verifier::Verifier::new(provider.clone())
                    .map_err(|e| Error::Config(format!("system certificate roots: {e}")))?,
            ),
        };
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainThenThumbprint {
                chain,
                expected,
                provider,
            }))
            .with_no_client_auth();
        builder = builder.tls_backend_preconfigured(config);
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
        assert!(e.contains("neither a SHA-1") && !e.contains("AB:CD"), "{e}");
        // insecure skips the thumbprint, even a malformed one (govmomi).
        assert!(
            http_client(
                &TlsOptions {
                    insecure: true,
                    thumbprint: Some("AB:CD".into()),
                    ..Default::default()
                },
                std::time::Duration::from_secs(1),
            )
            .is_ok()
        );
    }
}
