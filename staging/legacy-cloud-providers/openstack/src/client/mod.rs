//! A small OpenStack client on `reqwest`: keystone v3 password / application-credential auth
//! with token reuse (until a minute before expiry) and one re-authentication on a 401, the
//! service catalog (by type, interface and region), and JSON requests to nova, neutron and
//! octavia. No crate fits: the Rust OpenStack SDKs are either unmaintained (`openstack`,
//! `osauth`: last releases 2021–2022, on reqwest 0.11) or generated clients far larger than the
//! dozen calls a cloud-controller-manager makes.
//!
//! Secrets (the password, the application credential secret, tokens) never appear in errors,
//! logs or `Debug` output.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::config::{AuthOptions, Global};

mod error;
mod keystone;
mod paging;

pub use error::*;
pub use keystone::*;
pub use paging::*;

/// The services the provider talks to, by catalog type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// nova (`compute`).
    Compute,
    /// neutron (`network`).
    Network,
    /// octavia (`load-balancer`).
    LoadBalancer,
    /// barbican (`key-manager`): TLS certificate references are read there.
    KeyManager,
}

impl Service {
    /// The catalog type.
    pub fn catalog_type(self) -> &'static str {
        match self {
            Self::Compute => "compute",
            Self::Network => "network",
            Self::LoadBalancer => "load-balancer",
            Self::KeyManager => "key-manager",
        }
    }
}

/// How many times [`OpenStackClient::request`] sends a request at most.
pub const REQUEST_ATTEMPTS: u32 = 3;

/// The client; cheap to share behind an `Arc`.
pub struct OpenStackClient {
    http: reqwest::Client,
    auth: AuthOptions,
    region: String,
    interface: String,
    token: tokio::sync::Mutex<Option<Token>>,
    auth_count: std::sync::atomic::AtomicU64,
    request_count: std::sync::atomic::AtomicU64,
    /// Set once in shadow mode: from then on every request but a read is refused before it is
    /// sent (see [`OpenStackClient::request`]).
    dry_run: std::sync::OnceLock<k8s_controller_manager::writes::DryRun>,
}

impl std::fmt::Debug for OpenStackClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStackClient")
            .field("auth_url", &self.auth.auth_url)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// nova's microversion: 2.47 embeds the flavor (with `original_name`) in servers.
pub const NOVA_MICROVERSION: &str = "2.47";

impl OpenStackClient {
    /// Builds the client (no request yet).
    pub fn new(global: &Global, timeout: Duration) -> Result<Self, ClientError> {
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(10))
            .user_agent("k8s-cloud-provider-openstack");
        if global.tls_insecure {
            builder = builder.tls_danger_accept_invalid_certs(true);
        } else if let Some(path) = &global.ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| ClientError::Setup(format!("[Global] ca-file {}: {e}", path.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| ClientError::Setup(format!("[Global] ca-file {}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(ClientError::Setup(format!(
                    "[Global] ca-file {}: holds no certificate",
                    path.display()
                )));
            }
            builder = builder.tls_certs_only(certs);
        }
        match (&global.cert_file, &global.key_file) {
            (Some(cert), Some(key)) => {
                let read = |p: &std::path::PathBuf, what: &str| {
                    std::fs::read(p)
                        .map_err(|e| ClientError::Setup(format!("[Global] {what} {}: {e}", p.display())))
                };
                let mut pem = read(cert, "cert-file")?;
                pem.push(b'\n');
                pem.extend(read(key, "key-file")?);
                let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
                    ClientError::Setup(format!(
                        "[Global] cert-file {} / key-file {}: not a PEM certificate and key: {e}",
                        cert.display(),
                        key.display()
                    ))
                })?;
                builder = builder.identity(identity);
            }
            (None, None) => {}
            _ => {
                return Err(ClientError::Setup(
                    "[Global] cert-file and key-file go together: set both or neither".into(),
                ));
            }
        }
        let http = builder
            .build()
            .map_err(|e| ClientError::Setup(format!("HTTP client: {e}")))?;
        Ok(Self {
            http,
            auth: global.auth.clone(),
            region: global.region.clone(),
            interface: if global.interface.is_empty() {
                "public".into()
            } else {
                global.interface.clone()
            },
            token: tokio::sync::Mutex::new(None),
            auth_count: 0.into(),
            request_count: 0.into(),
            dry_run: std::sync::OnceLock::new(),
        })
    }

    /// Shadow mode (`--dry-run`): from now on every request but a `GET`/`HEAD` (keystone's
    /// token request excepted: it reads) is recorded as a write not made (one `dry run: would
    /// write` line with controller `openstack`, one count) and refused before it is sent, so
    /// nothing in the cloud changes whatever calls the client — as the AWS SDK's write guard.
    pub fn set_dry_run(&self, dry_run: k8s_controller_manager::writes::DryRun) {
        let _ = self.dry_run.set(dry_run);
    }

    /// Keystone authentications so far (a metric: tokens are reused).
    pub fn auth_count(&self) -> u64 {
        self.auth_count.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// API requests so far (authentications excluded).
    pub fn request_count(&self) -> u64 {
        self.request_count.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One JSON request; `path` is relative to the service's endpoint (octavia and neutron
    /// paths start with `/v2…`, nova's with `/servers…`). A 401 re-authenticates once.
    ///
    /// A request that failed on the way is sent again, up to [`REQUEST_ATTEMPTS`] times in all
    /// (0.2 s, then 0.4 s apart), when sending it again cannot do anything twice: any method
    /// after `429`/`503` (refused, not processed) or a connection that could not be made; an
    /// idempotent one (`GET`, `PUT`, `DELETE`) also after `500`/`502`/`504` or a connection
    /// lost mid-way. A `POST` that may have been processed is never repeated here: the
    /// controllers find what it made by name in their next sync.
    pub async fn request(
        &self,
        service: Service,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        if let Some(dry_run) = self.dry_run.get()
            && !matches!(method, Method::GET | Method::HEAD)
        {
            let action = format!("{}:{method} {}", service.catalog_type(), path_without_query(path));
            let object = body.map(summary).unwrap_or_default();
            dry_run.record("openstack", &action, &object);
            return Err(ClientError::DryRun(action));
        }
        let mut attempt = 1;
        loop {
            match self.request_once(service, method.clone(), path, body).await {
                Err(e) if attempt < REQUEST_ATTEMPTS && e.may_be_sent_again(&method) => {
                    tracing::debug!(error = %e, attempt, "OpenStack request failed on the way; sending it again");
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn request_once(
        &self,
        service: Service,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        let mut refused: Option<String> = None;
        loop {
            let (token, base) = self.session(service, refused.as_deref()).await?;
            let base = match service {
                // The catalog's network endpoint usually has no version.
                Service::Network if !base.ends_with("/v2.0") && !path.starts_with("/v2.0") => {
                    format!("{base}/v2.0")
                }
                // barbican's is usually unversioned too; paths here carry the version.
                Service::KeyManager if path.starts_with("/v1/") => base.trim_end_matches("/v1").to_string(),
                _ => base,
            };
            let url = format!("{base}{path}");
            let mut req = self
                .http
                .request(method.clone(), &url)
                .header("X-Auth-Token", &token)
                .header("Accept", "application/json");
            if service == Service::Compute {
                req = req.header("X-OpenStack-Nova-API-Version", NOVA_MICROVERSION);
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            self.request_count
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let resp = req.send().await.map_err(|e| ClientError::Transport {
                method: method.clone(),
                url: url.clone(),
                source: e.without_url(),
            })?;
            let status = resp.status();
            if status == StatusCode::UNAUTHORIZED && refused.is_none() {
                tracing::debug!(%url, "token refused; authenticating again");
                refused = Some(token);
                continue;
            }
            let bytes = resp.bytes().await.map_err(|e| ClientError::Transport {
                method: method.clone(),
                url: url.clone(),
                source: e.without_url(),
            })?;
            let value: Value = if bytes.is_empty() {
                Value::Null
            } else {
                match serde_json::from_slice(&bytes) {
                    Ok(v) => v,
                    Err(_) if !status.is_success() => {
                        Value::String(String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned())
                    }
                    Err(e) => {
                        return Err(ClientError::Decode {
                            method,
                            url,
                            message: e.to_string(),
                        });
                    }
                }
            };
            if !status.is_success() {
                return Err(ClientError::Http {
                    method,
                    url,
                    status,
                    message: openstack_message(&value),
                });
            }
            return Ok(value);
        }
    }

    /// GET.
    pub async fn get(&self, service: Service, path: &str) -> Result<Value, ClientError> {
        self.request(service, Method::GET, path, None).await
    }

    /// POST with a JSON body.
    pub async fn post(&self, service: Service, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.request(service, Method::POST, path, Some(body)).await
    }

    /// PUT with a JSON body.
    pub async fn put(&self, service: Service, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.request(service, Method::PUT, path, Some(body)).await
    }

    /// DELETE; a 404 counts as done.
    pub async fn delete(&self, service: Service, path: &str) -> Result<(), ClientError> {
        match self.request(service, Method::DELETE, path, None).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// GET and decode `body[key]`.
    pub async fn get_as<T: serde::de::DeserializeOwned>(
        &self,
        service: Service,
        path: &str,
        key: &str,
    ) -> Result<T, ClientError> {
        let v = self.get(service, path).await?;
        decode(&v, key, path)
    }
}

/// `path` without its query (for a dry-run record: IDs in the path name the object).
fn path_without_query(path: &str) -> &str {
    path.split_once('?').map_or(path, |(p, _)| p)
}

/// A short form of a request body for a dry-run record (at most 400 characters; request
/// bodies of this client carry no secret: keystone's token request is never refused).
pub(crate) fn summary(body: &Value) -> String {
    let mut s = body.to_string();
    if s.len() > 400 {
        let cut = (0..=400).rev().find(|i| s.is_char_boundary(*i)).unwrap_or(0);
        s.truncate(cut);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Under `--dry-run` a write is refused before anything is sent (no keystone either: the
    /// auth URL here answers nothing), recorded once; a read still goes out (and fails here
    /// reaching keystone, which proves it was not refused).
    #[tokio::test]
    async fn dry_run_refuses_every_write_before_sending_it() {
        let mut global = Global::default();
        global.auth.auth_url = "http://127.0.0.1:9/v3".into();
        let client = OpenStackClient::new(&global, Duration::from_secs(2)).unwrap();
        let dry_run = k8s_controller_manager::writes::DryRun::new();
        client.set_dry_run(dry_run.clone());
        let body = json!({"floatingip": {"floating_network_id": "n"}});
        for r in [
            client
                .post(Service::Network, "/floatingips", &body)
                .await
                .map(|_| ()),
            client
                .put(Service::LoadBalancer, "/v2/lbaas/listeners/l1", &body)
                .await
                .map(|_| ()),
            client
                .delete(Service::LoadBalancer, "/v2/lbaas/loadbalancers/lb1?cascade=true")
                .await,
        ] {
            assert!(matches!(r, Err(ClientError::DryRun(_))), "{r:?}");
        }
        let refused = |action: &str| dry_run.actions.with_label_values(&["openstack", action]).get();
        assert_eq!(refused("network:POST /floatingips"), 1);
        assert_eq!(refused("load-balancer:PUT /v2/lbaas/listeners/l1"), 1);
        assert_eq!(refused("load-balancer:DELETE /v2/lbaas/loadbalancers/lb1"), 1);
        assert_eq!(client.request_count(), 0, "nothing was sent");
        let read = client.get(Service::Compute, "/servers").await;
        assert!(matches!(read, Err(ClientError::Auth { .. })), "{read:?}");
    }

    /// `cert-file` and `key-file`: a client identity, both or neither, each file named in errors.
    #[test]
    fn client_certificate_files() {
        let mut g = Global::default();
        g.auth.auth_url = "http://k/v3".into();
        g.cert_file = Some("/nonexistent/cert.pem".into());
        let e = OpenStackClient::new(&g, Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("both or neither"), "{e}");
        g.key_file = Some("/nonexistent/key.pem".into());
        let e = OpenStackClient::new(&g, Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("cert-file /nonexistent/cert.pem"), "{e}");
    }
}
