//! The controller manager's HTTPS endpoint (`--secure-port`, default 10258 for the CCM):
//! `/healthz`, `/livez`, `/readyz` (aggregated named checks, `?verbose` lists them, 200 `ok`
//! or 500) and `/metrics` (Prometheus text format).
//!
//! TLS uses `--tls-cert-file`/`--tls-private-key-file` when given, else a self-signed
//! certificate for `localhost`/`127.0.0.1` generated at start (written to `--cert-dir` when
//! one is given), as upstream does.
//!
//! Deliberate difference: upstream wraps the endpoints in delegated authentication and
//! authorization (TokenReview/SubjectAccessReview); this server does not authenticate, so
//! `--bind-address` should stay on a private interface (or `/metrics` be scraped through a
//! network policy).

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
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::metrics::Metrics;

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
                    let write = |ext: &str, data: &str| {
                        let path = dir.join(format!("{}.{ext}", opts.pair_name));
                        std::fs::create_dir_all(dir)
                            .and_then(|_| std::fs::write(&path, data))
                            .map_err(|e| ServerError::Certificate {
                                flag: "--cert-dir",
                                path: path.display().to_string(),
                                reason: e.to_string(),
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
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Binds and starts serving in the background until `shutdown`. Returns the bound address
/// (`None` when `--secure-port` is 0).
pub async fn serve(
    opts: &ServingOptions,
    endpoints: Endpoints,
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
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(s) => s,
                    Err(e) => { warn!(error = %e, "accept failed"); continue; }
                },
                _ = shutdown.cancelled() => return,
            };
            let acceptor = acceptor.clone();
            let endpoints = endpoints.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = service_fn(move |req| {
                    let endpoints = endpoints.clone();
                    async move { Ok::<_, Infallible>(handle(&endpoints, req)) }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Ok(Some(local))
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
