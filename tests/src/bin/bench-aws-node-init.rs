//! Benchmark (not a test): initialise N tainted Nodes with `cloud-controller-manager-aws`
//! against a real kube-apiserver and moto, and print the wall time, the EC2 calls by operation
//! (from the CCM's own metrics) and the CCM's peak RSS.
//!
//! ```text
//! cargo run -p rcp-e2e --bin bench-aws-node-init -- [--nodes 1000] [-- <extra CCM flags>]
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_cloud_provider::{
    node::helpers::{addresses, has_taint},
    well_known::TAINT_UNINITIALIZED,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::PostParams};
use rcp_e2e::{Moto, TestCluster, ccm::CcmProcess, k8s::tainted_node};

#[tokio::main]
async fn main() -> Result<()> {
    let mut nodes_wanted = 1000usize;
    let mut extra: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--nodes" => nodes_wanted = args.next().context("--nodes needs a value")?.parse()?,
            "--" => extra.extend(args.by_ref()),
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let t = Instant::now();
    let world = moto.build_world("bench", nodes_wanted).await?;
    eprintln!(
        "moto world with {} instances built in {:.1?}",
        world.instances.len(),
        t.elapsed()
    );

    let config = cluster.dir().join("cloud.conf");
    std::fs::write(&config, moto.cloud_config(&world))?;
    let mut ccm_args = vec![
        format!("--cloud-config={}", config.display()),
        "--leader-elect=false".to_string(),
    ];
    ccm_args.extend(extra.iter().cloned());
    let ccm = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &ccm_args,
        &moto.sdk_env(),
    )?;
    while ccm.get("/healthz").await.map(|r| r.0).unwrap_or(0) != 200 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    let start = Instant::now();
    for chunk in world.instances.chunks(50) {
        futures::future::try_join_all(chunk.iter().map(|i| {
            let nodes = nodes.clone();
            async move {
                nodes
                    .create(&PostParams::default(), &tainted_node(&i.private_dns_name))
                    .await
            }
        }))
        .await?;
    }
    let created = start.elapsed();
    loop {
        let list = nodes.list(&Default::default()).await?;
        let done = list
            .items
            .iter()
            .filter(|n| !has_taint(n, TAINT_UNINITIALIZED) && !addresses(n).is_empty())
            .count();
        if done == nodes_wanted {
            break;
        }
        if start.elapsed() > Duration::from_secs(1800) {
            anyhow::bail!("only {done} of {nodes_wanted} nodes initialised after 30 min");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let wall = start.elapsed();
    let metrics = ccm.metrics().await?;
    println!(
        "== bench-aws-node-init: {nodes_wanted} nodes, CCM flags: {}",
        if extra.is_empty() {
            "(defaults)".into()
        } else {
            extra.join(" ")
        }
    );
    println!("nodes created in {created:.2?}; all initialised {wall:.2?} after the first create");
    let mut total = 0.0;
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("cloudprovider_aws_api_request_duration_seconds_count"))
    {
        let (name, value) = line.rsplit_once(' ').unwrap_or((line, "0"));
        let v: f64 = value.parse().unwrap_or(0.0);
        total += v;
        println!("  EC2 {name}: {v}");
    }
    println!(
        "EC2 calls in total: {total} ({:.4} per node)",
        total / nodes_wanted as f64
    );
    if let Some(kb) = ccm.peak_rss_kb() {
        println!("CCM peak RSS (VmHWM): {:.1} MB", kb as f64 / 1024.0);
    }
    Ok(())
}
