//! The controller manager's HTTPS endpoint (`--secure-port`, default 10258 for the CCM):
//! `/healthz`, `/livez`, `/readyz` (aggregated named checks, `?verbose` lists them, 200 `ok`
//! or 500) and `/metrics` (Prometheus text format).
//!
//! TLS uses `--tls-cert-file`/`--tls-private-key-file` when given, else a self-signed
//! certificate for `localhost`/`127.0.0.1` generated at start (written to `--cert-dir` when
//! one is given), as upstream does.
//!
//! Every request passes the delegated authentication and authorization of [`crate::auth`]
//! when the caller gives a [`Delegation`] (the cloud-controller-manager always does): with
//! upstream's defaults `/healthz`, `/readyz` and `/livez` are open and `/metrics` needs a user
//! allowed to `get` it. A client certificate is asked for (never required) when a client CA is
//! configured.

use std::{
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
    time::Duration,
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
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    auth::{Delegation, Refusal, UserInfo},
    metrics::Metrics,
};

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
    /// Certificates trusted to sign client certificates (`--client-ca-file`, or the cluster's
    /// `extension-apiserver-authentication` ConfigMap), as PEM, with where it came from (for
    /// errors). `None`: no client certificate is asked for.
    pub client_ca: Option<ClientCa>,
}

/// A client CA bundle and its origin.
#[derive(Debug, Clone)]
pub struct ClientCa {
    /// Where the bundle came from (`--client-ca-file <path>`, or the ConfigMap).
    pub source: String,
    /// The PEM text.
    pub pem: String,
}

/// Serving errors.
#[derive(Debug, thiserror::Error)]
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

fn tls_config(opts: &ServingOptions) -> Result<rustls::ServerConfig, ServerError> {
    let (certs, key): (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) =
        match (&opts.tls_cert_file, &opts.tls_private_key_file) {
            (Some(cert), Some(key)) => {
                let certs = CertificateDer::pem_file_iter(cert)
                    .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| ServerError::Certificate {
                        flag: "--tls-cert-file",
                        path: cert.display().to_string(),
                        reason: e.to_string(),
                    })?;
                if certs.is_empty() {
                    return Err(ServerError::Certificate {
                        flag: "--tls-cert-file",
                        path: cert.display().to_string(),
                        reason: "no certificate in the file".into(),
                    });
                }
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| ServerError::Certificate {
                    flag: "--tls-private-key-file",
                    path: key.display().to_string(),
                    reason: e.to_string(),
                })?;
                (certs, key)
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(ServerError::Tls(
                    "--tls-cert-file and --tls-private-key-file must be given together".into(),
                ));
            }
            (None, None) => {
                let generated = rcgen::generate_simple_self_signed(vec![
                    "localhost".to_string(),
                    "127.0.0.1".to_string(),
                ])
                .map_err(|e| ServerError::Tls(format!("generating a self-signed certificate: {e}")))?;
                let cert_pem = generated.cert.pem();
                let key_pem = generated.signing_key.serialize_pem();
                if let Some(dir) = &opts.cert_dir {
                    // The key is a secret: a private directory (0700, ours), files 0600.
                    let write = |ext: &str, data: &str| {
                        let path = dir.join(format!("{}.{ext}", opts.pair_name));
                        crate::private_files::ensure_private_dir(dir)
                            .and_then(|()| crate::private_files::write_private(&path, data.as_bytes()))
                            .map_err(|e| ServerError::Certificate {
                                flag: "--cert-dir",
                                path: e.path,
                                reason: e.reason,
                            })
                    };
                    write("crt", &cert_pem)?;
                    write("key", &key_pem)?;
                }
                let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
                    .map_err(|e| ServerError::Tls(e.to_string()))?;
                (vec![generated.cert.der().clone()], key)
            }
        };
    let builder = rustls::ServerConfig::builder();
    let builder = match &opts.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let bad = |reason: String| ServerError::Certificate {
                flag: "client CA",
                path: ca.source.clone(),
                reason,
            };
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
                roots
                    .add(cert.map_err(|e| bad(e.to_string()))?)
                    .map_err(|e| bad(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(bad("no certificate in the bundle".into()));
            }
            // Asked for, never required: requests without one go on to token authentication.
            let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                .allow_unauthenticated()
                .build()
                .map_err(|e| bad(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Limits that keep slow or idle clients from starving the process.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections served at once; further ones are closed at once.
    pub max_connections: usize,
    /// Time for the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time for a request's headers to arrive (HTTP/1).
    pub header_read_timeout: Duration,
    /// Longest life of one connection (keep-alive included).
    pub max_connection_age: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 128,
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(300),
        }
    }
}

/// Binds and starts serving in the background until `shutdown`, with the default
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
    let acceptor = TlsAcceptor::from(Arc::new(tls_config(opts)?));
    let addr = SocketAddr::new(opts.bind_address, opts.secure_port);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServerError::Bind { addr, source })?;
    info!(address = %local, "Serving securely on {local}");
    serve_on(
        listener,
        acceptor,
        endpoints,
        delegation,
        ConnectionLimits::default(),
        shutdown,
    );
    Ok(Some(local))
}

/// Serves TLS connections from `listener` with `limits` until `shutdown`, checking every
/// request with `delegation` when given.
pub fn serve_on(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    endpoints: Endpoints,
    delegation: Option<Delegation>,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(s) => s,
                    Err(e) => { warn!(error = %e, "accept failed"); continue; }
                },
                _ = shutdown.cancelled() => return,
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                debug!(peer = %peer, max = limits.max_connections, "too many connections; closing a new one");
                drop(stream);
                continue;
            };
            let acceptor = acceptor.clone();
            let endpoints = endpoints.clone();
            let delegation = delegation.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let Ok(Ok(tls)) =
                    tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await
                else {
                    return;
                };
                // A verified client certificate names the user of every request on this
                // connection; one without a Common Name authenticates nobody (401).
                let certificate: Option<Option<UserInfo>> = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(UserInfo::from_client_certificate);
                let certificate = Arc::new(certificate);
                let service = service_fn(move |req| {
                    let endpoints = endpoints.clone();
                    let delegation = delegation.clone();
                    let certificate = certificate.clone();
                    async move {
                        if let Some(gate) = &delegation
                            && let Err(refusal) = check(gate, &certificate, &req).await
                        {
                            return Ok::<_, Infallible>(refused(&refusal));
                        }
                        Ok::<_, Infallible>(handle(&endpoints, req))
                    }
                });
                let mut builder = auto::Builder::new(TokioExecutor::new());
                builder
                    .http1()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(limits.header_read_timeout);
                builder.http2().max_concurrent_streams(16);
                let _ = tokio::time::timeout(
                    limits.max_connection_age,
                    builder.serve_connection(TokioIo::new(tls), service),
                )
                .await;
            });
        }
    });
}

async fn check(
    gate: &Delegation,
    certificate: &Option<Option<UserInfo>>,
    req: &Request<Incoming>,
) -> Result<(), Refusal> {
    let certificate_user = match certificate {
        None => None,
        Some(Some(user)) => Some(user),
        Some(None) => return Err(Refusal::Unauthorized),
    };
    let authorization = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let path = req.uri().path();
    match gate
        .check(req.method(), path, authorization, certificate_user)
        .await
    {
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
    use super::*;

    #[tokio::test]
    async fn slow_and_idle_clients_cannot_starve_the_server() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let opts = ServingOptions {
            bind_address: "127.0.0.1".parse().unwrap(),
            secure_port: 1,
            tls_cert_file: None,
            tls_private_key_file: None,
            cert_dir: None,
            pair_name: "test".into(),
            client_ca: None,
        };
        let acceptor = TlsAcceptor::from(Arc::new(tls_config(&opts).unwrap()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ConnectionLimits {
            max_connections: 4,
            handshake_timeout: Duration::from_millis(300),
            header_read_timeout: Duration::from_millis(300),
            max_connection_age: Duration::from_secs(5),
        };
        let shutdown = CancellationToken::new();
        let endpoints = Endpoints {
            healthz: HealthChecks::default(),
            livez: HealthChecks::default(),
            readyz: HealthChecks::default(),
            metrics: Arc::new(crate::metrics::Metrics::new()),
        };
        serve_on(listener, acceptor, endpoints, None, limits, shutdown.clone());
        // Four idle clients take every slot; a fifth is closed at once.
        let mut idle = Vec::new();
        for _ in 0..4 {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut fifth = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = fifth.write_all(b"x").await;
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(2), fifth.read(&mut buf)).await;
        assert!(
            matches!(n, Ok(Ok(0)) | Ok(Err(_))),
            "over the cap: closed at once"
        );
        // The idle ones never finish a handshake: closed after the handshake timeout.
        for mut s in idle {
            let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await;
            assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "idle connection closed");
        }
        // Then the server answers again.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_ok());
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
