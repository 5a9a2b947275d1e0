//! Benchmark (not a test): create N `type: LoadBalancer` Services at once for
//! `cloud-controller-manager-aws` on a real kube-apiserver and moto, and print the time until
//! every Service has its `ingress[].hostname`, the time until all load balancers are gone
//! again after the Services are deleted, and the ELB / ELBv2 / EC2 calls by operation for
//! each phase (from the CCM's own `cloudprovider_aws_api_request_duration_seconds` metric).
//!
//! ```text
//! cargo run -p rcp-e2e --bin bench-aws-lb -- [--services 20] [--nodes 3] [--type clb|nlb]
//!     [--shared-elb-security-group]
//!     [-- <extra CCM flags, e.g. --concurrent-service-syncs=5>]
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use rcp_e2e::{
    Moto, TestCluster,
    bench::{aws_calls, describe_flags, print_calls, print_process_figures},
    ccm::CcmProcess,
    k8s::{ingress_hostname, load_balancer_service, register_tainted_nodes, wait_for},
};

/// Time allowed for each phase before the benchmark gives up.
const PHASE_LIMIT: Duration = Duration::from_secs(900);

#[tokio::main]
async fn main() -> Result<()> {
    let mut services_wanted = 20usize;
    let mut nodes_wanted = 3usize;
    let mut lb_type = "clb".to_string();
    let mut shared_elb_group = false;
    let mut extra: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--services" => services_wanted = args.next().context("--services needs a value")?.parse()?,
            "--nodes" => nodes_wanted = args.next().context("--nodes needs a value")?.parse()?,
            "--type" => lb_type = args.next().context("--type needs clb or nlb")?,
            "--shared-elb-security-group" => shared_elb_group = true,
            "--" => extra.extend(args.by_ref()),
            other => bail!("unknown argument {other:?}"),
        }
    }
    let annotations: &[(&str, &str)] = match lb_type.as_str() {
        "clb" => &[],
        "nlb" => &[("type", "nlb")],
        other => bail!("--type must be clb or nlb, not {other:?}"),
    };

    let cluster = TestCluster::start().await?;
    let moto = Moto::start().await?;
    let world = moto.build_world("bench", nodes_wanted).await?;
    let config = cluster.dir().join("cloud.conf");
    let mut cloud_config = moto.cloud_config(&world);
    if shared_elb_group {
        // `[Global] ElbSecurityGroup`: one security group for every classic ELB, so the Nodes'
        // group gets one rule instead of one per ELB (AWS allows 60 rules per group by default,
        // and moto enforces it: without this, 500 classic ELBs cannot all be provisioned).
        let group = moto
            .ec2()
            .create_security_group()
            .group_name("bench-elbs")
            .description("shared by every classic ELB of the benchmark")
            .vpc_id(&world.vpc_id)
            .send()
            .await?;
        let id = group.group_id().context("CreateSecurityGroup: no id")?;
        cloud_config =
            cloud_config.replacen("[Global]\n", &format!("[Global]\nElbSecurityGroup = {id}\n"), 1);
    }
    std::fs::write(&config, cloud_config)?;
    let mut ccm_args = vec![
        format!("--cloud-config={}", config.display()),
        "--leader-elect=false".to_string(),
        "--cluster-name=bench".to_string(),
    ];
    ccm_args.extend(extra.iter().cloned());
    let ccm = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "ccm-bench-lb",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &ccm_args,
        &moto.sdk_env(),
    )?;
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    register_tainted_nodes(&nodes, &world.node_names(), Some(PHASE_LIMIT)).await?;
    let before = aws_calls(&ccm).await?;

    let services: Api<Service> = Api::namespaced(client, "default");
    let names: Vec<String> = (0..services_wanted).map(|i| format!("bench-{i}")).collect();
    let start = Instant::now();
    futures::future::try_join_all(names.iter().map(|n| {
        let services = services.clone();
        async move {
            services
                .create(
                    &PostParams::default(),
                    &load_balancer_service(n, annotations, &[(80, "http"), (443, "https")]),
                )
                .await
        }
    }))
    .await?;
    wait_for("every Service has its ingress hostname", PHASE_LIMIT, || async {
        let list = services.list(&Default::default()).await.ok()?;
        let ready = list
            .items
            .iter()
            .filter(|s| ingress_hostname(s).is_some())
            .count();
        (ready == services_wanted).then_some(())
    })
    .await?;
    let provisioned = start.elapsed();
    let after_create = aws_calls(&ccm).await?;

    let start = Instant::now();
    for n in &names {
        services.delete(n, &DeleteParams::default()).await?;
    }
    // The service controller's finalizer is removed only after the load balancer is gone.
    wait_for("every Service deleted", PHASE_LIMIT, || async {
        let list = services.list(&Default::default()).await.ok()?;
        // `default` also holds the `kubernetes` Service.
        let left = list
            .items
            .iter()
            .filter(|s| {
                s.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("bench-"))
            })
            .count();
        (left == 0).then_some(())
    })
    .await?;
    let deleted = start.elapsed();
    let after_delete = aws_calls(&ccm).await?;

    println!(
        "== bench-aws-lb: {services_wanted} {lb_type} Services (2 ports each), {nodes_wanted} nodes, CCM flags: {}",
        describe_flags(&extra)
    );
    println!(
        "all {services_wanted} Services had an ingress hostname {provisioned:.2?} after the first create"
    );
    print_calls("provisioning", &before, &after_create, services_wanted, "Service");
    println!(
        "all {services_wanted} Services (and their load balancers) gone {deleted:.2?} after the first delete"
    );
    print_calls(
        "deletion",
        &after_create,
        &after_delete,
        services_wanted,
        "Service",
    );
    print_process_figures(&ccm);
    Ok(())
}
