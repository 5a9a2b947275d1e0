//! `FaultProxy`: an HTTP(S) reverse proxy on 127.0.0.1 in front of a test server (vcsim,
//! moto), whose rules answer chosen requests differently: an empty SOAP answer (what vCenter
//! returns for objects the account cannot see), an HTTP status, a delay, a dropped
//! connection, or a hang. Everything else is forwarded unchanged, and every request is counted
//! by its SOAP method (or path).
//!
//! With [`FaultProxy::start_tls`] it serves TLS with the upstream's own certificate and key,
//! so clients that pin or trust the upstream's certificate accept the proxy too.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// What a matching request gets instead of the upstream's answer.
#[derive(Debug, Clone)]
pub enum Action {
    /// This status and body (content type `text/xml`).
    Respond {
        /// HTTP status.
        status: u16,
        /// Body.
        body: String,
    },
    /// The request is forwarded after this delay.
    Delay(Duration),
    /// The request is forwarded at once (the operation happens) and its answer returned after
    /// this delay: a late answer.
    DelayAnswer(Duration),
    /// The connection is closed without an answer.
    Drop,
    /// No answer at all (until the client gives up).
    Hang,
    /// The connection is reset without an answer (hyper drops it mid-exchange).
    Reset,
    /// The request is forwarded and its answer's body passed through this function: an
    /// emulator made to answer as the real service does (e.g. the default health check real
    /// AWS reports for a Classic ELB, which moto leaves out).
    Rewrite(fn(&str) -> String),
    /// The request is forwarded (so the operation happens) but the answer is replaced by
    /// this status and body: a lost answer.
    LoseAnswer {
        /// HTTP status.
        status: u16,
        /// Body.
        body: String,
    },
}

/// The proxy's certificate chain and key from these PEM files (and rustls' provider set up).
fn server_identity(
    cert: &Path,
    key: &Path,
) -> Result<(
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
)> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    crate::init();
    let certs = CertificateDer::pem_file_iter(cert)
        .context("proxy certificate")?
        .collect::<Result<Vec<_>, _>>()
        .context("proxy certificate")?;
    let key = PrivateKeyDer::from_pem_file(key).context("proxy key")?;
    Ok((certs, key))
}

/// One kind of fault injected at random by [`FaultProxy::set_random_faults`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// The service's throttling error: EC2 `RequestLimitExceeded` (503), ELB/ELBv2
    /// `Throttling` (400).
    Throttle,
    /// `500 InternalError`.
    InternalError,
    /// `503 ServiceUnavailable` / `Unavailable`.
    Unavailable,
    /// The connection is reset without an answer.
    Reset,
    /// Forwarded after 0.5–2 s.
    Delay,
    /// Forwarded (the operation happens), then answered `500 InternalError`.
    LostAnswer,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 6] = [
        Self::Throttle,
        Self::InternalError,
        Self::Unavailable,
        Self::Reset,
        Self::Delay,
        Self::LostAnswer,
    ];
}

/// Random faults: each request that matches `only` (all substrings; empty = every request)
/// gets a fault with probability `share`, of a kind drawn uniformly from `kinds`.
#[derive(Debug, Clone)]
pub struct RandomFaults {
    /// Probability of a fault per request (0.0–1.0).
    pub share: f64,
    /// The kinds drawn from.
    pub kinds: Vec<FaultKind>,
    /// Substrings a request must contain to be faulted (e.g. `Action=`).
    pub only: Vec<String>,
    /// The API whose error documents are answered.
    pub api: FaultApi,
}

/// Whose errors [`RandomFaults`] answers with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FaultApi {
    /// AWS query APIs (EC2, ELB, ELBv2).
    #[default]
    Aws,
    /// vCenter: SOAP faults (`SystemError`), `503` for throttling.
    Vsphere,
    /// kube-apiserver: `Status` documents (`429 TooManyRequests` with `Retry-After`-like
    /// details for throttling, `500 InternalError`, `503 ServiceUnavailable`). Watches are
    /// never faulted (their streams stay open for minutes).
    Kube,
    /// OpenStack (nova, neutron, octavia): `429` over-limit, `500`, `503` JSON errors.
    OpenStack,
}

/// A kube-apiserver `Status` error document.
pub fn kube_status_body(code: u16, reason: &str, message: &str) -> String {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
        "details": {"retryAfterSeconds": 1},
    })
    .to_string()
}

/// An OpenStack error document (nova's and neutron's forms are alike).
pub fn openstack_error_body(code: u16, kind: &str, message: &str) -> String {
    serde_json::json!({ kind: {"code": code, "message": message} }).to_string()
}

/// A vCenter SOAP fault document of type `kind`.
pub fn soap_fault_body(kind: &str, message: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\"><soapenv:Body><soapenv:Fault><faultcode>ServerFaultCode</faultcode><faultstring>{message}</faultstring><detail><{kind}Fault xmlns=\"urn:vim25\" xsi:type=\"{kind}\"><reason>{message}</reason></{kind}Fault></detail></soapenv:Fault></soapenv:Body></soapenv:Envelope>"
    )
}

/// The AWS error document of `code` for the API a query-protocol request body belongs to
/// (EC2's `<Response><Errors>` form, or ELB/ELBv2's `<ErrorResponse>` form).
pub fn aws_error_body(request_body: &str, code: &str, message: &str) -> String {
    if request_body.contains("Version=2016-11-15") {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors><RequestID>fault-proxy</RequestID></Response>"
        )
    } else {
        format!(
            "<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error><RequestId>fault-proxy</RequestId></ErrorResponse>"
        )
    }
}

impl RandomFaults {
    /// The action for one request of this `body`, or `None` (forwarded unchanged).
    fn draw(&self, haystack: &str, body: &str) -> Option<Action> {
        use rand::Rng;
        if self.kinds.is_empty() || !self.only.iter().all(|m| haystack.contains(m.as_str())) {
            return None;
        }
        let first_line = haystack.lines().next().unwrap_or_default();
        if self.api == FaultApi::Kube && (first_line.contains("watch=true") || first_line.contains("watch=1"))
        {
            return None;
        }
        let mut rng = rand::rng();
        if !rng.random_bool(self.share.clamp(0.0, 1.0)) {
            return None;
        }
        let kind = self.kinds[rng.random_range(0..self.kinds.len())];
        if matches!(self.api, FaultApi::Kube | FaultApi::OpenStack) {
            let json = |code: u16| match self.api {
                FaultApi::Kube => kube_status_body(
                    code,
                    match code {
                        429 => "TooManyRequests",
                        503 => "ServiceUnavailable",
                        _ => "InternalError",
                    },
                    "injected by the fault proxy",
                ),
                _ => openstack_error_body(
                    code,
                    match code {
                        429 => "overLimit",
                        503 => "serviceUnavailable",
                        _ => "computeFault",
                    },
                    "injected by the fault proxy",
                ),
            };
            return Some(match kind {
                FaultKind::Throttle => Action::Respond {
                    status: 429,
                    body: json(429),
                },
                FaultKind::InternalError => Action::Respond {
                    status: 500,
                    body: json(500),
                },
                FaultKind::Unavailable => Action::Respond {
                    status: 503,
                    body: json(503),
                },
                FaultKind::Reset => Action::Reset,
                FaultKind::Delay => Action::Delay(Duration::from_millis(rng.random_range(500..2000))),
                FaultKind::LostAnswer => Action::LoseAnswer {
                    status: 500,
                    body: json(500),
                },
            });
        }
        if self.api == FaultApi::Vsphere {
            let fault = |status| Action::Respond {
                status,
                body: soap_fault_body("SystemError", "A general system error occurred: injected"),
            };
            return Some(match kind {
                FaultKind::Throttle | FaultKind::Unavailable => Action::Respond {
                    status: 503,
                    body: "Service Unavailable".into(),
                },
                FaultKind::InternalError => fault(500),
                FaultKind::Reset => Action::Reset,
                FaultKind::Delay => Action::Delay(Duration::from_millis(rng.random_range(500..2000))),
                FaultKind::LostAnswer => Action::LoseAnswer {
                    status: 500,
                    body: soap_fault_body("SystemError", "A general system error occurred: injected"),
                },
            });
        }
        let ec2 = body.contains("Version=2016-11-15");
        Some(match kind {
            FaultKind::Throttle if ec2 => Action::Respond {
                status: 503,
                body: aws_error_body(body, "RequestLimitExceeded", "Request limit exceeded."),
            },
            FaultKind::Throttle => Action::Respond {
                status: 400,
                body: aws_error_body(body, "Throttling", "Rate exceeded"),
            },
            FaultKind::InternalError => Action::Respond {
                status: 500,
                body: aws_error_body(body, "InternalError", "An internal error has occurred"),
            },
            FaultKind::Unavailable => Action::Respond {
                status: 503,
                body: aws_error_body(
                    body,
                    if ec2 { "Unavailable" } else { "ServiceUnavailable" },
                    "The service is unavailable",
                ),
            },
            FaultKind::Reset => Action::Reset,
            FaultKind::Delay => Action::Delay(Duration::from_millis(rng.random_range(500..2000))),
            FaultKind::LostAnswer => Action::LoseAnswer {
                status: 500,
                body: aws_error_body(body, "InternalError", "An internal error has occurred"),
            },
        })
    }
}

impl Action {
    /// The SOAP answer `<{method}Response xmlns="urn:vim25"/>`: no `returnval`, which is what
    /// vCenter answers for objects or searches the account cannot see.
    pub fn empty_soap(method: &str) -> Self {
        Self::Respond {
            status: 200,
            body: format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\"><soapenv:Body><{method}Response xmlns=\"urn:vim25\"></{method}Response></soapenv:Body></soapenv:Envelope>"
            ),
        }
    }
}

/// A rule: every substring must occur in the request's path or body.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Substrings of `path + body` that select the request.
    pub matches: Vec<String>,
    /// What to do.
    pub action: Action,
    /// How many more requests it applies to (`None`: every one).
    pub remaining: Option<usize>,
}

impl Rule {
    /// A rule for requests containing all of `matches`.
    pub fn new(matches: &[&str], action: Action) -> Self {
        Self {
            matches: matches.iter().map(|s| s.to_string()).collect(),
            action,
            remaining: None,
        }
    }

    /// The rule applies to the first `n` matching requests only; later ones are forwarded.
    pub fn times(mut self, n: usize) -> Self {
        self.remaining = Some(n);
        self
    }
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    random: Option<RandomFaults>,
    counts: BTreeMap<String, usize>,
    /// Requests seen by `METHOD path` (the query left out).
    by_method: BTreeMap<String, usize>,
    faulted: usize,
    faulted_by_kind: BTreeMap<String, usize>,
}

/// A running proxy; stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy").field("addr", &self.addr).finish()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The SOAP method of a request body (`<FindByUuid xmlns="urn:vim25">`), else the path.
fn request_kind(path: &str, body: &str) -> String {
    if let Some(i) = body.find(" xmlns=\"urn:vim25\"") {
        let head = &body[..i];
        if let Some(start) = head.rfind('<') {
            return head[start + 1..].to_string();
        }
    }
    path.to_string()
}

type Acceptor = Option<tokio_rustls::TlsAcceptor>;

impl FaultProxy {
    /// A plain-HTTP proxy in front of `upstream` (e.g. `http://127.0.0.1:5000`).
    pub async fn start(upstream: &str) -> Result<Self> {
        Self::start_with(upstream, None).await
    }

    /// A TLS proxy in front of `upstream` (`https://…`), serving the certificate and key at
    /// these PEM paths.
    pub async fn start_tls(upstream: &str, cert: &Path, key: &Path) -> Result<Self> {
        let (certs, key) = server_identity(cert, key)?;
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .context("proxy TLS config")?;
        Self::start_with(upstream, Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    /// A TLS proxy that also demands a client certificate signed by the CA at `client_ca`
    /// (PEM): a client without one fails its handshake.
    pub async fn start_mutual_tls(upstream: &str, cert: &Path, key: &Path, client_ca: &Path) -> Result<Self> {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let (certs, key) = server_identity(cert, key)?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(client_ca).context("client CA")? {
            roots.add(ca.context("client CA")?).context("client CA")?;
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
            .build()
            .context("client certificate verifier")?;
        let config = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .context("proxy TLS config")?;
        Self::start_with(upstream, Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    /// A TLS proxy in front of `upstream` with a fresh self-signed certificate for 127.0.0.1
    /// (for clients that skip verification, e.g. the tests' kubeconfigs).
    pub async fn start_tls_self_signed(upstream: &str) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let generated =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .context("generating the proxy's certificate")?;
        let (cert, key) = (dir.path().join("proxy.crt"), dir.path().join("proxy.key"));
        std::fs::write(&cert, generated.cert.pem())?;
        std::fs::write(&key, generated.signing_key.serialize_pem())?;
        Self::start_tls(upstream, &cert, &key).await
    }

    async fn start_with(upstream: &str, tls: Acceptor) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state: Arc<Mutex<State>> = Arc::default();
        // No overall timeout: watches stream for minutes (answers are streamed through).
        let client = reqwest::Client::builder()
            .tls_danger_accept_invalid_certs(true)
            .connect_timeout(Duration::from_secs(10))
            .build()?;
        let upstream = upstream.trim_end_matches('/').to_string();
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (state, client, upstream, tls) =
                    (shared.clone(), client.clone(), upstream.clone(), tls.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let (state, client, upstream) = (state.clone(), client.clone(), upstream.clone());
                        async move { handle(req, &state, &client, &upstream).await }
                    });
                    let builder = hyper::server::conn::http1::Builder::new();
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                            }
                        }
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                });
            }
        });
        Ok(Self { addr, state, task })
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Adds a rule (rules are tried in order; the first match wins).
    pub fn add(&self, rule: Rule) {
        self.state.lock().expect("proxy state").rules.push(rule);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.state.lock().expect("proxy state").rules.clear();
    }

    /// Requests seen, by SOAP method or path.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        self.state.lock().expect("proxy state").counts.clone()
    }

    /// Requests seen, by `METHOD path` (without the query): e.g. the writes a shadow-mode run
    /// sent (none).
    pub fn counts_by_method(&self) -> BTreeMap<String, usize> {
        self.state.lock().expect("proxy state").by_method.clone()
    }

    /// Requests answered by a rule or a random fault so far.
    pub fn faulted(&self) -> usize {
        self.state.lock().expect("proxy state").faulted
    }

    /// Injects random faults into the requests no rule matches (`None` stops).
    pub fn set_random_faults(&self, faults: Option<RandomFaults>) {
        self.state.lock().expect("proxy state").random = faults;
    }

    /// Random faults injected so far, by kind (`Throttle`, `Reset`, …).
    pub fn faulted_by_kind(&self) -> BTreeMap<String, usize> {
        self.state.lock().expect("proxy state").faulted_by_kind.clone()
    }

    /// Every request seen so far.
    pub fn total(&self) -> usize {
        self.state.lock().expect("proxy state").counts.values().sum()
    }

    /// Forgets the counts.
    pub fn reset_counts(&self) {
        let mut s = self.state.lock().expect("proxy state");
        s.counts.clear();
        s.by_method.clear();
        s.faulted = 0;
        s.faulted_by_kind.clear();
    }
}

type ProxyBody = BoxBody<Bytes, std::io::Error>;

fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

enum Outcome {
    Answer(Response<ProxyBody>),
    Forward,
}

async fn handle(
    req: Request<Incoming>,
    state: &Mutex<State>,
    client: &reqwest::Client,
    upstream: &str,
) -> Result<Response<ProxyBody>, std::io::Error> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let text = String::from_utf8_lossy(&body).to_string();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let action = {
        let mut s = state.lock().expect("proxy state");
        *s.counts.entry(request_kind(&path, &text)).or_default() += 1;
        let bare = path.split_once('?').map_or(path.as_str(), |(p, _)| p);
        *s.by_method.entry(format!("{} {bare}", parts.method)).or_default() += 1;
        let haystack = format!("{path}\n{text}");
        let mut found = s
            .rules
            .iter_mut()
            .filter(|r| r.remaining != Some(0))
            .find(|r| r.matches.iter().all(|m| haystack.contains(m.as_str())))
            .map(|r| {
                if let Some(n) = r.remaining.as_mut() {
                    *n -= 1;
                }
                r.action.clone()
            });
        if found.is_none()
            && let Some(random) = &s.random
        {
            found = random.draw(&haystack, &text);
            if let Some(a) = &found {
                let kind = match a {
                    Action::Respond { body, status } => body
                        .split("<Code>")
                        .nth(1)
                        .and_then(|c| c.split('<').next())
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("HTTP {status}")),
                    Action::LoseAnswer { .. } => "LostAnswer".into(),
                    Action::Rewrite(_) => "Rewrite".into(),
                    Action::Delay(_) | Action::DelayAnswer(_) => "Delay".into(),
                    Action::Reset => "Reset".into(),
                    Action::Drop | Action::Hang => "Other".into(),
                };
                *s.faulted_by_kind.entry(kind).or_default() += 1;
            }
        }
        if found.is_some() {
            s.faulted += 1;
        }
        found
    };
    let mut lose_answer = None;
    let mut answer_delay = None;
    let mut rewrite = None;
    let outcome = match action {
        None => Outcome::Forward,
        Some(Action::Rewrite(f)) => {
            rewrite = Some(f);
            Outcome::Forward
        }
        Some(Action::DelayAnswer(d)) => {
            answer_delay = Some(d);
            Outcome::Forward
        }
        Some(Action::Delay(d)) => {
            tokio::time::sleep(d).await;
            Outcome::Forward
        }
        Some(Action::Hang) => {
            std::future::pending::<()>().await;
            Outcome::Forward
        }
        Some(Action::Drop) => {
            // An empty 502 closes the exchange without a usable answer; hyper then closes the
            // connection because of the "connection: close" header.
            let mut r = Response::new(full(Bytes::new()));
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            r.headers_mut()
                .insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            Outcome::Answer(r)
        }
        Some(Action::Reset) => return Err(std::io::Error::other("fault proxy: connection reset")),
        Some(Action::LoseAnswer { status, body }) => {
            lose_answer = Some((status, body));
            Outcome::Forward
        }
        Some(Action::Respond { status, body }) => {
            let json = body.starts_with('{');
            let mut r = Response::new(full(body));
            *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(if json {
                    "application/json"
                } else {
                    "text/xml; charset=utf-8"
                }),
            );
            Outcome::Answer(r)
        }
    };
    if let Outcome::Answer(r) = outcome {
        return Ok(r);
    }
    let mut forward = client.request(parts.method.clone(), format!("{upstream}{path}"));
    for (name, value) in &parts.headers {
        if !matches!(
            name.as_str(),
            "host" | "content-length" | "connection" | "transfer-encoding"
        ) {
            forward = forward.header(name, value);
        }
    }
    let sent = forward.body(body).send().await;
    if let Some(delay) = answer_delay {
        tokio::time::sleep(delay).await;
    }
    if let (Some(f), Ok(resp)) = (rewrite, sent.as_ref().map_err(|_| ())) {
        let status = resp.status();
        let content_type = resp.headers().get(http::header::CONTENT_TYPE).cloned();
        let text = match sent {
            Ok(resp) => resp.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let mut r = Response::new(full(f(&text)));
        *r.status_mut() = status;
        if let Some(ct) = content_type {
            r.headers_mut().insert(http::header::CONTENT_TYPE, ct);
        }
        return Ok(r);
    }
    if let Some((status, body)) = lose_answer {
        // The operation happened upstream (its answer is read and thrown away).
        if let Ok(resp) = sent {
            let _ = resp.bytes().await;
        }
        let json = body.starts_with('{');
        let mut r = Response::new(full(body));
        *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(if json {
                "application/json"
            } else {
                "text/xml; charset=utf-8"
            }),
        );
        return Ok(r);
    }
    Ok(match sent {
        Ok(resp) => {
            let status = resp.status();
            let headers = resp.headers().clone();
            // Streamed chunk by chunk (watches stay open for minutes).
            let stream = futures::stream::unfold(Some(resp), |resp| async move {
                let mut resp = resp?;
                match resp.chunk().await {
                    Ok(Some(bytes)) => Some((Ok(hyper::body::Frame::data(bytes)), Some(resp))),
                    Ok(None) => None,
                    Err(e) => Some((Err(std::io::Error::other(e)), None)),
                }
            });
            let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
            *r.status_mut() = status;
            for (name, value) in &headers {
                if !matches!(
                    name.as_str(),
                    "content-length" | "connection" | "transfer-encoding"
                ) {
                    r.headers_mut().append(name, value.clone());
                }
            }
            r
        }
        Err(_) => {
            let mut r = Response::new(full(Bytes::new()));
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            r
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn soap_methods_are_named() {
        assert_eq!(
            super::request_kind(
                "/sdk",
                "<Envelope><Body><FindByUuid xmlns=\"urn:vim25\"><x/></FindByUuid>"
            ),
            "FindByUuid"
        );
        assert_eq!(super::request_kind("/rest/x", "{}"), "/rest/x");
    }
}
