//! Credentials from a Kubernetes Secret, the way a vendor's provider gets its API keys: read
//! through the API (no file mounted, no restart to rotate them), kept in memory, and read again
//! when the cloud refuses them, so that a rotation (new key in the Secret, old key revoked in
//! the cloud) is picked up at the next call. The token never reaches a log or an error.

use std::sync::OnceLock;

use k8s_cloud_provider::{
    CloudError, CloudResult,
    k8s_openapi::api::core::v1::Secret,
    kube::{Api, Client},
};

/// The key of the Secret holding the token.
pub const TOKEN_KEY: &str = "token";

/// The provider's credentials: the Secret named in the cloud config, if any.
pub struct Credentials {
    secret: Option<(String, String)>,
    /// Set by `CloudProvider::initialize` (the framework's client, the controller manager's
    /// identity); the controllers call the provider only after it.
    client: OnceLock<Client>,
    token: tokio::sync::Mutex<Option<String>>,
}

impl Credentials {
    /// Credentials from the Secret `secret` (namespace, name); `None`: the cloud needs none.
    pub fn new(secret: Option<(String, String)>) -> Self {
        Self {
            secret,
            client: OnceLock::new(),
            token: tokio::sync::Mutex::new(None),
        }
    }

    /// The client to read the Secret with.
    pub fn set_client(&self, client: Client) {
        let _ = self.client.set(client);
    }

    /// The Secret, for messages (`namespace/name`).
    pub fn source(&self) -> String {
        self.secret.as_ref().map_or_else(
            || "none".to_string(),
            |(ns, name)| format!("Secret {ns}/{name}"),
        )
    }

    /// The token: the one read before, or the Secret's current one when `fresh` (after the
    /// cloud refused the cached one) or never read. `None` when no Secret is configured.
    pub async fn token(&self, fresh: bool) -> CloudResult<Option<String>> {
        let Some((namespace, name)) = &self.secret else {
            return Ok(None);
        };
        let mut cached = self.token.lock().await;
        if !fresh && let Some(token) = cached.as_ref() {
            return Ok(Some(token.clone()));
        }
        let client = self.client.get().ok_or_else(|| {
            CloudError::msg("credentials: read before the provider was initialised")
        })?;
        let secret = Api::<Secret>::namespaced(client.clone(), namespace)
            .get(name)
            .await
            .map_err(|e| {
                CloudError::wrap(
                    format_args!("credentials: reading Secret {namespace}/{name}"),
                    e,
                )
            })?;
        let token = secret
            .data
            .and_then(|mut d| d.remove(TOKEN_KEY))
            .and_then(|b| String::from_utf8(b.0).ok())
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| {
                CloudError::msg(format!(
                    "credentials: Secret {namespace}/{name} has no non-empty UTF-8 key {TOKEN_KEY:?}"
                ))
            })?;
        *cached = Some(token.trim().to_string());
        Ok(cached.clone())
    }
}
