//! Building Kubernetes clients the way a controller manager does: from `--kubeconfig` /
//! `--master` (in-cluster config when both are empty), with a client-side QPS/burst limit
//! (client-go's token bucket: `--kube-api-qps`, `--kube-api-burst`) and a user agent.

use std::{
    future::Future,
    path::Path,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use kube::{
    Client, Config,
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};
use parking_lot::Mutex;
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use crate::writes::{DryRun, WriteLayer};

/// Errors building a client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig could not be read or used.
    #[error("--kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The path given.
        path: String,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig and not running in a cluster.
    #[error("no --kubeconfig or --master given and the in-cluster configuration is unavailable: {0}")]
    InCluster(#[source] kube::config::InClusterError),
    /// `--master` is not a URL.
    #[error("--master {0:?} is not a valid URL")]
    Master(String),
    /// The client could not be built (TLS, proxy, …).
    #[error("building the Kubernetes client: {0}")]
    Build(#[source] kube::Error),
}

/// Loads the REST configuration: `kubeconfig` (overridden by `master`), or in-cluster.
pub async fn load_config(kubeconfig: Option<&Path>, master: Option<&str>) -> Result<Config, ClientError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                })?
        }
        None => match master {
            Some(_) => Config::new("http://localhost".parse().expect("static URL")),
            None => Config::incluster().map_err(ClientError::InCluster)?,
        },
    };
    if let Some(m) = master.filter(|m| !m.is_empty()) {
        config.cluster_url = m.parse().map_err(|_| ClientError::Master(m.to_string()))?;
    }
    Ok(config)
}

/// A token bucket shared by every request of one client: `qps` tokens per second, at most
/// `burst` stored. A request waits for its token before it is sent (like client-go).
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A bucket that starts full. `qps <= 0` disables limiting.
    pub fn new(qps: f32, burst: u32) -> Arc<Self> {
        Self::full_at(qps, burst, Instant::now())
    }

    /// A full bucket as of `start` (tests give the clock explicitly: the shipped binaries'
    /// tokio has no paused time, and the tests build the same tokio so as to share its build).
    fn full_at(qps: f32, burst: u32, start: Instant) -> Arc<Self> {
        let burst = f64::from(burst.max(1));
        Arc::new(Self {
            qps: f64::from(qps),
            burst,
            state: Mutex::new((burst, start)),
        })
    }

    /// Takes a token, returning how long the caller must wait before using it.
    pub fn reserve(&self) -> Duration {
        self.reserve_at(Instant::now())
    }

    /// [`Self::reserve`] at `now`.
    fn reserve_at(&self, now: Instant) -> Duration {
        if self.qps <= 0.0 {
            return Duration::ZERO;
        }
        let mut s = self.state.lock();
        let refill = now.duration_since(s.1).as_secs_f64() * self.qps;
        s.0 = (s.0 + refill).min(self.burst);
        s.1 = now;
        s.0 -= 1.0;
        if s.0 >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-s.0 / self.qps)
        }
    }
}

/// Tower layer applying a [`TokenBucket`] before each request.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: Arc<TokenBucket>,
}

impl RateLimitLayer {
    /// A layer over `bucket`.
    pub fn new(bucket: Arc<TokenBucket>) -> Self {
        Self { bucket }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            sleep: None,
            reserved: false,
        }
    }
}

/// The service made by [`RateLimitLayer`]: `poll_ready` waits for a token.
pub struct RateLimited<S> {
    inner: S,
    bucket: Arc<TokenBucket>,
    sleep: Option<Pin<Box<Sleep>>>,
    reserved: bool,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.reserved {
            if self.sleep.is_none() {
                let wait = self.bucket.reserve();
                if !wait.is_zero() {
                    self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            self.reserved = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.reserved = false;
        self.inner.call(req)
    }
}

/// How long a client waits for the API server's answer to a request that is not a watch:
/// kube-apiserver's own default `--request-timeout` (1 min), after which it would have ended
/// the request itself. Without it, a server that accepts a request and never answers holds
/// the caller (a reconcile, with its key) until the connection's read timeout (295 s).
pub const API_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The error of a request not answered within its [`RequestTimeoutLayer`] bound (it names the
/// request; the client turns it into a `kube::Error::Service`).
#[derive(Debug, thiserror::Error)]
#[error("the API server did not answer {method} {path} within {after:?}")]
pub struct RequestTimedOut {
    /// The request's method.
    pub method: http::Method,
    /// The request's path, without its query.
    pub path: String,
    /// The bound.
    pub after: Duration,
}

/// Tower layer bounding every request but watches by a time (see [`API_REQUEST_TIMEOUT`]):
/// the wait for the answer's head. A watch (`watch=true`/`watch=1`) lasts as long as the
/// server keeps it open and is left alone.
#[derive(Debug, Clone, Copy)]
pub struct RequestTimeoutLayer {
    after: Duration,
}

impl RequestTimeoutLayer {
    /// A layer bounding each request by `after`.
    pub fn new(after: Duration) -> Self {
        Self { after }
    }
}

impl<S> Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeout<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestTimeout {
            inner,
            after: self.after,
        }
    }
}

/// The service made by [`RequestTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct RequestTimeout<S> {
    inner: S,
    after: Duration,
}

/// Whether a request is a watch (its query has `watch=true` or `watch=1`).
fn is_watch<B>(req: &http::Request<B>) -> bool {
    req.uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

impl<S, B> Service<http::Request<B>> for RequestTimeout<S>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let bound = (!is_watch(&req)).then(|| RequestTimedOut {
            method: req.method().clone(),
            path: req.uri().path().to_string(),
            after: self.after,
        });
        let answer = self.inner.call(req);
        Box::pin(async move {
            match bound {
                None => answer.await.map_err(Into::into),
                Some(timed_out) => match tokio::time::timeout(timed_out.after, answer).await {
                    Ok(r) => r.map_err(Into::into),
                    Err(_) => Err(Box::new(timed_out) as tower::BoxError),
                },
            }
        })
    }
}

/// Builds a client from `config` with a QPS/burst limit and the given user agent.
pub fn build_client(config: Config, qps: f32, burst: u32, user_agent: &str) -> Result<Client, ClientError> {
    build(config, qps, burst, user_agent, None, None)
}

/// Builds the client of one controller (or other writer) of a controller manager: like
/// [`build_client`], with its writes seen by a [`WriteLayer`] named `writer` (logged; made
/// server-side dry runs when `dry_run` is given).
pub fn build_writer_client(
    config: Config,
    qps: f32,
    burst: u32,
    user_agent: &str,
    writer: &str,
    dry_run: Option<DryRun>,
) -> Result<Client, ClientError> {
    build(
        config,
        qps,
        burst,
        user_agent,
        Some(WriteLayer::new(writer, dry_run)),
        None,
    )
}

/// [`build_writer_client`] authenticating every request with `token` (which its owner may
/// [`replace`](BearerToken::replace) at any time) instead of `config`'s credentials, which are
/// not used: `config`'s client certificate and token are dropped.
pub fn build_writer_client_with_token(
    mut config: Config,
    qps: f32,
    burst: u32,
    user_agent: &str,
    writer: &str,
    dry_run: Option<DryRun>,
    token: &BearerToken,
) -> Result<Client, ClientError> {
    config.auth_info = Default::default();
    build(
        config,
        qps,
        burst,
        user_agent,
        Some(WriteLayer::new(writer, dry_run)),
        Some(BearerTokenLayer(token.clone())),
    )
}

/// A bearer token held in memory, shared by the clients that send it and whoever renews it.
/// `--use-service-account-credentials` mints its controllers' tokens this way and never writes
/// them to a file (the CCM's root file system is read-only and has no `/tmp`). Its `Debug`
/// never shows the token, and the header is marked sensitive.
#[derive(Clone)]
pub struct BearerToken(Arc<parking_lot::RwLock<http::HeaderValue>>);

impl BearerToken {
    /// A token to send as `Authorization: Bearer <token>`; refused when it cannot be an HTTP
    /// header value (the error does not contain it).
    pub fn new(token: &str) -> Result<Self, http::header::InvalidHeaderValue> {
        Ok(Self(Arc::new(parking_lot::RwLock::new(Self::header(token)?))))
    }

    /// Replaces the token: every later request of every client sharing it sends the new one.
    pub fn replace(&self, token: &str) -> Result<(), http::header::InvalidHeaderValue> {
        *self.0.write() = Self::header(token)?;
        Ok(())
    }

    fn header(token: &str) -> Result<http::HeaderValue, http::header::InvalidHeaderValue> {
        let mut value = http::HeaderValue::from_str(&format!("Bearer {token}"))?;
        value.set_sensitive(true);
        Ok(value)
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// Sets `Authorization` from a [`BearerToken`] on every request.
#[derive(Debug, Clone)]
struct BearerTokenLayer(BearerToken);

impl<S> Layer<S> for BearerTokenLayer {
    type Service = WithBearerToken<S>;
    fn layer(&self, inner: S) -> Self::Service {
        WithBearerToken {
            inner,
            token: self.0.clone(),
        }
    }
}

/// The service made by [`BearerTokenLayer`].
#[derive(Debug, Clone)]
struct WithBearerToken<S> {
    inner: S,
    token: BearerToken,
}

impl<S, B> Service<http::Request<B>> for WithBearerToken<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let value = self.token.0.read().clone();
        req.headers_mut().insert(http::header::AUTHORIZATION, value);
        self.inner.call(req)
    }
}

fn build(
    mut config: Config,
    qps: f32,
    burst: u32,
    user_agent: &str,
    writes: Option<WriteLayer>,
    token: Option<BearerTokenLayer>,
) -> Result<Client, ClientError> {
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(user_agent)
            .unwrap_or_else(|_| http::HeaderValue::from_static("cloud-controller-manager")),
    ));
    let layer = RateLimitLayer::new(TokenBucket::new(qps, burst));
    let builder = ClientBuilder::try_from(config).map_err(ClientError::Build)?;
    Ok(builder
        .with_layer(&RequestTimeoutLayer::new(API_REQUEST_TIMEOUT))
        .with_layer(&layer)
        .with_layer(&tower::util::option_layer(writes))
        .with_layer(&tower::util::option_layer(token))
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_replaced_bearer_token_is_sent_by_every_client_sharing_it() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = {
            let seen = seen.clone();
            tower::service_fn(move |req: http::Request<()>| {
                let value = req.headers().get(http::header::AUTHORIZATION).cloned();
                seen.lock().push(value);
                async { Ok::<_, std::convert::Infallible>(http::Response::new(())) }
            })
        };
        let token = BearerToken::new("first").unwrap();
        let mut svc = BearerTokenLayer(token.clone()).layer(record);
        let get = || http::Request::get("/api/v1/nodes").body(()).unwrap();
        svc.call(get()).await.unwrap();
        token.replace("second").unwrap();
        svc.call(get()).await.unwrap();
        let seen = seen.lock();
        assert_eq!(seen[0].as_ref().unwrap(), "Bearer first");
        assert_eq!(seen[1].as_ref().unwrap(), "Bearer second");
        assert!(seen[1].as_ref().unwrap().is_sensitive());
        assert_eq!(format!("{token:?}"), "BearerToken(<redacted>)");
        assert!(BearerToken::new("new\nline").is_err());
    }

    #[tokio::test]
    async fn requests_but_watches_are_bounded() {
        // A server that never answers.
        let never = tower::service_fn(|_req: http::Request<()>| {
            std::future::pending::<Result<http::Response<()>, std::convert::Infallible>>()
        });
        // Real time (the shipped tokio has no paused clock): a bound of 50 ms.
        let mut svc = RequestTimeoutLayer::new(Duration::from_millis(50)).layer(never);
        let get = http::Request::get("/api/v1/nodes/a?resourceVersion=0")
            .body(())
            .unwrap();
        let e = svc.call(get).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "the API server did not answer GET /api/v1/nodes/a within 50ms"
        );
        let watch = http::Request::get("/api/v1/nodes?watch=true&timeoutSeconds=290")
            .body(())
            .unwrap();
        let pending = svc.call(watch);
        assert!(
            tokio::time::timeout(Duration::from_millis(500), pending)
                .await
                .is_err(),
            "a watch is not bounded"
        );
        assert!(!is_watch(
            &http::Request::get("/api/v1/nodes?watchers=true")
                .body(())
                .unwrap()
        ));
        assert!(is_watch(
            &http::Request::get("/api/v1/nodes?a=b&watch=1").body(()).unwrap()
        ));
    }

    #[test]
    fn bucket_allows_burst_then_qps() {
        let start = Instant::now();
        let b = TokenBucket::full_at(10.0, 3, start);
        assert_eq!(b.reserve_at(start), Duration::ZERO);
        assert_eq!(b.reserve_at(start), Duration::ZERO);
        assert_eq!(b.reserve_at(start), Duration::ZERO);
        let w = b.reserve_at(start);
        assert!((w.as_secs_f64() - 0.1).abs() < 1e-6, "{w:?}");
        let w = b.reserve_at(start);
        assert!((w.as_secs_f64() - 0.2).abs() < 1e-6, "{w:?}");
        // Half a token back after 50 ms: still 0.25 s to wait for the next.
        let w = b.reserve_at(start + Duration::from_millis(50));
        assert!((w.as_secs_f64() - 0.25).abs() < 1e-6, "{w:?}");
        let later = start + Duration::from_secs(10);
        assert_eq!(b.reserve_at(later), Duration::ZERO, "refilled (capped at burst)");
        assert_eq!(b.reserve_at(later), Duration::ZERO);
        assert_eq!(b.reserve_at(later), Duration::ZERO);
        assert!(b.reserve_at(later) > Duration::ZERO, "capped at a burst of 3");
        assert_eq!(TokenBucket::new(0.0, 1).reserve(), Duration::ZERO);
    }
}
