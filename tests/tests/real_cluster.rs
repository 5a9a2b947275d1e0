//! The CCM the way users run it: Nodes registered by real kubelets (containerd + runc), the CCM
//! as a DaemonSet Pod of its own image (`hack/build-image.sh`), deployed with `kubectl apply -k`
//! from `deploy/<provider>/overlays/local` (the shipped base; only image, cloud config and
//! endpoints differ from the example overlay), with the ServiceAccount token the kubelet mounts
//! and the probes the kubelet sends.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_cloud_provider::{
    node::helpers::{addresses, has_taint},
    well_known::TAINT_UNINITIALIZED,
};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use rcp_e2e::{
    Moto,
    k8s::{ingress_hostname, load_balancer_service, wait_for},
    kube_node::{Image, NodeOptions, RealCluster},
    paths,
};

const T: Duration = Duration::from_secs(120);
const CONTROL_PLANE: &str = "node-role.kubernetes.io/control-plane";

/// `hack/build-image.sh --profile dev <provider>` into a directory of this test run; returns the
/// image to import.
fn ccm_image(provider: &str, dir: &std::path::Path) -> Result<Image> {
    let out = std::process::Command::new("bash")
        .arg(paths::workspace_root().join("hack/build-image.sh"))
        .args(["--profile", "dev", "--out"])
        .arg(dir)
        .arg(provider)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "hack/build-image.sh {provider}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(Image {
        archive: dir.join(format!("cloud-controller-manager-{provider}.oci.tar")),
        name: format!("rcp.local/cloud-controller-manager-{provider}"),
    })
}

fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn ccm_pods(pods: &Api<Pod>) -> Vec<Pod> {
    pods.list(&ListParams::default().labels("k8s-app=cloud-controller-manager"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// Nodes registered by two kubelets are initialised by the AWS CCM running as a Pod on each
/// (one leads), a LoadBalancer Service gets its ELB and loses it on deletion, the Pods' logs
/// hold no secret, and when the leading Pod is deleted the other one initialises the next Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_ccm_pods_initialise_kubelet_nodes_serve_a_load_balancer_and_fail_over() -> Result<()> {
    let t0 = Instant::now();
    let moto = Moto::start().await?;
    let world = moto.build_world("local-up", 3).await?;
    let images = tempfile::Builder::new().prefix("rcp-images-").tempdir()?;
    let image = ccm_image("aws", images.path())?;
    let moto_port: u16 = moto.endpoint().rsplit(':').next().and_then(|p| p.parse().ok()).context("moto's port")?;
    let mut cluster = RealCluster::start(vec![image], &[moto_port]).await?;
    for instance in &world.instances[..2] {
        cluster
            .start_node(NodeOptions {
                name: instance.private_dns_name.clone(),
                ip: instance.private_ip.clone(),
                labels: vec![(CONTROL_PLANE.into(), String::new())],
                ..Default::default()
            })
            .await?;
    }
    let server_port = cluster.cluster.server().rsplit(':').next().unwrap_or_default().to_string();
    cluster.apply_local_overlay(
        "aws",
        &[
            ("cloud.conf", moto.cloud_config(&world)),
            (
                "endpoints.env",
                format!("KUBERNETES_SERVICE_HOST=127.0.0.1\nKUBERNETES_SERVICE_PORT={server_port}\nAWS_EC2_METADATA_DISABLED=true\n"),
            ),
            (
                "credentials.env",
                format!(
                    "AWS_ACCESS_KEY_ID=AKIDTEST\nAWS_SECRET_ACCESS_KEY={}\n",
                    rcp_e2e::secrets::AWS_SECRET_ACCESS_KEY
                ),
            ),
        ],
    )?;
    let client = cluster.cluster.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");

    // Both Nodes initialised by the CCM Pod and Ready with the bridge CNI.
    for instance in &world.instances[..2] {
        let name = &instance.private_dns_name;
        let node = wait_for(&format!("{name} initialised and Ready"), T, || async {
            let n = nodes.get_opt(name).await.ok()??;
            (!has_taint(&n, TAINT_UNINITIALIZED) && !addresses(&n).is_empty() && ready(&n)).then_some(n)
        })
        .await
        .with_context(|| diagnostics(&mut cluster))?;
        let spec = node.spec.clone().unwrap_or_default();
        assert_eq!(
            spec.provider_id.as_deref(),
            Some(instance.provider_id().as_str())
        );
        let labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("topology.kubernetes.io/zone"), Some(&instance.zone));
        assert_eq!(labels.get("topology.kubernetes.io/region"), Some(&"us-east-1".to_string()));
        assert_eq!(labels.get("node.kubernetes.io/instance-type"), Some(&instance.instance_type));
        assert!(
            addresses(&node)
                .iter()
                .any(|a| a.type_ == "InternalIP" && a.address == instance.private_ip),
            "{:?}",
            addresses(&node)
        );
        assert!(spec.pod_cidr.is_some(), "kube-controller-manager allocated a Pod CIDR");
    }
    // One CCM Pod per control-plane Node, Running and Ready (the kubelet's HTTPS probes pass).
    let running = wait_for("two CCM Pods Running and Ready", T, || async {
        let list = ccm_pods(&pods).await;
        (list.len() == 2 && list.iter().all(pod_ready)).then_some(list)
    })
    .await
    .with_context(|| diagnostics(&mut cluster))?;
    println!("real cluster with the CCM Pods Ready after {:.1?}", t0.elapsed());
    println!("{}", cluster.cluster.kubectl(&["get", "nodes", "-o", "wide"])?);
    println!("{}", cluster.cluster.kubectl(&["-n", "kube-system", "get", "pods", "-o", "wide"])?);
    for pod in &running {
        let spec = pod.spec.clone().unwrap_or_default();
        assert_eq!(spec.service_account_name.as_deref(), Some("cloud-controller-manager"));
        assert_eq!(spec.host_network, Some(true));
    }

    // A LoadBalancer Service gets its ELB; deleting it removes the ELB and the finalizer.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(&PostParams::default(), &load_balancer_service("hello", &[], &[(80, "http")]))
        .await?;
    let hostname = wait_for("Service hello's load balancer", T, || async {
        ingress_hostname(&services.get("hello").await.ok()?)
    })
    .await
    .with_context(|| diagnostics(&mut cluster))?;
    println!("{}", cluster.cluster.kubectl(&["get", "service", "hello"])?);
    assert_eq!(classic_load_balancers(&moto).await?, 1, "{hostname}");
    services.delete("hello", &DeleteParams::default()).await?;
    wait_for("Service hello gone with its load balancer", T, || async {
        let gone = services.get_opt("hello").await.ok()?.is_none();
        let lbs = classic_load_balancers(&moto).await.ok()?;
        (gone && lbs == 0).then_some(())
    })
    .await?;

    // `kubectl logs` (the API server reaching each kubelet by the Node's host name): the CCM's
    // own lines, plain text, no secret.
    let mut leader = None;
    for pod in &running {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let log = cluster.cluster.kubectl(&["-n", "kube-system", "logs", &name])?;
        assert!(log.contains("starting cloud-controller-manager"), "{name}: {log}");
        assert!(!log.contains('\u{1b}'), "terminal escapes in kubectl logs of {name}");
        rcp_e2e::secrets::assert_none_in(&format!("kubectl logs {name}"), &log);
        if log.contains("successfully acquired lease") {
            leader = Some(name);
        }
    }
    let leader = leader.context("no CCM Pod says it leads")?;

    // Fail-over: the leading Pod deleted, the other one initialises the next Node.
    let deleted = Instant::now();
    pods.delete(&leader, &DeleteParams::default().grace_period(0)).await?;
    let third = &world.instances[2];
    cluster
        .start_node(NodeOptions {
            name: third.private_dns_name.clone(),
            ip: third.private_ip.clone(),
            ..Default::default()
        })
        .await?;
    wait_for("the third Node initialised by the other CCM Pod", T, || async {
        let n = nodes.get_opt(&third.private_dns_name).await.ok()??;
        (!has_taint(&n, TAINT_UNINITIALIZED)).then_some(())
    })
    .await
    .with_context(|| diagnostics(&mut cluster))?;
    println!(
        "fail-over: leading CCM Pod {leader} deleted; the next Node initialised {:.1?} later",
        deleted.elapsed()
    );

    // A Node whose kubelet stopped and whose instance is terminated is deleted by the CCM.
    let first = &world.instances[0];
    cluster.node(&first.private_dns_name)?.stop();
    moto.ec2()
        .terminate_instances()
        .instance_ids(&first.id)
        .send()
        .await?;
    wait_for("the terminated instance's Node deleted", T, || async {
        nodes
            .get_opt(&first.private_dns_name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await
    .with_context(|| diagnostics(&mut cluster))?;
    Ok(())
}

async fn classic_load_balancers(moto: &Moto) -> Result<usize> {
    Ok(moto
        .elb()
        .describe_load_balancers()
        .send()
        .await?
        .load_balancer_descriptions()
        .len())
}

/// What to look at when the cluster does not do what was expected.
fn diagnostics(cluster: &mut RealCluster) -> String {
    let mut out = String::new();
    for args in [
        &["get", "nodes", "-o", "wide"][..],
        &["-n", "kube-system", "get", "pods", "-o", "wide"],
        &["get", "events", "-A"],
    ] {
        out.push_str(&format!(
            "$ kubectl {}\n{}\n",
            args.join(" "),
            cluster.cluster.kubectl(args).unwrap_or_else(|e| e.to_string())
        ));
    }
    if let Ok(pods) = cluster
        .cluster
        .kubectl(&["-n", "kube-system", "get", "pods", "-o", "name"])
    {
        for pod in pods.lines() {
            out.push_str(&format!(
                "$ kubectl logs {pod}\n{}\n",
                cluster
                    .cluster
                    .kubectl(&["-n", "kube-system", "logs", pod, "--tail=40"])
                    .unwrap_or_else(|e| e.to_string())
            ));
        }
    }
    for node in cluster.nodes() {
        out.push_str(&format!("--- kubelet {} ---\n{}\n", node.name, node.kubelet_log(25)));
    }
    out
}
