//! Keystone v3: the token request (password, application credential, trust), its answer
//! (token, catalog, expiry) and the session reused until a minute before expiry.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::*;

pub(super) struct Token {
    pub(super) value: String,
    pub(super) expires: Instant,
    pub(super) catalog: Vec<CatalogEntry>,
    pub(super) project_id: Option<String>,
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

impl OpenStackClient {
    pub(super) fn auth_body(&self) -> Value {
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

    pub(super) async fn authenticate(&self) -> Result<Token, ClientError> {
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
                message: super::describe_transport(&e.without_url()),
            })?;
        let status = resp.status();
        let subject_token = resp
            .headers()
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp.bytes().await.map_err(|e| ClientError::Auth {
            url: url.clone(),
            message: super::describe_transport(&e.without_url()),
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
    pub(super) async fn session(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
