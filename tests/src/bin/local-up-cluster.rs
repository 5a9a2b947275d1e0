//! The project's main job (`hack/local-up-cluster.sh`): a local Kubernetes cluster (the version hack/kube/go.mod pins)
//! with real nodes — etcd, kube-apiserver, kube-controller-manager and kube-scheduler on
//! 127.0.0.1, and two kubelets with containerd, each in network and mount namespaces of its own
//! holding its cloud machine's address — on an emulated AWS (moto: a cluster VPC and three
//! instances), with `--provider openstack` the real OpenStack of `hack/openstack.sh` (three
//! nova servers), or with `--provider vsphere` vcsim (three VMs). The CCM runs as users run it: a DaemonSet Pod of its own image
//! (`hack/build-image.sh`) on each control-plane Node, applied with
//! `kubectl apply -k deploy/<provider>/overlays/local`. It initialises the kubelets' Nodes, and a
//! `type: LoadBalancer` Service `hello` gets its load balancer (not on vSphere). Prints what a user would look at,
//! then keeps running until Ctrl-C and cleans up. See `rcp_e2e::local_up`.

use std::time::Instant;

use anyhow::Result;
use rcp_e2e::local_up::{Cloud, LocalUp};

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
    let started = Instant::now();
    let kube = rcp_e2e::paths::kubernetes_version();
    let mut up = match provider.as_str() {
        "aws" => {
            println!(
                "local-up-cluster: moto (EC2/ELB) with a cluster VPC and 3 instances; etcd, kube-apiserver, kube-controller-manager, kube-scheduler {kube}; 2 kubelets with containerd; the CCM image …"
            );
            LocalUp::aws(3, 2).await?
        }
        "openstack" => {
            println!(
                "local-up-cluster: the OpenStack of hack/openstack.sh (started if needed), a project with 3 nova servers; etcd, kube-apiserver, kube-controller-manager, kube-scheduler {kube}; 2 kubelets with containerd; the CCM image …"
            );
            LocalUp::openstack(3, 2).await?
        }
        "vsphere" => {
            println!(
                "local-up-cluster: vcsim (vCenter) with 3 VMs; etcd, kube-apiserver, kube-controller-manager, kube-scheduler {kube}; 2 kubelets with containerd; the CCM image …"
            );
            LocalUp::vsphere(3, 2).await?
        }
        other => {
            anyhow::bail!("--provider {other:?}: this demo runs aws (the default), openstack or vsphere")
        }
    };
    println!("local-up-cluster: machines:");
    for m in &up.machines {
        println!("    {}  {}  {}", m.id, m.name, m.ip);
    }
    println!(
        "local-up-cluster: applied deploy/{}/overlays/local (kubectl apply -k); waiting for the CCM Pods to initialise the kubelets' Nodes …",
        up.provider()
    );
    up.wait_initialised(0).await?;
    up.wait_initialised(1).await?;
    up.ccm_pods_ready(2).await?;
    println!(
        "local-up-cluster: cluster up, Nodes initialised and the CCM Pods Ready in {:.1?}",
        started.elapsed()
    );
    let kubectl = |args: &[&str]| up.cluster.cluster.kubectl(args);
    println!(
        "\n$ kubectl get nodes -o wide -L topology.kubernetes.io/zone,node.kubernetes.io/instance-type\n{}",
        kubectl(&[
            "get",
            "nodes",
            "-o",
            "wide",
            "-L",
            "topology.kubernetes.io/zone,node.kubernetes.io/instance-type"
        ])?
    );
    println!(
        "$ kubectl get nodes -o custom-columns=NAME:.metadata.name,PROVIDER-ID:.spec.providerID,TAINTS:.spec.taints[*].key\n{}",
        kubectl(&[
            "get",
            "nodes",
            "-o",
            "custom-columns=NAME:.metadata.name,PROVIDER-ID:.spec.providerID,TAINTS:.spec.taints[*].key"
        ])?
    );
    println!(
        "$ kubectl -n kube-system get pods -o wide\n{}",
        kubectl(&["-n", "kube-system", "get", "pods", "-o", "wide"])?
    );

    if !matches!(up.cloud, Cloud::VSphere { .. }) {
        println!(
            "local-up-cluster: creating the LoadBalancer Service default/hello; waiting for its load balancer …"
        );
        up.hello().await?;
        println!(
            "\n$ kubectl get service hello\n{}",
            up.cluster.cluster.kubectl(&["get", "service", "hello"])?
        );
    }
    for (node, kib) in up.ccm_rss_kib() {
        println!(
            "local-up-cluster: CCM container on {node}: RSS {:.1} MiB",
            kib as f64 / 1024.0
        );
    }

    println!("\nlocal-up-cluster: running. Try:");
    println!(
        "    export KUBECONFIG={}",
        up.cluster.cluster.kubeconfig_path().display()
    );
    println!(
        "    kubectl get nodes -o wide; kubectl -n kube-system get pods; kubectl -n kube-system logs -l k8s-app=cloud-controller-manager"
    );
    println!(
        "  logs: {} (kube-*.log; node-*/kubelet.log, node-*/containerd.log)",
        up.cluster.dir().display()
    );
    if let Cloud::OpenStack { os, .. } = &up.cloud {
        println!(
            "  OpenStack: keystone http://127.0.0.1:15000/v3, logs in {}/logs (it keeps running: hack/openstack.sh stop)",
            os.run_dir.display()
        );
    }
    println!("local-up-cluster: press Ctrl-C to stop and clean up.");
    if std::env::var_os("LOCAL_UP_EXIT_AFTER_START").is_some() {
        return Ok(());
    }
    tokio::signal::ctrl_c().await?;
    println!("\nlocal-up-cluster: stopping the kubelets (and their Pods), the control plane and the cloud …");
    drop(up);
    println!("local-up-cluster: cleaned up.");
    Ok(())
}
