//! Benchmark (not a test): the route controller of `cloud-controller-manager-aws` takes over a
//! cluster of N initialised Nodes, each with a /26 pod CIDR and no route yet (as after
//! `--allocate-node-cidrs`), on a real kube-apiserver and moto. Prints the time until every
//! route is in the cluster's route table, the time until every Node's `NetworkUnavailable`
//! condition says the route exists, the EC2 calls by operation, the calls of the idle passes that follow,
//! and the CCM's CPU seconds and peak RSS.
//!
//! ```text
//! cargo run -p rcp-e2e --bin bench-aws-routes -- [--nodes 1000] [--idle-seconds 30] [-- <extra CCM flags>]
//! ```

use std::{
    collections::HashSet,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use k8s_cloud_provider::well_known::conditions;
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::{Api, api::PostParams};
use rcp_e2e::{
    Moto, TestCluster,
    bench::{aws_calls, describe_flags, print_calls, print_process_figures},
    ccm::CcmProcess,
    k8s::wait_for,
    moto::World,
};

/// Time allowed for each phase before the benchmark gives up.
const PHASE_LIMIT: Duration = Duration::from_secs(1800);
/// The cluster CIDR the pod CIDRs are cut from (room for 65,536 Nodes of /26).
const CLUSTER_CIDR: &str = "100.64.0.0/10";

/// The `index`-th /26 of [`CLUSTER_CIDR`].
fn pod_cidr(index: usize) -> String {
    let base = u32::from(Ipv4Addr::new(100, 64, 0, 0));
    let network = Ipv4Addr::from(base + (index as u32) * 64);
    format!("{network}/26")
}

/// The destination CIDRs of the instance routes in the cluster's route table.
async fn instance_routes(moto: &Moto, world: &World) -> Result<HashSet<String>> {
    let out = moto
        .ec2()
        .describe_route_tables()
        .route_table_ids(&world.route_table_id)
        .send()
        .await
        .context("DescribeRouteTables")?;
    Ok(out
        .route_tables()
        .iter()
        .flat_map(|t| t.routes())
        .filter(|r| r.instance_id().is_some())
        .filter_map(|r| r.destination_cidr_block().map(str::to_string))
        .collect())
}

fn route_created(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == conditions::NETWORK_UNAVAILABLE
                    && c.status == "False"
                    && c.reason.as_deref() == Some(conditions::ROUTE_CREATED)
            })
        })
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut nodes_wanted = 1000usize;
    let mut idle_seconds = 30u64;
    let mut extra: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--nodes" => nodes_wanted = args.next().context("--nodes needs a value")?.parse()?,
            "--idle-seconds" => {
                idle_seconds = args.next().context("--idle-seconds needs a value")?.parse()?
            }
            "--" => extra.extend(args.by_ref()),
            other => bail!("unknown argument {other:?}"),
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
    // The Nodes exist before the CCM starts: it takes over a running cluster.
    let nodes: Api<Node> = Api::all(cluster.client().await?);
    let t = Instant::now();
    let wanted: HashSet<String> = (0..nodes_wanted).map(pod_cidr).collect();
    for (chunk_index, chunk) in world.instances.chunks(50).enumerate() {
        futures::future::try_join_all(chunk.iter().enumerate().map(|(i, instance)| {
            let nodes = nodes.clone();
            let cidr = pod_cidr(chunk_index * 50 + i);
            async move {
                let mut node = instance.node();
                node.spec = Some(NodeSpec {
                    pod_cidr: Some(cidr.clone()),
                    pod_cidrs: Some(vec![cidr]),
                    ..node.spec.unwrap_or_default()
                });
                nodes.create(&PostParams::default(), &node).await
            }
        }))
        .await?;
    }
    eprintln!(
        "{nodes_wanted} Nodes with pod CIDRs created in {:.1?}",
        t.elapsed()
    );

    let config = cluster.dir().join("cloud.conf");
    std::fs::write(&config, moto.cloud_config(&world))?;
    let mut ccm_args = vec![
        format!("--cloud-config={}", config.display()),
        "--leader-elect=false".to_string(),
        "--cluster-name=bench".to_string(),
        "--controllers=*,route".to_string(),
        "--configure-cloud-routes=true".to_string(),
        format!("--cluster-cidr={CLUSTER_CIDR}"),
    ];
    ccm_args.extend(extra.iter().cloned());
    let start = Instant::now();
    let ccm = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm-bench-routes",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &ccm_args,
        &moto.sdk_env(),
    )?;
    // Polled every 2 s: each poll is a DescribeRouteTables of up to N routes for moto too.
    let routes_done = loop {
        let have = instance_routes(&moto, &world).await?;
        if wanted.is_subset(&have) {
            break start.elapsed();
        }
        if start.elapsed() > PHASE_LIMIT {
            bail!(
                "only {} of {nodes_wanted} routes after {PHASE_LIMIT:?}",
                wanted.intersection(&have).count()
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    wait_for(
        "every Node's NetworkUnavailable=False (RouteCreated)",
        PHASE_LIMIT,
        || async {
            let list = nodes.list(&Default::default()).await.ok()?;
            (list.items.iter().filter(|n| route_created(n)).count() == nodes_wanted).then_some(())
        },
    )
    .await?;
    let conditions_done = start.elapsed();
    let after_burst = aws_calls(&ccm).await?;
    print_heading(nodes_wanted, &extra);
    println!("every route in the route table {routes_done:.2?} after the CCM started");
    println!(
        "every Node's NetworkUnavailable=False (RouteCreated) {conditions_done:.2?} after the CCM started"
    );
    print_calls(
        "route burst",
        &Default::default(),
        &after_burst,
        nodes_wanted,
        "route",
    );
    print_process_figures(&ccm);

    // Reconciliations with nothing to do (the default period is 10 s).
    let idle_for = Duration::from_secs(idle_seconds);
    tokio::time::sleep(idle_for).await;
    let after_idle = aws_calls(&ccm).await?;
    print_calls(
        &format!("idle {idle_for:.0?}"),
        &after_burst,
        &after_idle,
        nodes_wanted,
        "route",
    );
    print_process_figures(&ccm);
    Ok(())
}

fn print_heading(nodes: usize, extra: &[String]) {
    println!(
        "== bench-aws-routes: {nodes} Nodes, one /26 pod CIDR each, CCM flags: {}",
        describe_flags(extra)
    );
}
