//! Delegated authentication and authorization of the secure port, as upstream's
//! controller-manager does it (`k8s.io/apiserver` delegating authenticator/authorizer):
//!
//! - **Authentication**, first match wins: a client certificate verified against
//!   `--client-ca-file` (or, unless `--authentication-skip-lookup`, the `client-ca-file` key of
//!   `kube-system/extension-apiserver-authentication`): user = Common Name, groups =
//!   Organizations; then a bearer token checked with a `TokenReview` through
//!   `--authentication-kubeconfig` (answers cached `--authentication-token-webhook-cache-ttl`,
//!   authenticated or not); otherwise the request is anonymous (`system:anonymous`, group
//!   `system:unauthenticated`), as upstream (anonymous is enabled). A token the API server
//!   rejects, or a failed TokenReview, answers **401**.
//! - **Authorization**: paths in `--authorization-always-allow-paths` (exact, or a prefix with a
//!   trailing `*`) and the group `system:masters` are allowed; otherwise a
//!   `SubjectAccessReview` (non-resource URL, the verb from the method: GET/HEAD → `get`)
//!   through `--authorization-kubeconfig` decides, cached
//!   `--authorization-webhook-cache-authorized-ttl` / `-unauthorized-ttl`. Denied → **403**; a
//!   failed review → **500**. Without an authorization client everything but the always-allowed
//!   paths and groups is denied.
//!
//! Both kubeconfigs are optional as upstream: when empty, the in-cluster configuration is used,
//! and outside a cluster the part is switched off with a warning. Each of the two clients sends
//! at most [`REVIEW_QPS`] reviews a second in bursts of [`REVIEW_BURST`], each within
//! [`REVIEW_TIMEOUT`], as upstream's delegating clients: a flood of made-up tokens costs the API
//! server no more than that. Answers are kept in LRU caches of [`CACHE_CAPACITY`] entries each.
//!
//! Deliberate differences, so that nobody who can reach the port can lock out the clients that
//! are meant to use it (a flood of made-up tokens, or of anonymous requests, each costing a
//! review):
//! - **a budget per client**: one client (an IPv4 address, or an IPv6 /64) causes at most
//!   [`CLIENT_REVIEW_BURST`] reviews at once and [`CLIENT_REVIEW_QPS`] a second
//!   ([`Delegation::check_from`]); past it its requests answer 401 (500 for authorization)
//!   without a review;
//! - **a reserve for recently authenticated clients**: the last [`REVIEW_RESERVE`] of each
//!   budget is kept for a token that authenticated within [`RECENTLY_AUTHENTICATED`] and for
//!   the users such tokens (or client certificates) named: their reviews are sent when the
//!   cache entry expires however many reviews strangers ask for, and they are exempt from the
//!   per-client budget (a Prometheus on the same node as a flooding Pod keeps scraping);
//! - a stranger's review never waits for the rate limit (upstream waits up to the timeout); a
//!   recently authenticated client's waits at most [`REVIEW_MAX_QUEUE_WAIT`].
//!
//! Differences from upstream: the `--requestheader-*` front-proxy authentication is not
//! implemented (requests carrying `X-Remote-User` are treated like any other).

use std::{collections::BTreeMap, net::IpAddr, sync::Arc, time::Duration};

use k8s_openapi::api::{
    authentication::v1::TokenReview,
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
    core::v1::ConfigMap,
};
use kube::{Api, Client, api::PostParams};
use parking_lot::Mutex;
use rustls::pki_types::CertificateDer;
use tracing::{debug, warn};

mod limits;

pub use limits::{
    CACHE_CAPACITY, CLIENT_REVIEW_BURST, CLIENT_REVIEW_QPS, RECENTLY_AUTHENTICATED, REVIEW_BURST,
    REVIEW_MAX_QUEUE_WAIT, REVIEW_QPS, REVIEW_RESERVE, REVIEW_TIMEOUT, client_of,
};
use limits::{CacheKey, RateLimiter, TtlCache, key_of, user_key};

/// The user a request was authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// User name (`system:anonymous` when anonymous).
    pub name: String,
    /// UID, when the authenticator gives one.
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes (TokenReview `extra`).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// The anonymous user, as upstream names it.
    pub fn anonymous() -> Self {
        Self {
            name: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        }
    }

    /// The user of a verified client certificate: CN = name, O = groups. `None` when the
    /// certificate cannot be read or has no Common Name (upstream rejects those).
    pub fn from_client_certificate(cert: &CertificateDer<'_>) -> Option<Self> {
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
        let subject = parsed.subject();
        let name = subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .filter(|cn| !cn.is_empty())?
            .to_string();
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_string))
            .collect();
        Some(Self {
            name,
            uid: String::new(),
            groups,
            extra: BTreeMap::new(),
        })
    }
}

/// Settings of the delegated authentication and authorization (the flags, resolved).
#[derive(Clone)]
pub struct DelegationOptions {
    /// Client for TokenReviews (`--authentication-kubeconfig` or in-cluster); `None` = bearer
    /// tokens are not looked at.
    pub authentication_client: Option<Client>,
    /// `--authentication-token-webhook-cache-ttl` (default 10 s).
    pub token_cache_ttl: Duration,
    /// Client for SubjectAccessReviews (`--authorization-kubeconfig` or in-cluster); `None` =
    /// only always-allowed paths and groups pass.
    pub authorization_client: Option<Client>,
    /// `--authorization-always-allow-paths` (default `/healthz,/readyz,/livez`).
    pub always_allow_paths: Vec<String>,
    /// Groups allowed without review (upstream: `system:masters`).
    pub always_allow_groups: Vec<String>,
    /// `--authorization-webhook-cache-authorized-ttl` (default 10 s).
    pub authorized_ttl: Duration,
    /// `--authorization-webhook-cache-unauthorized-ttl` (default 10 s).
    pub unauthorized_ttl: Duration,
    /// Reviews a second each client sends at most ([`REVIEW_QPS`]).
    pub review_qps: f64,
    /// Reviews each client may send at once ([`REVIEW_BURST`]).
    pub review_burst: u32,
    /// Time for one review ([`REVIEW_TIMEOUT`]).
    pub review_timeout: Duration,
    /// Reviews a second one client address causes at most ([`CLIENT_REVIEW_QPS`]).
    pub client_review_qps: f64,
    /// Reviews one client address may cause at once ([`CLIENT_REVIEW_BURST`]).
    pub client_review_burst: u32,
}

impl std::fmt::Debug for DelegationOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegationOptions")
            .field("authentication", &self.authentication_client.is_some())
            .field("token_cache_ttl", &self.token_cache_ttl)
            .field("authorization", &self.authorization_client.is_some())
            .field("always_allow_paths", &self.always_allow_paths)
            .field("always_allow_groups", &self.always_allow_groups)
            .field("authorized_ttl", &self.authorized_ttl)
            .field("unauthorized_ttl", &self.unauthorized_ttl)
            .field("review_qps", &self.review_qps)
            .field("review_burst", &self.review_burst)
            .field("review_timeout", &self.review_timeout)
            .field("client_review_qps", &self.client_review_qps)
            .field("client_review_burst", &self.client_review_burst)
            .finish()
    }
}

impl DelegationOptions {
    /// Upstream's defaults, with the given clients.
    pub fn new(authentication_client: Option<Client>, authorization_client: Option<Client>) -> Self {
        Self {
            authentication_client,
            token_cache_ttl: Duration::from_secs(10),
            authorization_client,
            always_allow_paths: default_always_allow_paths(),
            always_allow_groups: vec!["system:masters".into()],
            authorized_ttl: Duration::from_secs(10),
            unauthorized_ttl: Duration::from_secs(10),
            review_qps: REVIEW_QPS,
            review_burst: REVIEW_BURST,
            review_timeout: REVIEW_TIMEOUT,
            client_review_qps: CLIENT_REVIEW_QPS,
            client_review_burst: CLIENT_REVIEW_BURST,
        }
    }
}

/// Upstream's `--authorization-always-allow-paths` default.
pub fn default_always_allow_paths() -> Vec<String> {
    vec!["/healthz".into(), "/readyz".into(), "/livez".into()]
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 401: the credentials were rejected or could not be checked.
    Unauthorized,
    /// 403: the user may not do this.
    Forbidden {
        /// The user.
        user: String,
        /// The verb.
        verb: String,
        /// The path.
        path: String,
        /// The reviewer's reason, when it gave one.
        reason: String,
    },
    /// 500: the authorization check failed.
    AuthorizationError(String),
}

impl Refusal {
    /// The HTTP status code.
    pub fn status(&self) -> u16 {
        match self {
            Self::Unauthorized => 401,
            Self::Forbidden { .. } => 403,
            Self::AuthorizationError(_) => 500,
        }
    }

    /// A `meta/v1` Status body, as upstream's response writers send.
    pub fn body(&self) -> String {
        let (message, reason) = match self {
            Self::Unauthorized => ("Unauthorized".to_string(), "Unauthorized"),
            Self::Forbidden {
                user,
                verb,
                path,
                reason,
            } => {
                let mut m = format!("forbidden: User \"{user}\" cannot {verb} path \"{path}\"");
                if !reason.is_empty() {
                    m.push_str(": ");
                    m.push_str(reason);
                }
                (m, "Forbidden")
            }
            Self::AuthorizationError(e) => (format!("Internal Server Error: \"{e}\""), "InternalError"),
        };
        serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": self.status(),
        })
        .to_string()
    }
}

/// Why a review was not answered.
#[derive(Debug, thiserror::Error)]
enum ReviewError {
    #[error("more reviews than the client's {0} a second allow")]
    RateLimited(f64),
    #[error("more reviews from client {0} than its budget allows")]
    ClientBudget(IpAddr),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// Authenticates and authorizes requests of the secure port. Cheap to clone.
#[derive(Clone)]
pub struct Delegation {
    inner: Arc<Inner>,
}

struct Inner {
    options: DelegationOptions,
    tokens: TtlCache<Option<UserInfo>>,
    decisions: TtlCache<(bool, String)>,
    token_reviews: RateLimiter,
    access_reviews: RateLimiter,
    /// Tokens that authenticated, and users they (or client certificates) named, within
    /// [`RECENTLY_AUTHENTICATED`].
    recent: TtlCache<()>,
    /// The review budget of each client ([`client_of`]), least recently used dropped first.
    clients: Mutex<lru::LruCache<IpAddr, Arc<RateLimiter>>>,
}

/// Who a review is for, for the budgets.
#[derive(Debug, Clone, Copy)]
struct Budget {
    /// The client's address, when known.
    client: Option<IpAddr>,
    /// A recently authenticated token or user: may use the reserve, and is exempt from the
    /// per-client budget.
    recent: bool,
}

impl std::fmt::Debug for Delegation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.options.fmt(f)
    }
}

impl Delegation {
    /// A gate with `options`.
    pub fn new(options: DelegationOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                tokens: TtlCache::new(),
                decisions: TtlCache::new(),
                token_reviews: RateLimiter::new(options.review_qps, options.review_burst),
                access_reviews: RateLimiter::new(options.review_qps, options.review_burst),
                recent: TtlCache::new(),
                clients: Mutex::new(lru::LruCache::new(
                    std::num::NonZeroUsize::new(CACHE_CAPACITY).unwrap_or(std::num::NonZeroUsize::MIN),
                )),
                options,
            }),
        }
    }

    /// The settings.
    pub fn options(&self) -> &DelegationOptions {
        &self.inner.options
    }

    /// Authenticates then authorizes a request: `certificate_user` is the user of a client
    /// certificate the TLS layer verified, `authorization` the `Authorization` header. No
    /// per-client budget applies ([`Delegation::check_from`] has one).
    pub async fn check(
        &self,
        method: &http::Method,
        path: &str,
        authorization: Option<&str>,
        certificate_user: Option<&UserInfo>,
    ) -> Result<UserInfo, Refusal> {
        self.check_from(None, method, path, authorization, certificate_user)
            .await
    }

    /// [`Delegation::check`] for a request from `client` (the peer's address): the reviews it
    /// causes count against that client's budget (see the module docs).
    pub async fn check_from(
        &self,
        client: Option<IpAddr>,
        method: &http::Method,
        path: &str,
        authorization: Option<&str>,
        certificate_user: Option<&UserInfo>,
    ) -> Result<UserInfo, Refusal> {
        let user = self
            .authenticate_from(client, authorization, certificate_user)
            .await?;
        self.authorize_from(client, &user, method, path).await?;
        Ok(user)
    }

    /// [`Delegation::check_from`] for a request whose client certificate the client CA did not
    /// sign: only a bearer token authenticates it (never anonymous), as upstream's union of the
    /// x509 and token authenticators.
    pub async fn check_token_only(
        &self,
        client: Option<IpAddr>,
        method: &http::Method,
        path: &str,
        authorization: Option<&str>,
    ) -> Result<UserInfo, Refusal> {
        if authorization.and_then(bearer_token).is_none()
            || self.inner.options.authentication_client.is_none()
        {
            return Err(Refusal::Unauthorized);
        }
        let user = self.authenticate_from(client, authorization, None).await?;
        self.authorize_from(client, &user, method, path).await?;
        Ok(user)
    }

    /// Who is asking (see the module docs for the order).
    pub async fn authenticate(
        &self,
        authorization: Option<&str>,
        certificate_user: Option<&UserInfo>,
    ) -> Result<UserInfo, Refusal> {
        self.authenticate_from(None, authorization, certificate_user)
            .await
    }

    async fn authenticate_from(
        &self,
        client_addr: Option<IpAddr>,
        authorization: Option<&str>,
        certificate_user: Option<&UserInfo>,
    ) -> Result<UserInfo, Refusal> {
        if let Some(user) = certificate_user {
            self.remember(None, user);
            return Ok(user.clone());
        }
        let (Some(client), Some(token)) = (
            &self.inner.options.authentication_client,
            authorization.and_then(bearer_token),
        ) else {
            return Ok(UserInfo::anonymous());
        };
        let key = key_of(token.as_bytes());
        let answer = match self.inner.tokens.get(key) {
            Some(answer) => answer,
            None => {
                let o = &self.inner.options;
                let budget = Budget {
                    client: client_addr,
                    recent: self.inner.recent.get(key).is_some(),
                };
                let answer = self
                    .limited(
                        &self.inner.token_reviews,
                        budget,
                        o.review_timeout,
                        review_token(client, token),
                    )
                    .await
                    .map_err(|e| {
                        match e {
                            ReviewError::RateLimited(_) | ReviewError::ClientBudget(_) => {
                                debug!(error = %e, "TokenReview not sent; answering 401")
                            }
                            _ => warn!(error = %e, "TokenReview failed; answering 401"),
                        }
                        Refusal::Unauthorized
                    })?;
                self.inner
                    .tokens
                    .put(key, answer.clone(), self.inner.options.token_cache_ttl);
                answer
            }
        };
        let user = answer.ok_or(Refusal::Unauthorized)?;
        self.remember(Some(key), &user);
        Ok(user)
    }

    /// Marks a token that authenticated, and the user it named, as recently authenticated.
    fn remember(&self, token: Option<CacheKey>, user: &UserInfo) {
        if let Some(token) = token {
            self.inner.recent.put(token, (), RECENTLY_AUTHENTICATED);
        }
        self.inner.recent.put(user_key(user), (), RECENTLY_AUTHENTICATED);
    }

    /// Sends one review within `timeout` through the shared `limiter` and, unless `budget` is
    /// a recently authenticated client's, the client's own budget (see the module docs).
    async fn limited<T>(
        &self,
        limiter: &RateLimiter,
        budget: Budget,
        timeout: Duration,
        review: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ReviewError> {
        let o = &self.inner.options;
        if !budget.recent
            && let Some(addr) = budget.client
        {
            let own = self
                .inner
                .clients
                .lock()
                .get_or_insert(client_of(addr), || {
                    Arc::new(RateLimiter::new(o.client_review_qps, o.client_review_burst))
                })
                .clone();
            if own.reserve(Duration::ZERO, 0.0).is_none() {
                return Err(ReviewError::ClientBudget(client_of(addr)));
            }
        }
        let (max_wait, floor) = if budget.recent {
            (timeout.min(REVIEW_MAX_QUEUE_WAIT), 0.0)
        } else {
            (Duration::ZERO, limiter.burst * REVIEW_RESERVE)
        };
        let start = tokio::time::Instant::now();
        let wait = limiter
            .reserve(max_wait, floor)
            .ok_or(ReviewError::RateLimited(limiter.qps))?;
        tokio::time::sleep(wait).await;
        let left = timeout.saturating_sub(start.elapsed());
        tokio::time::timeout(left, review)
            .await
            .map_err(|_| ReviewError::Timeout(timeout))?
            .map_err(ReviewError::from)
    }

    /// Whether `user` may `method` `path`.
    pub async fn authorize(&self, user: &UserInfo, method: &http::Method, path: &str) -> Result<(), Refusal> {
        self.authorize_from(None, user, method, path).await
    }

    async fn authorize_from(
        &self,
        client_addr: Option<IpAddr>,
        user: &UserInfo,
        method: &http::Method,
        path: &str,
    ) -> Result<(), Refusal> {
        let o = &self.inner.options;
        if o.always_allow_paths.iter().any(|p| path_matches(p, path)) {
            return Ok(());
        }
        if user.groups.iter().any(|g| o.always_allow_groups.contains(g)) {
            return Ok(());
        }
        let verb = verb_of(method);
        let forbidden = |reason: String| Refusal::Forbidden {
            user: user.name.clone(),
            verb: verb.to_string(),
            path: path.to_string(),
            reason,
        };
        let Some(client) = &o.authorization_client else {
            return Err(forbidden(String::new()));
        };
        let key = key_of(format!("{:?}", (user, verb, path)).as_bytes());
        let (allowed, reason) = match self.inner.decisions.get(key) {
            Some(d) => d,
            None => {
                let budget = Budget {
                    client: client_addr,
                    recent: self.inner.recent.get(user_key(user)).is_some(),
                };
                let d = self
                    .limited(
                        &self.inner.access_reviews,
                        budget,
                        o.review_timeout,
                        review_access(client, user, verb, path),
                    )
                    .await
                    .map_err(|e| {
                        match e {
                            ReviewError::RateLimited(_) | ReviewError::ClientBudget(_) => {
                                debug!(error = %e, path, "SubjectAccessReview not sent; answering 500")
                            }
                            _ => warn!(error = %e, path, "SubjectAccessReview failed"),
                        }
                        Refusal::AuthorizationError(e.to_string())
                    })?;
                let ttl = if d.0 { o.authorized_ttl } else { o.unauthorized_ttl };
                self.inner.decisions.put(key, d.clone(), ttl);
                d
            }
        };
        if allowed {
            Ok(())
        } else {
            debug!(user = %user.name, path, verb, "forbidden");
            Err(forbidden(reason))
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), as
/// upstream's bearer-token authenticator reads it; other schemes are ignored.
fn bearer_token(header: &str) -> Option<&str> {
    let header = header.trim();
    let (scheme, token) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

/// Upstream's request verb for a non-resource URL.
fn verb_of(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET | http::Method::HEAD => "get",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "",
    }
}

/// Upstream's always-allow path rule: exact, or a prefix when the pattern ends in `*`.
fn path_matches(pattern: &str, path: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => pattern == path,
    }
}

async fn review_token(client: &Client, token: &str) -> Result<Option<UserInfo>, kube::Error> {
    // The spec is built from JSON: `token` is an `Option<String>` in k8s-openapi's API versions
    // up to 1.35 and a `String` from 1.36 on, and the binary, not this library, chooses one.
    let review = TokenReview {
        spec: serde_json::from_value(serde_json::json!({ "token": token }))
            .map_err(kube::Error::SerdeError)?,
        ..Default::default()
    };
    let answer = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let Some(status) = answer.status else {
        return Ok(None);
    };
    if status.authenticated != Some(true) {
        return Ok(None);
    }
    let user = status.user.unwrap_or_default();
    Ok(Some(UserInfo {
        name: user.username.unwrap_or_default(),
        uid: user.uid.unwrap_or_default(),
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    }))
}

async fn review_access(
    client: &Client,
    user: &UserInfo,
    verb: &str,
    path: &str,
) -> Result<(bool, String), kube::Error> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.to_string()),
                verb: Some(verb.to_string()),
            }),
            resource_attributes: None,
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let status = answer.status.unwrap_or_default();
    Ok((
        status.allowed && status.denied != Some(true),
        status.reason.unwrap_or_default(),
    ))
}

/// Where upstream publishes the API server's client CA for delegating servers.
pub const AUTHENTICATION_CONFIGMAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");

/// How many times [`lookup_client_ca`] reads the ConfigMap at most when the API server fails
/// (`5xx`, `429`, no answer).
pub const LOOKUP_ATTEMPTS: u32 = 5;

/// Errors looking up the client CA.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// Reading `kube-system/extension-apiserver-authentication` failed.
    #[error(
        "unable to load configmap based client CA file from kube-system/extension-apiserver-authentication: {0} (--authentication-tolerate-lookup-failure=true starts without client certificate authentication)"
    )]
    ConfigMap(#[source] kube::Error),
}

/// The `client-ca-file` of `kube-system/extension-apiserver-authentication`, as PEM text:
/// `Ok(None)` when the ConfigMap or key does not exist (client certificates then are not
/// authenticated, with a warning, as upstream); an error when it cannot be read within
/// [`LOOKUP_ATTEMPTS`] attempts, unless `tolerate_failure`.
pub async fn lookup_client_ca(
    client: &Client,
    tolerate_failure: bool,
) -> Result<Option<String>, LookupError> {
    let (namespace, name) = AUTHENTICATION_CONFIGMAP;
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    // A server error or a lost connection is asked again a few times (1 s apart) before the
    // process gives up: an API server that fails one request at start-up should not cost a
    // restart. (Upstream fails at once, unless the answer carries Retry-After.)
    let mut answer = configmaps.get_opt(name).await;
    for _ in 1..LOOKUP_ATTEMPTS {
        match &answer {
            Err(kube::Error::Api(s)) if s.code < 500 && s.code != 429 => break,
            Err(e) => {
                warn!(error = %e, "reading configmap/{name} in {namespace}; asking again in 1 s");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                answer = configmaps.get_opt(name).await;
            }
            Ok(_) => break,
        }
    }
    match answer {
        Ok(Some(cm)) => {
            let ca = cm.data.and_then(|mut d| d.remove("client-ca-file"));
            if ca.is_none() {
                warn!(
                    "cluster doesn't provide client-ca-file in configmap/{name} in {namespace}, so client certificate authentication won't work."
                );
            }
            Ok(ca)
        }
        Ok(None) => {
            warn!(
                "configmap/{name} in {namespace} not found, so client certificate authentication won't work."
            );
            Ok(None)
        }
        Err(e) if tolerate_failure => {
            warn!(error = %e, "Error looking up in-cluster authentication configuration; continuing without client certificate authentication (--authentication-tolerate-lookup-failure)");
            Ok(None)
        }
        Err(e) => Err(LookupError::ConfigMap(e)),
    }
}

#[cfg(test)]
mod tests;
