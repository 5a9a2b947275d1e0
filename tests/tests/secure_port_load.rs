//! The secure port under what anyone who can reach it can send, on the real binary and a real
//! API server: idle TLS connections, connections that never start TLS, and a flood of made-up
//! bearer tokens must not make the kubelet's `/healthz` liveness probe restart the CCM (as the
//! shipped manifests set it: 5 s timeout, 3 failures in a row; and at least 90 % of the probes
//! answered) or cost the API server more TokenReviews than upstream's client limits allow; and the TLS settings hardened manifests
//! use: `--tls-min-version`, `--tls-cipher-suites`, `--tls-sni-cert-key`, and a serving
//! certificate and a client CA rotated on disk and used without a restart.
//!
//! The floods come from many 127.x addresses other than 127.0.0.1, the probe from 127.0.0.1, as
//! the kubelet probes from its own address. Each test checks that the abuse happened
//! (connections opened, bytes sent, reviews caused) and prints its figures; each fails when the
//! protection it is about is removed (noted at each test).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use rcp_e2e::{TestCluster, ccm::CcmProcess, certs::ClientCa, k8s::wait_for};
use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    pki_types::{CertificateDer, ServerName, UnixTime},
};

const FAKE: &str = "fake-cloud-controller-manager";
const T: Duration = Duration::from_secs(60);
/// How long each flood is held, and how many probes are sent meanwhile (one a second): 20 s
/// here (every protection these tests prove fails within the first seconds without it);
/// `hack/bench-secure-port.sh` holds them for a minute (`RCP_FLOOD_SECONDS`).
fn hold_seconds() -> u64 {
    match std::env::var("RCP_FLOOD_SECONDS") {
        Err(_) => 20,
        Ok(v) => v
            .parse()
            .ok()
            .filter(|s| *s > 0)
            .unwrap_or_else(|| panic!("RCP_FLOOD_SECONDS={v:?}: a whole number of seconds above 0")),
    }
}
/// Connections a connection flood holds (the port's cap is 512) ...
const CONNECTIONS: usize = 1200;
/// ... from this many client addresses.
const ADDRESSES: usize = 600;
/// The CCM's open-file limit in the connection floods (systemd's default soft limit): without
/// the connection cap, the flood would use up the CCM's files and the probe's connection would
/// not be accepted.
const CCM_FILES: u32 = 1024;

/// Accepts any server certificate (the probe is about availability, not identity).
#[derive(Debug)]
struct AnyServer;

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        rustls::crypto::aws_lc_rs::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A TLS client of the given versions (and, when given, TLS 1.2 suites by rustls name).
fn client_config(
    versions: &[&'static rustls::SupportedProtocolVersion],
    suites: Option<&[&str]>,
) -> Result<Arc<rustls::ClientConfig>> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    if let Some(names) = suites {
        provider
            .cipher_suites
            .retain(|s| names.contains(&format!("{:?}", s.suite()).as_str()));
    }
    Ok(Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(versions)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer))
            .with_no_client_auth(),
    ))
}

/// The `n`th flood address: 127.0.2.1, 127.0.2.2, … (never 127.0.0.1, the probe's).
fn flood_address(n: usize) -> std::net::IpAddr {
    std::net::IpAddr::from([127, 0, 2 + (n / 250) as u8, 1 + (n % 250) as u8])
}

/// A TCP connection to 127.0.0.1:`port` from `from`.
async fn connect_from(from: std::net::IpAddr, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((from, 0).into())?;
    socket.connect(([127, 0, 0, 1], port).into()).await
}

/// A TLS handshake on 127.0.0.1:`port` with `server_name` as SNI; the certificate the server
/// presented.
async fn handshake(
    port: u16,
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
) -> Result<CertificateDer<'static>> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from(server_name.to_string())?, tcp)
        .await?;
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.clone().into_owned())
        .context("no certificate")
}

/// The kubelet's liveness probe as the shipped manifests set it (`deploy/common/daemonset.yaml`,
/// the charts): a 5 s timeout, and the container is restarted after 3 failures in a row.
const PROBE_TIMEOUT_SECS: u64 = 5;
const PROBE_FAILURE_THRESHOLD: usize = 3;

/// What the probe loop saw.
struct Probes {
    /// Probes answered 200 within the timeout.
    answered: usize,
    /// Probes sent.
    sent: usize,
    /// The slowest answered probe.
    slowest: Duration,
    /// The longest run of failed probes in a row.
    longest_failure_run: usize,
    /// Each failure: second, curl's exit code and HTTP code, time taken.
    failures: Vec<String>,
}

impl Probes {
    /// Whether the kubelet would have kept the CCM running (never `PROBE_FAILURE_THRESHOLD`
    /// failures in a row) and at least 90 % of the probes were answered.
    fn kept_alive(&self) -> bool {
        self.longest_failure_run < PROBE_FAILURE_THRESHOLD && self.answered * 10 >= self.sent * 9
    }
}

impl std::fmt::Display for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "/healthz answered {} of {} probes, slowest {:?}, at most {} failed in a row",
            self.answered, self.sent, self.slowest, self.longest_failure_run
        )?;
        if !self.failures.is_empty() {
            write!(f, " (failures: {})", self.failures.join("; "))?;
        }
        Ok(())
    }
}

/// `curl -sk --max-time 5 https://127.0.0.1:<port>/healthz` once a second for `seconds`.
async fn probe_loop(port: u16, seconds: u64) -> Probes {
    probe_loop_within(port, seconds, PROBE_TIMEOUT_SECS).await
}

/// `curl -sk --max-time <timeout> https://127.0.0.1:<port>/healthz` once a second for
/// `seconds`.
async fn probe_loop_within(port: u16, seconds: u64, timeout_secs: u64) -> Probes {
    let mut probes = Probes {
        answered: 0,
        sent: 0,
        slowest: Duration::ZERO,
        longest_failure_run: 0,
        failures: Vec::new(),
    };
    let mut run = 0;
    for second in 0..seconds {
        let start = Instant::now();
        let out = tokio::process::Command::new("curl")
            .args(["-sk", "--max-time", &timeout_secs.to_string()])
            .args(["-o", "/dev/null", "-w", "%{http_code}"])
            .arg(format!("https://127.0.0.1:{port}/healthz"))
            .output()
            .await;
        let took = start.elapsed();
        probes.sent += 1;
        match out {
            Ok(o) if o.stdout == b"200" => {
                probes.answered += 1;
                probes.slowest = probes.slowest.max(took);
                run = 0;
            }
            other => {
                run += 1;
                probes.longest_failure_run = probes.longest_failure_run.max(run);
                probes.failures.push(match other {
                    Ok(o) => format!(
                        "{second} s: curl exit {:?}, HTTP {}, after {took:.1?}",
                        o.status.code(),
                        String::from_utf8_lossy(&o.stdout)
                    ),
                    Err(e) => format!("{second} s: curl did not run: {e}"),
                });
            }
        }
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(took)).await;
    }
    probes
}

/// Starts the fake CCM with `extra` flags, as the CCM's ServiceAccount, and waits for its port.
async fn start(cluster: &TestCluster, name: &str, extra: &[String]) -> Result<CcmProcess> {
    let fake = cluster.dir().join(format!("{name}.json"));
    std::fs::write(&fake, "{}")?;
    let mut args = vec![
        format!("--cloud-config={}", fake.display()),
        "--cluster-cidr=10.244.0.0/16".into(),
        "--leader-elect=false".into(),
    ];
    args.extend_from_slice(extra);
    let ccm = CcmProcess::start(
        FAKE,
        name,
        &cluster.ccm_kubeconfig("common")?,
        cluster.dir(),
        &args,
    )?;
    let port = ccm.port();
    wait_for("the secure port", T, || async {
        let out = tokio::process::Command::new("curl")
            .args(["-sk", "--max-time", "2", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(format!("https://127.0.0.1:{port}/healthz"))
            .output()
            .await
            .ok()?;
        (out.stdout == b"200").then_some(())
    })
    .await?;
    Ok(ccm)
}

/// Sets the open-file limit of process `pid` (prlimit(1)).
fn limit_files(pid: u32, files: u32) -> Result<()> {
    let out = std::process::Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={files}:{files}"))
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "prlimit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Holds `CONNECTIONS` connections from `ADDRESSES` client addresses made by `open` (each
/// reconnecting when the server drops it) while the probe loop runs, the CCM limited to
/// `CCM_FILES` open files; prints and checks the figures. Fails without the connection cap
/// (the CCM's files run out and the probe is not accepted) and without the per-client fairness
/// (at the cap the probe would be closed).
async fn hold_while_probing<F, Fut>(ccm: &CcmProcess, what: &str, open: F) -> Result<()>
where
    F: Fn(std::net::IpAddr, u16) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Option<Held>> + Send,
{
    limit_files(ccm.pid(), CCM_FILES)?;
    let port = ccm.port();
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let addresses_used = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let mut holders = Vec::new();
    for i in 0..CONNECTIONS {
        let (stop, opened, open) = (stop.clone(), opened.clone(), open.clone());
        let addresses_used = addresses_used.clone();
        let from = flood_address(i % ADDRESSES);
        holders.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Some(mut held) = open(from, port).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                opened.fetch_add(1, Ordering::Relaxed);
                addresses_used.lock().expect("not poisoned").insert(from);
                // Held until the server drops it or the test ends.
                while !stop.load(Ordering::Relaxed) && !held.closed().await {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let hold = hold_seconds();
    let probes = probe_loop(port, hold).await;
    stop.store(true, Ordering::Relaxed);
    for h in holders {
        let _ = h.await;
    }
    let rss = ccm.peak_rss_kb().unwrap_or_default();
    let (opened, addresses) = (
        opened.load(Ordering::Relaxed),
        addresses_used.lock().expect("not poisoned").len(),
    );
    println!(
        "secure port, {CONNECTIONS} {what} from {ADDRESSES} addresses held {hold} s, CCM limited to {CCM_FILES} files (connections opened: {opened}, from {addresses} addresses): {probes}; CCM peak RSS {:.1} MB",
        rss as f64 / 1024.0
    );
    assert!(
        opened >= CONNECTIONS,
        "the flood opened only {opened} connections"
    );
    assert_eq!(addresses, ADDRESSES, "every flood address connected");
    assert!(probes.kept_alive(), "{probes}\n{}", ccm.log());
    Ok(())
}

/// A connection held by a flood: plain TCP or TLS.
enum Held {
    Tcp(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

impl Held {
    /// Whether the server closed it (checked without waiting).
    async fn closed(&mut self) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 64];
        let read = match self {
            Held::Tcp(s) => tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await,
            Held::Tls(s) => tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await,
        };
        matches!(read, Ok(Ok(0)) | Ok(Err(_)))
    }
}

#[tokio::test]
async fn idle_tls_connections_never_starve_the_health_probe() -> Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cluster = TestCluster::start().await?;
    let ccm = start(&cluster, "ccm-idle-tls", &[]).await?;
    let config = client_config(rustls::DEFAULT_VERSIONS, None)?;
    hold_while_probing(&ccm, "idle TLS connections", move |from, port| {
        let config = config.clone();
        async move {
            let tcp = connect_from(from, port).await.ok()?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(ServerName::try_from("localhost").ok()?, tcp)
                .await
                .ok()?;
            Some(Held::Tls(Box::new(tls)))
        }
    })
    .await
}

#[tokio::test]
async fn connections_that_never_start_tls_never_starve_the_health_probe() -> Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cluster = TestCluster::start().await?;
    let ccm = start(&cluster, "ccm-no-tls", &[]).await?;
    hold_while_probing(
        &ccm,
        "connections that never start TLS",
        |from, port| async move {
            let tcp = connect_from(from, port).await.ok()?;
            Some(Held::Tcp(tcp))
        },
    )
    .await
}

/// The API server's count of TokenReviews created.
async fn token_reviews(client: &kube::Client) -> Result<f64> {
    rcp_e2e::k8s::apiserver_requests(client, "tokenreviews", "POST").await
}

/// The API server's count of SubjectAccessReviews created.
async fn access_reviews(client: &kube::Client) -> Result<f64> {
    rcp_e2e::k8s::apiserver_requests(client, "subjectaccessreviews", "POST").await
}

/// A token of the ServiceAccount `monitoring/prometheus`, allowed to `get` `/metrics` by a
/// ClusterRole (as a Prometheus is): neither `system:masters` nor always allowed.
async fn prometheus_token(cluster: &TestCluster) -> Result<String> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
    let kubeconfig = cluster
        .kubeconfig_for_service_account("monitoring", "prometheus")
        .await?;
    let text = std::fs::read_to_string(kubeconfig)?;
    let token = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .context("no token in the ServiceAccount's kubeconfig")?
        .trim_matches('"')
        .to_string();
    let client = cluster.client().await?;
    let meta = |name: &str| kube::api::ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    kube::Api::<ClusterRole>::all(client.clone())
        .create(
            &Default::default(),
            &ClusterRole {
                metadata: meta("metrics-reader"),
                rules: Some(vec![PolicyRule {
                    non_resource_urls: Some(vec!["/metrics".into()]),
                    verbs: vec!["get".into()],
                    ..Default::default()
                }]),
                ..Default::default()
            },
        )
        .await?;
    kube::Api::<ClusterRoleBinding>::all(client)
        .create(
            &Default::default(),
            &ClusterRoleBinding {
                metadata: meta("prometheus-metrics-reader"),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: "metrics-reader".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: "prometheus".into(),
                    namespace: Some("monitoring".into()),
                    ..Default::default()
                }]),
            },
        )
        .await?;
    Ok(token)
}

/// 500 made-up tokens a second from 100 addresses and 500 anonymous requests a second for
/// distinct unserved paths from 100 others, while a Prometheus's ServiceAccount token (RBAC,
/// not `system:masters`; the review caches off, so every one of its requests needs a
/// TokenReview and a SubjectAccessReview) scrapes `/metrics`: every scrape is answered 200,
/// the made-up tokens 401, the unserved paths 404 without a review, and the API server gets no
/// more TokenReviews than upstream's client limits allow. Fails without the priority of
/// recently authenticated clients (checked: with it switched off, 11 of the 16 scrapes during
/// the flood answered 401) and without the 404 before review (thousands of
/// SubjectAccessReviews).
#[tokio::test]
async fn made_up_tokens_and_unserved_paths_never_lock_out_a_scraper() -> Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cluster = TestCluster::start().await?;
    let ccm = start(
        &cluster,
        "ccm-token-flood",
        &[
            "--authentication-token-webhook-cache-ttl=0s".into(),
            "--authorization-webhook-cache-authorized-ttl=0s".into(),
            "--authorization-webhook-cache-unauthorized-ttl=0s".into(),
        ],
    )
    .await?;
    let port = ccm.port();
    let admin = cluster.client().await?;
    let prometheus = prometheus_token(&cluster).await?;
    let scraper = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .local_address(std::net::IpAddr::from([127, 0, 1, 1]))
        .timeout(Duration::from_secs(5))
        .build()?;
    let scrape = {
        let scraper = scraper.clone();
        let token = prometheus.clone();
        move || {
            let (scraper, token) = (scraper.clone(), token.clone());
            async move {
                let r = scraper
                    .get(format!("https://127.0.0.1:{port}/metrics"))
                    .bearer_auth(token)
                    .send()
                    .await?;
                anyhow::Ok(r.status().as_u16())
            }
        }
    };
    // The scraper has been scraping before the flood (it is a known client).
    assert_eq!(scrape().await?, 200);
    let (tokens_before, accesses_before) = (token_reviews(&admin).await?, access_reviews(&admin).await?);
    let clients: Vec<reqwest::Client> = (0..200)
        .map(|n| {
            reqwest::Client::builder()
                .danger_accept_invalid_certs(true)
                .local_address(flood_address(n))
                .timeout(Duration::from_secs(15))
                .build()
        })
        .collect::<Result<_, _>>()?;
    let start = Instant::now();
    let (mut made_up, mut unserved, mut scrapes) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..4000usize {
        let client = clients[i % clients.len()].clone();
        if i % 2 == 0 {
            let token: String = (0..32)
                .map(|_| format!("{:x}", rand::random::<u8>() % 16))
                .collect();
            made_up.push(tokio::spawn(async move {
                client
                    .get(format!("https://127.0.0.1:{port}/metrics"))
                    .bearer_auth(token)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            }));
        } else {
            unserved.push(tokio::spawn(async move {
                client
                    .get(format!("https://127.0.0.1:{port}/not-served/{i}"))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            }));
        }
        if i % 250 == 0 {
            scrapes.push(tokio::spawn(scrape()));
        }
        // 1000 a second.
        let due = Duration::from_millis(u64::try_from(i + 1).unwrap_or(u64::MAX));
        tokio::time::sleep(due.saturating_sub(start.elapsed())).await;
    }
    let flood_secs = start.elapsed().as_secs_f64();
    let count = |statuses: Vec<u16>| {
        let mut by = std::collections::BTreeMap::<u16, usize>::new();
        for s in statuses {
            *by.entry(s).or_default() += 1;
        }
        by
    };
    let mut all = Vec::new();
    for s in made_up {
        all.push(s.await?);
    }
    let made_up = count(all);
    let mut all = Vec::new();
    for s in unserved {
        all.push(s.await?);
    }
    let unserved = count(all);
    let elapsed = start.elapsed().as_secs_f64();
    let mut scraped = Vec::new();
    for s in scrapes {
        scraped.push(s.await??);
    }
    let tokens = token_reviews(&admin).await? - tokens_before;
    let accesses = access_reviews(&admin).await? - accesses_before;
    // Upstream's client: a burst of 400, then 200 a second, for as long as the flood lasted.
    let allowed = 400.0 + 200.0 * elapsed;
    println!(
        "secure port, 2000 made-up tokens and 2000 unserved paths from 200 addresses in {flood_secs:.1} s (all answered after {elapsed:.1} s): {tokens} TokenReviews (allowed by QPS 200/burst 400: {allowed:.0}), {accesses} SubjectAccessReviews; made-up tokens answered {made_up:?}, unserved paths {unserved:?}; the ServiceAccount's scrapes (each reviewed) during the flood: {scraped:?}"
    );
    assert!(tokens <= allowed, "{tokens} TokenReviews > {allowed}");
    assert!(tokens >= 200.0, "the made-up tokens caused reviews: {tokens}");
    // 0: no answer (a connection the flood's own clients lost); at most a few.
    let only = |by: &std::collections::BTreeMap<u16, usize>, status: u16| {
        by.keys().all(|s| *s == status || *s == 0) && by.get(&0).copied().unwrap_or(0) <= 100
    };
    assert!(only(&made_up, 401), "{made_up:?}");
    assert!(only(&unserved, 404), "{unserved:?}");
    assert!(
        accesses <= scraped.len() as f64 + 2.0,
        "only the scrapes were authorized by review: {accesses}"
    );
    assert!(scraped.iter().all(|s| *s == 200), "{scraped:?}\n{}", ccm.log());
    assert_eq!(scrape().await?, 200);
    Ok(())
}

/// 512 connections (from 128 addresses), each sending a request head of 400 KB that never
/// ends, held for the flood's time (`hold_seconds`): the CCM's peak RSS stays under 150 MiB (a head is refused past 16 KiB;
/// hyper's default would hold ~400 KiB for each, ~200 MiB in all) and the probe is answered.
#[tokio::test]
async fn unfinished_400_kb_heads_never_grow_the_ccm_or_starve_the_probe() -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cluster = TestCluster::start().await?;
    let ccm = start(&cluster, "ccm-big-heads", &[]).await?;
    let port = ccm.port();
    let config = client_config(rustls::DEFAULT_VERSIONS, None)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (opened, bytes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let head = {
        let mut h = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Fill: ".to_vec();
        h.resize(400 * 1000, b'a');
        Arc::new(h)
    };
    let mut senders = Vec::new();
    for i in 0..512usize {
        let (stop, opened, bytes, config, head) = (
            stop.clone(),
            opened.clone(),
            bytes.clone(),
            config.clone(),
            head.clone(),
        );
        let from = flood_address(i % 128);
        senders.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let connected = async {
                    let tcp = connect_from(from, port).await.ok()?;
                    tokio_rustls::TlsConnector::from(config.clone())
                        .connect(ServerName::try_from("localhost").ok()?, tcp)
                        .await
                        .ok()
                };
                let Some(mut tls) = connected.await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                opened.fetch_add(1, Ordering::Relaxed);
                // 16 KiB at a time, never the end of the head; held until the server closes.
                for chunk in head.chunks(16 * 1024) {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    match tokio::time::timeout(Duration::from_secs(5), tls.write_all(chunk)).await {
                        Ok(Ok(())) => {
                            bytes.fetch_add(chunk.len(), Ordering::Relaxed);
                        }
                        _ => break,
                    }
                }
                let mut held = Held::Tls(Box::new(tls));
                while !stop.load(Ordering::Relaxed) && !held.closed().await {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let hold = hold_seconds();
    let probes = probe_loop(port, hold).await;
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        let _ = s.await;
    }
    let rss = ccm.peak_rss_kb().unwrap_or_default() as f64 / 1024.0;
    let (opened, bytes) = (opened.load(Ordering::Relaxed), bytes.load(Ordering::Relaxed));
    println!(
        "secure port, 512 connections sending unfinished 400 KB heads for {hold} s (connections opened: {opened}, head bytes the kernel took: {:.1} MB): {probes}; CCM peak RSS {rss:.1} MiB",
        bytes as f64 / 1e6
    );
    assert!(opened >= 512, "the flood opened only {opened} connections");
    assert!(bytes >= 512 * 16 * 1024, "the heads were sent: {bytes} bytes");
    assert!(rss < 150.0, "CCM peak RSS {rss:.1} MiB\n{}", ccm.log());
    assert!(probes.kept_alive(), "{probes}\n{}", ccm.log());
    Ok(())
}

/// An RSA-2048 serving certificate (PEM cert, PEM key), made with openssl.
fn rsa_certificate(dir: &std::path::Path) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let (crt, key) = (dir.join("rsa.crt"), dir.join("rsa.key"));
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((crt, key))
}

/// Full TLS handshakes against an RSA-2048 serving key (each costs the server a signature,
/// 1–2 ms of CPU), as fast as 1,024 clients at a time from 16 addresses can make them, for
/// 30 s (aiming at 2,000 a second, more than the port's thread can sign): the probe (one a
/// second) is answered within the kubelet's default timeout of 1 s as the kubelet would judge
/// it (never 3 failures in a row, at least 90 % answered). Fails without the per-client
/// handshake bound: the flood's handshakes queue ahead of the probe's on the port's thread
/// (measured: 0 of 26 probes answered; with 256 clients the queue stayed short enough for the
/// probe even without the bound, so the test proved nothing). With the bound at 64 handshakes
/// in all, work at idle priority beside the test (CI's) made the probe miss (19 of 26, 3 in a
/// row); at 16 (the default now), with two idle-priority busy loops beside it, 26 of 26,
/// slowest 247 ms. Runs alone in CI (.config/nextest.toml).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_rsa_handshakes_never_delays_the_probe_past_a_second() -> Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cluster = TestCluster::start().await?;
    let (crt, key) = rsa_certificate(cluster.dir())?;
    let ccm = start(
        &cluster,
        "ccm-handshakes",
        &[
            format!("--tls-cert-file={}", crt.display()),
            format!("--tls-private-key-file={}", key.display()),
        ],
    )
    .await?;
    let port = ccm.port();
    let config = client_config(rustls::DEFAULT_VERSIONS, None)?;
    let seconds = 30u64;
    let stop = Arc::new(AtomicBool::new(false));
    let (attempts, completed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..1024usize {
        let (stop, attempts, completed, config) =
            (stop.clone(), attempts.clone(), completed.clone(), config.clone());
        let from = flood_address(w % 16);
        workers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // 2,000 a second in all: each worker one every 512 ms.
                n += 1;
                let due = Duration::from_millis(512 * n);
                tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
                attempts.fetch_add(1, Ordering::Relaxed);
                let Ok(tcp) = connect_from(from, port).await else {
                    continue;
                };
                let done = tokio::time::timeout(
                    Duration::from_secs(2),
                    tokio_rustls::TlsConnector::from(config.clone())
                        .connect(ServerName::try_from("localhost").expect("a name"), tcp),
                )
                .await;
                if matches!(done, Ok(Ok(_))) {
                    completed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The kubelet's default probe timeout (1 s), tighter than the shipped manifests' 5 s.
    let probes = probe_loop_within(port, seconds - 4, 1).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    let secs = started.elapsed().as_secs_f64();
    let (attempts, completed) = (
        attempts.load(Ordering::Relaxed),
        completed.load(Ordering::Relaxed),
    );
    println!(
        "secure port, RSA-2048 handshake flood for {secs:.0} s: {attempts} attempted ({:.0}/s), {completed} completed ({:.0}/s); within 1 s {probes}",
        attempts as f64 / secs,
        completed as f64 / secs
    );
    assert!(
        attempts as f64 >= 1000.0 * secs * 0.5,
        "the flood ran: {attempts} attempts"
    );
    assert!(completed >= 1000, "handshakes were made: {completed}");
    assert!(probes.kept_alive(), "{probes}\n{}", ccm.log());
    Ok(())
}

/// A self-signed certificate for `names` (PEM cert, PEM key).
fn certificate(names: &[&str]) -> Result<(String, String)> {
    let c = rcgen::generate_simple_self_signed(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
    Ok((c.cert.pem(), c.signing_key.serialize_pem()))
}

#[tokio::test]
async fn tls_flags_of_hardened_manifests_and_a_rotated_certificate() -> Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cluster = TestCluster::start().await?;
    let dir = cluster.dir();
    let (cert_a, key_a) = certificate(&["localhost", "serving-a.example"])?;
    let (cert_sni, key_sni) = certificate(&["ccm.example"])?;
    let (serving_crt, serving_key) = (dir.join("serving.crt"), dir.join("serving.key"));
    std::fs::write(&serving_crt, &cert_a)?;
    std::fs::write(&serving_key, &key_a)?;
    std::fs::write(dir.join("sni.crt"), &cert_sni)?;
    std::fs::write(dir.join("sni.key"), &key_sni)?;
    let (ca_one, ca_two) = (ClientCa::new("client-ca-one")?, ClientCa::new("client-ca-two")?);
    let ca_file = dir.join("client-ca.crt");
    std::fs::write(&ca_file, &ca_one.pem)?;
    // TLS 1.2 and up; of the TLS 1.2 suites only ECDSA with AES-128-GCM (the certificates are
    // ECDSA), plus a suite rustls does not implement (accepted, not offered), as CIS lists do.
    let ccm = start(
        &cluster,
        "ccm-tls-flags",
        &[
            format!("--client-ca-file={}", ca_file.display()),
            format!("--tls-cert-file={}", serving_crt.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!(
                "--tls-sni-cert-key={},{}:ccm.example",
                dir.join("sni.crt").display(),
                dir.join("sni.key").display()
            ),
            "--tls-min-version=VersionTLS12".into(),
            "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_RSA_WITH_AES_128_GCM_SHA256"
                .into(),
        ],
    )
    .await?;
    let port = ccm.port();
    let der = |pem: &str| -> Result<Vec<u8>> {
        Ok(CertificateDer::pem_slice_iter(pem.as_bytes())
            .next()
            .context("no certificate")??
            .to_vec())
    };
    use rustls::pki_types::pem::PemObject;
    let any = client_config(rustls::DEFAULT_VERSIONS, None)?;
    assert_eq!(
        handshake(port, any.clone(), "localhost").await?.to_vec(),
        der(&cert_a)?
    );
    assert_eq!(
        handshake(port, any.clone(), "ccm.example").await?.to_vec(),
        der(&cert_sni)?,
        "the SNI name gets its certificate"
    );
    // TLS 1.2 with the allowed suite works; with another one it does not.
    let tls12 = |suite: &str| client_config(&[&rustls::version::TLS12], Some(&[suite]));
    assert!(
        handshake(
            port,
            tls12("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256")?,
            "localhost"
        )
        .await
        .is_ok()
    );
    assert!(
        handshake(
            port,
            tls12("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384")?,
            "localhost"
        )
        .await
        .is_err(),
        "a TLS 1.2 suite not in --tls-cipher-suites is refused"
    );
    assert!(
        ccm.log().contains("TLS_RSA_WITH_AES_128_GCM_SHA256"),
        "the suite not offered is named in a warning"
    );

    // The serving certificate rotated on disk: new connections get the new one, no restart.
    let (cert_b, key_b) = certificate(&["localhost", "serving-b.example"])?;
    std::fs::write(&serving_crt, &cert_b)?;
    std::fs::write(&serving_key, &key_b)?;
    let rotated = Instant::now();
    wait_for(
        "the rotated certificate to be served",
        Duration::from_secs(20),
        || async {
            let got = handshake(port, any.clone(), "localhost").await.ok()?;
            (got.to_vec() == der(&cert_b).ok()?).then_some(())
        },
    )
    .await?;
    println!(
        "secure port: a rotated serving certificate was served {:?} after it was written",
        rotated.elapsed()
    );

    // The client CA file rotated on disk: a certificate of the new CA is accepted, no restart.
    let with_identity = |identity: reqwest::Identity| async move {
        reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .identity(identity)
            .timeout(Duration::from_secs(5))
            .build()?
            .get(format!("https://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .map_err(anyhow::Error::from)
    };
    assert_eq!(with_identity(ca_one.client_identity("one", &[])?).await?, 200);
    assert_eq!(
        with_identity(ca_two.client_identity("two", &[])?).await?,
        401,
        "a certificate of a CA not (yet) trusted authenticates nobody"
    );
    std::fs::write(&ca_file, &ca_two.pem)?;
    wait_for(
        "the rotated client CA to be used",
        Duration::from_secs(20),
        || async {
            (with_identity(ca_two.client_identity("two", &[]).ok()?)
                .await
                .ok()?
                == 200)
                .then_some(())
        },
    )
    .await?;

    // --tls-min-version=VersionTLS13 refuses a TLS 1.2 client.
    let ccm13 = start(&cluster, "ccm-tls13", &["--tls-min-version=VersionTLS13".into()]).await?;
    assert!(
        handshake(
            ccm13.port(),
            client_config(&[&rustls::version::TLS12], None)?,
            "localhost"
        )
        .await
        .is_err(),
        "a TLS 1.2 client is refused"
    );
    assert!(
        handshake(
            ccm13.port(),
            client_config(&[&rustls::version::TLS13], None)?,
            "localhost"
        )
        .await
        .is_ok()
    );
    Ok(())
}
