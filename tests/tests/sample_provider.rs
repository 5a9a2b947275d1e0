//! The sample out-of-tree provider (`examples/cloud-provider-sample`), built by
//! `hack/publish-roundtrip.sh` from the staged crates *as published to a registry* (never by
//! path), runs against a real kube-apiserver: it initialises the Nodes its inventory lists,
//! gives LoadBalancer Services addresses from its pool (an exhausted pool is retried, a
//! Service of another controller left alone), keeps working when its credentials' Secret
//! rotates, deletes the Node whose machine leaves the inventory, and serves its own metric.
//!
//! CI runs the round trip before the tests; run alone, the test runs it first when the sample
//! binary is missing or was built from other sources than the working tree's.

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{Context, Result, ensure};
use k8s_cloud_provider::well_known::{
    LABEL_INSTANCE_TYPE, LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE, TAINT_UNINITIALIZED,
};
use k8s_openapi::api::core::v1::{Node, Secret, Service};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use rcp_e2e::{
    TestCluster,
    ccm::CcmProcess,
    k8s::{events_for, ingress_ip, initialised, load_balancer_service, register_tainted_nodes, wait_for},
    paths,
};

/// What the sources the sample is built from are: `hack/publish-roundtrip.sh` writes the same
/// text beside the binary.
fn sources_stamp() -> Result<String> {
    let root = paths::workspace_root();
    let git = |args: &[&str]| -> Result<String> {
        let out = Command::new("git").current_dir(&root).args(args).output()?;
        ensure!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    };
    let head = git(&["rev-parse", "HEAD"])?;
    let diff = git(&[
        "diff",
        "HEAD",
        "--",
        "staging",
        "examples",
        "Cargo.toml",
        "Cargo.lock",
    ])?;
    Ok(format!("{}{}", head, if diff.is_empty() { "clean\n" } else { "dirty\n" }) + &diff)
}

/// The sample binary, built from the registry for the current sources.
fn sample_binary() -> Result<PathBuf> {
    let dir = paths::cache_dir().join("sample");
    let bin = dir.join("cloud-controller-manager-sample");
    let fresh = std::fs::read_to_string(dir.join("sources")).ok() == Some(sources_stamp()?);
    if !(bin.exists() && fresh) {
        println!("the sample binary is missing or stale: running hack/publish-roundtrip.sh --skip-semver");
        let status = Command::new(paths::workspace_root().join("hack/publish-roundtrip.sh"))
            .arg("--skip-semver")
            .status()
            .context("hack/publish-roundtrip.sh")?;
        ensure!(status.success(), "hack/publish-roundtrip.sh failed ({status})");
    }
    Ok(bin)
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

async fn put_secret(secrets: &Api<Secret>, token: &str) -> Result<()> {
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "sample-cloud", "namespace": "kube-system"},
        "stringData": {"token": token}
    }))?;
    secrets
        .patch(
            "sample-cloud",
            &PatchParams::apply("sample-test").force(),
            &Patch::Apply(secret),
        )
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_provider_from_the_registry_initialises_and_deletes_nodes() -> Result<()> {
    let bin = sample_binary()?;
    let cluster = TestCluster::start().await?;
    let dir = cluster.dir().to_path_buf();
    let inventory = dir.join("machines.json");
    let machines = |with_b: bool, token: &str| {
        let mut m = vec![serde_json::json!({
            "id": "m-1", "name": "node-a", "type": "small", "zone": "zone-a", "region": "region-1",
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "node-a"}]
        })];
        if with_b {
            m.push(
                serde_json::json!({"id": "m-2", "name": "node-b", "type": "large", "zone": "zone-b",
                "region": "region-1", "addresses": [{"type": "InternalIP", "address": "10.0.0.2"}]}),
            );
        }
        serde_json::to_vec(&serde_json::json!({ "token": token, "machines": m }))
    };
    // The cloud's "API" takes the token of the Secret kube-system/sample-cloud.
    let client = cluster.client().await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    // The tokens must never show in the CCM's log (checked when it stops) or in an event.
    rcp_e2e::secrets::register("first-token");
    rcp_e2e::secrets::register("second-token");
    put_secret(&secrets, "first-token").await?;
    std::fs::write(&inventory, machines(true, "first-token")?)?;
    let cloud_config = dir.join("sample.conf");
    std::fs::write(
        &cloud_config,
        format!(
            "[Global]\ninventory = {}\ncredentials-secret = kube-system/sample-cloud\n\n[LoadBalancer]\naddress-pool = 192.0.2.10-192.0.2.11\n",
            inventory.display()
        ),
    )?;

    let nodes: Api<Node> = Api::all(client.clone());
    register_tainted_nodes(&nodes, &["node-a", "node-b"], None).await?;
    let ccm = CcmProcess::start_binary(
        &bin,
        "sample-ccm",
        cluster.kubeconfig_path(),
        &dir,
        &[
            "--cloud-provider=sample".into(),
            format!("--cloud-config={}", cloud_config.display()),
            "--leader-elect=false".into(),
            "--controllers=cloud-node,cloud-node-lifecycle,service,pool-usage".into(),
            "--node-monitor-period=1s".into(),
            "--pool-usage-interval=1s".into(),
            "--sample-api-timeout=5s".into(),
        ],
        &[],
    )?;

    for (name, id, zone, kind, ip) in [
        ("node-a", "m-1", "zone-a", "small", "10.0.0.1"),
        ("node-b", "m-2", "zone-b", "large", "10.0.0.2"),
    ] {
        let node = wait_for(
            &format!("{name} initialised by the sample provider"),
            Duration::from_secs(60),
            || initialised(&nodes, name),
        )
        .await
        .with_context(|| ccm.log())?;
        let spec = node.spec.clone().unwrap_or_default();
        assert_eq!(
            spec.provider_id.as_deref(),
            Some(format!("sample://{id}").as_str())
        );
        assert!(
            !spec
                .taints
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == TAINT_UNINITIALIZED),
            "{name} still tainted"
        );
        assert_eq!(label(&node, LABEL_TOPOLOGY_ZONE), Some(zone));
        assert_eq!(label(&node, LABEL_TOPOLOGY_REGION), Some("region-1"));
        assert_eq!(label(&node, LABEL_INSTANCE_TYPE), Some(kind));
        let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
        assert!(
            addresses
                .iter()
                .any(|a| a.type_ == "InternalIP" && a.address == ip),
            "{name}: {addresses:?}"
        );
        println!("{name}: providerID sample://{id}, zone {zone}, instance type {kind}, InternalIP {ip}");
    }

    // The provider's own metric is on /metrics next to the framework's.
    let metrics = ccm.metrics().await?;
    let reads = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sample_inventory_reads_total "))
        .context("sample_inventory_reads_total is not on /metrics")?;
    assert!(reads.trim().parse::<f64>()? >= 2.0, "reads: {reads}");

    // Load balancers: two addresses for three Services; a fourth is another controller's.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    for name in ["lb-1", "lb-2", "lb-3"] {
        services
            .create(
                &PostParams::default(),
                &load_balancer_service(name, &[], &[(80, "http")]),
            )
            .await?;
        // One at a time, so that the first two get the two addresses.
        if name != "lb-3" {
            wait_for(&format!("{name} address"), Duration::from_secs(60), || async {
                services.get(name).await.ok().and_then(|s| ingress_ip(&s))
            })
            .await
            .with_context(|| ccm.log())?;
        }
    }
    let mut external = load_balancer_service("lb-external", &[], &[(80, "http")]);
    external.metadata.annotations = Some(
        [(
            "sample.example.com/load-balancer".to_string(),
            "external".to_string(),
        )]
        .into(),
    );
    services.create(&PostParams::default(), &external).await?;
    let got: Vec<Option<String>> = ingress_ips(&services, &["lb-1", "lb-2"]).await?;
    assert_eq!(
        got,
        [Some("192.0.2.10".to_string()), Some("192.0.2.11".to_string())]
    );
    // The pool is exhausted: an event says so and the service controller retries.
    wait_for("lb-3's exhausted-pool event", Duration::from_secs(60), || async {
        events_for(&client, "default", "lb-3")
            .await
            .ok()
            .filter(|events| {
                events.iter().any(|(reason, message, _)| {
                    reason == "SyncLoadBalancerFailed" && message.contains("is exhausted")
                })
            })
    })
    .await
    .with_context(|| ccm.log())?;
    assert_eq!(ingress_ip(&services.get("lb-3").await?), None);
    // lb-1 goes: its address goes to lb-3 at the retry.
    services.delete("lb-1", &Default::default()).await?;
    let lb3 = wait_for("lb-3 gets lb-1's address", Duration::from_secs(60), || async {
        services.get("lb-3").await.ok().and_then(|s| ingress_ip(&s))
    })
    .await
    .with_context(|| ccm.log())?;
    assert_eq!(lb3, "192.0.2.10");
    // Another controller's Service: no status, no failure event.
    let external = services.get("lb-external").await?;
    assert_eq!(ingress_ip(&external), None);
    assert!(
        !events_for(&client, "default", "lb-external")
            .await?
            .iter()
            .any(|(reason, _, _)| reason == "SyncLoadBalancerFailed"),
        "ImplementedElsewhere is no failure"
    );
    println!(
        "load balancers: lb-1 192.0.2.10, lb-2 192.0.2.11, lb-3 waited and took 192.0.2.10; lb-external left alone"
    );
    // The sample's own controller reports the pool's use (lb-2 and lb-3 hold its two).
    wait_for("sample_address_pool_held 2", Duration::from_secs(30), || async {
        let metrics = ccm.metrics().await.ok()?;
        metrics
            .lines()
            .any(|l| l.trim() == "sample_address_pool_held 2")
            .then_some(())
    })
    .await
    .with_context(|| ccm.log())?;
    assert!(
        ccm.log().contains("Started \"pool-usage\""),
        "the provider's controller runs as the framework's do"
    );
    // Its flags and the provider's are the command's, in sections of their own.
    let help = Command::new(&bin).arg("--help").output()?;
    let help = String::from_utf8_lossy(&help.stdout);
    for wanted in [
        "Sample provider flags",
        "--sample-api-timeout",
        "Pool usage controller flags",
        "--pool-usage-interval",
    ] {
        assert!(help.contains(wanted), "{wanted} in --help:\n{help}");
    }

    // The credentials rotate (the Secret gets a new token, the cloud drops the old one), and
    // node-b's machine leaves the cloud: the provider reads the Secret again when refused,
    // and the cloud-node-lifecycle controller deletes node-b's Node, and only that one.
    put_secret(&secrets, "second-token").await?;
    std::fs::write(&inventory, machines(false, "second-token")?)?;
    wait_for("node-b deleted", Duration::from_secs(60), || async {
        nodes
            .get_opt("node-b")
            .await
            .ok()
            .and_then(|n| n.is_none().then_some(()))
    })
    .await
    .with_context(|| ccm.log())?;
    assert!(nodes.get_opt("node-a").await?.is_some(), "node-a must stay");
    println!("credentials rotated; node-b deleted after its machine left the inventory; node-a kept");
    Ok(())
}

/// The ingress IPs of `names`, in order.
async fn ingress_ips(services: &Api<Service>, names: &[&str]) -> Result<Vec<Option<String>>> {
    let mut out = Vec::new();
    for name in names {
        out.push(ingress_ip(&services.get(name).await?));
    }
    Ok(out)
}
