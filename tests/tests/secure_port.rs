//! The secure port's delegated authentication and authorization against a real API server:
//! TokenReview for bearer tokens, client certificates from `--client-ca-file`,
//! SubjectAccessReview with the RBAC of the cluster, the always-allowed health paths, and the
//! decision caches. The CCM runs as the deployed ServiceAccount (`deploy/common` RBAC), so the
//! TokenReview/SubjectAccessReview rights of the shipped role are exercised too.

use std::time::Duration;

use anyhow::{Context, Result};
use rcp_e2e::{TestCluster, ccm::CcmProcess, certs::ClientCa, k8s::wait_for};

const FAKE: &str = "fake-cloud-controller-manager";
const T: Duration = Duration::from_secs(60);

async fn get(
    port: u16,
    path: &str,
    bearer: Option<&str>,
    identity: Option<reqwest::Identity>,
) -> Result<(u16, String)> {
    let mut builder = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(5));
    if let Some(id) = identity {
        builder = builder.identity(id);
    }
    let mut request = builder.build()?.get(format!("https://127.0.0.1:{port}{path}"));
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    let r = request.send().await.with_context(|| format!("GET {path}"))?;
    Ok((r.status().as_u16(), r.text().await?))
}

fn token_of(kubeconfig: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(kubeconfig)?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("token: ").map(str::to_string))
        .context("no token in the kubeconfig")
}

const METRICS_READER: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: metrics-reader
rules:
- nonResourceURLs: ["/metrics"]
  verbs: ["get"]
"#;

fn binding(name: &str, subject: &str) -> String {
    format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {name}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: metrics-reader
subjects:
{subject}
"#
    )
}

/// Starts the fake CCM as `kubeconfig` with `extra` flags and waits for its secure port.
async fn start_fake(
    cluster: &TestCluster,
    name: &str,
    kubeconfig: &std::path::Path,
    extra: &[String],
) -> Result<CcmProcess> {
    let fake = cluster.dir().join("fake.json");
    std::fs::write(&fake, "{}")?;
    let mut args = vec![
        format!("--cloud-config={}", fake.display()),
        "--cluster-cidr=10.244.0.0/16".into(),
        "--leader-elect=false".into(),
    ];
    args.extend_from_slice(extra);
    let ccm = CcmProcess::start(FAKE, name, kubeconfig, cluster.dir(), &args)?;
    let port = ccm.port();
    wait_for("the secure port", T, || async {
        get(port, "/healthz", None, None)
            .await
            .ok()
            .filter(|r| r.0 == 200)
    })
    .await?;
    Ok(ccm)
}

#[tokio::test]
async fn metrics_need_an_authorized_user_and_health_paths_stay_open() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let kubeconfig = cluster.ccm_kubeconfig("common")?;
    let ca = ClientCa::new("metrics-client-ca")?;
    let ca_file = cluster.dir().join("client-ca.crt");
    std::fs::write(&ca_file, &ca.pem)?;
    let ccm = start_fake(
        &cluster,
        "ccm-secure-port",
        &kubeconfig,
        &[
            format!("--client-ca-file={}", ca_file.display()),
            // Allowed answers are kept an hour, denied ones not at all: both caches are seen.
            "--authorization-webhook-cache-authorized-ttl=1h".into(),
            "--authorization-webhook-cache-unauthorized-ttl=0s".into(),
        ],
    )
    .await?;
    let port = ccm.port();
    cluster.kubectl_stdin(&["apply", "-f", "-"], METRICS_READER)?;
    let scraper = token_of(
        &cluster
            .kubeconfig_for_service_account("default", "scraper")
            .await?,
    )?;
    let mut matrix = Vec::new();

    // Health paths: open to anyone (always-allow paths), as upstream.
    for path in ["/healthz", "/readyz", "/livez"] {
        let (status, body) = get(port, path, None, None).await?;
        assert_eq!((status, body.as_str()), (200, "ok"), "{path}");
    }
    matrix.push(("anonymous", "/healthz", 200));

    // Anonymous: upstream keeps anonymous requests on and lets RBAC decide: 403.
    let (status, body) = get(port, "/metrics", None, None).await?;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains(r#"forbidden: User \"system:anonymous\" cannot get path \"/metrics\""#),
        "{body}"
    );
    matrix.push(("anonymous", "/metrics", status));

    // A token the API server does not know: 401.
    let (status, body) = get(port, "/metrics", Some("not-a-real-token"), None).await?;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains(r#""reason":"Unauthorized""#), "{body}");
    matrix.push(("unknown token", "/metrics", status));

    // A real ServiceAccount token without the right: 403 naming the user.
    let (status, body) = get(port, "/metrics", Some(&scraper), None).await?;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("system:serviceaccount:default:scraper"), "{body}");
    matrix.push(("token without RBAC", "/metrics", status));

    // Granted: 200 at once (denials are not cached with a 0s TTL).
    cluster.kubectl_stdin(
        &["apply", "-f", "-"],
        &binding(
            "scraper-metrics",
            "- kind: ServiceAccount\n  name: scraper\n  namespace: default",
        ),
    )?;
    let (status, body) = get(port, "/metrics", Some(&scraper), None).await?;
    assert_eq!(status, 200);
    assert!(body.contains("running_managed_controllers"), "the metrics text");
    matrix.push(("token with RBAC", "/metrics", status));

    // Revoked: still 200 within the authorized TTL (the answer is cached, as upstream).
    cluster.kubectl(&["delete", "clusterrolebinding", "scraper-metrics"])?;
    let (status, _) = get(port, "/metrics", Some(&scraper), None).await?;
    assert_eq!(
        status, 200,
        "an allowed answer is cached for --authorization-webhook-cache-authorized-ttl"
    );

    // The cluster admin (group system:masters) is always allowed.
    let (status, _) = get(port, "/metrics", Some(cluster.admin_token()), None).await?;
    assert_eq!(status, 200);
    matrix.push(("system:masters token", "/metrics", status));

    // Client certificates signed by --client-ca-file: CN is the user, O the groups.
    let (status, body) = get(
        port,
        "/metrics",
        None,
        Some(ca.client_identity("cert-scraper", &["monitoring"])?),
    )
    .await?;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains(r#"User \"cert-scraper\""#), "{body}");
    matrix.push(("client cert without RBAC", "/metrics", status));
    cluster.kubectl_stdin(
        &["apply", "-f", "-"],
        &binding(
            "monitoring-metrics",
            "- kind: Group\n  apiGroup: rbac.authorization.k8s.io\n  name: monitoring",
        ),
    )?;
    let (status, _) = get(
        port,
        "/metrics",
        None,
        Some(ca.client_identity("cert-scraper", &["monitoring"])?),
    )
    .await?;
    assert_eq!(status, 200, "the certificate's O=monitoring group is bound");
    matrix.push(("client cert, group bound", "/metrics", status));

    // A certificate from another CA authenticates nobody (as upstream, the connection stands
    // and the request answers 401).
    let stranger = ClientCa::new("someone-else")?;
    let (status, _) = get(
        port,
        "/metrics",
        None,
        Some(stranger.client_identity("intruder", &["system:masters"])?),
    )
    .await?;
    assert_eq!(status, 401, "an unknown CA's certificate authenticates nobody");
    matrix.push(("client cert of another CA", "/metrics", status));

    for (who, path, status) in &matrix {
        println!("secure port: {who:<28} GET {path:<9} -> {status}");
    }
    assert!(
        !ccm.log().contains(&scraper) && !ccm.log().contains(cluster.admin_token()),
        "tokens never reach the log"
    );
    Ok(())
}

#[tokio::test]
async fn without_delegation_kubeconfigs_only_health_paths_answer() -> Result<()> {
    let cluster = TestCluster::start().await?;
    // An empty --authentication-kubeconfig/--authorization-kubeconfig outside a cluster: no
    // TokenReview, no SubjectAccessReview (upstream warns and goes on).
    let ccm = start_fake(
        &cluster,
        "ccm-no-delegation",
        cluster.kubeconfig_path(),
        &[
            "--authentication-kubeconfig=".into(),
            "--authorization-kubeconfig=".into(),
        ],
    )
    .await?;
    let port = ccm.port();
    // Even the admin token is not looked at: the request is anonymous, and nothing reviews it.
    let (status, body) = get(port, "/metrics", Some(cluster.admin_token()), None).await?;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("system:anonymous"), "{body}");
    let log = ccm.log();
    assert!(
        log.contains("No authentication-kubeconfig provided")
            && log.contains("No authorization-kubeconfig provided"),
        "both are warned about"
    );
    Ok(())
}

/// Requests for paths the port does not serve are answered 404 before any review: 300
/// anonymous requests for distinct unserved paths and 50 with made-up tokens cost not one
/// SubjectAccessReview or TokenReview (each used to cost one, making the flood of one client
/// the review budget of all). A request head over 16 KiB is refused (431) instead of being
/// buffered (hyper's default holds ~400 KiB per connection).
#[tokio::test]
async fn unserved_paths_cost_no_review_and_oversized_heads_are_refused() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let kubeconfig = cluster.ccm_kubeconfig("common")?;
    let ccm = start_fake(&cluster, "ccm-unserved", &kubeconfig, &[]).await?;
    let port = ccm.port();
    let admin = cluster.client().await?;
    let reviews = || async {
        let sar = rcp_e2e::k8s::apiserver_requests(&admin, "subjectaccessreviews", "POST").await?;
        let tr = rcp_e2e::k8s::apiserver_requests(&admin, "tokenreviews", "POST").await?;
        anyhow::Ok((sar, tr))
    };
    // A served path does cost a review: the counters see the fake CCM's reviews.
    let before = reviews().await?;
    let (status, _) = get(port, "/metrics", None, None).await?;
    assert_eq!(status, 403, "anonymous /metrics is reviewed and refused");
    let after_one = reviews().await?;
    assert!(
        after_one.0 > before.0,
        "the anonymous /metrics cost a SubjectAccessReview"
    );

    let client = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for i in 0..350 {
        let mut request = client.get(format!("https://127.0.0.1:{port}/unserved/{i}"));
        if i >= 300 {
            request = request.bearer_auth(format!("made-up-token-{i}"));
        }
        *statuses
            .entry(request.send().await?.status().as_u16())
            .or_default() += 1;
    }
    let after = reviews().await?;
    println!(
        "350 requests for unserved paths: answers {statuses:?}; SubjectAccessReviews {} → {}, TokenReviews {} → {}",
        after_one.0, after.0, after_one.1, after.1
    );
    assert_eq!(statuses, [(404, 350)].into(), "every one answered 404");
    assert_eq!(after, after_one, "not one review for an unserved path");

    let (status, _) = get(port, "/healthz", None, None).await?;
    assert_eq!(status, 200);
    // HTTP/1 (HTTP/2's header list is limited to 16 KiB by hyper's default already).
    let http1 = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .http1_only()
        .timeout(Duration::from_secs(10))
        .build()?;
    let big = "x".repeat(64 * 1024);
    let r = http1
        .get(format!("https://127.0.0.1:{port}/healthz"))
        .header("x-padding", &big)
        .send()
        .await;
    match r {
        Ok(r) => assert_eq!(r.status().as_u16(), 431, "a 64 KiB head is refused"),
        Err(e) => println!("a 64 KiB head: the connection was closed ({e})"),
    }
    assert_eq!(
        get(port, "/healthz", None, None).await?.0,
        200,
        "the port still serves"
    );
    Ok(())
}

/// `curl` against the secure port: the HTTP version it got and its exit code (35: the TLS
/// handshake failed).
fn curl(port: u16, extra: &[&str]) -> Result<(String, i32)> {
    let out = std::process::Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "-w",
            "%{http_version}",
        ])
        .args(extra)
        .arg(format!("https://127.0.0.1:{port}/healthz"))
        .output()
        .context("curl")?;
    Ok((
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        out.status.code().unwrap_or(-1),
    ))
}

/// The secure-serving flags of Go's cloud-controller-manager take effect: `--disable-http2-serving`
/// (a client asking for HTTP/2 gets HTTP/1.1; without the flag it gets HTTP/2),
/// `--tls-curve-preferences` (only the named key exchange is offered), and
/// `--permit-port-sharing` (a second process binds the same port; without the flag on both it
/// cannot).
#[tokio::test]
async fn serving_flags_of_the_go_ccm_take_effect() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let kubeconfig = cluster.kubeconfig_path();
    let default = start_fake(&cluster, "ccm-serving-default", kubeconfig, &[]).await?;
    assert_eq!(
        curl(default.port(), &["--http2"])?,
        ("2".to_string(), 0),
        "HTTP/2 by default"
    );
    let tuned = start_fake(
        &cluster,
        "ccm-serving-tuned",
        kubeconfig,
        &[
            "--disable-http2-serving".into(),
            "--tls-curve-preferences=24".into(),
            "--permit-port-sharing".into(),
        ],
    )
    .await?;
    let port = tuned.port();
    assert_eq!(curl(port, &["--http2"])?, ("1.1".to_string(), 0), "HTTP/1.1 only");
    assert_eq!(curl(port, &["--curves", "P-384"])?.1, 0, "P-384 is offered");
    assert_eq!(curl(port, &["--curves", "X25519"])?.1, 35, "X25519 is not");
    assert_eq!(
        curl(default.port(), &["--curves", "X25519"])?.1,
        0,
        "X25519 is by default"
    );

    // A second process on the same port, with SO_REUSEPORT as the first: it serves.
    let mut second = start_fake(
        &cluster,
        "ccm-serving-shared",
        kubeconfig,
        &[format!("--secure-port={port}"), "--permit-port-sharing".into()],
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    second.check_running()?;
    assert!(
        second
            .log()
            .contains(&format!("Serving securely on 127.0.0.1:{port}")),
        "the second binds the port"
    );
    // A third without the flag cannot bind it, and says why.
    let fake = cluster.dir().join("fake.json");
    let mut third = CcmProcess::start(
        FAKE,
        "ccm-serving-refused",
        kubeconfig,
        cluster.dir(),
        &[
            format!("--secure-port={port}"),
            format!("--cloud-config={}", fake.display()),
            "--cluster-cidr=10.244.0.0/16".into(),
            "--leader-elect=false".into(),
        ],
    )?;
    let code = third.wait_exit(T)?;
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}");
    assert!(third.log().contains("Address already in use"), "{}", third.log());
    Ok(())
}

/// The cluster's client CA (`kube-system/extension-apiserver-authentication`, as kube-apiserver
/// publishes it) is followed without a restart, and a certificate the client CA did not sign
/// is handled as upstream's union of authenticators: its request authenticates with a valid
/// bearer token, and without one answers 401 (also on the always-allowed health paths), never
/// ending the TLS connection.
#[tokio::test]
async fn the_clusters_client_ca_is_followed_and_a_foreign_certificate_defers_to_the_token() -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let cluster = TestCluster::start().await?;
    let kubeconfig = cluster.ccm_kubeconfig("common")?;
    let (one, two) = (
        ClientCa::new("apiserver-client-ca-one")?,
        ClientCa::new("apiserver-client-ca-two")?,
    );
    let configmaps: kube::Api<ConfigMap> = kube::Api::namespaced(cluster.client().await?, "kube-system");
    let published = |pem: &str| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("extension-apiserver-authentication".into()),
            ..Default::default()
        },
        data: Some([("client-ca-file".to_string(), pem.to_string())].into()),
        ..Default::default()
    };
    configmaps
        .create(&Default::default(), &published(&one.pem))
        .await?;
    let ccm = start_fake(&cluster, "ccm-cluster-ca", &kubeconfig, &[]).await?;
    let port = ccm.port();
    let admin = cluster.admin_token().to_string();
    let masters = |ca: &ClientCa| ca.client_identity("operator", &["system:masters"]);
    // A certificate of the published CA authenticates.
    assert_eq!(get(port, "/metrics", None, Some(masters(&one)?)).await?.0, 200);
    // One of another CA: the TLS connection stands, the request needs a valid token.
    assert_eq!(get(port, "/metrics", None, Some(masters(&two)?)).await?.0, 401);
    assert_eq!(get(port, "/healthz", None, Some(masters(&two)?)).await?.0, 401);
    assert_eq!(
        get(port, "/metrics", Some("made-up"), Some(masters(&two)?))
            .await?
            .0,
        401
    );
    assert_eq!(
        get(port, "/metrics", Some(&admin), Some(masters(&two)?)).await?.0,
        200,
        "a foreign certificate with a valid token is the token's user"
    );
    // The API server's client CA rotated: the CCM follows the ConfigMap, no restart.
    configmaps
        .replace("extension-apiserver-authentication", &Default::default(), &{
            let mut cm = configmaps.get("extension-apiserver-authentication").await?;
            cm.data = published(&two.pem).data;
            cm
        })
        .await?;
    let rotated = std::time::Instant::now();
    wait_for("the rotated cluster client CA to be trusted", T, || async {
        let id = masters(&two).ok()?;
        (get(port, "/metrics", None, Some(id)).await.ok()?.0 == 200).then_some(())
    })
    .await?;
    println!(
        "secure port: the cluster's rotated client CA was trusted {:?} after the ConfigMap changed",
        rotated.elapsed()
    );
    assert_eq!(
        get(port, "/metrics", None, Some(masters(&one)?)).await?.0,
        401,
        "the old CA's certificates no longer authenticate"
    );
    assert!(ccm.log().contains("client CA"), "{}", ccm.log());
    Ok(())
}
