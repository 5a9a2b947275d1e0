//! The cloud-controller-manager application as real processes against a real kube-apiserver:
//! leader election and fail-over, health and metrics endpoints, `--controllers`, bad flags.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use k8s_cloud_provider::well_known::FINALIZER_LOAD_BALANCER_CLEANUP;
use k8s_openapi::api::core::v1::{Node, Service, ServicePort, ServiceSpec};
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
};
use nix::sys::signal::Signal;
use rcp_e2e::{
    TestCluster,
    ccm::{CcmProcess, run_to_exit, run_to_exit_with_env},
    k8s::{tainted_node, wait_for},
};

const FAKE: &str = "fake-cloud-controller-manager";
const LEASE: &str = "cloud-controller-manager";

fn fake_config(cluster: &TestCluster, nodes: &[&str]) -> Result<PathBuf> {
    rcp_e2e::k8s::write_fake_cloud_config(cluster.dir(), nodes)
}

fn args(config: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        format!("--cloud-config={}", config.display()),
        "--cluster-cidr=10.244.0.0/16".to_string(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

#[tokio::test]
async fn exactly_one_leader_runs_controllers_and_fails_over_on_kill_and_sigterm() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let config = fake_config(&cluster, &[])?;
    // As the deployed ServiceAccount: leader election must work with the shipped RBAC.
    let kc = cluster.ccm_kubeconfig("common")?;
    let a = CcmProcess::start(FAKE, "ccm-a", &kc, cluster.dir(), &args(&config, &[]))?;
    wait_for("a leads", Duration::from_secs(30), || async {
        a.is_leader(LEASE).await.ok()?.then_some(())
    })
    .await?;
    let mut b = CcmProcess::start(FAKE, "ccm-b", &kc, cluster.dir(), &args(&config, &[]))?;
    wait_for("b serves /healthz", Duration::from_secs(30), || async {
        (b.get("/healthz").await.ok()?.0 == 200).then_some(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Exactly one runs the controllers.
    assert!(a.is_leader(LEASE).await? && a.runs_controller("cloud-node").await?);
    assert!(!b.is_leader(LEASE).await?, "b must be a follower");
    assert!(
        !b.runs_controller("cloud-node").await?,
        "a follower runs no controller"
    );
    assert_eq!(b.get("/readyz").await?.0, 200, "a healthy follower is ready");

    // kill -9 the leader: b takes over once the lease expires.
    a.signal(Signal::SIGKILL)?;
    let killed = Instant::now();
    wait_for("b leads after kill -9", Duration::from_secs(40), || async {
        b.is_leader(LEASE).await.ok()?.then_some(())
    })
    .await
    .with_context(|| b.log())?;
    let failover = killed.elapsed();
    wait_for("b runs controllers", Duration::from_secs(10), || async {
        b.runs_controller("cloud-node").await.ok()?.then_some(())
    })
    .await?;
    println!("leader fail-over after kill -9: {failover:.2?} (lease duration 15s, retry period 2s)");
    // The standby never takes a lease before it expired: the killed leader renewed it at
    // most one retry period (2 s, ×1.2 jitter) before the kill, and the lease lasts 15 s. (How
    // fast the fail-over is after that is a figure, printed above, not a pass/fail bound.)
    assert!(
        failover >= Duration::from_secs_f64(15.0 - 2.0 * 1.2 - 0.5),
        "the standby led {failover:?} after the kill: before the lease expired"
    );

    // SIGTERM the leader: it releases the lease, and a standby takes over at its next retry.
    let c = CcmProcess::start(FAKE, "ccm-c", &kc, cluster.dir(), &args(&config, &[]))?;
    wait_for("c serves /healthz", Duration::from_secs(30), || async {
        (c.get("/healthz").await.ok()?.0 == 200).then_some(())
    })
    .await?;
    b.signal(Signal::SIGTERM)?;
    let termed = Instant::now();
    wait_for("c leads after SIGTERM of b", Duration::from_secs(20), || async {
        c.is_leader(LEASE).await.ok()?.then_some(())
    })
    .await?;
    let handover = termed.elapsed();
    println!("leader hand-over after SIGTERM: {handover:.2?}");
    // Well before the 15 s lease could have expired: the lease was released, not waited out.
    assert!(
        handover < Duration::from_secs(15),
        "hand-over took {handover:?}: the released lease was not used"
    );
    assert_eq!(
        b.wait_exit(Duration::from_secs(20))?,
        Some(0),
        "graceful shutdown exits 0"
    );
    assert!(b.log().contains("released leader lease"), "{}", b.log());

    // Every Lease write after the create is an update (the `update` verb upstream's RBAC
    // grants) of the Lease as read, with the elector's fields changed (every other field is
    // sent back as read: leaderelection's unit test `a_lease_write_keeps_every_field_…`).
    let lease_writes: Vec<_> = cluster
        .audit_writes()
        .into_iter()
        .filter(|e| e["objectRef"]["resource"] == "leases" && e["objectRef"]["name"] == LEASE)
        .collect();
    assert!(
        lease_writes.iter().filter(|e| e["verb"] == "update").count() >= 3,
        "renewals audited"
    );
    for e in &lease_writes {
        match e["verb"].as_str() {
            Some("create" | "update") => {}
            other => panic!("a Lease write other than create or update ({other:?}): {e}"),
        }
    }
    Ok(())
}

/// The CCM keeps working when its ServiceAccount token is rotated and the old one dies: the
/// kubelet writes a new token into the mounted file well before the old one expires, and the
/// client (in-cluster config or a kubeconfig's `tokenFile`, the same code) reads the file
/// again at least once a minute. The kubelet itself rotates after 80 % of a token's life, and
/// the API server's shortest life is 10 minutes, so the test rotates the file as the kubelet
/// does, then revokes the old token (bound to a Secret that it deletes): the leader keeps its
/// lease and initialises a Node registered after the revocation.
#[tokio::test]
async fn a_rotated_service_account_token_is_read_again_and_the_old_one_may_die() -> Result<()> {
    use k8s_openapi::api::{
        authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
        core::v1::{Secret, ServiceAccount},
    };
    let cluster = TestCluster::start().await?;
    let config = fake_config(&cluster, &["rotation-a", "rotation-b"])?;
    cluster.ccm_kubeconfig("common")?; // the ServiceAccount and the shipped RBAC
    let client = cluster.client().await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "kube-system");
    // A token bound to a Secret of its own: deleting the Secret revokes the token at once.
    let mint = |binding: &'static str| {
        let (secrets, accounts) = (secrets.clone(), accounts.clone());
        async move {
            let secret = secrets
                .create(
                    &PostParams::default(),
                    &Secret {
                        metadata: ObjectMeta {
                            name: Some(binding.into()),
                            ..Default::default()
                        },
                        ..Default::default()
                    },
                )
                .await?;
            let request = TokenRequest {
                spec: Some(TokenRequestSpec {
                    audiences: Some(vec!["https://kubernetes.default.svc".into()]),
                    expiration_seconds: Some(600),
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Secret".into()),
                        name: Some(binding.into()),
                        uid: secret.metadata.uid,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let answer: TokenRequest = accounts
                .create_subresource(
                    "token",
                    "cloud-controller-manager",
                    &PostParams::default(),
                    &request,
                )
                .await?;
            let token = answer.status.and_then(|s| s.token).unwrap_or_default();
            rcp_e2e::secrets::register(&token);
            anyhow::Ok(token)
        }
    };
    let token_file = cluster.dir().join("rotated.token");
    std::fs::write(&token_file, mint("token-one").await?)?;
    let kubeconfig = cluster.dir().join("rotated.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    \
             insecure-skip-tls-verify: true\nusers:\n- name: ccm\n  user:\n    tokenFile: {}\ncontexts:\n\
             - name: test\n  context:\n    cluster: test\n    user: ccm\ncurrent-context: test\n",
            cluster.server(),
            token_file.display()
        ),
    )?;
    let mut ccm = CcmProcess::start(
        FAKE,
        "ccm-rotation",
        &kubeconfig,
        cluster.dir(),
        &args(&config, &[]),
    )?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &tainted_node("rotation-a"))
        .await?;
    wait_for("rotation-a initialised", Duration::from_secs(60), || {
        rcp_e2e::k8s::initialised(&nodes, "rotation-a")
    })
    .await?;

    // Rotated as the kubelet rotates: a new token in the file, the old one still valid for a
    // while (a minute and a bit: the client reads the file again at least once a minute).
    let old = std::fs::read_to_string(&token_file)?;
    std::fs::write(&token_file, mint("token-two").await?)?;
    tokio::time::sleep(Duration::from_secs(65)).await;
    secrets.delete("token-one", &Default::default()).await?;
    let http = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .build()?;
    let refused = wait_for("the old token refused", Duration::from_secs(30), || async {
        let status = http
            .get(format!("{}/api/v1/nodes", cluster.server()))
            .bearer_auth(old.trim())
            .send()
            .await
            .ok()?
            .status();
        (status == reqwest::StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    refused?;

    nodes
        .create(&PostParams::default(), &tainted_node("rotation-b"))
        .await?;
    wait_for(
        "rotation-b initialised after the old token died",
        Duration::from_secs(60),
        || rcp_e2e::k8s::initialised(&nodes, "rotation-b"),
    )
    .await?;
    ccm.check_running()?;
    assert!(
        ccm.is_leader(LEASE).await?,
        "the CCM kept its lease:\n{}",
        ccm.log()
    );
    assert!(!ccm.log().contains("Unauthorized"), "{}", ccm.log());
    Ok(())
}

#[tokio::test]
async fn health_readiness_and_metrics_after_a_node_is_initialised() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let config = fake_config(&cluster, &["metrics-node"])?;
    let ccm = CcmProcess::start(
        FAKE,
        "ccm",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &args(&config, &[]),
    )?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client);
    nodes
        .create(&PostParams::default(), &tainted_node("metrics-node"))
        .await?;
    wait_for("node initialised", Duration::from_secs(60), || async {
        let n = nodes.get("metrics-node").await.ok()?;
        n.spec.as_ref()?.provider_id.clone().filter(|p| p == "fake://i-0")
    })
    .await?;

    let (status, body) = ccm.get("/healthz").await?;
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (_, verbose) = ccm.get("/healthz?verbose").await?;
    for line in [
        "[+]ping ok",
        "[+]leaderElection ok",
        "[+]cloud-node-controller ok",
        "[+]service-lb-controller ok",
        "healthz check passed",
    ] {
        assert!(verbose.contains(line), "missing {line:?} in:\n{verbose}");
    }
    assert_eq!(ccm.get("/livez").await?.0, 200);
    let (status, ready) = ccm.get("/readyz?verbose").await?;
    assert_eq!(status, 200, "{ready}");
    assert!(ready.contains("[+]informer-sync ok"), "{ready}");
    assert_eq!(ccm.get("/nope").await?.0, 404);

    let metrics = wait_for("taint removal metric", Duration::from_secs(10), || async {
        let m = ccm.metrics().await.ok()?;
        m.contains("node_controller_initial_node_sync_delay_seconds_count 1")
            .then_some(m)
    })
    .await?;
    for name in [
        "node_controller_cloud_provider_taint_removal_delay_seconds_count 1",
        "node_controller_initial_node_sync_delay_seconds_count 1",
        "running_managed_controllers{manager=\"cloud-controller-manager\",name=\"cloud-node\"} 1",
        "running_managed_controllers{manager=\"cloud-controller-manager\",name=\"cloud-node-lifecycle\"} 1",
        "running_managed_controllers{manager=\"cloud-controller-manager\",name=\"service\"} 1",
        "running_managed_controllers{manager=\"cloud-controller-manager\",name=\"route\"} 1",
        "leader_election_master_status{name=\"cloud-controller-manager\"} 1",
        "workqueue_adds_total{name=\"Nodes\"}",
        "workqueue_depth{name=\"Nodes\"}",
        "workqueue_queue_duration_seconds_bucket{name=\"Nodes\"",
        "workqueue_work_duration_seconds_bucket{name=\"Nodes\"",
        "service_controller_loadbalancer_sync_total",
        "service_controller_nodesync_latency_seconds",
        "service_controller_update_loadbalancer_host_latency_seconds",
        "service_controller_nodesync_error_total",
        "route_controller_route_sync_total",
        "controller_reconcile_total{controller=\"cloud-node-controller\",result=\"success\"}",
        "controller_reconcile_duration_seconds_bucket{controller=\"cloud-node-controller\"",
        "cloudprovider_api_calls_total{controller=\"cloud-node-controller\",operation=\"InstanceMetadata\",result=\"success\"} 1",
        "process_resident_memory_bytes",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}");
    }
    Ok(())
}

fn lb_service(name: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

#[tokio::test]
async fn controllers_flag_disables_the_service_controller_by_name_and_by_alias() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let config = fake_config(&cluster, &["sel-node-1", "sel-node-2"])?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client, "default");
    services
        .create(&PostParams::default(), &lb_service("ignored"))
        .await?;

    for (i, flag) in [
        "--controllers=*,-service-lb-controller",
        "--controllers=*,-service",
    ]
    .iter()
    .enumerate()
    {
        let mut ccm = CcmProcess::start(
            FAKE,
            &format!("ccm-{i}"),
            cluster.kubeconfig_path(),
            cluster.dir(),
            &args(&config, &[flag, "--leader-elect=false"]),
        )?;
        let node = format!("sel-node-{}", i + 1);
        nodes.create(&PostParams::default(), &tainted_node(&node)).await?;
        wait_for("node initialised", Duration::from_secs(60), || async {
            nodes
                .get(&node)
                .await
                .ok()?
                .spec?
                .provider_id
                .filter(|p| !p.is_empty())
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let svc = services.get("ignored").await?;
        assert!(
            !svc.metadata
                .finalizers
                .unwrap_or_default()
                .contains(&FINALIZER_LOAD_BALANCER_CLEANUP.to_string()),
            "{flag}: the service controller must not touch the Service"
        );
        assert!(
            ccm.log().contains("\"service-lb-controller\" is disabled"),
            "{flag}: log:\n{}",
            ccm.log()
        );
        assert!(!ccm.runs_controller("service").await? && ccm.runs_controller("cloud-node").await?);
        ccm.signal(Signal::SIGTERM)?;
        assert_eq!(ccm.wait_exit(Duration::from_secs(20))?, Some(0));
    }
    Ok(())
}

fn dummy_kubeconfig() -> Result<tempfile::NamedTempFile> {
    let f = tempfile::NamedTempFile::new()?;
    std::fs::write(
        f.path(),
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    token: t\ncurrent-context: c\n",
    )?;
    Ok(f)
}

#[test]
fn bad_flags_and_bad_cloud_config_exit_non_zero_with_a_one_line_reason() -> Result<()> {
    rcp_e2e::init();
    let kc = dummy_kubeconfig()?;
    let kc_flag = format!("--kubeconfig={}", kc.path().display());
    let bad_json = tempfile::NamedTempFile::new()?;
    std::fs::write(bad_json.path(), "{\"instances\": 42}")?;
    let bad_json_flag = format!("--cloud-config={}", bad_json.path().display());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--concurrent-node-syncs=0"],
            "error: invalid flags: --concurrent-node-syncs must be a positive number (got 0)",
        ),
        (
            vec!["--controllers=*,-nope"],
            "error: invalid flags: --controllers: \"nope\" is not in the list of known controllers",
        ),
        (
            vec!["--leader-elect-resource-lock=endpoints"],
            "--leader-elect-resource-lock: resourceLock value must be \"leases\"",
        ),
        (
            vec!["--leader-elect-renew-deadline=20s"],
            "--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline",
        ),
        (
            vec!["--cluster-cidr=10.0.0.0/33"],
            "--cluster-cidr: \"10.0.0.0/33\" is not a valid CIDR",
        ),
        (
            vec![&kc_flag, "--cloud-config=/nonexistent/cloud.json"],
            "error: --cloud-config: couldn't open cloud provider configuration /nonexistent/cloud.json",
        ),
        (
            vec![&kc_flag, &bad_json_flag],
            "error: Cloud provider could not be initialized: fake cloud config: invalid type: integer `42`",
        ),
        (vec![&kc_flag], "error: invalid flags: --cluster-cidr must be set"),
        (
            vec![&kc_flag, "--cloud-provider=aws"],
            "--cloud-provider=\"aws\": this binary links only the \"fake\" provider",
        ),
    ];
    for (args, expected) in cases {
        let (code, _, stderr) = run_to_exit(FAKE, &args)?;
        assert_ne!(code, 0, "{args:?} must fail");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line on stderr, got:\n{stderr}");
        assert!(
            lines[0].contains(expected),
            "{args:?}: expected {expected:?} in {stderr:?}"
        );
    }
    // Parse errors (clap) name the flag and the value.
    for (args, needle) in [
        (vec!["--leader-elect=maybe"], "--leader-elect"),
        (vec!["--node-monitor-period=5"], "missing unit"),
        (vec!["--no-such-flag"], "--no-such-flag"),
    ] {
        let (code, _, stderr) = run_to_exit(FAKE, &args)?;
        assert_ne!(code, 0);
        assert!(
            stderr.lines().next().unwrap_or_default().contains(needle) || stderr.contains(needle),
            "{args:?}: {stderr}"
        );
    }
    // A bad TOKIO_WORKER_THREADS is an error naming it and its value, not tokio's panic.
    let (code, _, stderr) = run_to_exit_with_env(FAKE, &[&kc_flag], &[("TOKIO_WORKER_THREADS", "zero")])?;
    assert_eq!(code, 1);
    assert_eq!(
        stderr.trim(),
        "error: environment variable TOKIO_WORKER_THREADS: \"zero\" is not a positive number of threads"
    );
    Ok(())
}

#[test]
fn aws_binary_help_lists_the_upstream_flags() -> Result<()> {
    let (code, stdout, _) = run_to_exit("cloud-controller-manager-aws", &["--help"])?;
    assert_eq!(code, 0);
    for flag in [
        "--cloud-provider",
        "--cloud-config",
        "--kubeconfig",
        "--master",
        "--controllers",
        "--cluster-name",
        "--cluster-cidr",
        "--allocate-node-cidrs",
        "--configure-cloud-routes",
        "--leader-elect",
        "--leader-elect-lease-duration",
        "--leader-elect-renew-deadline",
        "--leader-elect-retry-period",
        "--leader-elect-resource-lock",
        "--leader-elect-resource-name",
        "--leader-elect-resource-namespace",
        "--secure-port",
        "--bind-address",
        "--node-status-update-frequency",
        "--node-monitor-period",
        "--route-reconciliation-period",
        "--concurrent-service-syncs",
        "--concurrent-node-syncs",
        "--kube-api-qps",
        "--kube-api-burst",
        "--use-service-account-credentials",
        "--tls-cert-file",
        "--logging-format",
    ] {
        assert!(stdout.contains(flag), "--help lacks {flag}");
    }
    for heading in [
        "Cloud provider flags:",
        "Generic flags:",
        "Leader election flags:",
        "Secure serving flags:",
    ] {
        assert!(stdout.contains(heading), "--help lacks the {heading} section");
    }
    assert!(
        stdout.contains("[default: aws]"),
        "the AWS binary defaults --cloud-provider to aws"
    );
    Ok(())
}

#[tokio::test]
async fn service_account_credentials_act_as_the_controllers_own_service_accounts() -> Result<()> {
    use k8s_openapi::api::{core::v1::ServiceAccount, rbac::v1::ClusterRoleBinding};
    let cluster = TestCluster::start().await?;
    let config = fake_config(&cluster, &["sa-node"])?;
    let client = cluster.client().await?;
    // Without its bootstrap binding, kube-system/node-controller may not update Nodes …
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding = bindings.get("system:controller:node-controller").await?;
    bindings
        .delete("system:controller:node-controller", &Default::default())
        .await?;

    // No usable temporary directory, as in the shipped DaemonSet (read-only root file system,
    // no /tmp volume): the controllers' tokens are held in memory, never written to a file.
    let ccm = CcmProcess::start_with_env(
        FAKE,
        "ccm-sa",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &args(
            &config,
            &["--use-service-account-credentials", "--leader-elect=false"],
        ),
        &[("TMPDIR", "/nonexistent/read-only-root")],
    )?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &tainted_node("sa-node"))
        .await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "kube-system");
    for sa in ["node-controller", "service-controller", "route-controller"] {
        wait_for(
            &format!("service account {sa}"),
            Duration::from_secs(30),
            || async { sas.get_opt(sa).await.ok()? },
        )
        .await?;
    }
    wait_for("a forbidden update", Duration::from_secs(30), || async {
        ccm.log()
            .contains("system:serviceaccount:kube-system:node-controller")
            .then_some(())
    })
    .await?;
    let n = nodes.get("sa-node").await?;
    assert!(
        n.spec.unwrap().provider_id.is_none(),
        "the root credentials must not be used for the node controller's writes"
    );

    // … and with it restored, the node is initialised under that identity.
    let mut restored = binding.clone();
    restored.metadata = ObjectMeta {
        name: binding.metadata.name.clone(),
        labels: binding.metadata.labels.clone(),
        annotations: binding.metadata.annotations.clone(),
        ..Default::default()
    };
    bindings.create(&PostParams::default(), &restored).await?;
    wait_for("node initialised", Duration::from_secs(60), || async {
        nodes
            .get("sa-node")
            .await
            .ok()?
            .spec?
            .provider_id
            .filter(|p| p == "fake://i-0")
    })
    .await?;
    Ok(())
}

/// A panic inside one reconcile (a provider bug hit by one Service or one Node) fails that
/// reconcile only: it is logged with the key, counted in `controller_panics_total`, and the
/// key is retried with back-off until it succeeds, while the process and the other keys carry
/// on (upstream's controllers crash the whole process instead).
#[tokio::test]
async fn a_panic_in_one_reconcile_is_caught_counted_and_retried() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let config = cluster.dir().join("fake-cloud.json");
    std::fs::write(
        &config,
        serde_json::to_vec(&serde_json::json!({
            "instances": {"panic-node": {"providerID": "fake://i-9", "instanceType": "fake.large",
                "zone": "z", "region": "r", "addresses": [{"type": "InternalIP", "address": "10.1.0.9"}]}},
            "panics": [
                {"call": "EnsureLoadBalancer default/boom", "times": 2},
                {"call": "InstanceMetadata panic-node", "times": 1}
            ]
        }))?,
    )?;
    let mut ccm = CcmProcess::start(
        FAKE,
        "ccm",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &args(&config, &["--leader-elect=false"]),
    )?;
    let client = cluster.client().await?;
    let (nodes, services): (Api<Node>, Api<Service>) =
        (Api::all(client.clone()), Api::namespaced(client, "default"));
    nodes
        .create(&PostParams::default(), &tainted_node("panic-node"))
        .await?;
    for name in ["boom", "calm"] {
        services.create(&PostParams::default(), &lb_service(name)).await?;
    }
    for name in ["calm", "boom"] {
        rcp_e2e::k8s::wait_for_ingress(&services, name, Duration::from_secs(60)).await?;
    }
    wait_for("panic-node initialised", Duration::from_secs(60), || async {
        rcp_e2e::k8s::initialised(&nodes, "panic-node").await
    })
    .await?;
    ccm.check_running()?;
    let m = ccm.metrics().await?;
    for line in [
        "controller_panics_total{controller=\"service-lb-controller\"} 2",
        "controller_panics_total{controller=\"cloud-node-controller\"} 1",
        "controller_reconcile_total{controller=\"service-lb-controller\",result=\"panic\"} 2",
        "controller_reconcile_total{controller=\"cloud-node-controller\",result=\"panic\"} 1",
        "running_managed_controllers{manager=\"cloud-controller-manager\",name=\"service\"} 1",
    ] {
        assert!(m.contains(line), "/metrics lacks {line:?}:\n{m}");
    }
    let log = ccm.log();
    assert!(
        log.contains("default/boom panicked") && log.contains("injected panic"),
        "the log names the key and the panic:\n{log}"
    );
    assert_eq!(ccm.get("/healthz").await?.0, 200);
    Ok(())
}
