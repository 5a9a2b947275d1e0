//! The controller manager's HTTPS endpoint (`--secure-port`, default 10258 for the CCM):
//! `/healthz`, `/livez`, `/readyz` (aggregated named checks, `?verbose` lists them, 200 `ok`
//! or 500) and `/metrics` (Prometheus text format).
//!
//! TLS uses `--tls-cert-file`/`--tls-private-key-file` when given, else a self-signed
//! certificate for `localhost`/`127.0.0.1` generated at start (written to `--cert-dir` when
//! one is given), as upstream does; `--tls-sni-cert-key`, `--tls-min-version` and
//! `--tls-cipher-suites` as upstream, and certificates, keys and the client CA file are
//! reloaded when they change ([`tls`]). Idle, slow and greedy clients cannot starve the health
//! probes ([`connections`]).
//!
//! A request for any other path is answered 404 at once, and a request head (HTTP/1 request
//! line and headers, HTTP/2 header list) is limited to 16 KiB.
//!
//! Every request for a served path passes the delegated authentication and authorization of
//! [`crate::auth`] when the caller gives a [`Delegation`] (the cloud-controller-manager always
//! does): with
//! upstream's defaults `/healthz`, `/readyz` and `/livez` are open and `/metrics` needs a user
//! allowed to `get` it. A client certificate is asked for (never required) when a client CA is
//! configured.

use std::{
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::{body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use parking_lot::RwLock;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub mod connections;
pub mod tls;

pub use connections::ConnectionLimits;
pub use tls::{ReloadingConfig, SniCertKey};

use crate::{
    auth::{Delegation, Refusal, UserInfo},
    metrics::Metrics,
};

/// The most a request's head may take (HTTP/1 request line and headers; HTTP/2 header list):
/// the requests served here are a path and a bearer token or client certificate. With hyper's
/// ~400 KiB default, 512 connections each holding an unfinished head would hold ~200 MiB.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// HTTP/2 flow-control windows: the requests served here have no body.
const HTTP2_WINDOW_BYTES: u32 = 64 * 1024;

/// The paths served. A request for any other path is answered 404 before any authentication
/// or authorization: an unserved path costs no TokenReview or SubjectAccessReview.
fn served(path: &str) -> bool {
    matches!(path, "/healthz" | "/livez" | "/readyz" | "/metrics")
}

/// A named health check.
pub type HealthCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// A set of named checks served on one path. Cheap to clone; clones share the set.
#[derive(Clone, Default)]
pub struct HealthChecks {
    checks: Arc<RwLock<Vec<(String, HealthCheck)>>>,
}

impl std::fmt::Debug for HealthChecks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.checks.read().iter().map(|(n, _)| n.clone()))
            .finish()
    }
}

impl HealthChecks {
    /// Adds (or replaces) a check.
    pub fn add(&self, name: &str, check: HealthCheck) {
        let mut checks = self.checks.write();
        checks.retain(|(n, _)| n != name);
        checks.push((name.to_string(), check));
    }

    /// Removes a check.
    pub fn remove(&self, name: &str) {
        self.checks.write().retain(|(n, _)| n != name);
    }

    /// Runs every check (the default `ping` when none is registered): `(healthy, report)`.
    pub fn run(&self, path: &str, verbose: bool) -> (bool, String) {
        let checks = self.checks.read();
        let mut lines = vec!["[+]ping ok".to_string()];
        let mut ok = true;
        for (name, check) in checks.iter() {
            match check() {
                Ok(()) => lines.push(format!("[+]{name} ok")),
                Err(reason) => {
                    ok = false;
                    warn!(check = %name, path, reason = %reason, "health check failed");
                    lines.push(if verbose {
                        format!("[-]{name} failed: {reason}")
                    } else {
                        format!("[-]{name} failed: reason withheld")
                    });
                }
            }
        }
        let what = path.trim_start_matches('/');
        match (ok, verbose) {
            (true, false) => (true, "ok".into()),
            (true, true) => (true, format!("{}\n{what} check passed\n", lines.join("\n"))),
            (false, _) => (false, format!("{}\n{what} check failed\n", lines.join("\n"))),
        }
    }
}

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct ServingOptions {
    /// `--bind-address`.
    pub bind_address: IpAddr,
    /// `--secure-port` (0 = no server).
    pub secure_port: u16,
    /// `--tls-cert-file`.
    pub tls_cert_file: Option<PathBuf>,
    /// `--tls-private-key-file`.
    pub tls_private_key_file: Option<PathBuf>,
    /// `--cert-dir` (where a generated pair is written).
    pub cert_dir: Option<PathBuf>,
    /// Base name of a generated pair (`cloud-controller-manager`).
    pub pair_name: String,
    /// `--tls-sni-cert-key` (repeatable).
    pub sni_cert_keys: Vec<SniCertKey>,
    /// `--tls-min-version` (Go's names, `VersionTLS12`; empty: TLS 1.2).
    pub tls_min_version: String,
    /// `--tls-cipher-suites` (Go's names; empty: the defaults).
    pub tls_cipher_suites: Vec<String>,
    /// Certificates trusted to sign client certificates (`--client-ca-file`, or the cluster's
    /// `extension-apiserver-authentication` ConfigMap), as PEM, with where it came from (for
    /// errors). `None`: no client certificate is asked for.
    pub client_ca: Option<ClientCa>,
    /// `--tls-curve-preferences`: Go `crypto/tls` CurveIDs (the TLS named-group code points),
    /// in preference order; empty: the defaults.
    pub tls_curve_preferences: Vec<u16>,
    /// `--disable-http2-serving`: HTTP/1.1 only (no `h2` in ALPN).
    pub disable_http2: bool,
    /// `--http2-max-streams-per-connection` (0: this server's default,
    /// [`ConnectionLimits::default`]'s 16).
    pub http2_max_streams_per_connection: u32,
    /// `--permit-port-sharing`: `SO_REUSEPORT` on the listening socket, so that more than one
    /// process can bind the same address and port. (`SO_REUSEADDR`, `--permit-address-sharing`,
    /// is always set, as Rust's and Go's listeners on Linux set it.)
    pub permit_port_sharing: bool,
}

/// A client CA bundle and its origin.
#[derive(Debug, Clone)]
pub struct ClientCa {
    /// Where the bundle came from (`--client-ca-file <path>`, or the ConfigMap).
    pub source: String,
    /// The PEM text (read from `file` instead when that is set).
    pub pem: String,
    /// The file it is read from (`--client-ca-file`), and read again when it changes; `None`
    /// for a bundle from the cluster.
    pub file: Option<PathBuf>,
    /// New bundles (PEM), taken for new connections as they come (a bundle from the cluster,
    /// read again by whoever holds the sender); `None`: no updates.
    pub updates: Option<tokio::sync::watch::Receiver<String>>,
}

/// Serving errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Binding the port failed.
    #[error("failed to listen on {addr} (--bind-address/--secure-port): {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate or key could not be loaded.
    #[error("{flag} {path}: {reason}")]
    Certificate {
        /// The flag naming the file.
        flag: &'static str,
        /// The path.
        path: String,
        /// Why.
        reason: String,
    },
    /// Generating or using the TLS configuration failed.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// The secure port's own thread could not be started.
    #[error("starting the secure port's thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// The endpoints' state.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// `/healthz` checks.
    pub healthz: HealthChecks,
    /// `/livez` checks.
    pub livez: HealthChecks,
    /// `/readyz` checks.
    pub readyz: HealthChecks,
    /// `/metrics`.
    pub metrics: Arc<Metrics>,
}

/// Binds and starts serving on a thread of its own until `shutdown`, with the default
/// [`ConnectionLimits`]. Returns the bound address (`None` when `--secure-port` is 0).
///
/// With `delegation`, every request is authenticated and authorized by it (401/403 otherwise);
/// without, every request is served (for embedding in a process that guards the port itself).
pub async fn serve(
    opts: &ServingOptions,
    endpoints: Endpoints,
    delegation: Option<Delegation>,
    shutdown: CancellationToken,
) -> Result<Option<SocketAddr>, ServerError> {
    if opts.secure_port == 0 {
        info!("--secure-port is 0: not serving health and metrics");
        return Ok(None);
    }
    let tls = ReloadingConfig::start(opts, shutdown.clone())?;
    let addr = SocketAddr::new(opts.bind_address, opts.secure_port);
    // The port is served on its own thread: TLS handshakes (1–2 ms of CPU each) and a flood of
    // connections never take the workers the controllers run on, and a busy controller never
    // delays the kubelet's probe.
    let runtime = own_runtime(shutdown.clone())?;
    let _on_its_thread = runtime.enter();
    let listener =
        bind(addr, opts.permit_port_sharing).map_err(|source| ServerError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServerError::Bind { addr, source })?;
    info!(address = %local, http2 = !opts.disable_http2, "Serving securely on {local}");
    let defaults = ConnectionLimits::default();
    let limits = ConnectionLimits {
        http2_max_concurrent_streams: match opts.http2_max_streams_per_connection {
            0 => defaults.http2_max_concurrent_streams,
            n => n,
        },
        http1_only: opts.disable_http2,
        ..defaults
    };
    serve_on(listener, tls, endpoints, delegation, limits, shutdown);
    Ok(Some(local))
}

/// A single-threaded runtime on a thread of its own (`secure-port`), running until `shutdown`.
fn own_runtime(shutdown: CancellationToken) -> Result<tokio::runtime::Handle, ServerError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServerError::Thread)?;
    let handle = runtime.handle().clone();
    std::thread::Builder::new()
        .name("secure-port".into())
        .spawn(move || runtime.block_on(shutdown.cancelled()))
        .map_err(ServerError::Thread)?;
    Ok(handle)
}

/// The listening socket: `SO_REUSEADDR` (as `TcpListener::bind` sets it), `SO_REUSEPORT` when
/// asked for.
fn bind(addr: SocketAddr, reuse_port: bool) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    if reuse_port {
        socket.set_reuseport(true)?;
    }
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Serves TLS connections from `listener` with `limits` until `shutdown`, checking every
/// request with `delegation` when given.
pub fn serve_on(
    listener: TcpListener,
    tls: ReloadingConfig,
    endpoints: Endpoints,
    delegation: Option<Delegation>,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let table = connections::ConnectionTable::default();
    let handshakes = connections::HandshakeGate::default();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(s) => s,
                    Err(e) => { warn!(error = %e, "accept failed"); continue; }
                },
                _ = shutdown.cancelled() => return,
            };
            let Some(slot) = table.admit(peer.ip(), limits.max_connections) else {
                debug!(peer = %peer, max = limits.max_connections, "every connection is answering a request; closing a new one");
                drop(stream);
                continue;
            };
            let config = tls.config();
            let tls_state = tls.clone();
            let handshakes = handshakes.clone();
            let endpoints = endpoints.clone();
            let delegation = delegation.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let close = slot.close.clone();
                let activity = slot.activity.clone();
                let served = async {
                    let handshake = async {
                        // The client's hello costs nothing to wait for; the rest (the server's
                        // signature) needs a place in the handshake gate.
                        let start = tokio_rustls::LazyConfigAcceptor::new(
                            rustls::server::Acceptor::default(),
                            stream,
                        )
                        .await
                        .ok()?;
                        let Some(_place) = handshakes.enter(
                            peer.ip(),
                            limits.max_handshakes,
                            limits.max_handshakes_per_client,
                        ) else {
                            debug!(peer = %peer, "too many TLS handshakes in progress; closing a new one");
                            return None;
                        };
                        start.into_stream(config).await.ok()
                    };
                    let Ok(Some(tls)) = tokio::time::timeout(limits.handshake_timeout, handshake).await
                    else {
                        return;
                    };
                    // A verified client certificate names the user of every request on this
                    // connection; one without a Common Name authenticates nobody (401); one the
                    // client CA did not sign leaves the requests to their bearer token.
                    let certificate = match tls.get_ref().1.peer_certificates() {
                        Some(certs) if !certs.is_empty() => {
                            if tls_state.verify_client(certs) {
                                Certificate::Verified(UserInfo::from_client_certificate(&certs[0]))
                            } else {
                                Certificate::Foreign
                            }
                        }
                        _ => Certificate::None,
                    };
                    let certificate = Arc::new(certificate);
                    let in_flight = activity.clone();
                    let service = service_fn(move |req| {
                        let endpoints = endpoints.clone();
                        let delegation = delegation.clone();
                        let certificate = certificate.clone();
                        let in_flight = in_flight.clone();
                        async move {
                            if !served(req.uri().path()) {
                                return Ok::<_, Infallible>(not_found());
                            }
                            // Only a request that passed the checks keeps its connection from
                            // being closed to make room: one still waiting for its TokenReview
                            // does not.
                            if let Some(gate) = &delegation
                                && let Err(refusal) = check(gate, peer.ip(), &certificate, &req).await
                            {
                                return Ok::<_, Infallible>(refused(&refusal));
                            }
                            let _request = in_flight.request();
                            Ok::<_, Infallible>(handle(&endpoints, req))
                        }
                    });
                    let mut builder = auto::Builder::new(TokioExecutor::new());
                    if limits.http1_only {
                        builder = builder.http1_only();
                    }
                    builder
                        .http1()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(limits.header_read_timeout)
                        .max_buf_size(MAX_HEAD_BYTES);
                    builder
                        .http2()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .keep_alive_interval(limits.http2_keep_alive_interval)
                        .keep_alive_timeout(limits.idle_timeout)
                        .max_concurrent_streams(limits.http2_max_concurrent_streams)
                        .max_header_list_size(MAX_HEAD_BYTES as u32)
                        .initial_stream_window_size(HTTP2_WINDOW_BYTES)
                        .initial_connection_window_size(HTTP2_WINDOW_BYTES);
                    let io = connections::IdleTimeout::new(tls, limits.idle_timeout, activity);
                    let _ = builder.serve_connection(TokioIo::new(io), service).await;
                };
                tokio::select! {
                    _ = tokio::time::timeout(limits.max_connection_age, served) => {}
                    _ = close.cancelled() => {}
                    _ = shutdown.cancelled() => {}
                }
                drop(slot);
            });
        }
    });
}

/// The client certificate of a connection.
enum Certificate {
    /// None was presented.
    None,
    /// One the client CA signed, and the user it names (`None`: no Common Name).
    Verified(Option<UserInfo>),
    /// One the client CA did not sign (another CA, a rotated one, or none configured).
    Foreign,
}

async fn check(
    gate: &Delegation,
    peer: IpAddr,
    certificate: &Certificate,
    req: &Request<Incoming>,
) -> Result<(), Refusal> {
    let authorization = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let path = req.uri().path();
    let checked = match certificate {
        Certificate::None => {
            gate.check_from(Some(peer), req.method(), path, authorization, None)
                .await
        }
        Certificate::Verified(Some(user)) => {
            gate.check_from(Some(peer), req.method(), path, authorization, Some(user))
                .await
        }
        Certificate::Verified(None) => Err(Refusal::Unauthorized),
        // As upstream's x509 authenticator failing inside its union: the token may still
        // authenticate the request; without one, it is not anonymous but refused.
        Certificate::Foreign => {
            gate.check_token_only(Some(peer), req.method(), path, authorization)
                .await
        }
    };
    match checked {
        Ok(user) => {
            debug!(user = %user.name, path, "authorized");
            Ok(())
        }
        Err(refusal) => {
            debug!(path, status = refusal.status(), "refused");
            Err(refusal)
        }
    }
}

fn refused(refusal: &Refusal) -> Response<Full<Bytes>> {
    let status = StatusCode::from_u16(refusal.status()).unwrap_or(StatusCode::FORBIDDEN);
    text(status, refusal.body(), "application/json")
}

fn handle(endpoints: &Endpoints, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let verbose = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "verbose" || p.starts_with("verbose=")));
    let path = req.uri().path();
    let checks = match path {
        "/healthz" => Some(&endpoints.healthz),
        "/livez" => Some(&endpoints.livez),
        "/readyz" => Some(&endpoints.readyz),
        _ => None,
    };
    if let Some(checks) = checks {
        let (ok, body) = checks.run(path, verbose);
        return text(
            if ok {
                StatusCode::OK
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            },
            body,
            "text/plain; charset=utf-8",
        );
    }
    if path == "/metrics" {
        return text(
            StatusCode::OK,
            endpoints.metrics.encode(),
            "text/plain; version=0.0.4; charset=utf-8",
        );
    }
    not_found()
}

fn not_found() -> Response<Full<Bytes>> {
    text(
        StatusCode::NOT_FOUND,
        "404 page not found\n".into(),
        "text/plain; charset=utf-8",
    )
}

fn text(status: StatusCode, body: String, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_flood_of_idle_connections_loses_its_own_and_never_starves_another_client() {
        use tokio::io::AsyncReadExt;
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let opts = ServingOptions {
            bind_address: "127.0.0.1".parse().unwrap(),
            secure_port: 1,
            tls_cert_file: None,
            tls_private_key_file: None,
            cert_dir: None,
            pair_name: "test".into(),
            client_ca: None,
            sni_cert_keys: vec![],
            tls_min_version: String::new(),
            tls_cipher_suites: vec![],
            tls_curve_preferences: vec![],
            disable_http2: false,
            http2_max_streams_per_connection: 0,
            permit_port_sharing: false,
        };
        let tls = ReloadingConfig::fixed(tls::server_config(&opts).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ConnectionLimits {
            max_connections: 4,
            handshake_timeout: Duration::from_millis(4000),
            ..ConnectionLimits::default()
        };
        let shutdown = CancellationToken::new();
        let endpoints = Endpoints {
            healthz: HealthChecks::default(),
            livez: HealthChecks::default(),
            readyz: HealthChecks::default(),
            metrics: Arc::new(crate::metrics::Metrics::new()),
        };
        serve_on(listener, tls, endpoints, None, limits, shutdown.clone());
        let closed = |mut s: tokio::net::TcpStream, within: Duration| async move {
            let mut buf = [0u8; 1];
            matches!(
                tokio::time::timeout(within, s.read(&mut buf)).await,
                Ok(Ok(0)) | Ok(Err(_))
            )
        };
        // Four idle clients of one address take every place.
        let mut flood = Vec::new();
        for _ in 0..4 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            flood.push(socket.connect(addr).await.unwrap());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Another client gets in once the flood's connections are old enough to be closed
        // (younger ones never are): the flood's oldest connection is closed for it.
        tokio::time::sleep(connections::MIN_AGE_TO_CLOSE + Duration::from_millis(100)).await;
        let other = tokio::net::TcpStream::connect(addr).await.unwrap();
        let oldest = flood.remove(0);
        assert!(
            closed(oldest, Duration::from_secs(1)).await,
            "the flood's oldest goes"
        );
        let mut buf = [0u8; 1];
        let mut other = other;
        assert!(
            tokio::time::timeout(Duration::from_millis(300), other.read(&mut buf))
                .await
                .is_err(),
            "the other client's connection stays open"
        );
        // Connections that never finish a handshake are closed after the handshake timeout.
        for s in flood {
            assert!(closed(s, Duration::from_secs(5)).await, "idle connection closed");
        }
        shutdown.cancel();
    }

    #[test]
    fn health_report_format() {
        let checks = HealthChecks::default();
        assert_eq!(checks.run("/healthz", false), (true, "ok".into()));
        checks.add("leaderElection", Arc::new(|| Ok(())));
        assert_eq!(
            checks.run("/healthz", true).1,
            "[+]ping ok\n[+]leaderElection ok\nhealthz check passed\n"
        );
        checks.add("cloud-node-controller", Arc::new(|| Err("stuck".into())));
        let (ok, body) = checks.run("/healthz", false);
        assert!(!ok);
        assert!(
            body.contains("[-]cloud-node-controller failed: reason withheld"),
            "{body}"
        );
        assert!(
            checks
                .run("/healthz", true)
                .1
                .contains("[-]cloud-node-controller failed: stuck")
        );
    }
}
