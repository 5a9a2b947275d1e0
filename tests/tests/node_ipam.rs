//! The node IPAM controller a provider offers (`k8s_cloud_provider::controllers::nodeipam`, in
//! the fake CCM), against a real API server: Pod CIDRs per family from `--cluster-cidr` (the
//! lowest free, what Nodes hold taken, a deleted Node's given again), nothing rewritten after a
//! restart, `CIDRNotAvailable` when the range is used up, skipped without
//! `--allocate-node-cidrs`, and the cloud's CIDRs with `--cidr-allocator-type=CloudAllocator`.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Result;
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, PostParams},
};
use rcp_e2e::{
    TestCluster,
    ccm::CcmProcess,
    k8s::{events_for, wait_for},
};

const FAKE: &str = "fake-cloud-controller-manager";
const T: Duration = Duration::from_secs(60);

fn node(name: &str, pod_cidrs: &[&str]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: pod_cidrs.first().map(|c| c.to_string()),
            pod_cidrs: (!pod_cidrs.is_empty()).then(|| pod_cidrs.iter().map(|c| c.to_string()).collect()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pod_cidrs(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
}

/// Every Node's name and resource version.
async fn versions(nodes: &Api<Node>) -> Result<Vec<(String, Option<String>)>> {
    Ok(nodes
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|n| {
            (
                n.metadata.name.clone().unwrap_or_default(),
                n.metadata.resource_version.clone(),
            )
        })
        .collect())
}

/// Starts the fake CCM running only the node IPAM controller, with `args`.
fn start(cluster: &TestCluster, name: &str, config: &str, args: &[&str]) -> Result<CcmProcess> {
    let file = cluster.dir().join(format!("{name}.json"));
    std::fs::write(&file, config)?;
    let mut all = vec![
        format!("--cloud-config={}", file.display()),
        "--leader-elect=false".into(),
        "--controllers=nodeipam".into(),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    CcmProcess::start(
        FAKE,
        name,
        &cluster.ccm_kubeconfig("common")?,
        cluster.dir(),
        &all,
    )
}

/// Waits until `names` all have Pod CIDRs; returns them by Node.
async fn cidrs_of(
    nodes: &Api<Node>,
    names: &[&str],
    ccm: &CcmProcess,
) -> Result<BTreeMap<String, Vec<String>>> {
    let mut out = BTreeMap::new();
    for name in names {
        let got = wait_for(&format!("{name}'s Pod CIDRs"), T, || async {
            let c = pod_cidrs(&nodes.get(name).await.ok()?);
            (!c.is_empty()).then_some(c)
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", ccm.log()))?;
        out.insert(name.to_string(), got);
    }
    Ok(out)
}

#[tokio::test]
async fn dual_stack_pod_cidrs_are_allocated_kept_and_given_again() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    // One Node holds the first subnets already (set by someone else): they are taken.
    nodes
        .create(
            &PostParams::default(),
            &node("node-pre", &["10.244.0.0/24", "fd00:244::/64"]),
        )
        .await?;
    for n in ["node-a", "node-b"] {
        nodes.create(&PostParams::default(), &node(n, &[])).await?;
    }
    let args = [
        "--allocate-node-cidrs=true",
        "--cluster-cidr=10.244.0.0/16,fd00:244::/56",
    ];
    let ccm = start(&cluster, "ccm-ipam", "{}", &args)?;
    let got = cidrs_of(&nodes, &["node-a", "node-b"], &ccm).await?;
    let mut all: Vec<&Vec<String>> = got.values().collect();
    all.sort();
    assert_eq!(
        all,
        [
            &vec!["10.244.1.0/24".to_string(), "fd00:244:0:1::/64".to_string()],
            &vec!["10.244.2.0/24".to_string(), "fd00:244:0:2::/64".to_string()],
        ],
        "the lowest free subnet of each family, one per Node"
    );
    assert_eq!(
        pod_cidrs(&nodes.get("node-pre").await?),
        ["10.244.0.0/24", "fd00:244::/64"],
        "a Node's own CIDRs are kept"
    );
    let node_a = got["node-a"].clone();

    // node-a goes: its subnets are given to the next Node.
    nodes.delete("node-a", &DeleteParams::default()).await?;
    wait_for("node-a deleted", T, || async {
        nodes.get_opt("node-a").await.ok()?.is_none().then_some(())
    })
    .await?;
    nodes.create(&PostParams::default(), &node("node-c", &[])).await?;
    let c = cidrs_of(&nodes, &["node-c"], &ccm).await?;
    assert_eq!(c["node-c"], node_a, "node-a's subnets, free again");

    // A restart rewrites nothing: every Node keeps its resource version.
    drop(ccm);
    let before = versions(&nodes).await?;
    let ccm = start(&cluster, "ccm-ipam-2", "{}", &args)?;
    wait_for("the controller's first pass", T, || async {
        ccm.log().contains("allocating Pod CIDRs to Nodes").then_some(())
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = versions(&nodes).await?;
    assert_eq!(after, before, "no Node written after the restart\n{}", ccm.log());
    println!(
        "node IPAM: node-a {node_a:?} given to node-c after node-a's deletion; nothing rewritten after a restart"
    );
    Ok(())
}

#[tokio::test]
async fn a_used_up_range_says_so_and_without_the_flag_nothing_is_allocated() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for n in ["node-1", "node-2", "node-3"] {
        nodes.create(&PostParams::default(), &node(n, &[])).await?;
    }
    // Without --allocate-node-cidrs the controller is skipped.
    let off = start(&cluster, "ccm-ipam-off", "{}", &["--cluster-cidr=10.250.0.0/23"])?;
    wait_for("the skip", T, || async {
        off.log()
            .contains("Skipping \"node-ipam-controller\": --allocate-node-cidrs is false")
            .then_some(())
    })
    .await?;
    drop(off);
    for n in ["node-1", "node-2", "node-3"] {
        assert!(pod_cidrs(&nodes.get(n).await?).is_empty(), "{n} untouched");
    }
    // Two /24 in a /23: the third Node gets none and an event says why.
    let ccm = start(
        &cluster,
        "ccm-ipam-small",
        "{}",
        &[
            "--allocate-node-cidrs",
            "--cluster-cidr=10.250.0.0/23",
            "--node-cidr-mask-size=24",
        ],
    )?;
    let event = wait_for("a CIDRNotAvailable event", T, || async {
        for n in ["node-1", "node-2", "node-3"] {
            let events = events_for(&client, "default", n).await.ok()?;
            if let Some((_, message, _)) = events.iter().find(|(reason, _, _)| reason == "CIDRNotAvailable") {
                return Some((n.to_string(), message.clone()));
            }
        }
        None
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", ccm.log()))?;
    assert!(
        event.1.contains("no free subnet of /24 left in 10.250.0.0/23"),
        "{event:?}"
    );
    let mut given = Vec::new();
    for n in ["node-1", "node-2", "node-3"] {
        given.extend(pod_cidrs(&nodes.get(n).await?));
    }
    given.sort();
    assert_eq!(
        given,
        ["10.250.0.0/24", "10.250.1.0/24"],
        "two Nodes got one each"
    );
    assert!(pod_cidrs(&nodes.get(&event.0).await?).is_empty());
    Ok(())
}

#[tokio::test]
async fn the_cloud_allocator_gives_the_cidrs_the_cloud_assigned() -> Result<()> {
    let cluster = TestCluster::start().await?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    nodes.create(&PostParams::default(), &node("node-x", &[])).await?;
    let config = r#"{"instances": {"node-x": {"providerID": "fake://x", "podCIDRs": ["10.99.7.0/24"]}}}"#;
    let ccm = start(
        &cluster,
        "ccm-ipam-cloud",
        config,
        &["--allocate-node-cidrs", "--cidr-allocator-type=CloudAllocator"],
    )?;
    let got = cidrs_of(&nodes, &["node-x"], &ccm).await?;
    assert_eq!(got["node-x"], ["10.99.7.0/24"]);
    // An allocator type nobody knows is refused at start, naming the flag.
    let file = cluster.dir().join("bad.json");
    std::fs::write(&file, "{}")?;
    let (code, _, err) = rcp_e2e::ccm::run_to_exit(
        FAKE,
        &[
            &format!("--cloud-config={}", file.display()),
            "--controllers=nodeipam",
            "--allocate-node-cidrs",
            "--cidr-allocator-type=IPAMFromCluster",
            "--kubeconfig=/nonexistent",
        ],
    )?;
    assert_ne!(code, 0);
    assert!(err.contains("--cidr-allocator-type=\"IPAMFromCluster\""), "{err}");
    Ok(())
}
