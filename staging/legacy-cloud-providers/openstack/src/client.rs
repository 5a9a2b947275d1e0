//! A small OpenStack client on `reqwest`: keystone v3 password / application-credential auth
//! with token reuse (until a minute before expiry) and one re-authentication on a 401, the
//! service catalog (by type, interface and region), and JSON requests to nova, neutron and
//! octavia. No crate fits: the Rust OpenStack SDKs are either unmaintained (`openstack`,
//! `osauth`: last releases 2021–2022, on reqwest 0.11) or generated clients far larger than the
//! dozen calls a cloud-controller-manager makes.
//!
//! Secrets (the password, the application credential secret, tokens) never appear in errors,
//! logs or `Debug` output.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::config::{AuthOptions, Global};

/// The services the provider talks to, by catalog type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// nova (`compute`).
    Compute,
    /// neutron (`network`).
    Network,
    /// octavia (`load-balancer`).
    LoadBalancer,
}

impl Service {
    /// The catalog type.
    pub fn catalog_type(self) -> &'static str {
        match self {
            Self::Compute => "compute",
            Self::Network => "network",
            Self::LoadBalancer => "load-balancer",
        }
    }
}

/// A client error. Messages carry the method, the URL path and OpenStack's own message.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Keystone refused the credentials or answered without a token.
    #[error("keystone authentication at {url}: {message}")]
    Auth {
        /// The token URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The catalog has no endpoint for a service.
    #[error("the keystone catalog has no {interface} endpoint of type {service:?}{region}")]
    NoEndpoint {
        /// Catalog type.
        service: &'static str,
        /// Interface asked for.
        interface: String,
        /// ` in region R` or empty.
        region: String,
    },
    /// An HTTP answer other than 2xx.
    #[error("{method} {url}: HTTP {status}: {message}")]
    Http {
        /// Method.
        method: Method,
        /// URL.
        url: String,
        /// Status.
        status: StatusCode,
        /// OpenStack's message (or the body's start).
        message: String,
    },
    /// No answer (connection refused, timeout, TLS).
    #[error("{method} {url}: {source}")]
    Transport {
        /// Method.
        method: Method,
        /// URL.
        url: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// An answer that is not the JSON expected.
    #[error("{method} {url}: unexpected answer: {message}")]
    Decode {
        /// Method.
        method: Method,
        /// URL.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// A TLS or client setting.
    #[error("{0}")]
    Setup(String),
    /// A write not sent: the controller manager runs with `--dry-run` (shadow mode).
    #[error("dry run: {0} was not sent (the controller manager runs with --dry-run)")]
    DryRun(String),
}

/// How many times [`OpenStackClient::request`] sends a request at most.
pub const REQUEST_ATTEMPTS: u32 = 3;

impl ClientError {
    /// Whether the request that failed so may be sent again as it is (see
    /// [`OpenStackClient::request`]).
    pub fn may_be_sent_again(&self, method: &Method) -> bool {
        let idempotent = matches!(*method, Method::GET | Method::HEAD | Method::PUT | Method::DELETE);
        match self {
            Self::Http { status, .. } => match status.as_u16() {
                429 | 503 => true,
                500 | 502 | 504 => idempotent,
                _ => false,
            },
            Self::Transport { source, .. } => source.is_connect() || idempotent,
            _ => false,
        }
    }

    /// HTTP 404.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Http { status, .. } if *status == StatusCode::NOT_FOUND)
    }

    /// HTTP 409 (octavia: the load balancer is immutable while PENDING_*).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Http { status, .. } if *status == StatusCode::CONFLICT)
    }
}

struct Token {
    value: String,
    expires: Instant,
    catalog: Vec<CatalogEntry>,
    project_id: Option<String>,
}

/// One service of keystone's catalog.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct CatalogEntry {
    /// The service type (`compute`, `network`, `load-balancer`, …).
    #[serde(rename = "type")]
    pub kind: String,
    /// Its endpoints.
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
}

/// One endpoint of a catalog entry.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Endpoint {
    /// `public`, `internal` or `admin`.
    pub interface: String,
    /// The endpoint's URL.
    pub url: String,
    /// The region (keystone v3).
    #[serde(default)]
    pub region_id: Option<String>,
    /// The region (older keystones).
    #[serde(default)]
    pub region: Option<String>,
}

/// What keystone's answer to `POST /v3/auth/tokens` gives.
#[derive(Debug, Clone)]
pub struct TokenAnswer {
    /// The token (`X-Subject-Token`; a secret: never logged).
    pub value: String,
    /// How long it is valid from now (`expires_at`; 1 h when absent or unreadable).
    pub lifetime: Duration,
    /// The service catalog (empty when absent or unreadable).
    pub catalog: Vec<CatalogEntry>,
    /// The project the token is scoped to (`token.project.id`), if any.
    pub project_id: Option<String>,
}

/// Reads keystone's answer to a token request: the status, the `X-Subject-Token` header and
/// the body, at `now_unix` (seconds since the epoch). An error names the URL and keystone's
/// message; a body that is not JSON is an error only when the status is one.
pub fn read_token_answer(
    url: &str,
    status: StatusCode,
    subject_token: Option<&str>,
    body: &[u8],
    now_unix: u64,
) -> Result<TokenAnswer, ClientError> {
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if !status.is_success() {
        return Err(ClientError::Auth {
            url: url.to_string(),
            message: format!("HTTP {status}: {}", openstack_message(&body)),
        });
    }
    let value = subject_token
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ClientError::Auth {
            url: url.to_string(),
            message: "no X-Subject-Token in the answer".into(),
        })?
        .to_string();
    let t = &body["token"];
    let catalog: Vec<CatalogEntry> = serde_json::from_value(t["catalog"].clone()).unwrap_or_default();
    let lifetime = t["expires_at"]
        .as_str()
        .and_then(unix_seconds_utc)
        .map(|exp| Duration::from_secs(exp.saturating_sub(now_unix)))
        .unwrap_or(Duration::from_secs(3600));
    let project_id = t["project"]["id"].as_str().map(str::to_string);
    Ok(TokenAnswer {
        value,
        lifetime,
        catalog,
        project_id,
    })
}

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

    fn auth_body(&self) -> Value {
        let a = &self.auth;
        let domain = |id: &str, name: &str, fallback_id: &str, fallback_name: &str| -> Value {
            if !id.is_empty() {
                json!({"id": id})
            } else if !name.is_empty() {
                json!({"name": name})
            } else if !fallback_id.is_empty() {
                json!({"id": fallback_id})
            } else if !fallback_name.is_empty() {
                json!({"name": fallback_name})
            } else {
                json!({"id": "default"})
            }
        };
        if !a.application_credential_id.is_empty() || !a.application_credential_name.is_empty() {
            let mut cred = json!({"secret": a.application_credential_secret});
            if !a.application_credential_id.is_empty() {
                cred["id"] = json!(a.application_credential_id);
            } else {
                cred["name"] = json!(a.application_credential_name);
                cred["user"] = if a.user_id.is_empty() {
                    json!({"name": a.username, "domain": domain(&a.user_domain_id, &a.user_domain_name, &a.domain_id, &a.domain_name)})
                } else {
                    json!({"id": a.user_id})
                };
            }
            return json!({"auth": {"identity": {"methods": ["application_credential"], "application_credential": cred}}});
        }
        // With a trust, OCCM's legacy trustee credentials authenticate when set.
        let user = if !a.trust_id.is_empty() && !a.trustee_id.is_empty() {
            json!({"id": a.trustee_id, "password": a.trustee_password})
        } else if a.user_id.is_empty() {
            json!({"name": a.username, "password": a.password,
                   "domain": domain(&a.user_domain_id, &a.user_domain_name, &a.domain_id, &a.domain_name)})
        } else {
            json!({"id": a.user_id, "password": a.password})
        };
        let scope = if !a.trust_id.is_empty() {
            json!({"OS-TRUST:trust": {"id": a.trust_id}})
        } else if !a.project_id.is_empty() {
            json!({"project": {"id": a.project_id}})
        } else if !a.project_name.is_empty() {
            json!({"project": {"name": a.project_name,
                   "domain": domain(&a.project_domain_id, &a.project_domain_name, &a.domain_id, &a.domain_name)}})
        } else if !a.domain_id.is_empty() {
            json!({"domain": {"id": a.domain_id}})
        } else {
            Value::Null
        };
        let mut body = json!({"auth": {"identity": {"methods": ["password"], "password": {"user": user}}}});
        if !scope.is_null() {
            body["auth"]["scope"] = scope;
        }
        body
    }

    async fn authenticate(&self) -> Result<Token, ClientError> {
        let url = format!("{}/auth/tokens", self.auth.auth_url.trim_end_matches('/'));
        self.auth_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let resp = self
            .http
            .post(&url)
            .json(&self.auth_body())
            .send()
            .await
            .map_err(|e| ClientError::Auth {
                url: url.clone(),
                message: e.without_url().to_string(),
            })?;
        let status = resp.status();
        let subject_token = resp
            .headers()
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp.bytes().await.map_err(|e| ClientError::Auth {
            url: url.clone(),
            message: e.without_url().to_string(),
        })?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let answer = read_token_answer(&url, status, subject_token.as_deref(), &body, now)?;
        // Renew a minute early (or halfway, for very short tokens).
        let lifetime = answer.lifetime;
        let reuse_for = lifetime.saturating_sub(Duration::from_secs(60)).max(lifetime / 2);
        Ok(Token {
            value: answer.value,
            expires: Instant::now() + reuse_for,
            catalog: answer.catalog,
            project_id: answer.project_id,
        })
    }

    /// The current token and the service's endpoint, authenticating when needed: when there is
    /// none, it expired, or it is the token `refused` (a 401). Requests refused at once
    /// authenticate once between them: the first takes the lock and a new token; the others
    /// then find a token other than the one refused to them and use it.
    async fn session(
        &self,
        service: Service,
        refused: Option<&str>,
    ) -> Result<(String, String), ClientError> {
        let mut guard = self.token.lock().await;
        let stale = |t: &Token| Instant::now() >= t.expires || refused == Some(t.value.as_str());
        if guard.as_ref().is_none_or(stale) {
            *guard = Some(self.authenticate().await?);
        }
        let Some(t) = guard.as_ref() else {
            return Err(ClientError::Setup("no token".into()));
        };
        let endpoint = t
            .catalog
            .iter()
            .filter(|c| c.kind == service.catalog_type())
            .flat_map(|c| c.endpoints.iter())
            .find(|e| {
                e.interface == self.interface
                    && (self.region.is_empty()
                        || e.region_id.as_deref() == Some(self.region.as_str())
                        || e.region.as_deref() == Some(self.region.as_str()))
            })
            .ok_or_else(|| ClientError::NoEndpoint {
                service: service.catalog_type(),
                interface: self.interface.clone(),
                region: if self.region.is_empty() {
                    String::new()
                } else {
                    format!(" in region {}", self.region)
                },
            })?;
        Ok((t.value.clone(), endpoint.url.trim_end_matches('/').to_string()))
    }

    /// The project of the current token (authenticating when there is none yet).
    pub async fn project_id(&self) -> Result<Option<String>, ClientError> {
        self.session(Service::Compute, None).await?;
        Ok(self
            .token
            .lock()
            .await
            .as_ref()
            .and_then(|t| t.project_id.clone()))
    }

    /// Checks the credentials and the catalog (used at start-up).
    pub async fn check(&self) -> Result<(), ClientError> {
        self.session(Service::Compute, None).await.map(|_| ())
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

    /// Every item of a list, page after page: GET `path`, decode `body[key]`, and follow the
    /// `next` link of `body[<key>_links]` (its query, on `path`'s endpoint: the link may name
    /// another host) until there is none. A page cut short by the server's page size is never
    /// taken for the whole list (that made the route controller take live next hops for
    /// blackholes past nova's page size).
    pub async fn list<T: serde::de::DeserializeOwned>(
        &self,
        service: Service,
        path: &str,
        key: &str,
    ) -> Result<Vec<T>, ClientError> {
        let base = path.split_once('?').map_or(path, |(p, _)| p);
        let mut out = Vec::new();
        let mut page_path = path.to_string();
        for _ in 0..MAX_PAGES {
            let page = self.get(service, &page_path).await?;
            let items: Vec<T> = decode(&page, key, &page_path)?;
            let empty = items.is_empty();
            out.extend(items);
            match next_page_query(&page, key) {
                Some(q) if !empty => {
                    let next = format!("{base}?{q}");
                    if next == page_path {
                        // Never a partial list on doubt: the caller's sync fails and is retried.
                        return Err(ClientError::Decode {
                            method: Method::GET,
                            url: page_path,
                            message: format!("the next page of {key} is this page again"),
                        });
                    }
                    page_path = next;
                }
                _ => return Ok(out),
            }
        }
        Err(ClientError::Decode {
            method: Method::GET,
            url: path.to_string(),
            message: format!("more than {MAX_PAGES} pages of {key}"),
        })
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

/// The query of the `next` link of a list page (`<key>_links`, as nova, neutron and Octavia
/// give one when there are more), if any.
pub fn next_page_query(page: &Value, key: &str) -> Option<String> {
    page.get(format!("{key}_links"))?
        .as_array()?
        .iter()
        .find(|l| l.get("rel").and_then(Value::as_str) == Some("next"))?
        .get("href")?
        .as_str()?
        .split_once('?')
        .map(|(_, q)| q.to_string())
        .filter(|q| !q.is_empty())
}

/// Most pages [`OpenStackClient::list`] reads for one list (a bound against a server whose
/// `next` links never end).
pub const MAX_PAGES: usize = 10_000;

/// Decodes `value[key]`.
pub fn decode<T: serde::de::DeserializeOwned>(
    value: &Value,
    key: &str,
    path: &str,
) -> Result<T, ClientError> {
    serde_json::from_value(value.get(key).cloned().unwrap_or(Value::Null)).map_err(|e| ClientError::Decode {
        method: Method::GET,
        url: path.to_string(),
        message: format!("field {key:?}: {e}"),
    })
}

/// OpenStack's error bodies: `{"badRequest": {"message": …}}` (nova),
/// `{"NeutronError": {"message": …}}`, `{"faultstring": …}` (octavia),
/// `{"error": {"message": …}}` (keystone).
fn openstack_message(body: &Value) -> String {
    if let Some(s) = body.as_str() {
        return s.trim().to_string();
    }
    if let Some(s) = body.get("faultstring").and_then(Value::as_str) {
        return s.to_string();
    }
    if let Some(obj) = body.as_object() {
        for v in obj.values() {
            if let Some(m) = v.get("message").and_then(Value::as_str) {
                return m.to_string();
            }
        }
    }
    let s = body.to_string();
    s.chars().take(300).collect()
}

/// Seconds since the Unix epoch of keystone's `expires_at` (`2026-11-24T20:55:12.000000Z`:
/// UTC, `Z` or `+00:00`, fraction ignored); `None` for anything else.
pub fn unix_seconds_utc(s: &str) -> Option<u64> {
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    // Keystone writes four-digit years; anything else is not a time it means.
    if !(1970..=9999).contains(&y) {
        return None;
    }
    let time = time.strip_suffix('Z').or_else(|| time.strip_suffix("+00:00"))?;
    let time = time.split('.').next()?;
    let mut t = time.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m)
        || !(1..=31).contains(&day)
        || !(0..=23).contains(&hh)
        || !(0..=59).contains(&mm)
        || !(0..=60).contains(&ss)
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

/// Percent-encodes a query value.
pub fn query_escape(v: &str) -> String {
    url::form_urlencoded::byte_serialize(v.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_cannot_happen_twice_is_sent_again() {
        let http = |status: u16| ClientError::Http {
            method: Method::POST,
            url: "/x".into(),
            status: StatusCode::from_u16(status).unwrap(),
            message: String::new(),
        };
        for m in [Method::GET, Method::PUT, Method::DELETE, Method::POST] {
            assert!(http(429).may_be_sent_again(&m), "{m} after 429");
            assert!(http(503).may_be_sent_again(&m), "{m} after 503");
            assert!(!http(404).may_be_sent_again(&m), "{m} after 404");
            assert!(!http(409).may_be_sent_again(&m), "{m} after 409");
        }
        assert!(http(500).may_be_sent_again(&Method::GET));
        assert!(http(502).may_be_sent_again(&Method::DELETE));
        assert!(
            !http(500).may_be_sent_again(&Method::POST),
            "a POST that may have been processed"
        );
        assert!(!http(504).may_be_sent_again(&Method::POST));
        assert!(!ClientError::Setup("x".into()).may_be_sent_again(&Method::GET));
    }

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

    #[test]
    fn error_bodies_of_each_service() {
        assert_eq!(
            openstack_message(&json!({"itemNotFound": {"code": 404, "message": "gone"}})),
            "gone"
        );
        assert_eq!(
            openstack_message(&json!({"NeutronError": {"message": "busy", "type": "x"}})),
            "busy"
        );
        assert_eq!(
            openstack_message(&json!({"faultstring": "immutable"})),
            "immutable"
        );
        assert_eq!(openstack_message(&json!("plain")), "plain");
    }

    #[test]
    fn keystone_expiry_times() {
        assert_eq!(unix_seconds_utc("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            unix_seconds_utc("2026-11-24T20:55:12.000000Z"),
            Some(1_795_553_712)
        );
        assert_eq!(unix_seconds_utc("2000-03-01T00:00:00+00:00"), Some(951_868_800));
        assert_eq!(unix_seconds_utc("2026-13-01T00:00:00Z"), None);
        assert_eq!(unix_seconds_utc("yesterday"), None);
        assert_eq!(unix_seconds_utc("2026-01-01T-1:00:00Z"), None);
        assert_eq!(unix_seconds_utc("9223372036854775807-01-01T00:00:00Z"), None);
    }

    #[test]
    fn auth_bodies_scope_and_domains() {
        let mut g = Global::default();
        g.auth.auth_url = "http://k/v3".into();
        g.auth.username = "u".into();
        g.auth.password = "p".into();
        g.auth.project_name = "demo".into();
        g.auth.domain_name = "D".into();
        let c = OpenStackClient::new(&g, Duration::from_secs(5)).unwrap();
        let b = c.auth_body();
        assert_eq!(b["auth"]["identity"]["password"]["user"]["domain"]["name"], "D");
        assert_eq!(b["auth"]["scope"]["project"]["name"], "demo");
        assert_eq!(b["auth"]["scope"]["project"]["domain"]["name"], "D");
        assert!(!format!("{c:?}").contains('p') || !format!("{c:?}").contains("\"p\""));
        g.auth.application_credential_id = "ac".into();
        g.auth.application_credential_secret = "sec".into();
        let b = OpenStackClient::new(&g, Duration::from_secs(5))
            .unwrap()
            .auth_body();
        assert_eq!(b["auth"]["identity"]["methods"][0], "application_credential");
        assert!(b["auth"].get("scope").is_none());
    }

    /// OCCM's legacy trusts: the trustee authenticates, scoped to the trust.
    #[test]
    fn trustee_credentials_with_a_trust() {
        let mut g = Global::default();
        g.auth.auth_url = "http://k/v3".into();
        g.auth.trust_id = "t1".into();
        g.auth.trustee_id = "trustee".into();
        g.auth.trustee_password = "tp".into();
        let b = OpenStackClient::new(&g, Duration::from_secs(5))
            .unwrap()
            .auth_body();
        assert_eq!(b["auth"]["identity"]["password"]["user"]["id"], "trustee");
        assert_eq!(b["auth"]["identity"]["password"]["user"]["password"], "tp");
        assert_eq!(b["auth"]["scope"]["OS-TRUST:trust"]["id"], "t1");
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
