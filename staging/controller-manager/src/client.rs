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
        let burst = f64::from(burst.max(1));
        Arc::new(Self {
            qps: f64::from(qps),
            burst,
            state: Mutex::new((burst, Instant::now())),
        })
    }

    /// Takes a token, returning how long the caller must wait before using it.
    pub fn reserve(&self) -> Duration {
        if self.qps <= 0.0 {
            return Duration::ZERO;
        }
        let mut s = self.state.lock();
        let now = Instant::now();
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

/// Builds a client from `config` with a QPS/burst limit and the given user agent.
pub fn build_client(config: Config, qps: f32, burst: u32, user_agent: &str) -> Result<Client, ClientError> {
    build(config, qps, burst, user_agent, None)
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
    )
}

fn build(
    mut config: Config,
    qps: f32,
    burst: u32,
    user_agent: &str,
    writes: Option<WriteLayer>,
) -> Result<Client, ClientError> {
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(user_agent)
            .unwrap_or_else(|_| http::HeaderValue::from_static("cloud-controller-manager")),
    ));
    let layer = RateLimitLayer::new(TokenBucket::new(qps, burst));
    let builder = ClientBuilder::try_from(config).map_err(ClientError::Build)?;
    Ok(builder
        .with_layer(&layer)
        .with_layer(&tower::util::option_layer(writes))
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_burst_then_qps() {
        let b = TokenBucket::new(10.0, 3);
        assert_eq!(b.reserve(), Duration::ZERO);
        assert_eq!(b.reserve(), Duration::ZERO);
        assert_eq!(b.reserve(), Duration::ZERO);
        let w = b.reserve();
        assert!((w.as_secs_f64() - 0.1).abs() < 1e-6, "{w:?}");
        let w = b.reserve();
        assert!((w.as_secs_f64() - 0.2).abs() < 1e-6, "{w:?}");
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(b.reserve(), Duration::ZERO, "refilled (capped at burst)");
        assert_eq!(TokenBucket::new(0.0, 1).reserve(), Duration::ZERO);
    }
}
