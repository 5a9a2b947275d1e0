//! Test certificate authorities: a CA whose PEM a server is given as its client CA, and client
//! certificates it signs.

use anyhow::Result;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};

/// A CA and a way to sign client certificates with it.
pub struct ClientCa {
    /// The CA certificate, PEM.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl ClientCa {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A client certificate (PEM cert + key, as reqwest's identity wants) for `cn` in `groups`.
    pub fn client_identity(&self, cn: &str, groups: &[&str]) -> Result<reqwest::Identity> {
        let (cert, key) = self.client_cert_pem(cn, groups)?;
        Ok(reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes())?)
    }

    /// A server certificate for the DNS name `host`, signed by this CA, as PEM certificate and
    /// PEM key.
    pub fn server_cert_pem(&self, host: &str) -> Result<(String, String)> {
        let mut params = CertificateParams::new(vec![host.to_string()])?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// A client certificate for `cn` in `group` (Kubernetes reads the organisation as the
    /// group), as PEM certificate and PEM key.
    pub fn client_cert_pem(&self, cn: &str, groups: &[&str]) -> Result<(String, String)> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}
