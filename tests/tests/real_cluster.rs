//! The CCM the way users run it: Nodes registered by real kubelets (containerd + runc, each node
//! a network and mount namespace of its own holding its machine's cloud address), the CCM as a
//! DaemonSet Pod of its own image (`hack/build-image.sh`) on each control-plane Node, deployed
//! with `kubectl apply -k deploy/<provider>/overlays/local` (the shipped base; only image, cloud
//! config and endpoints differ from the example overlay), with the ServiceAccount token the
//! kubelet mounts and the probes the kubelet sends. See `rcp_e2e::local_up`.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use k8s_cloud_provider::{
    node::helpers::{addresses, has_taint},
    well_known::{ANNOTATION_PROVIDED_NODE_IP, TAINT_UNINITIALIZED},
};
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    coordination::v1::Lease,
    core::v1::{Node, Pod, Service, ServiceAccount},
    rbac::v1::ClusterRole,
};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use rcp_e2e::{
    k8s::wait_for,
    local_up::{Cloud, Deploy, LocalUp, REGISTRY_HOST, STEP},
};

/// What both providers must do once the CCM Pods run on two control-plane Nodes: the Nodes
/// initialised as that cloud initialises them (checked by `check_node`), with addresses only
/// the CCM writes (`check_addresses`: current kubelets with `--cloud-provider=external` write
/// none but their host name), both Pods Ready, a
/// LoadBalancer Service served (`ingress`) and cleaned up on deletion (`load_balancers` counts
/// the cloud's), `kubectl logs` of each Pod plain and free of secrets, the leading Pod deleted
/// and the other one initialising the next Node (its kubelet given `--node-ip`: the CCM accepts
/// the provided-node-ip annotation and puts that address first), and a Node whose kubelet stopped and whose
/// machine is deleted (`delete_machine`) deleted by the CCM.
async fn scenario(
    up: &mut LocalUp,
    started: Instant,
    check_node: impl Fn(&LocalUp, usize, &Node),
    check_addresses: impl Fn(&LocalUp, &Node) -> bool,
) -> Result<()> {
    let client = up.cluster.cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    for i in 0..2 {
        let node = up.wait_initialised(i).await?;
        let m = up.machines[i].clone();
        assert_eq!(
            node.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
            Some(m.provider_id.as_str())
        );
        assert!(
            node.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_some(),
            "kube-controller-manager allocated a Pod CIDR"
        );
        check_node(up, i, &node);
        let node = wait_for("the Node's addresses from the cloud", STEP, || async {
            let n = nodes.get_opt(&m.name).await.ok()??;
            check_addresses(up, &n).then_some(n)
        })
        .await
        .with_context(|| up.diagnostics())?;
        println!("{}: {} addresses {:?}", up.provider(), m.name, addresses(&node));
    }
    let running = up.ccm_pods_ready(2).await?;
    println!(
        "{}: real cluster up, both Nodes initialised and the CCM Pods Ready {:.1?} after the start",
        up.provider(),
        started.elapsed()
    );
    // One Pod on the kubeadm-labelled Node, one on the k3s-style one (label "true", tainted
    // CriticalAddonsOnly).
    let on: BTreeSet<String> = running
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(
        on,
        BTreeSet::from([up.machines[0].name.clone(), up.machines[1].name.clone()]),
        "the CCM Pods run on both control-plane Nodes"
    );
    for pod in &running {
        let spec = pod.spec.clone().unwrap_or_default();
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("cloud-controller-manager")
        );
        // With --use-service-account-credentials (the AWS and vSphere overlays), the controllers
        // run with tokens of their own ServiceAccounts, minted by the CCM and held in memory
        // (the root file system is read-only): the Pod runs, and the ServiceAccounts exist
        // (kube-controller-manager makes no service-controller of its own).
        let args = spec.containers[0].args.clone().unwrap_or_default();
        if args.iter().any(|a| a == "--use-service-account-credentials=true") {
            let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "kube-system");
            for name in ["node-controller", "service-controller", "route-controller"] {
                assert!(sas.get_opt(name).await?.is_some(), "kube-system/{name}");
            }
        }
        assert_eq!(spec.host_network, Some(true));
        assert!(
            spec.containers[0].image.as_deref().is_some_and(|i| i
                .starts_with("rcp.local/cloud-controller-manager-")
                || i.starts_with(&format!(
                    "{REGISTRY_HOST}/rust-cloud-provider/cloud-controller-manager-"
                ))),
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
    // (vSphere's CCM serves no load balancers.)
    if !matches!(up.cloud, Cloud::VSphere { .. }) {
        up.hello().await?;
        let services: Api<Service> = Api::namespaced(client.clone(), "default");
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
    }

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
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let holder = |l: Option<Lease>| l.and_then(|l| l.spec?.holder_identity).unwrap_or_default();
    let before = holder(leases.get_opt("cloud-controller-manager").await?);
    let deleted = Instant::now();
    pods.delete(&leader, &DeleteParams::default().grace_period(0))
        .await?;
    let taken = wait_for("the other CCM Pod holding the lease", STEP, || async {
        let now = holder(leases.get_opt("cloud-controller-manager").await.ok()?);
        (!now.is_empty() && now != before).then_some(())
    })
    .await;
    taken.with_context(|| up.diagnostics())?;
    println!(
        "{}: fail-over: leading CCM Pod {leader} deleted; the other Pod held the lease {:.1?} later",
        up.provider(),
        deleted.elapsed()
    );
    // Its kubelet is given `--node-ip` (its machine's address): the kubelet leaves the
    // provided-node-ip annotation, which the CCM checks against the cloud's addresses.
    let third_ip = up.machines[2].ip.clone();
    up.start_node_with(2, false, vec![format!("--node-ip={third_ip}")], Vec::new())
        .await?;
    let third = up.machines[2].name.clone();
    let initialised = wait_for(
        "the third Node initialised by the other CCM Pod",
        STEP,
        || async {
            let n = nodes.get_opt(&third).await.ok()??;
            (!has_taint(&n, TAINT_UNINITIALIZED)).then_some(n)
        },
    )
    .await;
    let third_node = initialised.with_context(|| up.diagnostics())?;
    // Accepted: the annotation stays (the kubelet writes it again at every status update, as
    // upstream's controller leaves it), and the given address is the first InternalIP.
    assert_eq!(
        third_node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_PROVIDED_NODE_IP))
            .map(String::as_str),
        Some(third_ip.as_str())
    );
    let third_node = wait_for("the third Node's addresses from the cloud", STEP, || async {
        let n = nodes.get_opt(&third).await.ok()??;
        check_addresses(up, &n).then_some(n)
    })
    .await
    .with_context(|| up.diagnostics())?;
    assert_eq!(
        addresses(&third_node)
            .iter()
            .find(|a| a.type_ == "InternalIP")
            .map(|a| a.address.as_str()),
        Some(third_ip.as_str()),
        "{:?}",
        addresses(&third_node)
    );
    println!(
        "{}: fail-over: the next Node (its kubelet started after the hand-over) initialised {:.1?} after the leading Pod was deleted",
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

/// Whether the Node has its machine's address as an InternalIP. A kubelet without `--node-ip`
/// writes its host name only, so on OpenStack and vSphere that address is the CCM's (nova's
/// server address, the VM's guest address).
fn internal_ip_from_the_cloud(up: &LocalUp, node: &Node) -> bool {
    let name = node.metadata.name.clone().unwrap_or_default();
    up.machines.iter().find(|m| m.name == name).is_some_and(|m| {
        addresses(node)
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == m.ip)
    })
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
        Cloud::VSphere { .. } => 0,
    })
}

async fn delete_machine(up: &LocalUp, id: &str) -> Result<()> {
    match &up.cloud {
        Cloud::Aws { moto, .. } => {
            moto.ec2().terminate_instances().instance_ids(id).send().await?;
        }
        Cloud::OpenStack { project, .. } => project.delete_server(id).await?,
        Cloud::VSphere { vcsim } => {
            vcsim.govc(&["vm.destroy", id])?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_ccm_pods_initialise_kubelet_nodes_serve_a_load_balancer_and_fail_over() -> Result<()> {
    let started = Instant::now();
    // Installed with its Helm chart, as the other providers' tests do (the main job,
    // hack/local-up-cluster.sh, applies the kustomize overlays).
    let mut up = LocalUp::aws_with(4, 2, Deploy::Helm).await?;
    let Cloud::Aws { world, .. } = &up.cloud else {
        unreachable!()
    };
    let instances = world.instances.clone();
    // The kubelet (`--cloud-provider=external`, no `--node-ip`) writes no address but its host
    // name; InternalIP and InternalDNS come from the CCM alone.
    let from_the_cloud = |up: &LocalUp, node: &Node| {
        let name = node.metadata.name.clone().unwrap_or_default();
        let Some(m) = up.machines.iter().find(|m| m.name == name) else {
            return false;
        };
        let has = |t: &str, v: &str| addresses(node).iter().any(|a| a.type_ == t && a.address == v);
        has("InternalIP", &m.ip) && has("InternalDNS", &m.name)
    };
    let scenario_result = scenario(
        &mut up,
        started,
        |_, i, node| {
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
        },
        from_the_cloud,
    )
    .await;
    scenario_result?;

    // A kubelet whose `--node-ip` is an address of its own that the instance does not have:
    // refused with an Event on the Node, which stays uninitialised (nothing of it written).
    let fourth = up.machines[3].name.clone();
    let foreign_ip = "10.99.0.7".to_string();
    up.start_node_with(
        3,
        false,
        vec![format!("--node-ip={foreign_ip}")],
        vec![foreign_ip.clone()],
    )
    .await?;
    let client = up.cluster.cluster.client().await?;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::all(client.clone());
    let refused = wait_for(
        "the Warning event refusing the fourth Node's --node-ip",
        STEP,
        || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.involved_object.name.as_deref() == Some(fourth.as_str())
                    && e.reason.as_deref() == Some("ProvidedNodeIPInvalid")
            })
        },
    )
    .await
    .with_context(|| up.diagnostics())?;
    println!("aws: refused: {}", refused.message.unwrap_or_default());
    let node = Api::<Node>::all(client).get(&fourth).await?;
    assert!(
        has_taint(&node, TAINT_UNINITIALIZED),
        "the refused Node stays uninitialised"
    );
    assert!(
        node.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .is_none_or(str::is_empty),
        "no provider ID written to the refused Node"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openstack_ccm_pods_initialise_kubelet_nodes_serve_a_load_balancer_and_fail_over() -> Result<()> {
    let started = Instant::now();
    let mut up = LocalUp::openstack_with(3, 2, Deploy::Helm).await?;
    let Cloud::OpenStack { project, .. } = &up.cloud else {
        unreachable!()
    };
    let region = project.region.clone();
    scenario(
        &mut up,
        started,
        |_, _, node| {
            let labels = node.metadata.labels.clone().unwrap_or_default();
            assert_eq!(labels.get("topology.kubernetes.io/region"), Some(&region));
            assert_eq!(
                labels.get("node.kubernetes.io/instance-type").map(String::as_str),
                Some("rcp.small")
            );
        },
        internal_ip_from_the_cloud,
    )
    .await?;
    // `doctor` in the cluster, as docs/prerequisites.md runs it: a Pod of the CCM's image with
    // its ServiceAccount and the chart's cloud-config Secret. Every check passes (exit 0).
    let (ok, log) = up
        .doctor_pod(
            "cloud.conf",
            serde_json::json!({"secret": {"secretName": "cloud-config"}}),
        )
        .await?;
    println!("$ kubectl -n kube-system run ccm-doctor … doctor\n{log}");
    assert!(ok, "doctor failed in the cluster:\n{log}");
    assert!(log.contains("keystone"), "{log}");
    rcp_e2e::secrets::assert_none_in("the doctor Pod's log", &log);
    Ok(())
}

/// The kubelet pulls an image from a private ECR registry with the credentials our
/// `ecr-credential-provider` returns: the shipped
/// `deploy/aws/kubelet/credential-provider-config.yaml` as it is (`kubelet.config.k8s.io/v1`, what
/// current kubelets read), with moto's endpoint and credentials added as `env`, and the binary in
/// `--image-credential-provider-bin-dir`. The registry (Debian's docker-registry, TLS
/// for the ECR host name, which the node resolves to its 127.0.0.1) lets in only the user and
/// password moto's `GetAuthorizationToken` hands out, so the Pod runs only if the kubelet asked
/// the plugin and containerd used its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_pulls_from_ecr_with_the_credentials_of_ecr_credential_provider() -> Result<()> {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use rcp_e2e::{Moto, kube_node::NodeOptions, kube_node::RealCluster, paths, registry::Registry};
    const HOST: &str = "123456789012.dkr.ecr.us-east-1.amazonaws.com";
    let moto = Moto::start().await?;
    let world = moto.build_world("ecr-pull", 1).await?;
    let mut registry = Registry::start(HOST, "AWS", "123456789012-auth-token").await?;
    let mut cluster = RealCluster::start(vec![], &[moto.port()]).await?;
    registry
        .push_oci_archive(
            cluster.pause_archive(),
            "app",
            "1",
            "AWS",
            "123456789012-auth-token",
        )
        .await?;
    cluster.forward(443, registry.port);

    // The shipped configuration, with moto as ECR.
    let plugin_dir = tempfile::tempdir()?;
    let bin_dir = plugin_dir.path().join("bin");
    std::fs::create_dir_all(&bin_dir)?;
    std::fs::copy(
        paths::workspace_binary("ecr-credential-provider")?,
        bin_dir.join("ecr-credential-provider"),
    )?;
    let shipped = std::fs::read_to_string(
        paths::workspace_root().join("deploy/aws/kubelet/credential-provider-config.yaml"),
    )?;
    assert!(
        shipped.contains("apiVersion: kubelet.config.k8s.io/v1\n"),
        "the shipped credential-provider config is kubelet.config.k8s.io/v1"
    );
    let mut config = shipped;
    config.push_str("    env:\n");
    for (k, v) in moto
        .sdk_env()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain([("AWS_ENDPOINT_URL".to_string(), moto.endpoint().to_string())])
    {
        config.push_str(&format!("      - name: {k}\n        value: \"{v}\"\n"));
    }
    let config_path = plugin_dir.path().join("credential-provider-config.yaml");
    std::fs::write(&config_path, config)?;

    let instance = &world.instances[0];
    cluster
        .start_node(NodeOptions {
            name: instance.private_dns_name.clone(),
            ip: instance.private_ip.clone(),
            kubelet_args: vec![
                format!("--image-credential-provider-config={}", config_path.display()),
                format!("--image-credential-provider-bin-dir={}", bin_dir.display()),
            ],
            hosts: vec![(HOST.into(), "127.0.0.1".into())],
            registry_cas: vec![(HOST.into(), registry.ca_pem.clone())],
            ..Default::default()
        })
        .await?;

    let client = cluster.cluster.client().await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    wait_for("the default ServiceAccount", STEP, || async {
        accounts.get_opt("default").await.ok()?
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "from-ecr"},
        "spec": {
            "nodeName": instance.private_dns_name,
            "hostNetwork": true,
            "automountServiceAccountToken": false,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "app", "image": format!("{HOST}/app:1"), "imagePullPolicy": "Always"}]
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let running = wait_for("the Pod from ECR running", STEP, || async {
        let p = pods.get("from-ecr").await.ok()?;
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
    })
    .await;
    if let Err(e) = running {
        let events = cluster
            .cluster
            .kubectl(&["get", "events", "-A"])
            .unwrap_or_default();
        let kubelet = cluster.nodes()[0].kubelet_log(40);
        anyhow::bail!(
            "{e}\n{events}\n--- kubelet ---\n{kubelet}\n--- registry ---\n{}",
            registry.log()
        );
    }
    registry.check_running()?;
    // The plugin asked moto's ECR for a token (signed for us-east-1, the region of the host).
    let asked = moto.recorded().into_iter().any(|(headers, _)| {
        headers
            .get("x-amz-target")
            .is_some_and(|t| t.ends_with("GetAuthorizationToken"))
    });
    assert!(asked, "no GetAuthorizationToken reached moto");
    // containerd was refused without credentials and let in with them (the registry knows only
    // user AWS with moto's password).
    let log = registry.log();
    let by_containerd =
        |l: &&str| l.contains("useragent=\"containerd/") && l.contains("uri=/v2/app/manifests/1");
    assert!(
        log.lines()
            .filter(by_containerd)
            .any(|l| l.contains("msg=\"authorized request\"")),
        "containerd's manifest request was never authorized:\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("/v2/app/manifests/1 HTTP/1.1\" 200") && l.contains("containerd/")),
        "containerd never got the manifest:\n{log}"
    );
    rcp_e2e::secrets::assert_none_in("the kubelet's log", &cluster.nodes()[0].kubelet_log(10_000));
    println!("ecr: Pod from-ecr Running from {HOST}/app:1, pulled with the plugin's credentials");
    Ok(())
}

/// vSphere's CCM Pods on real kubelets, vcsim's VMs the machines: Nodes found by their guest
/// host names get the VMs' provider IDs, guest addresses and zone and region from the tags; a
/// hand-over between the Pods; a Node whose VM is destroyed is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vsphere_ccm_pods_initialise_kubelet_nodes_and_fail_over() -> Result<()> {
    let started = Instant::now();
    // Installed with its Helm chart; then upgraded and uninstalled with helm.
    let mut up = LocalUp::vsphere_with(4, 2, Deploy::Helm).await?;
    scenario(
        &mut up,
        started,
        |_, _, node| {
            let labels = node.metadata.labels.clone().unwrap_or_default();
            assert_eq!(
                labels.get("topology.kubernetes.io/zone").map(String::as_str),
                Some("zone-a")
            );
            assert_eq!(
                labels.get("topology.kubernetes.io/region").map(String::as_str),
                Some("region-1")
            );
        },
        internal_ip_from_the_cloud,
    )
    .await?;
    // The kubelets pulled the CCM's image from the registry (nothing was imported), with the
    // chart's pull Secret (the registry lets nobody else in).
    let registry = up.registry.as_ref().context("the Helm install uses a registry")?;
    let log = registry.log();
    assert!(
        log.lines().any(|l| l.contains(&format!(
            "/v2/rust-cloud-provider/cloud-controller-manager-vsphere/manifests/{} HTTP/1.1\" 200",
            env!("CARGO_PKG_VERSION")
        )) && l.contains("containerd/")),
        "no pull of the CCM's image in the registry's log:\n{log}"
    );
    // The tag names an image index (the released multi-arch form): containerd then fetched
    // its platform's image manifest by digest.
    assert!(
        log.lines().any(|l| l
            .contains("/v2/rust-cloud-provider/cloud-controller-manager-vsphere/manifests/sha256:")
            && l.contains("HTTP/1.1\" 200")
            && l.contains("containerd/")),
        "containerd never fetched the platform's manifest from the index:\n{log}"
    );

    // `helm upgrade` (the image pinned by digest, one more flag): the DaemonSet rolls its Pod,
    // and the CCM it starts initialises the next Node.
    let client = up.cluster.cluster.client().await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let before = daemonsets.get("cloud-controller-manager").await?;
    let generation = before.metadata.generation.unwrap_or_default();
    // As a user moves to another image — here the released index pinned by its digest — and
    // changes one flag: the rest of the values reused.
    let digest = up
        .image_digest
        .clone()
        .context("the Helm install's image digest")?;
    up.helm_upgrade(
        "vsphere",
        &[
            "--reuse-values",
            "--set",
            &format!("image.digest={digest}"),
            "--set-json",
            r#"args=["--v=3"]"#,
        ],
    )?;
    wait_for("the upgraded DaemonSet rolled out", STEP, || async {
        let ds = daemonsets.get("cloud-controller-manager").await.ok()?;
        let status = ds.status?;
        (ds.metadata.generation.unwrap_or_default() > generation
            && status.observed_generation.unwrap_or_default() >= ds.metadata.generation.unwrap_or_default()
            && status.updated_number_scheduled.unwrap_or_default() >= 1
            && status.number_ready >= 1
            && status.number_unavailable.unwrap_or_default() == 0)
            .then_some(())
    })
    .await
    .with_context(|| up.diagnostics())?;
    let pods = up.ccm_pods_ready(1).await?;
    assert!(
        pods.iter().all(|p| p
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].args.as_ref())
            .is_some_and(|a| a.iter().any(|a| a == "--v=3"))
            && p.spec.as_ref().is_some_and(|s| s.containers[0]
                .image
                .as_deref()
                .is_some_and(|i| i.ends_with(&format!("@{digest}"))))),
        "the CCM Pods run the upgraded DaemonSet (the image by digest, --v=3)"
    );
    up.start_node(3, false).await?;
    let fourth = up.wait_initialised(3).await?;
    println!(
        "vsphere: after helm upgrade, {} initialised (provider ID {:?})",
        up.machines[3].name,
        fourth.spec.as_ref().and_then(|s| s.provider_id.as_deref())
    );

    // `helm uninstall`: the chart's objects are gone (the Nodes stay, as they should).
    println!(
        "$ helm uninstall ccm -n kube-system\n{}",
        up.cluster
            .cluster
            .helm(&["uninstall", "ccm", "--namespace", "kube-system", "--wait"])?
    );
    assert!(daemonsets.get_opt("cloud-controller-manager").await?.is_none());
    let roles: Api<ClusterRole> = Api::all(client.clone());
    assert!(roles.get_opt("system:cloud-controller-manager").await?.is_none());
    let nodes: Api<Node> = Api::all(client);
    assert!(nodes.get_opt(&up.machines[3].name).await?.is_some());
    Ok(())
}
