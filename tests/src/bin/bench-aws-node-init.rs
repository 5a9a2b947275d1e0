//! Benchmark (not a test): initialise N tainted Nodes with `cloud-controller-manager-aws`
//! against a real kube-apiserver and moto, and print the wall time, the EC2 calls by operation
//! (from the CCM's own metrics), the CCM's CPU seconds and peak RSS; then, with
//! `--idle-minutes M`, mark every Node Ready (as kubelet would) and print the EC2 calls per
//! minute of the steady state that follows (the periodic address sync, the lifecycle checks).
//!
//! ```text
//! cargo run -p rcp-e2e --bin bench-aws-node-init -- [--nodes 1000] [--idle-minutes 0]
//!     [-- <extra CCM flags>]
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_cloud_provider::{
    node::helpers::{addresses, has_taint},
    well_known::TAINT_UNINITIALIZED,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::PostParams};
use rcp_e2e::{
    Moto, TestCluster,
    bench::{aws_calls, describe_flags, print_calls, print_process_figures},
    ccm::CcmProcess,
    k8s::{set_ready, tainted_node},
};

/// Nodes created (or marked Ready) at once.
const CHUNK: usize = 50;

#[tokio::main]
async fn main() -> Result<()> {
    let mut nodes_wanted = 1000usize;
    let mut idle_minutes = 0u64;
    let mut extra: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--nodes" => nodes_wanted = args.next().context("--nodes needs a value")?.parse()?,
            "--idle-minutes" => {
                idle_minutes = args.next().context("--idle-minutes needs a value")?.parse()?
            }
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
    for chunk in world.instances.chunks(CHUNK) {
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
        if start.elapsed() > Duration::from_secs(3600) {
            anyhow::bail!("only {done} of {nodes_wanted} nodes initialised after 60 min");
        }
        // A list of 5000 Nodes is ~10 MB for the API server: poll less often at that size.
        tokio::time::sleep(Duration::from_millis(if nodes_wanted > 1000 {
            1000
        } else {
            250
        }))
        .await;
    }
    let wall = start.elapsed();
    let after_init = aws_calls(&ccm).await?;
    println!(
        "== bench-aws-node-init: {nodes_wanted} nodes, CCM flags: {}",
        describe_flags(&extra)
    );
    println!("nodes created in {created:.2?}; all initialised {wall:.2?} after the first create");
    print_calls(
        "initialisation",
        &Default::default(),
        &after_init,
        nodes_wanted,
        "node",
    );
    print_process_figures(&ccm);

    if idle_minutes > 0 {
        let t = Instant::now();
        for chunk in world.instances.chunks(CHUNK) {
            futures::future::try_join_all(
                chunk
                    .iter()
                    .map(|i| set_ready(&nodes, &i.private_dns_name, "True")),
            )
            .await?;
        }
        eprintln!("{nodes_wanted} Nodes marked Ready in {:.1?}", t.elapsed());
        let before = aws_calls(&ccm).await?;
        let idle = Duration::from_secs(idle_minutes * 60);
        tokio::time::sleep(idle).await;
        let after = aws_calls(&ccm).await?;
        println!("steady state, {nodes_wanted} Ready Nodes, {idle_minutes} min:");
        let total = print_calls("steady state", &before, &after, nodes_wanted, "node");
        println!(
            "steady state: {:.1} EC2 calls per minute ({:.4} per node per minute)",
            total / idle_minutes as f64,
            total / idle_minutes as f64 / nodes_wanted as f64
        );
        print_process_figures(&ccm);
    }
    Ok(())
}
