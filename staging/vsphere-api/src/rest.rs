//! The vSphere Automation REST API, tagging reads: one session per vCenter, created on first
//! use (`POST …/session` with basic auth), reused for every call, and created again once when
//! vCenter answers 401 (expired). The newer `/api` paths (vSphere 7.0U2+) are tried first; a
//! 404 switches the client to the `/rest` paths for good (vcsim, older vCenters).

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Instant,
};

use parking_lot::Mutex;
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::{
    Error, MoRef,
    login::{CredentialSource, Credentials, LoginGate},
    tls::{TlsOptions, http_client},
};

/// A tag.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Tag {
    /// Tag ID (`urn:vmomi:InventoryServiceTag:…`).
    pub id: String,
    /// Tag name (e.g. the zone name).
    pub name: String,
    /// ID of its category.
    pub category_id: String,
}

/// A tag category.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Category {
    /// Category ID.
    pub id: String,
    /// Category name (e.g. `k8s-zone`).
    pub name: String,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Flavour {
    Api,
    Rest,
}

/// A REST client for one vCenter.
pub struct RestClient {
    base: String,
    http: reqwest::Client,
    credentials: CredentialSource,
    session: Mutex<Option<String>>,
    flavour: Mutex<Option<Flavour>>,
    logins: AtomicU64,
    calls: AtomicU64,
    gate: tokio::sync::Mutex<LoginGate>,
}

impl std::fmt::Debug for RestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl RestClient {
    /// A client for `https://<server>:<port>`.
    pub fn new(
        server: &str,
        port: u16,
        tls: &TlsOptions,
        credentials: impl Into<CredentialSource>,
    ) -> Result<Self, Error> {
        let host = crate::url_host(server);
        Ok(Self {
            base: format!("https://{host}:{port}"),
            http: http_client(tls, std::time::Duration::from_secs(30))?,
            credentials: credentials.into(),
            session: Mutex::new(None),
            flavour: Mutex::new(None),
            logins: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            gate: tokio::sync::Mutex::new(LoginGate::default()),
        })
    }

    /// How many REST sessions this client has created (attempts).
    pub fn logins(&self) -> u64 {
        self.logins.load(Ordering::SeqCst)
    }

    /// How many REST API requests (not logins) this client has sent.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// A session: the current one unless it is `stale` (the one a caller saw rejected), else a
    /// new one (concurrent callers share it; the login back-off applies).
    async fn create_session(&self, stale: Option<&str>) -> Result<String, Error> {
        let mut gate = self.gate.lock().await;
        let existing = self.session.lock().clone();
        if let Some(s) = existing
            && Some(s.as_str()) != stale
        {
            return Ok(s);
        }
        *self.session.lock() = None;
        let credentials = self.credentials.get(gate.last_rejected()).await?;
        gate.check(&self.base, &credentials, Instant::now())?;
        let result = self.login(&credentials).await;
        match &result {
            Ok(_) => gate.succeeded(),
            Err(e) => {
                let rejected = matches!(
                    e,
                    Error::Status {
                        status: 401 | 403,
                        ..
                    }
                );
                warn!(base = %self.base, user = %credentials.username, error = %e, "vSphere REST login failed");
                gate.failed(&credentials, rejected, e, Instant::now());
            }
        }
        result
    }

    async fn login(&self, credentials: &Credentials) -> Result<String, Error> {
        let known = *self.flavour.lock();
        let flavours: Vec<Flavour> = match known {
            Some(f) => vec![f],
            None => vec![Flavour::Api, Flavour::Rest],
        };
        for f in flavours {
            let path = match f {
                Flavour::Api => "/api/session",
                Flavour::Rest => "/rest/com/vmware/cis/session",
            };
            self.logins.fetch_add(1, Ordering::SeqCst);
            let resp = self
                .http
                .post(format!("{}{path}", self.base))
                .basic_auth(&credentials.username, Some(credentials.password.expose()))
                .send()
                .await
                .map_err(|e| Error::Connect {
                    url: format!("{}{path}", self.base),
                    reason: crate::error_chain(&e),
                })?;
            if resp.status() == StatusCode::NOT_FOUND && f == Flavour::Api {
                debug!(base = %self.base, "no /api endpoints; using /rest");
                continue;
            }
            if !resp.status().is_success() {
                return Err(Error::Status {
                    url: format!("{}{path}", self.base),
                    status: resp.status().as_u16(),
                    body: String::new(),
                });
            }
            let v: Value = resp
                .json()
                .await
                .map_err(|e| Error::Response(format!("{path}: {e}")))?;
            let id = v
                .get("value")
                .unwrap_or(&v)
                .as_str()
                .ok_or_else(|| Error::Response(format!("{path}: no session id")))?
                .to_string();
            *self.flavour.lock() = Some(f);
            *self.session.lock() = Some(id.clone());
            info!(base = %self.base, user = %credentials.username, flavour = ?f, "created vSphere REST session");
            return Ok(id);
        }
        Err(Error::Response("no REST session endpoint answered".into()))
    }

    async fn request(
        &self,
        method: Method,
        api_path: &str,
        rest_path: &str,
        body: Option<Value>,
    ) -> Result<Value, Error> {
        let mut stale: Option<String> = None;
        for attempt in 0..2 {
            let existing = self.session.lock().clone().filter(|s| Some(s) != stale.as_ref());
            let session = match existing {
                Some(s) => s,
                None => self.create_session(stale.as_deref()).await?,
            };
            let flavour = self.flavour.lock().unwrap_or(Flavour::Rest);
            let path = if flavour == Flavour::Api {
                api_path
            } else {
                rest_path
            };
            let url = format!("{}{path}", self.base);
            self.calls.fetch_add(1, Ordering::SeqCst);
            let mut req = self
                .http
                .request(method.clone(), &url)
                .header("vmware-api-session-id", &session);
            if let Some(b) = &body {
                req = req.json(b);
            }
            let resp = req.send().await.map_err(|e| Error::Connect {
                url: url.clone(),
                reason: crate::error_chain(&e),
            })?;
            if resp.status() == StatusCode::UNAUTHORIZED && attempt == 0 {
                debug!(base = %self.base, "REST session expired; creating a new one");
                stale = Some(session);
                continue;
            }
            if !resp.status().is_success() {
                let status = resp.status().as_u16();
                let text = resp.text().await.unwrap_or_default();
                return Err(Error::Status {
                    url,
                    status,
                    body: text.chars().take(200).collect(),
                });
            }
            let v: Value = resp
                .json()
                .await
                .map_err(|e| Error::Response(format!("{path}: {e}")))?;
            return Ok(match v {
                Value::Object(mut m) if flavour == Flavour::Rest && m.contains_key("value") => {
                    m.remove("value").unwrap_or(Value::Null)
                }
                other => other,
            });
        }
        Err(Error::Response("REST session rejected twice".into()))
    }

    /// Tag IDs attached to an object.
    pub async fn list_attached_tags(&self, obj: &MoRef) -> Result<Vec<String>, Error> {
        let body = json!({ "object_id": { "id": obj.value, "type": obj.kind } });
        let v = self
            .request(
                Method::POST,
                "/api/cis/tagging/tag-association?action=list-attached-tags",
                "/rest/com/vmware/cis/tagging/tag-association?~action=list-attached-tags",
                Some(body),
            )
            .await?;
        Ok(match v {
            Value::Null => Vec::new(),
            Value::Array(a) => a
                .into_iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect(),
            other => {
                return Err(Error::Response(format!(
                    "list-attached-tags: unexpected answer {other}"
                )));
            }
        })
    }

    /// Tag IDs attached to each of `objects`, in one call (`list-attached-tags-on-objects`).
    /// Objects without tags may be missing from the answer (then they have none).
    pub async fn list_attached_tags_on_objects(
        &self,
        objects: &[MoRef],
    ) -> Result<std::collections::HashMap<MoRef, Vec<String>>, Error> {
        let mut out = std::collections::HashMap::new();
        if objects.is_empty() {
            return Ok(out);
        }
        let ids: Vec<Value> = objects
            .iter()
            .map(|o| json!({ "id": o.value, "type": o.kind }))
            .collect();
        let v = self
            .request(
                Method::POST,
                "/api/cis/tagging/tag-association?action=list-attached-tags-on-objects",
                "/rest/com/vmware/cis/tagging/tag-association?~action=list-attached-tags-on-objects",
                Some(json!({ "object_ids": ids })),
            )
            .await?;
        let Value::Array(entries) = v else {
            return Err(Error::Response(format!(
                "list-attached-tags-on-objects: unexpected answer {v}"
            )));
        };
        for e in entries {
            let (Some(id), Some(kind)) = (
                e.pointer("/object_id/id").and_then(Value::as_str),
                e.pointer("/object_id/type").and_then(Value::as_str),
            ) else {
                continue;
            };
            let tags = e
                .get("tag_ids")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|t| t.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            out.insert(MoRef::new(kind, id), tags);
        }
        Ok(out)
    }

    /// A tag by ID.
    pub async fn get_tag(&self, id: &str) -> Result<Tag, Error> {
        let v = self
            .request(
                Method::GET,
                &format!("/api/cis/tagging/tag/{id}"),
                &format!("/rest/com/vmware/cis/tagging/tag/id:{id}"),
                None,
            )
            .await?;
        serde_json::from_value(v).map_err(|e| Error::Response(format!("tag {id}: {e}")))
    }

    /// A category by ID.
    pub async fn get_category(&self, id: &str) -> Result<Category, Error> {
        let v = self
            .request(
                Method::GET,
                &format!("/api/cis/tagging/category/{id}"),
                &format!("/rest/com/vmware/cis/tagging/category/id:{id}"),
                None,
            )
            .await?;
        serde_json::from_value(v).map_err(|e| Error::Response(format!("category {id}: {e}")))
    }

    /// Deletes the session (errors ignored).
    pub async fn logout(&self) {
        self.gate.lock().await.logged_out();
        let taken = self.session.lock().take();
        let Some(session) = taken else { return };
        let path = match self.flavour.lock().unwrap_or(Flavour::Rest) {
            Flavour::Api => "/api/session",
            Flavour::Rest => "/rest/com/vmware/cis/session",
        };
        let _ = self
            .http
            .delete(format!("{}{path}", self.base))
            .header("vmware-api-session-id", session)
            .send()
            .await;
    }
}
