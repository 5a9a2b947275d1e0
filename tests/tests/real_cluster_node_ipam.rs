//! The node IPAM controller a provider offers (`k8s_cloud_provider::controllers::nodeipam`, in
//! the fake CCM) on the real-node cluster: kube-controller-manager allocates no Pod CIDRs, a
//! kubelet registers its Node, the CCM gives it a Pod CIDR from `--cluster-cidr`, containerd
//! configures the node's CNI from it, and a Pod on that node starts with an address inside it.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, api::PostParams};
use rcp_e2e::{
    ccm::CcmProcess,
    k8s::{wait_for, write_fake_cloud_config},
    kube_node::{NodeOptions, RealCluster},
};

const FAKE: &str = "fake-cloud-controller-manager";
const T: Duration = Duration::from_secs(120);
const NODE: &str = "ipam-node-0";

#[tokio::test]
async fn a_kubelets_pods_get_addresses_from_the_pod_cidr_the_ccm_allocated() -> Result<()> {
    let mut real = RealCluster::start_with(Vec::new(), &[], false).await?;
    real.start_node(NodeOptions {
        name: NODE.into(),
        ip: "10.30.0.10".into(),
        ..Default::default()
    })
    .await?;
    let client = real.cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for("the kubelet registered its Node", T, || async {
        nodes.get_opt(NODE).await.ok()?.map(|_| ())
    })
    .await?;
    // Nobody allocates yet: the Node has no Pod CIDR.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let node = nodes.get(NODE).await?;
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.pod_cidr.clone()),
        None,
        "kube-controller-manager allocates no Pod CIDRs in this test"
    );

    let config = write_fake_cloud_config(real.cluster.dir(), &[NODE])?;
    let ccm = CcmProcess::start(
        FAKE,
        "ccm-ipam-real",
        &real.cluster.ccm_kubeconfig("common")?,
        real.cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".into(),
            "--controllers=nodeipam".into(),
            "--allocate-node-cidrs=true".into(),
            format!("--cluster-cidr={}", real.cluster_cidr()),
        ],
    )?;
    let cidr = wait_for("the CCM gave the Node a Pod CIDR", T, || async {
        nodes.get(NODE).await.ok()?.spec?.pod_cidr
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", ccm.log()))?;
    let net: ipnet::Ipv4Net = cidr.parse().with_context(|| format!("Pod CIDR {cidr}"))?;
    assert!(
        real.cluster_cidr().parse::<ipnet::Ipv4Net>()?.contains(&net),
        "{cidr} is inside --cluster-cidr {}",
        real.cluster_cidr()
    );

    // A Pod on that node: its sandbox's network comes from the CNI configuration containerd
    // renders from the Node's Pod CIDR.
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "on-ipam-node"},
        "spec": {
            "nodeName": NODE,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "pause", "image": "rcp.local/pause:3.4.1",
                            "imagePullPolicy": "Never"}]
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let ip = wait_for("the Pod running with an address", T, || async {
        let status = pods.get("on-ipam-node").await.ok()?.status?;
        (status.phase.as_deref() == Some("Running"))
            .then_some(())
            .and(status.pod_ip)
    })
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}\nkubelet:\n{}",
            real.node(NODE).map(|n| n.kubelet_log(40)).unwrap_or_default()
        )
    })?;
    let ip: std::net::Ipv4Addr = ip.parse().with_context(|| format!("Pod IP {ip}"))?;
    assert!(
        net.contains(&ip),
        "the Pod's address {ip} is inside the Node's Pod CIDR {cidr}"
    );
    println!("node IPAM on a real kubelet: {NODE} got {cidr} from the CCM; its Pod got {ip}");
    Ok(())
}
