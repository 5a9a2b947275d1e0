//! TLS termination (`loadbalancer.openstack.org/default-tls-container-ref`, `[LoadBalancer]
//! default-tls-container-ref`), as OCCM: every TCP port of the Service gets a
//! `TERMINATED_HTTPS` listener with the reference as its default certificate, and an HTTP pool
//! (the members receive plain HTTP). With `container-store = barbican` (the default) the
//! reference is read in barbican with the provider's own credentials before anything is made
//! or changed, so a reference that does not exist or that the provider may not read is an
//! error on the Service naming it, never a listener left half-made; Octavia then grants its
//! own service user read access and checks the certificate itself.

use k8s_cloud_provider::{CloudError, CloudResult};

use crate::{
    OpenStackCloud,
    client::{ClientError, Service},
    config::ContainerStore,
};

/// A barbican reference, as OCCM reads it: the last two path segments of
/// `https://<barbican>/v1/secrets/<id>` or `…/v1/containers/<id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BarbicanReference {
    /// A secret (a PKCS#12 bundle, Octavia's preferred form).
    Secret(String),
    /// A certificate container (certificate, private key, intermediates).
    Container(String),
}

impl BarbicanReference {
    /// The path on barbican's endpoint (`/v1/secrets/<id>`, `/v1/containers/<id>`).
    pub fn path(&self) -> String {
        match self {
            Self::Secret(id) => format!("/v1/secrets/{id}"),
            Self::Container(id) => format!("/v1/containers/{id}"),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::Secret(_) => "secret",
            Self::Container(_) => "container",
        }
    }
}

/// Reads a reference; the error says what a barbican reference looks like.
pub fn barbican_reference(reference: &str) -> Result<BarbicanReference, String> {
    let bad = || {
        format!(
            "{reference:?} is not a barbican reference (https://<barbican>/v1/secrets/<id> or https://<barbican>/v1/containers/<id>; with another store set [LoadBalancer] container-store = external)"
        )
    };
    let mut segments = reference.trim_end_matches('/').rsplit('/');
    let id = segments
        .next()
        .filter(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    match (segments.next(), id) {
        (Some("secrets"), Some(id)) => Ok(BarbicanReference::Secret(id.to_string())),
        (Some("containers"), Some(id)) => Ok(BarbicanReference::Container(id.to_string())),
        _ => Err(bad()),
    }
}

/// Where a Service's TLS reference comes from, for errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsSource {
    /// The Service's annotation.
    Annotation,
    /// `[LoadBalancer] default-tls-container-ref`.
    Config,
}

impl std::fmt::Display for TlsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Annotation => write!(f, "annotation {}", super::options::ANNOTATION_TLS_CONTAINER_REF),
            Self::Config => write!(f, "[LoadBalancer] default-tls-container-ref"),
        }
    }
}

/// A Service's TLS termination: the certificate reference and where it was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsTermination {
    /// The reference Octavia gets as `default_tls_container_ref`.
    pub reference: String,
    /// Where it was set.
    pub source: TlsSource,
}

impl OpenStackCloud {
    /// Checks that barbican has the reference and lets the provider read it (OCCM's check);
    /// nothing with `container-store = external`. One read, no write.
    pub(super) async fn check_tls_reference(&self, tls: &TlsTermination) -> CloudResult<()> {
        if self.config.load_balancer.container_store == ContainerStore::External {
            return Ok(());
        }
        let parsed = barbican_reference(&tls.reference)
            .map_err(|m| CloudError::msg(format!("{}: {m}", tls.source)))?;
        match self.client.get(Service::KeyManager, &parsed.path()).await {
            Ok(_) => Ok(()),
            Err(ClientError::Http { status, message, .. }) if status.as_u16() == 404 => {
                Err(CloudError::msg(format!(
                    "{} {:?}: barbican has no such {} ({message}); nothing was changed on the load balancer",
                    tls.source,
                    tls.reference,
                    parsed.kind()
                )))
            }
            Err(ClientError::Http { status, message, .. }) if status.as_u16() == 403 => {
                Err(CloudError::msg(format!(
                    "{} {:?}: barbican does not let this provider's user read the {} ({message}); grant it read access (an ACL) or use the owner's credentials; nothing was changed on the load balancer",
                    tls.source,
                    tls.reference,
                    parsed.kind()
                )))
            }
            Err(ClientError::NoEndpoint { .. }) => Err(CloudError::msg(format!(
                "{} {:?}: the keystone catalog has no key-manager (barbican) endpoint to check it in; with certificates stored elsewhere set [LoadBalancer] container-store = external",
                tls.source, tls.reference
            ))),
            Err(e) => Err(crate::cloud_error(
                format!("reading {} {:?} in barbican", tls.source, tls.reference),
                e,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_as_occm_reads_them() {
        assert_eq!(
            barbican_reference("https://kms.example:9311/v1/secrets/6f1c-aa").unwrap(),
            BarbicanReference::Secret("6f1c-aa".into())
        );
        assert_eq!(
            barbican_reference("http://127.0.0.1:19311/v1/containers/abc/").unwrap(),
            BarbicanReference::Container("abc".into())
        );
        for bad in [
            "",
            "abc",
            "https://kms/v1/orders/x",
            "https://kms/v1/secrets/",
            "https://kms/v1/secrets/a?b",
        ] {
            let e = barbican_reference(bad).unwrap_err();
            assert!(
                e.contains(&format!("{bad:?}")) && e.contains("container-store"),
                "{e}"
            );
        }
    }
}
