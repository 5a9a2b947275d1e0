//! A cloud, the real-node cluster ([`crate::kube_node`]) on its machines, and the CCM deployed
//! the way users deploy it: its image (`hack/build-image.sh`) imported into each node, and
//! `kubectl apply -k deploy/<provider>/overlays/local`. What the README's main job
//! (`hack/local-up-cluster.sh`) runs and `tests/tests/real_cluster.rs` tests.

use std::{path::Path, time::Duration};

use anyhow::{Context, Result};
use k8s_cloud_provider::{
    node::helpers::{addresses, has_taint},
    well_known::TAINT_UNINITIALIZED,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, api::ListParams};
use tempfile::TempDir;

use crate::{
    Moto,
    k8s::wait_for,
    kube_node::{Image, NodeOptions, RealCluster},
    moto::World,
    openstack::{Network, OpenStack, Project},
    paths,
    registry::Registry,
    vcsim::{Vcsim, small_model, vm_name},
};

/// How long the cluster may take for each step.
pub const STEP: Duration = Duration::from_secs(120);
/// The label that puts the base's DaemonSet on a Node.
pub const CONTROL_PLANE: &str = "node-role.kubernetes.io/control-plane";

/// A machine of the cloud, for one node.
#[derive(Debug, Clone)]
pub struct Machine {
    /// The Node's name as that cloud names it (EC2's private DNS name, nova's server name).
    pub name: String,
    /// The instance or server ID.
    pub id: String,
    /// Its private IPv4 address.
    pub ip: String,
    /// The provider ID the CCM gives its Node.
    pub provider_id: String,
}

/// The cloud under the cluster.
pub enum Cloud {
    /// moto on 127.0.0.1 as EC2 and ELB.
    Aws {
        /// The server.
        moto: Moto,
        /// Its VPC, subnets and instances.
        world: World,
    },
    /// vcsim on 127.0.0.1 as vCenter, its VMs the machines.
    VSphere {
        /// The simulator.
        vcsim: Vcsim,
    },
    /// The OpenStack of `hack/openstack.sh`, a project of its own.
    OpenStack {
        /// The project (dropped before the handle).
        project: Box<Project>,
        /// Its private network (the servers' and the load balancers' subnet).
        network: Network,
        /// Its external network (floating IPs).
        public: Network,
        /// The shared OpenStack.
        os: OpenStack,
    },
}

/// The running whole: cloud, cluster, and the CCM DaemonSet applied.
pub struct LocalUp {
    // Drop order: the cluster (nodes first) before the cloud.
    /// The real-node cluster.
    pub cluster: RealCluster,
    /// The cloud.
    pub cloud: Cloud,
    /// The cloud's machines, one per node that may be started.
    pub machines: Vec<Machine>,
    provider: &'static str,
    /// The image registry the nodes pull the CCM's image from, when they pull it (otherwise
    /// it is imported into each node's containerd).
    pub registry: Option<Registry>,
    /// The digest of the image index in [`Self::registry`] (what `helm upgrade` may pin).
    pub image_digest: Option<String>,
    _images: TempDir,
}

/// The registry's host name (the nodes resolve it to their 127.0.0.1, forwarded to it).
pub const REGISTRY_HOST: &str = "registry.rcp.test";
/// The account the registry lets in (a docker-registry Secret gives it to the kubelets).
const REGISTRY_USER: &str = "puller";
const REGISTRY_PASSWORD: &str = "rcp-registry-test-password";

impl LocalUp {
    /// moto with a cluster VPC and `machines` instances; the cluster, with a control-plane node
    /// on each of the first `control_plane` instances; the AWS CCM DaemonSet applied.
    pub async fn aws(machines: usize, control_plane: usize) -> Result<Self> {
        Self::aws_with(machines, control_plane, Deploy::Kustomize).await
    }

    /// [`Self::aws`], the CCM installed as `deploy` says.
    pub async fn aws_with(machines: usize, control_plane: usize, deploy: Deploy) -> Result<Self> {
        let images = tempfile::Builder::new().prefix("rcp-images-").tempdir()?;
        let image = ccm_image("aws", images.path())?;
        let moto = Moto::start().await?;
        let world = moto.build_world("local-up", machines).await?;
        let list = world
            .instances
            .iter()
            .map(|i| Machine {
                name: i.private_dns_name.clone(),
                id: i.id.clone(),
                ip: i.private_ip.clone(),
                provider_id: i.provider_id(),
            })
            .collect();
        let (cluster, registry, image_digest) =
            cluster_for(deploy, "aws", image, images.path(), &[moto.port()]).await?;
        let mut up = Self {
            cluster,
            cloud: Cloud::Aws { moto, world },
            machines: list,
            provider: "aws",
            registry,
            image_digest,
            _images: images,
        };
        for i in 0..control_plane {
            up.start_node(i, true).await?;
        }
        let Cloud::Aws { moto, world } = &up.cloud else {
            unreachable!("made above")
        };
        let cloud_conf = moto.cloud_config(world);
        let endpoints = "AWS_EC2_METADATA_DISABLED=true\n";
        let credentials = format!(
            "AWS_ACCESS_KEY_ID=AKIDTEST\nAWS_SECRET_ACCESS_KEY={}\n",
            crate::secrets::AWS_SECRET_ACCESS_KEY
        );
        match deploy {
            Deploy::Kustomize => {
                let files = [
                    ("cloud.conf", cloud_conf),
                    ("endpoints.env", up.endpoints_env(endpoints)),
                    ("credentials.env", credentials),
                ];
                up.cluster.apply_local_overlay("aws", &files)?;
            }
            Deploy::Helm => {
                // On EC2 the credentials come from the instance profile or IRSA; here moto's
                // made-up ones, in a Secret the user makes.
                let mut args = vec![
                    "-n",
                    "kube-system",
                    "create",
                    "secret",
                    "generic",
                    "aws-credentials",
                ];
                let literals: Vec<String> = credentials
                    .lines()
                    .map(|l| format!("--from-literal={l}"))
                    .collect();
                args.extend(literals.iter().map(String::as_str));
                up.cluster.cluster.kubectl(&args)?;
                let values = serde_json::json!({
                    "cloudConfig": {"contents": cloud_conf},
                    "args": ["--cluster-name=local-up"],
                    "useServiceAccountCredentials": true,
                    "envFrom": [
                        {"configMapRef": {"name": "local-endpoints"}},
                        {"secretRef": {"name": "aws-credentials"}},
                    ],
                });
                up.helm_install("aws", endpoints, &values)?;
            }
        }
        Ok(up)
    }

    /// A project of the shared OpenStack with a private network, an external one and a router,
    /// `machines` nova servers; the cluster, with a control-plane node on each of the first
    /// `control_plane` servers; the OpenStack CCM DaemonSet applied.
    pub async fn openstack(machines: usize, control_plane: usize) -> Result<Self> {
        Self::openstack_with(machines, control_plane, Deploy::Kustomize).await
    }

    /// [`Self::openstack`], the CCM installed as `deploy` says.
    pub async fn openstack_with(machines: usize, control_plane: usize, deploy: Deploy) -> Result<Self> {
        let images = tempfile::Builder::new().prefix("rcp-images-").tempdir()?;
        let image = ccm_image("openstack", images.path())?;
        let os = OpenStack::shared().await?;
        let project = os.project("local-up").await?;
        let network = project.network("private", "10.77.0.0/24").await?;
        let public = project.external_network("public", "172.24.77.0/24").await?;
        project.router("edge", &public, &network).await?;
        let mut list = Vec::new();
        for i in 0..machines {
            let name = format!("node-{i}");
            let id = project.server(&name, &network).await?;
            let ip = project.server_ip(&id, "private").await?;
            list.push(Machine {
                provider_id: format!("openstack:///{id}"),
                name,
                id,
                ip,
            });
        }
        // keystone, and this project's region: nova, neutron and Octavia (through the proxies
        // its catalog names).
        let ports = [
            15000,
            project.nova_proxy.port(),
            project.neutron_proxy.port(),
            project.octavia_proxy.port(),
        ];
        let (cluster, registry, image_digest) =
            cluster_for(deploy, "openstack", image, images.path(), &ports).await?;
        let cloud_conf = format!(
            "{}[LoadBalancer]\nsubnet-id = {}\nfloating-network-id = {}\n",
            project.global_section(),
            network.subnet_id,
            public.id
        );
        let mut up = Self {
            cluster,
            cloud: Cloud::OpenStack {
                project: Box::new(project),
                network,
                public,
                os,
            },
            machines: list,
            provider: "openstack",
            registry,
            image_digest,
            _images: images,
        };
        for i in 0..control_plane {
            up.start_node(i, true).await?;
        }
        match deploy {
            Deploy::Kustomize => {
                let files = [
                    ("cloud.conf", cloud_conf),
                    ("endpoints.env", up.endpoints_env("")),
                ];
                up.cluster.apply_local_overlay("openstack", &files)?;
            }
            Deploy::Helm => {
                let values = serde_json::json!({
                    "cloudConfig": {"create": true, "contents": cloud_conf},
                    "envFrom": [{"configMapRef": {"name": "local-endpoints"}}],
                });
                up.helm_install("openstack", "", &values)?;
            }
        }
        Ok(up)
    }

    /// vcsim with `machines` VMs of one cluster (guest host names `node-<i>`, addresses
    /// `10.20.0.<i+10>`; zone and region tags on the cluster and the datacenter); the cluster,
    /// with a control-plane node on each of the first `control_plane` VMs; the vSphere CCM
    /// DaemonSet applied, its vCenter credentials in the Secret its cloud config names.
    pub async fn vsphere(machines: usize, control_plane: usize) -> Result<Self> {
        Self::vsphere_with(machines, control_plane, Deploy::Kustomize).await
    }

    /// [`Self::vsphere`], the CCM installed as `deploy` says.
    pub async fn vsphere_with(machines: usize, control_plane: usize, deploy: Deploy) -> Result<Self> {
        let images = tempfile::Builder::new().prefix("rcp-images-").tempdir()?;
        let image = ccm_image("vsphere", images.path())?;
        let vcsim = Vcsim::start_with(small_model(machines))?;
        vcsim.identify(machines)?;
        vcsim.tag_zone_and_region()?;
        let mut list = Vec::new();
        for i in 0..machines {
            let uuid = vcsim.vm_uuid(&vm_name(i))?;
            list.push(Machine {
                name: format!("node-{i}"),
                ip: format!("10.20.0.{}", i + 10),
                provider_id: format!("vsphere://{uuid}"),
                id: vm_name(i),
            });
        }
        let port: u16 = vcsim
            .host_port()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .context("vcsim's port")?;
        let (cluster, registry, image_digest) =
            cluster_for(deploy, "vsphere", image, images.path(), &[port]).await?;
        let conf = format!(
            "global:\n  port: {port}\n  insecureFlag: true\n  secretName: vsphere-cloud-secret\n  \
             secretNamespace: kube-system\nvcenter:\n  sim:\n    server: 127.0.0.1\n    datacenters:\n    - DC0\n\
             labels:\n  zone: k8s-zone\n  region: k8s-region\n"
        );
        let credentials = format!(
            "127.0.0.1.username={}\n127.0.0.1.password={}\n",
            vcsim.username(),
            vcsim.password()
        );
        let mut up = Self {
            cluster,
            cloud: Cloud::VSphere { vcsim },
            machines: list,
            provider: "vsphere",
            registry,
            image_digest,
            _images: images,
        };
        for i in 0..control_plane {
            up.start_node(i, true).await?;
        }
        match deploy {
            Deploy::Kustomize => {
                let files = [
                    ("vsphere.conf", conf),
                    ("credentials.env", credentials),
                    ("endpoints.env", up.endpoints_env("")),
                ];
                up.cluster.apply_local_overlay("vsphere", &files)?;
            }
            Deploy::Helm => {
                // What a user gives the chart: the image, vsphere.conf and the credentials
                // Secret's keys; the API server's address as the local overlay gives it.
                let data: serde_json::Map<String, serde_json::Value> = credentials
                    .lines()
                    .filter_map(|l| l.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.into()))
                    .collect();
                let values = serde_json::json!({
                    "cloudConfig": {"create": true, "contents": conf},
                    "credentials": {"create": true, "data": data},
                    "useServiceAccountCredentials": true,
                    "envFrom": [{"configMapRef": {"name": "local-endpoints"}}],
                });
                up.helm_install("vsphere", "", &values)?;
            }
        }
        Ok(up)
    }

    /// `helm install ccm charts/<provider>-cloud-controller-manager -n kube-system` with
    /// `values` (and the ConfigMap `local-endpoints` the local overlays make: the API server's
    /// address, as no kube-proxy runs, and the `extra_env` lines). Returns helm's output.
    pub fn helm_install(
        &self,
        provider: &str,
        extra_env: &str,
        values: &serde_json::Value,
    ) -> Result<String> {
        let k = &self.cluster.cluster;
        let endpoints: Vec<String> = self
            .endpoints_env(extra_env)
            .lines()
            .map(|l| format!("--from-literal={l}"))
            .collect();
        let mut args = vec!["-n", "kube-system", "create", "configmap", "local-endpoints"];
        args.extend(endpoints.iter().map(String::as_str));
        k.kubectl(&args)?;
        let mut values = values.clone();
        if self.registry.is_some() {
            // A private registry, as many have: the kubelets pull with a docker-registry
            // Secret the chart names.
            k.kubectl(&[
                "-n",
                "kube-system",
                "create",
                "secret",
                "docker-registry",
                "registry-pull",
                &format!("--docker-server={REGISTRY_HOST}"),
                &format!("--docker-username={REGISTRY_USER}"),
                &format!("--docker-password={REGISTRY_PASSWORD}"),
            ])?;
            values["image"] = serde_json::json!({
                "repository": format!("{REGISTRY_HOST}/rust-cloud-provider/cloud-controller-manager-{provider}"),
                "pullPolicy": "IfNotPresent",
            });
            values["imagePullSecrets"] = serde_json::json!([{"name": "registry-pull"}]);
        }
        self.helm_install_values(provider, &values)
    }

    /// `helm upgrade ccm …` of the release [`Self::helm_install`] made, with `args` (e.g.
    /// `--reuse-values --set …`).
    pub fn helm_upgrade(&self, provider: &str, args: &[&str]) -> Result<String> {
        let chart = paths::workspace_root()
            .join("charts")
            .join(format!("{provider}-cloud-controller-manager"));
        let chart = chart.display().to_string();
        let mut all = vec!["upgrade", "ccm", chart.as_str(), "--namespace", "kube-system"];
        all.extend_from_slice(args);
        let out = self.cluster.cluster.helm(&all)?;
        println!(
            "$ helm upgrade ccm charts/{provider}-cloud-controller-manager -n kube-system {}\n{out}",
            args.join(" ")
        );
        Ok(out)
    }

    fn helm_install_values(&self, provider: &str, values: &serde_json::Value) -> Result<String> {
        let verb = "install";
        let k = &self.cluster.cluster;
        // JSON is YAML: helm reads it as a values file.
        let file = k.dir().join(format!("helm-{verb}-values.yaml"));
        std::fs::write(&file, serde_json::to_string_pretty(values)?)?;
        let chart = paths::workspace_root()
            .join("charts")
            .join(format!("{provider}-cloud-controller-manager"));
        let out = k.helm(&[
            verb,
            "ccm",
            &chart.display().to_string(),
            "--namespace",
            "kube-system",
            "--values",
            &file.display().to_string(),
        ])?;
        println!("$ helm {verb} ccm charts/{provider}-cloud-controller-manager -n kube-system\n{out}");
        Ok(out)
    }

    /// `endpoints.env` of the overlay: the API server on the node's 127.0.0.1, and `extra`.
    fn endpoints_env(&self, extra: &str) -> String {
        let port = self
            .cluster
            .cluster
            .server()
            .rsplit(':')
            .next()
            .unwrap_or_default();
        format!("KUBERNETES_SERVICE_HOST=127.0.0.1\nKUBERNETES_SERVICE_PORT={port}\n{extra}")
    }

    /// Starts a node on machine `i`. A control-plane one is labelled as kubeadm does
    /// (`node-role.kubernetes.io/control-plane=""`) when it is the first machine, and as k3s and
    /// RKE2 do otherwise (`="true"`, tainted `CriticalAddonsOnly=true:NoExecute`): the
    /// DaemonSet must run on both.
    pub async fn start_node(&mut self, i: usize, control_plane: bool) -> Result<()> {
        self.start_node_with(i, control_plane, Vec::new(), Vec::new())
            .await
    }

    /// [`Self::start_node`] with more kubelet flags, and addresses of the node's own that the
    /// cloud does not know (for a `--node-ip` the CCM must refuse).
    pub async fn start_node_with(
        &mut self,
        i: usize,
        control_plane: bool,
        kubelet_args: Vec<String>,
        extra_ips: Vec<String>,
    ) -> Result<()> {
        let m = self.machines.get(i).context("no such machine")?.clone();
        let k3s_style = control_plane && i > 0;
        let mut kubelet_args = kubelet_args;
        if k3s_style {
            kubelet_args.push("--register-with-taints=CriticalAddonsOnly=true:NoExecute".into());
        }
        // A vSphere VM's BIOS UUID is what its kubelet reports as the system UUID.
        let system_uuid = m.provider_id.strip_prefix("vsphere://").map(str::to_string);
        self.cluster
            .start_node(NodeOptions {
                system_uuid,
                name: m.name,
                ip: m.ip,
                labels: if control_plane {
                    let value = if k3s_style { "true" } else { "" };
                    vec![(CONTROL_PLANE.into(), value.into())]
                } else {
                    Vec::new()
                },
                kubelet_args,
                extra_ips,
                hosts: self
                    .registry
                    .iter()
                    .map(|r| (r.host.clone(), "127.0.0.1".to_string()))
                    .collect(),
                registry_cas: self
                    .registry
                    .iter()
                    .map(|r| (r.host.clone(), r.ca_pem.clone()))
                    .collect(),
                ..Default::default()
            })
            .await
    }

    /// Waits until machine `i`'s Node is initialised (no uninitialized taint, addresses) and
    /// Ready, and returns it.
    pub async fn wait_initialised(&mut self, i: usize) -> Result<Node> {
        let name = self.machines[i].name.clone();
        let nodes: Api<Node> = Api::all(self.cluster.cluster.client().await?);
        let node = wait_for(&format!("{name} initialised and Ready"), STEP, || async {
            let n = nodes.get_opt(&name).await.ok()??;
            (!has_taint(&n, TAINT_UNINITIALIZED) && !addresses(&n).is_empty() && node_ready(&n)).then_some(n)
        })
        .await;
        node.with_context(|| self.diagnostics())
    }

    /// Waits until `count` CCM Pods are Running and Ready (the kubelet's HTTPS probes pass).
    pub async fn ccm_pods_ready(&mut self, count: usize) -> Result<Vec<Pod>> {
        let pods: Api<Pod> = Api::namespaced(self.cluster.cluster.client().await?, "kube-system");
        let running = wait_for(&format!("{count} CCM Pods Running and Ready"), STEP, || async {
            let list = ccm_pods(&pods).await;
            (list.len() == count && list.iter().all(pod_ready)).then_some(list)
        })
        .await;
        running.with_context(|| self.diagnostics())
    }

    /// Creates the LoadBalancer Service `default/hello` and waits until it has its load
    /// balancer; returns the ingress host name (AWS) or address (OpenStack).
    pub async fn hello(&mut self) -> Result<String> {
        use k8s_openapi::api::core::v1::Service;
        let services: Api<Service> = Api::namespaced(self.cluster.cluster.client().await?, "default");
        services
            .create(
                &kube::api::PostParams::default(),
                &crate::k8s::load_balancer_service("hello", &[], &[(80, "http")]),
            )
            .await?;
        let served = wait_for(
            "Service hello's load balancer",
            Duration::from_secs(180),
            || async {
                let s = services.get("hello").await.ok()?;
                crate::k8s::ingress_hostname(&s).or_else(|| crate::k8s::ingress_ip(&s))
            },
        )
        .await;
        served.with_context(|| self.diagnostics())
    }

    /// The CCM Pod that says in its log (read with `kubectl logs`) that it leads.
    pub fn leader(&self) -> Result<String> {
        for pod in self.ccm_pod_names()? {
            if self.kubectl_logs(&pod)?.contains("successfully acquired lease") {
                return Ok(pod);
            }
        }
        anyhow::bail!("no CCM Pod says it leads")
    }

    /// The CCM Pods' names.
    pub fn ccm_pod_names(&self) -> Result<Vec<String>> {
        Ok(self
            .cluster
            .cluster
            .kubectl(&[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                "k8s-app=cloud-controller-manager",
                "-o",
                "jsonpath={.items[*].metadata.name}",
            ])?
            .split_whitespace()
            .map(str::to_string)
            .collect())
    }

    /// `kubectl -n kube-system logs <pod>`.
    pub fn kubectl_logs(&self, pod: &str) -> Result<String> {
        self.cluster.cluster.kubectl(&["-n", "kube-system", "logs", pod])
    }

    /// Runs `doctor` in the cluster as docs/prerequisites.md says: a Pod of the CCM's image
    /// with the CCM's ServiceAccount and its cloud config (`volume`, mounted at `/etc/config`),
    /// made with `kubectl run --overrides`; waits for it to end and returns whether it
    /// succeeded (exit code 0: no failed check) and its log. (The API server's address comes
    /// from `local-endpoints`, as no kube-proxy runs here.)
    pub async fn doctor_pod(
        &mut self,
        config_file: &str,
        volume: serde_json::Value,
    ) -> Result<(bool, String)> {
        let k = &self.cluster.cluster;
        let image = k.kubectl(&[
            "-n",
            "kube-system",
            "get",
            "daemonset",
            "cloud-controller-manager",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ])?;
        let mut volume = volume;
        volume["name"] = "cloud-config".into();
        let overrides = serde_json::json!({"spec": {
            "serviceAccountName": "cloud-controller-manager",
            "hostNetwork": true,
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "ccm-doctor",
                "image": image,
                "args": ["doctor", format!("--cloud-config=/etc/config/{config_file}")],
                "envFrom": [{"configMapRef": {"name": "local-endpoints"}}],
                "volumeMounts": [{"name": "cloud-config", "mountPath": "/etc/config", "readOnly": true}],
            }],
            "volumes": [volume],
        }});
        let mut overrides = overrides;
        if self.registry.is_some() {
            // The DaemonSet's pull Secret (the doctor's Pod may land on a Node without the image).
            overrides["spec"]["imagePullSecrets"] = serde_json::json!([{"name": "registry-pull"}]);
        }
        k.kubectl(&[
            "-n",
            "kube-system",
            "run",
            "ccm-doctor",
            "--restart=Never",
            &format!("--image={image}"),
            &format!("--overrides={overrides}"),
        ])?;
        let pods: Api<Pod> = Api::namespaced(k.client().await?, "kube-system");
        let ended = wait_for("the doctor Pod to end", Duration::from_secs(120), || async {
            let phase = pods.get("ccm-doctor").await.ok()?.status?.phase?;
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
        })
        .await;
        let phase = ended.with_context(|| self.diagnostics())?;
        let log = self.kubectl_logs("ccm-doctor")?;
        self.cluster.cluster.kubectl(&[
            "-n",
            "kube-system",
            "delete",
            "pod",
            "ccm-doctor",
            "--wait=false",
        ])?;
        Ok((phase == "Succeeded", log))
    }

    /// The resident memory of each CCM container's process (KiB), found by the node cgroups.
    pub fn ccm_rss_kib(&mut self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let nodes: Vec<(String, u32)> = self
            .cluster
            .nodes()
            .iter()
            .filter_map(|n| n.pid().map(|p| (n.name.clone(), p)))
            .collect();
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return out;
        };
        for p in procs.flatten() {
            let path = p.path();
            let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            if !comm.starts_with("cloud-controlle") {
                continue;
            }
            let cgroup = std::fs::read_to_string(path.join("cgroup")).unwrap_or_default();
            let Some((node, _)) = nodes
                .iter()
                .find(|(_, pid)| cgroup.contains(&format!("/rcp-node-{pid}/kubepods")))
            else {
                continue;
            };
            let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
            if let Some(kib) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
            {
                out.push((node.clone(), kib));
            }
        }
        out
    }

    /// What to look at when the cluster does not do what was expected: Nodes, Pods, events,
    /// the CCM Pods' logs and the kubelets' logs.
    pub fn diagnostics(&mut self) -> String {
        let mut out = String::new();
        // The CCM Pods' logs read on their nodes, for when the API server cannot reach a
        // kubelet (a Node without an InternalIP yet: the CCM had not initialised it).
        let pods = self.ccm_pod_names().unwrap_or_default();
        let mut node_logs = String::new();
        for node in self.cluster.nodes() {
            for pod in &pods {
                let logs = node.container_logs("kube-system", pod, 40);
                if !logs.is_empty() {
                    node_logs.push_str(&format!(
                        "--- {pod} on {} (its /var/log/pods) ---\n{logs}\n",
                        node.name
                    ));
                }
            }
        }
        let kubectl = |args: &[&str]| {
            self.cluster
                .cluster
                .kubectl(args)
                .unwrap_or_else(|e| e.to_string())
        };
        for args in [
            &["get", "nodes", "-o", "wide"][..],
            &["-n", "kube-system", "get", "pods", "-o", "wide"],
            &["get", "events", "-A"],
        ] {
            out.push_str(&format!("$ kubectl {}\n{}\n", args.join(" "), kubectl(args)));
        }
        for pod in self.ccm_pod_names().unwrap_or_default() {
            out.push_str(&format!(
                "$ kubectl -n kube-system logs {pod} --tail=40\n{}\n",
                kubectl(&["-n", "kube-system", "logs", &pod, "--tail=40"])
            ));
        }
        out.push_str(&node_logs);
        for node in self.cluster.nodes() {
            out.push_str(&format!(
                "--- kubelet {} ---\n{}\n",
                node.name,
                node.kubelet_log(25)
            ));
        }
        out
    }

    /// The provider (`aws`, `openstack`, `vsphere`).
    pub fn provider(&self) -> &str {
        self.provider
    }
}

/// `hack/build-image.sh --profile dev <provider>` into `dir`; the image to import.
pub fn ccm_image(provider: &str, dir: &Path) -> Result<Image> {
    image_script("build-image.sh", &[], provider, dir)?;
    Ok(Image {
        archive: dir.join(format!("cloud-controller-manager-{provider}.oci.tar")),
        name: format!("rcp.local/cloud-controller-manager-{provider}"),
    })
}

/// Runs `hack/<script> --profile <profile> <args> --out <dir> <provider>`. The tests' image is
/// the dev build (quick to build); `hack/local-up-cluster.sh` runs the release build, as users
/// do (RCP_IMAGE_PROFILE=release).
fn image_script(script: &str, args: &[&str], provider: &str, dir: &Path) -> Result<()> {
    let profile = std::env::var("RCP_IMAGE_PROFILE").unwrap_or_else(|_| "dev".into());
    let out = std::process::Command::new("bash")
        .arg(paths::workspace_root().join("hack").join(script))
        .args(["--profile", &profile])
        .args(args)
        .arg("--out")
        .arg(dir)
        .arg(provider)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "hack/{script} {provider}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `hack/release-image.sh --profile <RCP_IMAGE_PROFILE or dev> --arches amd64` of the
/// provider into `dir`: the multi-arch image's OCI archive (an image index).
pub fn release_image_index(provider: &str, dir: &Path) -> Result<std::path::PathBuf> {
    image_script("release-image.sh", &["--arches", "amd64"], provider, dir)?;
    Ok(dir.join(format!("release/cloud-controller-manager-{provider}.oci.tar")))
}

/// The real-node cluster for `deploy`: with helm, its kubelets pull the CCM's image as
/// released — an OCI image index ([`release_image_index`]) in a private registry (returned,
/// with the index's digest), resolved by containerd to its platform; with kustomize, `image`
/// is imported into each node's containerd.
async fn cluster_for(
    deploy: Deploy,
    provider: &str,
    image: Image,
    images: &Path,
    cloud_ports: &[u16],
) -> Result<(RealCluster, Option<Registry>, Option<String>)> {
    if deploy == Deploy::Kustomize {
        return Ok((RealCluster::start(vec![image], cloud_ports).await?, None, None));
    }
    let registry = Registry::start(REGISTRY_HOST, REGISTRY_USER, REGISTRY_PASSWORD).await?;
    let release = release_image_index(provider, images)?;
    registry
        .push_oci_archive(
            &release,
            &format!("rust-cloud-provider/cloud-controller-manager-{provider}"),
            env!("CARGO_PKG_VERSION"),
            REGISTRY_USER,
            REGISTRY_PASSWORD,
        )
        .await?;
    let layout = images.join(format!("release/cloud-controller-manager-{provider}/index.json"));
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(&layout)?)?;
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .context("the release layout names no index")?
        .to_string();
    let mut cluster = RealCluster::start(vec![], cloud_ports).await?;
    cluster.forward(443, registry.port);
    Ok((cluster, Some(registry), Some(digest)))
}

/// How the CCM is installed on the real-node cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deploy {
    /// `kubectl apply -k deploy/<provider>/overlays/local`.
    Kustomize,
    /// `helm install` of `charts/<provider>-cloud-controller-manager`.
    Helm,
}

/// Whether the Node's `Ready` condition is true.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the Pod's `Ready` condition is true.
pub fn pod_ready(pod: &Pod) -> bool {
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
