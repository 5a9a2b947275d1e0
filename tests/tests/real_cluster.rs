//! The CCM the way users run it: Nodes registered by real kubelets (containerd + runc, each node
//! a network and mount namespace of its own holding its machine's cloud address), the CCM as a
//! DaemonSet Pod of its own image (`hack/build-image.sh`) on each control-plane Node, deployed
//! with `kubectl apply -k deploy/<provider>/overlays/local` (the shipped base; only image, cloud
//! config and endpoints differ from the example overlay), with the ServiceAccount token the
//! kubelet mounts and the probes the kubelet sends. See `rcp_e2e::local_up`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_cloud_provider::{
    node::helpers::{addresses, has_taint},
    well_known::TAINT_UNINITIALIZED,
};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use rcp_e2e::{
    k8s::{ingress_hostname, ingress_ip, load_balancer_service, wait_for},
    local_up::{Cloud, LocalUp, STEP},
};

/// What both providers must do once the CCM Pods run on two control-plane Nodes: the Nodes
/// initialised as that cloud initialises them (checked by `check_node`), both Pods Ready, a
/// LoadBalancer Service served (`ingress`) and cleaned up on deletion (`load_balancers` counts
/// the cloud's), `kubectl logs` of each Pod plain and free of secrets, the leading Pod deleted
/// and the other one initialising the next Node, and a Node whose kubelet stopped and whose
/// machine is deleted (`delete_machine`) deleted by the CCM.
async fn scenario(
    up: &mut LocalUp,
    started: Instant,
    check_node: impl Fn(&LocalUp, usize, &Node),
) -> Result<()> {
    let client = up.cluster.cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    for i in 0..2 {
        let node = up.wait_initialised(i).await?;
        let m = &up.machines[i];
        assert_eq!(
            node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
            Some(m.provider_id.as_str())
        );
        assert!(
            addresses(&node)
                .iter()
                .any(|a| a.type_ == "InternalIP" && a.address == m.ip),
            "{:?}",
            addresses(&node)
        );
        assert!(
            node.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_some(),
            "kube-controller-manager allocated a Pod CIDR"
        );
        check_node(up, i, &node);
    }
    let running = up.ccm_pods_ready(2).await?;
    println!(
        "{}: real cluster up, both Nodes initialised and the CCM Pods Ready {:.1?} after the start",
        up.provider(),
        started.elapsed()
    );
    for pod in &running {
        let spec = pod.spec.clone().unwrap_or_default();
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("cloud-controller-manager")
        );
        assert_eq!(spec.host_network, Some(true));
        assert!(
            spec.containers[0]
                .image
                .as_deref()
                .is_some_and(|i| i.starts_with("rcp.local/cloud-controller-manager-")),
            "{:?}",
            spec.containers[0].image
        );
    }
    println!(
        "$ kubectl get nodes -o wide\n{}",
        up.cluster.cluster.kubectl(&["get", "nodes", "-o", "wide"])?
    );
    println!(
        "$ kubectl -n kube-system get pods -o wide\n{}",
        up.cluster
            .cluster
            .kubectl(&["-n", "kube-system", "get", "pods", "-o", "wide"])?
    );
    for (node, kib) in up.ccm_rss_kib() {
        println!(
            "{}: CCM container on {node}: RSS {:.1} MiB",
            up.provider(),
            kib as f64 / 1024.0
        );
    }

    // A LoadBalancer Service gets its load balancer; deleting it removes it and the finalizer.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &load_balancer_service("hello", &[], &[(80, "http")]),
        )
        .await?;
    let served = wait_for(
        "Service hello's load balancer",
        Duration::from_secs(180),
        || async {
            let s = services.get("hello").await.ok()?;
            ingress_hostname(&s).or_else(|| ingress_ip(&s))
        },
    )
    .await;
    served.with_context(|| up.diagnostics())?;
    println!(
        "$ kubectl get service hello\n{}",
        up.cluster.cluster.kubectl(&["get", "service", "hello"])?
    );
    assert_eq!(load_balancers(up).await?, 1);
    services.delete("hello", &DeleteParams::default()).await?;
    for _ in 0..360 {
        if services.get_opt("hello").await?.is_none() && load_balancers(up).await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(services.get_opt("hello").await?.is_none(), "{}", up.diagnostics());
    assert_eq!(
        load_balancers(up).await?,
        0,
        "the load balancer is deleted with its Service"
    );

    // `kubectl logs` (the API server reaching each kubelet at its Node's address): the CCM's own
    // lines, plain text, no secret.
    for pod in up.ccm_pod_names()? {
        let log = up.kubectl_logs(&pod)?;
        assert!(log.contains("starting cloud-controller-manager"), "{pod}: {log}");
        assert!(
            !log.contains('\u{1b}'),
            "terminal escapes in kubectl logs of {pod}"
        );
        rcp_e2e::secrets::assert_none_in(&format!("kubectl logs {pod}"), &log);
    }

    // Fail-over: the leading Pod deleted, the other one initialises the next Node.
    let leader = up.leader()?;
    let deleted = Instant::now();
    pods.delete(&leader, &DeleteParams::default().grace_period(0))
        .await?;
    up.start_node(2, false).await?;
    let third = up.machines[2].name.clone();
    let initialised = wait_for(
        "the third Node initialised by the other CCM Pod",
        STEP,
        || async {
            let n = nodes.get_opt(&third).await.ok()??;
            (!has_taint(&n, TAINT_UNINITIALIZED)).then_some(())
        },
    )
    .await;
    initialised.with_context(|| up.diagnostics())?;
    println!(
        "{}: fail-over: leading CCM Pod {leader} deleted; the next Node (its kubelet started then) initialised {:.1?} later",
        up.provider(),
        deleted.elapsed()
    );

    // A Node whose kubelet stopped and whose machine is deleted is deleted by the CCM.
    let first = up.machines[0].clone();
    up.cluster.node(&first.name)?.stop();
    delete_machine(up, &first.id).await?;
    let deleted = wait_for("the deleted machine's Node deleted", STEP, || async {
        nodes.get_opt(&first.name).await.ok()?.is_none().then_some(())
    })
    .await;
    deleted.with_context(|| up.diagnostics())?;
    Ok(())
}

async fn load_balancers(up: &LocalUp) -> Result<usize> {
    Ok(match &up.cloud {
        Cloud::Aws { moto, .. } => moto
            .elb()
            .describe_load_balancers()
            .send()
            .await?
            .load_balancer_descriptions()
            .len(),
        Cloud::OpenStack { project, .. } => project
            .octavia_list("loadbalancers", "loadbalancers")
            .await?
            .len(),
    })
}

async fn delete_machine(up: &LocalUp, id: &str) -> Result<()> {
    match &up.cloud {
        Cloud::Aws { moto, .. } => {
            moto.ec2().terminate_instances().instance_ids(id).send().await?;
        }
        Cloud::OpenStack { project, .. } => project.delete_server(id).await?,
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_ccm_pods_initialise_kubelet_nodes_serve_a_load_balancer_and_fail_over() -> Result<()> {
    let started = Instant::now();
    let mut up = LocalUp::aws(3, 2).await?;
    let Cloud::Aws { world, .. } = &up.cloud else {
        unreachable!()
    };
    let instances = world.instances.clone();
    scenario(&mut up, started, |_, i, node| {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("topology.kubernetes.io/zone"),
            Some(&instances[i].zone)
        );
        assert_eq!(
            labels.get("topology.kubernetes.io/region").map(String::as_str),
            Some("us-east-1")
        );
        assert_eq!(
            labels.get("node.kubernetes.io/instance-type"),
            Some(&instances[i].instance_type)
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openstack_ccm_pods_initialise_kubelet_nodes_serve_a_load_balancer_and_fail_over() -> Result<()> {
    let started = Instant::now();
    let mut up = LocalUp::openstack(3, 2).await?;
    let Cloud::OpenStack { project, .. } = &up.cloud else {
        unreachable!()
    };
    let region = project.region.clone();
    scenario(&mut up, started, |_, _, node| {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("topology.kubernetes.io/region"), Some(&region));
        assert_eq!(
            labels.get("node.kubernetes.io/instance-type").map(String::as_str),
            Some("rcp.small")
        );
    })
    .await
}
