//! The secure port under what anyone who can reach it can send, on the real binary and a real
//! API server: idle TLS connections, connections that never start TLS, and a flood of made-up
//! bearer tokens must not make the kubelet's `/healthz` probe fail or cost the API server more
//! TokenReviews than upstream's client limits allow; and the TLS settings hardened manifests
//! use: `--tls-min-version`, `--tls-cipher-suites`, `--tls-sni-cert-key`, and a serving
//! certificate and a client CA rotated on disk and used without a restart.
//!
//! The floods come from 127.0.0.2 (another client address), the probe from 127.0.0.1, as the
//! kubelet probes from its own address; each test prints its figures.

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
/// How long each flood is held, and how many probes are sent meanwhile (one a second).
const HOLD_SECONDS: u64 = 60;
const CONNECTIONS: usize = 200;

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

/// A TCP connection to 127.0.0.1:`port` from 127.0.0.2.
async fn connect_from_elsewhere(port: u16) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind("127.0.0.2:0".parse().expect("an address"))?;
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

/// `curl -sk --max-time 2 https://127.0.0.1:<port>/healthz` once a second for `seconds`:
/// (probes answered 200, probes sent, slowest answer).
async fn probe_loop(port: u16, seconds: u64) -> (usize, usize, Duration) {
    let mut ok = 0;
    let mut slowest = Duration::ZERO;
    for _ in 0..seconds {
        let start = Instant::now();
        let out = tokio::process::Command::new("curl")
            .args(["-sk", "--max-time", "2", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(format!("https://127.0.0.1:{port}/healthz"))
            .output()
            .await;
        let took = start.elapsed();
        if out.is_ok_and(|o| o.stdout == b"200") {
            ok += 1;
            slowest = slowest.max(took);
        }
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(took)).await;
    }
    (ok, seconds as usize, slowest)
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

/// Holds `CONNECTIONS` connections from 127.0.0.2 made by `open` (reconnecting each when the
/// server drops it) while the probe loop runs; prints and checks the figures.
async fn hold_while_probing<F, Fut>(ccm: &CcmProcess, what: &str, open: F) -> Result<()>
where
    F: Fn(u16) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Option<Held>> + Send,
{
    let port = ccm.port();
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let mut holders = Vec::new();
    for _ in 0..CONNECTIONS {
        let (stop, opened, open) = (stop.clone(), opened.clone(), open.clone());
        holders.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Some(mut held) = open(port).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                opened.fetch_add(1, Ordering::Relaxed);
                // Held until the server drops it or the test ends.
                while !stop.load(Ordering::Relaxed) && !held.closed().await {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (ok, sent, slowest) = probe_loop(port, HOLD_SECONDS).await;
    stop.store(true, Ordering::Relaxed);
    for h in holders {
        let _ = h.await;
    }
    let rss = ccm.peak_rss_kb().unwrap_or_default();
    println!(
        "secure port, {CONNECTIONS} {what} held {HOLD_SECONDS} s (connections opened: {}): /healthz answered {ok} of {sent} probes, slowest {slowest:?}; CCM peak RSS {:.1} MB",
        opened.load(Ordering::Relaxed),
        rss as f64 / 1024.0
    );
    assert!(ok + 1 >= sent, "{ok} of {sent} probes answered\n{}", ccm.log());
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
    hold_while_probing(&ccm, "idle TLS connections", move |port| {
        let config = config.clone();
        async move {
            let tcp = connect_from_elsewhere(port).await.ok()?;
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
    hold_while_probing(&ccm, "connections that never start TLS", |port| async move {
        let tcp = connect_from_elsewhere(port).await.ok()?;
        Some(Held::Tcp(tcp))
    })
    .await
}

/// The API server's count of TokenReviews created.
async fn token_reviews(client: &kube::Client) -> Result<f64> {
    rcp_e2e::k8s::apiserver_requests(client, "tokenreviews", "POST").await
}

#[tokio::test]
async fn a_flood_of_made_up_tokens_costs_no_more_token_reviews_than_upstreams_limits() -> Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cluster = TestCluster::start().await?;
    let ccm = start(&cluster, "ccm-token-flood", &[]).await?;
    let port = ccm.port();
    let admin = cluster.client().await?;
    let legit = |token: String| async move {
        let r = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .timeout(Duration::from_secs(5))
            .build()?
            .get(format!("https://127.0.0.1:{port}/metrics"))
            .bearer_auth(token)
            .send()
            .await?;
        anyhow::Ok(r.status().as_u16())
    };
    // The cluster admin reads /metrics before the flood (its answer is cached, as upstream).
    assert_eq!(legit(cluster.admin_token().to_string()).await?, 200);
    let before = token_reviews(&admin).await?;
    let flood = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .timeout(Duration::from_secs(15))
        .build()?;
    let start = Instant::now();
    let mut sent = Vec::new();
    let mut legit_during = Vec::new();
    for i in 0..2000u32 {
        let token: String = (0..32)
            .map(|_| format!("{:x}", rand::random::<u8>() % 16))
            .collect();
        let flood = flood.clone();
        sent.push(tokio::spawn(async move {
            flood
                .get(format!("https://127.0.0.1:{port}/metrics"))
                .bearer_auth(token)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }));
        if i % 250 == 0 {
            legit_during.push(tokio::spawn(legit(cluster.admin_token().to_string())));
        }
        // 500 a second.
        let due = Duration::from_millis(2 * u64::from(i + 1));
        tokio::time::sleep(due.saturating_sub(start.elapsed())).await;
    }
    let flood_secs = start.elapsed().as_secs_f64();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for s in sent {
        *statuses.entry(s.await?).or_default() += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut legit_statuses = Vec::new();
    for l in legit_during {
        legit_statuses.push(l.await??);
    }
    let reviews = token_reviews(&admin).await? - before;
    // Upstream's client: a burst of 400, then 200 a second, for as long as the flood lasted.
    let allowed = 400.0 + 200.0 * elapsed;
    println!(
        "secure port, 2000 made-up tokens in {flood_secs:.1} s (all answered after {elapsed:.1} s): {reviews} TokenReviews (allowed by QPS 200/burst 400: {allowed:.0}); answers {statuses:?}; the admin's /metrics during the flood: {legit_statuses:?}"
    );
    assert!(reviews <= allowed, "{reviews} TokenReviews > {allowed}");
    assert!(reviews >= 400.0, "the burst is used: {reviews}");
    assert!(statuses.keys().all(|s| *s == 401 || *s == 0), "{statuses:?}");
    assert!(legit_statuses.iter().all(|s| *s == 200), "{legit_statuses:?}");
    assert_eq!(legit(cluster.admin_token().to_string()).await?, 200);
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
    assert!(
        with_identity(ca_two.client_identity("two", &[])?).await.is_err(),
        "a certificate of a CA not (yet) trusted is refused"
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
