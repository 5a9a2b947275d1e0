//! Benchmark (not a test): N tainted Nodes (found by guest host name) with zone and region tags
//! initialised by `cloud-controller-manager-vsphere` against kube-apiserver and vcsim. The
//! vCenter requests are counted by a proxy in front of vcsim (SOAP by method, REST by path),
//! so any build can be measured (`RCP_CCM_BINARY=<path>` runs another binary).
//!
//! ```text
//! cargo run -p rcp-e2e --bin bench-vsphere-zones -- [--nodes 100]
//! ```

use std::{collections::BTreeMap, time::Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::PostParams};
use rcp_e2e::{
    TestCluster, Vcsim,
    ccm::CcmProcess,
    fault_proxy::FaultProxy,
    k8s::{initialised, tainted_node, wait_for},
    vcsim::small_model,
};

#[tokio::main]
async fn main() -> Result<()> {
    let mut n = 100usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--nodes" => n = args.next().context("--nodes needs a value")?.parse()?,
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    let cluster = TestCluster::start().await?;
    let vcsim = Vcsim::start_with(small_model(n))?;
    vcsim.identify(n)?;
    vcsim.tag_zone_and_region()?;
    let (cert, key) = vcsim.tls_files();
    let proxy = FaultProxy::start_tls(&format!("https://{}", vcsim.host_port()), &cert, &key).await?;
    let config = cluster.dir().join("vsphere.yaml");
    std::fs::write(
        &config,
        vcsim.cloud_config_yaml(proxy.port(), "labels:\n  zone: k8s-zone\n  region: k8s-region\n")?,
    )?;
    let ccm = CcmProcess::start(
        "cloud-controller-manager-vsphere",
        "ccm",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--leader-elect=false".to_string(),
            "--concurrent-node-syncs=5".to_string(),
        ],
    )?;
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    let before = proxy.counts();
    let t = Instant::now();
    for i in 0..n {
        nodes
            .create(&PostParams::default(), &tainted_node(&format!("node-{i}")))
            .await?;
    }
    for i in 0..n {
        let name = format!("node-{i}");
        wait_for(
            &format!("{name} initialised"),
            std::time::Duration::from_secs(600),
            || initialised(&nodes, &name),
        )
        .await?;
    }
    let took = t.elapsed();
    let after = proxy.counts();
    let mut soap: BTreeMap<String, usize> = BTreeMap::new();
    let mut rest: BTreeMap<String, usize> = BTreeMap::new();
    for (kind, count) in &after {
        let delta = count - before.get(kind).copied().unwrap_or(0);
        if delta == 0 {
            continue;
        }
        if kind.starts_with('/') {
            // Group REST calls by endpoint (ids cut off).
            let key = kind.split(['?', ':']).next().unwrap_or(kind).to_string();
            *rest.entry(key).or_default() += delta;
        } else {
            soap.insert(kind.clone(), delta);
        }
    }
    let (soap_total, rest_total): (usize, usize) = (soap.values().sum(), rest.values().sum());
    println!("{n} nodes with zone/region tags initialised in {took:.2?}");
    println!(
        "vCenter requests: SOAP {soap_total} ({:.2}/node), REST {rest_total} ({:.2}/node)",
        soap_total as f64 / n as f64,
        rest_total as f64 / n as f64
    );
    for (k, v) in &soap {
        println!("  SOAP {k:<32} {v}");
    }
    for (k, v) in &rest {
        println!("  REST {k:<60} {v}");
    }
    if let Some(kb) = ccm.peak_rss_kb() {
        println!("CCM peak RSS: {:.1} MB", kb as f64 / 1024.0);
    }
    Ok(())
}
