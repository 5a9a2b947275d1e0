//! The project's main job (`hack/local-up-cluster.sh`): a local Kubernetes control plane
//! (etcd + kube-apiserver v1.20.2) with an emulated AWS (moto) holding a cluster VPC with three
//! instances, three Nodes registered as kubelet `--cloud-provider=external` would register
//! them (tainted, named by private DNS name), and `cloud-controller-manager-aws` initialising
//! them, and a `type: LoadBalancer` Service `hello` that the CCM gives a Classic ELB. Prints
//! what a user would look at, then keeps running until Ctrl-C and cleans up.
//!
//! `--provider openstack`: the same with the real OpenStack of `hack/openstack.sh` (three nova
//! servers, an Octavia load balancer with a floating IP) and `cloud-controller-manager-openstack`.

use std::time::Duration;

use anyhow::Result;
use k8s_cloud_provider::{node::helpers::has_taint, well_known::TAINT_UNINITIALIZED};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{Api, api::PostParams};
use rcp_e2e::{
    Moto, TestCluster,
    ccm::CcmProcess,
    k8s::{ingress_hostname, ingress_ip, load_balancer_service, register_tainted_nodes, wait_for},
};

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let provider = match args.iter().position(|a| a == "--provider") {
        Some(i) => args.get(i + 1).cloned().unwrap_or_default(),
        None => args
            .iter()
            .find_map(|a| a.strip_prefix("--provider=").map(str::to_string))
            .unwrap_or_else(|| "aws".into()),
    };
    match provider.as_str() {
        "aws" => aws().await,
        "openstack" => openstack().await,
        other => anyhow::bail!("--provider {other:?}: this demo runs aws (the default) or openstack"),
    }
}

/// Waits until no Node has the uninitialized taint.
async fn wait_initialised(nodes: &Api<Node>, ccm: &CcmProcess) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let list = nodes.list(&Default::default()).await?;
        if list.items.iter().all(|n| !has_taint(n, TAINT_UNINITIALIZED)) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("nodes not initialised after 2 minutes; CCM log:\n{}", ccm.log());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn print_nodes(cluster: &TestCluster) -> Result<()> {
    println!("\n$ kubectl get nodes -o wide -L topology.kubernetes.io/zone,node.kubernetes.io/instance-type");
    print!(
        "{}",
        cluster.kubectl(&[
            "get",
            "nodes",
            "-o",
            "wide",
            "-L",
            "topology.kubernetes.io/zone,node.kubernetes.io/instance-type"
        ])?
    );
    println!(
        "\n$ kubectl get nodes -o custom-columns=NAME:.metadata.name,PROVIDER-ID:.spec.providerID,TAINTS:.spec.taints[*].key"
    );
    print!(
        "{}",
        cluster.kubectl(&[
            "get",
            "nodes",
            "-o",
            "custom-columns=NAME:.metadata.name,PROVIDER-ID:.spec.providerID,TAINTS:.spec.taints[*].key"
        ])?
    );
    Ok(())
}

/// Registers `names` as kubelet would, waits for the CCM to initialise them, prints them, and
/// creates the LoadBalancer Service `default/hello`.
async fn nodes_and_hello(
    cluster: &TestCluster,
    ccm: &CcmProcess,
    names: &[&str],
    what: &str,
) -> Result<Api<Service>> {
    let client = cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    register_tainted_nodes(&nodes, names, None).await?;
    println!(
        "local-up-cluster: created 3 Nodes with the node.cloudprovider.kubernetes.io/uninitialized taint; waiting for the CCM …"
    );
    wait_initialised(&nodes, ccm).await?;
    print_nodes(cluster)?;
    let services: Api<Service> = Api::namespaced(client, "default");
    services
        .create(
            &PostParams::default(),
            &load_balancer_service("hello", &[], &[(80, "http")]),
        )
        .await?;
    println!("\nlocal-up-cluster: created the LoadBalancer Service default/hello; waiting for its {what} …");
    Ok(services)
}

async fn openstack() -> Result<()> {
    use rcp_e2e::openstack::OpenStack;
    println!("local-up-cluster: starting (or finding) the OpenStack of hack/openstack.sh on 127.0.0.1 …");
    let os = OpenStack::shared().await?;
    println!("local-up-cluster: starting etcd + kube-apiserver v1.20.2 on 127.0.0.1 …");
    let cluster = TestCluster::start().await?;
    let project = os.project("local-up").await?;
    let net = project.network("private", "10.0.0.0/24").await?;
    let public = project.external_network("public", "172.24.4.0/24").await?;
    project.router("edge", &public, &net).await?;
    println!(
        "local-up-cluster: project {} (region {}), network private {} (subnet {}), external network public {}; servers:",
        project.name, project.region, net.id, net.subnet_id, public.id
    );
    let names = ["node-0", "node-1", "node-2"];
    for name in names {
        let id = project.server(name, &net).await?;
        println!("    {id}  {name}  {}", project.server_ip(&id, "private").await?);
    }
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(
        &config,
        format!(
            "{}[LoadBalancer]\nsubnet-id = {}\nfloating-network-id = {}\n",
            project.global_section(),
            net.subnet_id,
            public.id
        ),
    )?;
    let ccm = CcmProcess::start(
        "cloud-controller-manager-openstack",
        "cloud-controller-manager-openstack",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--cluster-name=local-up".into(),
        ],
    )?;
    let services = nodes_and_hello(&cluster, &ccm, &names, "Octavia load balancer").await?;
    let ready = wait_for("Service hello's ingress IP", Duration::from_secs(120), || async {
        let s = services.get("hello").await.ok()?;
        ingress_ip(&s).map(|_| s)
    })
    .await;
    if let Err(e) = ready {
        anyhow::bail!("{e}; CCM log:\n{}", ccm.log());
    }
    println!("\n$ kubectl get service hello");
    print!("{}", cluster.kubectl(&["get", "service", "hello"])?);
    println!("\nlocal-up-cluster: running. Try:");
    println!("    export KUBECONFIG={}", cluster.kubeconfig_path().display());
    println!("    kubectl get nodes -o wide; kubectl get services; kubectl get events");
    println!(
        "  OpenStack: keystone http://127.0.0.1:15000/v3, user/project {} (password in {}), logs in {}/logs",
        project.name,
        config.display(),
        os.run_dir.display()
    );
    println!(
        "  CCM log: {}/cloud-controller-manager-openstack.log",
        cluster.dir().display()
    );
    println!(
        "local-up-cluster: press Ctrl-C to stop and clean up (the OpenStack keeps running: hack/openstack.sh stop)."
    );
    if std::env::var_os("LOCAL_UP_EXIT_AFTER_START").is_some() {
        return Ok(());
    }
    tokio::signal::ctrl_c().await?;
    println!("\nlocal-up-cluster: stopping the CCM, kube-apiserver and etcd …");
    drop(ccm);
    drop(project);
    drop(cluster);
    println!("local-up-cluster: cleaned up.");
    Ok(())
}

async fn aws() -> Result<()> {
    println!("local-up-cluster: starting etcd + kube-apiserver v1.20.2 on 127.0.0.1 …");
    let cluster = TestCluster::start().await?;
    println!("local-up-cluster: starting moto (emulated EC2/ELB) …");
    let moto = Moto::start().await?;
    let world = moto.build_world("local-up", 3).await?;
    println!(
        "local-up-cluster: VPC {} with subnets {} and route table {}; instances:",
        world.vpc_id,
        world
            .subnets
            .iter()
            .map(|(z, s)| format!("{s} ({z})"))
            .collect::<Vec<_>>()
            .join(", "),
        world.route_table_id
    );
    for i in &world.instances {
        println!(
            "    {}  {}  {}  {}",
            i.id, i.zone, i.private_dns_name, i.private_ip
        );
    }
    let config = cluster.dir().join("cloud.conf");
    std::fs::write(&config, moto.cloud_config(&world))?;
    let ccm = CcmProcess::start_with_env(
        "cloud-controller-manager-aws",
        "cloud-controller-manager-aws",
        cluster.kubeconfig_path(),
        cluster.dir(),
        &[
            format!("--cloud-config={}", config.display()),
            "--cluster-name=local-up".into(),
        ],
        &moto.sdk_env(),
    )?;
    let names = world.node_names();
    let services = nodes_and_hello(&cluster, &ccm, &names, "load balancer").await?;
    let ready = wait_for(
        "Service hello's ingress hostname",
        Duration::from_secs(120),
        || async {
            services
                .get("hello")
                .await
                .ok()
                .filter(|s| ingress_hostname(s).is_some())
        },
    )
    .await;
    if let Err(e) = ready {
        anyhow::bail!("{e}; CCM log:\n{}", ccm.log());
    }
    println!("\n$ kubectl get service hello");
    print!("{}", cluster.kubectl(&["get", "service", "hello"])?);

    println!("\nlocal-up-cluster: running. Try:");
    println!("    export KUBECONFIG={}", cluster.kubeconfig_path().display());
    println!("    kubectl get nodes -o wide; kubectl get services; kubectl get events");
    println!(
        "    curl -sk https://127.0.0.1:{}/metrics | grep cloudprovider_aws",
        ccm.port()
    );
    println!(
        "  CCM log: {}/cloud-controller-manager-aws.log",
        cluster.dir().display()
    );
    println!("local-up-cluster: press Ctrl-C to stop and clean up.");
    if std::env::var_os("LOCAL_UP_EXIT_AFTER_START").is_some() {
        return Ok(());
    }
    tokio::signal::ctrl_c().await?;
    println!("\nlocal-up-cluster: stopping the CCM, moto, kube-apiserver and etcd …");
    drop(ccm);
    drop(moto);
    drop(cluster);
    println!("local-up-cluster: cleaned up.");
    Ok(())
}
