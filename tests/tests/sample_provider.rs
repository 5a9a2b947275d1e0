//! The sample out-of-tree provider (`examples/cloud-provider-sample`), built by
//! `hack/publish-roundtrip.sh` from the staged crates *as published to a registry* (never by
//! path), runs against a real kube-apiserver: it initialises the Nodes its inventory lists,
//! deletes the Node whose machine leaves the inventory, and serves its own metric.
//!
//! CI runs the round trip before the tests; run alone, the test runs it first when the sample
//! binary is missing or was built from other sources than the working tree's.

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{Context, Result, ensure};
use k8s_cloud_provider::well_known::{
    LABEL_INSTANCE_TYPE, LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE, TAINT_UNINITIALIZED,
};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use rcp_e2e::{
    TestCluster,
    ccm::CcmProcess,
    k8s::{initialised, register_tainted_nodes, wait_for},
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_provider_from_the_registry_initialises_and_deletes_nodes() -> Result<()> {
    let bin = sample_binary()?;
    let cluster = TestCluster::start().await?;
    let dir = cluster.dir().to_path_buf();
    let inventory = dir.join("machines.json");
    let machines = |with_b: bool| {
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
        serde_json::to_vec(&serde_json::json!({ "machines": m }))
    };
    std::fs::write(&inventory, machines(true)?)?;
    let cloud_config = dir.join("sample.json");
    std::fs::write(
        &cloud_config,
        serde_json::to_vec(&serde_json::json!({ "inventory": inventory }))?,
    )?;

    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client);
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
            "--controllers=cloud-node,cloud-node-lifecycle".into(),
            "--node-monitor-period=1s".into(),
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

    // node-b's machine leaves the cloud: the cloud-node-lifecycle controller deletes its Node,
    // and only that one.
    std::fs::write(&inventory, machines(false)?)?;
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
    println!("node-b deleted after its machine left the inventory; node-a kept");
    Ok(())
}
