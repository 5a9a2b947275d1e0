//! A real-node cluster: etcd, kube-apiserver, kube-controller-manager and kube-scheduler
//! (the version hack/kube/go.mod pins), and nodes that are a real kubelet with containerd and runc each
//! (`hack/lib/kube-node.sh`), all on 127.0.0.1 or in namespaces made here.
//!
//! - Identities: kubelets, kube-controller-manager and kube-scheduler use client certificates of
//!   a CA made here (`system:node:<name>` in `system:nodes`, `system:kube-controller-manager`,
//!   `system:kube-scheduler`), with the Node and RBAC authorizers as in a kubeadm cluster.
//!   kube-controller-manager signs ServiceAccount tokens (its token controller) and runs every
//!   controller but the cloud ones (`--cloud-provider=external`).
//! - Network: each node is a network namespace of its own holding the cloud's address for its
//!   machine (a moto instance's or a nova server's private IP), like a machine of its own: the
//!   kubelet, the Pods with host networking (the CCM) and their probes answer there, and the API
//!   server reaches the kubelet (logs, exec) at the Node's `InternalIP` through a veth pair whose
//!   host end routes that one address (`/32`). Nothing in a node can reach any other address:
//!   what it dials (the API server, the cloud's endpoints) it dials on its own 127.0.0.1, where
//!   this process forwards each such port to the host's 127.0.0.1. Two clusters whose machines
//!   have the same address cannot run at once (the second one's route is refused).
//! - Pod networking: containerd renders a bridge CNI configuration for the Node's Pod CIDR
//!   (allocated by kube-controller-manager), inside the node's namespace.
//! - Images are never pulled: the sandbox image is built from the Kubernetes tree's pause program
//!   (`hack/lib/pause-image.sh`) and every image a test adds is imported into each node's
//!   containerd before its kubelet starts.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::{
    TestCluster,
    certs::ClientCa,
    k8s::wait_for,
    paths,
    process::{ManagedProcess, free_port},
};

/// An OCI archive to import into every node's containerd, tagged `name:<its tag>`.
#[derive(Debug, Clone)]
pub struct Image {
    /// The OCI archive (e.g. `hack/build-image.sh`'s `<binary>.oci.tar`).
    pub archive: PathBuf,
    /// The name it gets (e.g. `rcp.local/cloud-controller-manager-aws`).
    pub name: String,
}

/// How a node registers.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// The Node's name (`--hostname-override`): as the cloud names the machine.
    pub name: String,
    /// The machine's private IPv4 address in the cloud: the node's address.
    pub ip: String,
    /// `--provider-id`, when the cloud cannot find the machine by name.
    pub provider_id: Option<String>,
    /// Labels the Node gets once registered (a kubelet may not set `node-role.…` on itself).
    pub labels: Vec<(String, String)>,
    /// More addresses of the node's interface, which the cloud does not know (a kubelet's
    /// `--node-ip` must be one of the node's own addresses).
    pub extra_ips: Vec<String>,
    /// The machine's UUID as the kubelet reports it (`status.nodeInfo.systemUUID`; a VM's BIOS
    /// UUID). This kind of machine has no DMI data, so the kubelet reports `/etc/machine-id`:
    /// the node gets its own file there.
    pub system_uuid: Option<String>,
    /// More kubelet flags.
    pub kubelet_args: Vec<String>,
    /// Host names the node resolves to addresses of its own choosing (`/etc/hosts` entries).
    pub hosts: Vec<(String, String)>,
    /// Registries containerd trusts by their CA: (host, CA PEM).
    pub registry_cas: Vec<(String, String)>,
}

/// One node: the `hack/lib/kube-node.sh` process (containerd + kubelet) and its directory.
pub struct KubeNode {
    /// The Node's name.
    pub name: String,
    /// The node's directory (logs: `kubelet.log`, `containerd.log`).
    pub dir: PathBuf,
    /// The node's address.
    pub ip: String,
    process: Option<ManagedProcess>,
    forwarders: Vec<tokio::task::JoinHandle<()>>,
}

impl KubeNode {
    /// The last `n` lines of the kubelet's log.
    pub fn kubelet_log(&self, n: usize) -> String {
        crate::process::tail(&self.dir.join("kubelet.log"), n)
    }

    /// The last `n` lines of the logs of this node's containers of `namespace/pod` (from the
    /// node's `/var/log/pods`, readable when the API server cannot reach the kubelet: a Node
    /// without an InternalIP yet, before the CCM gave it one).
    pub fn container_logs(&self, namespace: &str, pod: &str, n: usize) -> String {
        let pods = self.dir.join("log").join("pods");
        let mut out = String::new();
        for dir in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
            let name = dir.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&format!("{namespace}_{pod}_")) {
                continue;
            }
            for container in std::fs::read_dir(dir.path()).into_iter().flatten().flatten() {
                for file in std::fs::read_dir(container.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    out.push_str(&crate::process::tail(&file.path(), n));
                }
            }
        }
        out
    }

    /// The pid of the node's script (its cgroups are `/rcp-node-<pid>`), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.pid())
    }

    /// Whether the node's processes still run.
    pub fn is_running(&mut self) -> bool {
        self.process.as_mut().is_some_and(|p| p.check_running().is_ok())
    }

    /// Stops kubelet and containerd and everything they ran (the Node object stays).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop();
        }
        for f in self.forwarders.drain(..) {
            f.abort();
        }
    }
}

/// The real-node cluster. Dropping it stops the nodes first, then the control plane.
pub struct RealCluster {
    // Drop order: nodes, then the controllers, then the API server and etcd.
    nodes: Vec<KubeNode>,
    scheduler: ManagedProcess,
    kcm: ManagedProcess,
    /// The API server and etcd (admin kubeconfig, kubectl).
    pub cluster: TestCluster,
    ca: ClientCa,
    images: Vec<Image>,
    forwarded_ports: Vec<(u16, u16)>,
    cluster_cidr: String,
    dir: TempDir,
}

impl RealCluster {
    /// Starts the control plane (no node yet). `images` are imported into every node started
    /// later, with the sandbox image; `cloud_ports` (and the API server's) are forwarded from
    /// each node's 127.0.0.1 to the host's.
    pub async fn start(images: Vec<Image>, cloud_ports: &[u16]) -> Result<Self> {
        Self::start_with(images, cloud_ports, true).await
    }

    /// As [`RealCluster::start`]; `kcm_allocates_node_cidrs = false` leaves the Nodes' Pod
    /// CIDRs to someone else (a CCM's node IPAM controller): kube-controller-manager runs with
    /// `--allocate-node-cidrs=false`, and a node's Pods start only once its Node has one.
    pub async fn start_with(
        images: Vec<Image>,
        cloud_ports: &[u16],
        kcm_allocates_node_cidrs: bool,
    ) -> Result<Self> {
        crate::init();
        let dir = tempfile::Builder::new().prefix("rcp-real-cluster-").tempdir()?;
        let d = dir.path().to_path_buf();
        let ca = ClientCa::new("rcp-real-cluster-ca")?;
        std::fs::write(d.join("client-ca.pem"), &ca.pem)?;
        let cluster = TestCluster::start_with(&[
            &format!("--client-ca-file={}", d.join("client-ca.pem").display()),
            "--authorization-mode=Node,RBAC",
            // Never a name: resolving one would ask the machine's DNS server.
            "--kubelet-preferred-address-types=InternalIP",
        ])
        .await?;
        let cluster_cidr = "10.244.0.0/16".to_string();
        let apiserver_port: u16 = cluster
            .server()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .context("the API server's port")?;
        let mut forwarded_ports = vec![(apiserver_port, apiserver_port)];
        forwarded_ports.extend(cloud_ports.iter().map(|p| (*p, *p)));

        let kcm_kubeconfig = write_cert_kubeconfig(
            &cluster,
            &ca,
            &d,
            "kube-controller-manager",
            "system:kube-controller-manager",
            &[],
        )?;
        let kcm = ManagedProcess::spawn(
            "kube-controller-manager",
            &paths::test_bin("kube-controller-manager")?,
            &[
                format!("--kubeconfig={}", kcm_kubeconfig.display()),
                format!("--authentication-kubeconfig={}", kcm_kubeconfig.display()),
                format!("--authorization-kubeconfig={}", kcm_kubeconfig.display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()),
                "--leader-elect=false".into(),
                // Current releases run no cloud loop of their own (they are the CCM's).
                "--cloud-provider=external".into(),
                "--use-service-account-credentials=true".into(),
                format!(
                    "--service-account-private-key-file={}",
                    cluster.service_account_key().display()
                ),
                format!("--root-ca-file={}", cluster.serving_cert().display()),
                format!("--allocate-node-cidrs={kcm_allocates_node_cidrs}"),
                format!("--cluster-cidr={cluster_cidr}"),
                "--node-cidr-mask-size=24".into(),
                "--configure-cloud-routes=false".into(),
                "--v=1".into(),
            ],
            &[],
            &d.join("kube-controller-manager.log"),
            Signal::SIGTERM,
        )?;
        let scheduler_kubeconfig =
            write_cert_kubeconfig(&cluster, &ca, &d, "kube-scheduler", "system:kube-scheduler", &[])?;
        let scheduler = ManagedProcess::spawn(
            "kube-scheduler",
            &paths::test_bin("kube-scheduler")?,
            &[
                format!("--kubeconfig={}", scheduler_kubeconfig.display()),
                format!("--authentication-kubeconfig={}", scheduler_kubeconfig.display()),
                format!("--authorization-kubeconfig={}", scheduler_kubeconfig.display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()),
                "--leader-elect=false".into(),
                "--v=1".into(),
            ],
            &[],
            &d.join("kube-scheduler.log"),
            Signal::SIGTERM,
        )?;

        let pause = d.join("pause.oci.tar");
        run(std::process::Command::new("bash")
            .arg(paths::workspace_root().join("hack/lib/pause-image.sh"))
            .arg(paths::test_bin("pause")?)
            .arg(&pause))
        .context("building the pause image (hack/lib/pause-image.sh)")?;
        let mut all_images = vec![Image {
            archive: pause,
            name: "rcp.local/pause".into(),
        }];
        all_images.extend(images);
        Ok(Self {
            nodes: Vec::new(),
            scheduler,
            kcm,
            cluster,
            ca,
            images: all_images,
            forwarded_ports,
            cluster_cidr,
            dir,
        })
    }

    /// Nodes started from now on forward their 127.0.0.1:`inside` to the host's
    /// 127.0.0.1:`outside` (e.g. a registry's 443 to the port it listens on).
    pub fn forward(&mut self, inside: u16, outside: u16) {
        self.forwarded_ports.push((inside, outside));
    }

    /// The sandbox (pause) image's OCI archive (tag 3.4.1).
    pub fn pause_archive(&self) -> &Path {
        &self.images[0].archive
    }

    /// The Pod CIDR the Nodes' CIDRs are allocated from.
    pub fn cluster_cidr(&self) -> &str {
        &self.cluster_cidr
    }

    /// The directory holding the control plane's logs and every node's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts a node (containerd + kubelet `--cloud-provider=external`) and waits until its
    /// Node is registered (tainted uninitialized, as the CCM finds it), then labels it.
    pub async fn start_node(&mut self, options: NodeOptions) -> Result<()> {
        let name = options.name.clone();
        let index = self.nodes.len();
        let dir = self.dir.path().join(format!("node-{index}"));
        std::fs::create_dir_all(&dir)?;
        write_cert_kubeconfig(
            &self.cluster,
            &self.ca,
            &dir,
            "kubelet",
            &format!("system:node:{name}"),
            &["system:nodes"],
        )?;
        std::fs::write(
            dir.join("kubelet.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\n\
             kind: KubeletConfiguration\n\
             cgroupDriver: cgroupfs\n\
             # This kind of machine has cgroup v1 hierarchies only (kubelet >= 1.35 refuses them\n\
             # unless told otherwise).\n\
             failCgroupV1: false\n\
             failSwapOn: false\n\
             makeIPTablesUtilChains: false\n\
             readOnlyPort: 0\n\
             # Only the API server reaches a kubelet here (its namespace routes one address).\n\
             authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\n\
             authorization:\n  mode: AlwaysAllow\n\
             # A CI machine's disk is shared and may be fuller than kubelet's default limits:\n\
             # no eviction and no image garbage collection (the images are imported, not pulled).\n\
             evictionHard:\n  memory.available: \"1Mi\"\n  nodefs.available: \"0%\"\n  nodefs.inodesFree: \"0%\"\n  imagefs.available: \"0%\"\n\
             imageGCHighThresholdPercent: 100\n\
             imageGCLowThresholdPercent: 99\n\
             nodeStatusUpdateFrequency: 4s\n",
        )?;
        let mut args = vec![
            format!("--hostname-override={name}"),
            "--cloud-provider=external".to_string(),
            "--v=1".to_string(),
        ];
        if let Some(pid) = &options.provider_id {
            args.push(format!("--provider-id={pid}"));
        }
        args.extend(options.kubelet_args.iter().cloned());
        if !options.hosts.is_empty() {
            let mut hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
            for (name, ip) in &options.hosts {
                hosts.push_str(&format!("{ip} {name}\n"));
            }
            std::fs::write(dir.join("hosts"), hosts)?;
        }
        let mut cas = String::new();
        for (i, (host, pem)) in options.registry_cas.iter().enumerate() {
            let file = dir.join(format!("registry-ca-{i}.pem"));
            std::fs::write(&file, pem)?;
            cas.push_str(&format!("{host} {}\n", file.display()));
        }
        std::fs::write(dir.join("registry-cas"), cas)?;
        std::fs::write(dir.join("kubelet.args"), args.join("\n") + "\n")?;
        std::fs::write(dir.join("node-ip"), &options.ip)?;
        if let Some(uuid) = &options.system_uuid {
            std::fs::write(dir.join("machine-id"), format!("{uuid}\n"))?;
        }
        std::fs::write(
            dir.join("extra-ips"),
            options
                .extra_ips
                .iter()
                .map(|ip| format!("{ip}\n"))
                .collect::<String>(),
        )?;
        std::fs::write(
            dir.join("cni-template.json"),
            format!(
                r#"{{"cniVersion": "0.4.0", "name": "rcp", "plugins": [{{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true, "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{{{{.PodCIDR}}}}"}}]], "dataDir": "{}"}}}}]}}"#,
                dir.join("cni-ipam").display()
            ),
        )?;
        let list: String = self
            .images
            .iter()
            .map(|i| format!("{} {}\n", i.archive.display(), i.name))
            .collect();
        std::fs::write(dir.join("images.list"), list)?;

        let process = ManagedProcess::spawn(
            &format!("node {name}"),
            Path::new("unshare"),
            &[
                "--net".into(),
                "--mount".into(),
                "--propagation".into(),
                "private".into(),
                "--".into(),
                "bash".into(),
                paths::workspace_root()
                    .join("hack/lib/kube-node.sh")
                    .display()
                    .to_string(),
                dir.display().to_string(),
            ],
            &[(
                "PATH".into(),
                format!(
                    "{}:{}",
                    paths::test_bin_dir().display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )],
            &dir.join("node.log"),
            Signal::SIGTERM,
        )?;
        let pid = process.pid();
        let mut node = KubeNode {
            name: name.clone(),
            dir: dir.clone(),
            ip: options.ip.clone(),
            process: Some(process),
            forwarders: Vec::new(),
        };
        wait_for_own_network_namespace(pid).await?;
        // The host end of the node's link: 169.254.123.1 and a route to the node's address.
        let host_end = format!("rcph{:08x}", crc32(&dir.display().to_string()));
        let ip = |args: &[&str]| run(std::process::Command::new("ip").args(args));
        ip(&[
            "link",
            "add",
            &host_end,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &pid.to_string(),
        ])?;
        ip(&["addr", "add", "169.254.123.1/32", "dev", &host_end])?;
        ip(&["link", "set", &host_end, "up"])?;
        ip(&[
            "route",
            "add",
            &format!("{}/32", options.ip),
            "dev",
            &host_end,
            "src",
            "169.254.123.1",
        ])
        .with_context(|| {
            format!(
                "routing {} to node {name} (is another cluster with that address running?)",
                options.ip
            )
        })?;
        node.forwarders = forward_into_namespace(pid, &self.forwarded_ports)?;
        self.nodes.push(node);

        let client = self.cluster.client().await?;
        let nodes: Api<Node> = Api::all(client);
        let registered = wait_for(
            &format!("Node {name} registered by its kubelet"),
            Duration::from_secs(90),
            || async { nodes.get_opt(&name).await.ok().flatten() },
        )
        .await;
        if let Err(e) = registered {
            bail!(
                "{e}\n--- node ---\n{}\n--- containerd ---\n{}\n--- kubelet ---\n{}",
                crate::process::tail(&dir.join("node.log"), 20),
                crate::process::tail(&dir.join("containerd.log"), 20),
                crate::process::tail(&dir.join("kubelet.log"), 40)
            );
        }
        for (k, v) in &options.labels {
            self.cluster
                .kubectl(&["label", "node", &name, &format!("{k}={v}"), "--overwrite"])?;
        }
        Ok(())
    }

    /// The nodes started so far.
    pub fn nodes(&mut self) -> &mut [KubeNode] {
        &mut self.nodes
    }

    /// The node named `name`.
    pub fn node(&mut self, name: &str) -> Result<&mut KubeNode> {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name}"))
    }

    /// Deploys `deploy/<provider>/overlays/local` with `kubectl apply -k`, from a copy of
    /// `deploy/` in which `files` (name, content) replace the overlay's placeholders.
    pub fn apply_local_overlay(&self, provider: &str, files: &[(&str, String)]) -> Result<String> {
        let copy = self.dir.path().join("deploy");
        if !copy.exists() {
            run(std::process::Command::new("cp")
                .arg("-r")
                .arg(paths::workspace_root().join("deploy"))
                .arg(&copy))?;
        }
        let overlay = copy.join(provider).join("overlays").join("local");
        for (name, content) in files {
            std::fs::write(overlay.join(name), content)?;
        }
        self.cluster
            .kubectl(&["apply", "-k", &overlay.display().to_string()])
            .with_context(|| format!("kubectl apply -k {}", overlay.display()))
    }

    /// Whether kube-controller-manager and kube-scheduler still run.
    pub fn check_running(&mut self) -> Result<()> {
        self.kcm.check_running()?;
        self.scheduler.check_running()
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.stop();
        }
    }
}

/// Waits until process `pid` has left this process's network namespace (`unshare --net` ran).
async fn wait_for_own_network_namespace(pid: u32) -> Result<()> {
    let ours = std::fs::read_link("/proc/self/ns/net")?;
    for _ in 0..200 {
        if let Ok(theirs) = std::fs::read_link(format!("/proc/{pid}/ns/net"))
            && theirs != ours
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("process {pid} did not enter a network namespace of its own")
}

/// Listens on 127.0.0.1:`inside` inside the network namespace of process `pid`, for each pair of
/// `ports`, and forwards every connection to 127.0.0.1:`outside` of this process's namespace. The
/// listening sockets are made by a thread that enters that namespace and ends; the connections
/// out are made by the runtime's threads, which never leave this one.
fn forward_into_namespace(pid: u32, ports: &[(u16, u16)]) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let namespace = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    let wanted = ports.to_vec();
    let listeners = std::thread::spawn(move || -> Result<Vec<(u16, std::net::TcpListener)>> {
        nix::sched::setns(&namespace, nix::sched::CloneFlags::CLONE_NEWNET)?;
        wanted
            .iter()
            .map(|(inside, outside)| {
                let l = std::net::TcpListener::bind(("127.0.0.1", *inside))?;
                l.set_nonblocking(true)?;
                Ok((*outside, l))
            })
            .collect()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the thread entering the node's namespace panicked"))??;
    let mut tasks = Vec::new();
    for (port, listener) in listeners {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        tasks.push(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        }));
    }
    Ok(tasks)
}

/// Writes `DIR/<file>.kubeconfig` for a client certificate of `user` in `groups`.
fn write_cert_kubeconfig(
    cluster: &TestCluster,
    ca: &ClientCa,
    dir: &Path,
    file: &str,
    user: &str,
    groups: &[&str],
) -> Result<PathBuf> {
    use base64::Engine;
    let (cert, key) = ca.client_cert_pem(user, groups)?;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let path = dir.join(format!("{file}.kubeconfig"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\n\
             users:\n- name: {user}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n\
             contexts:\n- name: local\n  context:\n    cluster: local\n    user: {user}\ncurrent-context: local\n",
            cluster.server(),
            b64(&cert),
            b64(&key)
        ),
    )?;
    Ok(path)
}

fn run(cmd: &mut std::process::Command) -> Result<()> {
    let out = cmd.output()?;
    if !out.status.success() {
        bail!(
            "{:?} failed: {}{}",
            cmd,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// CRC-32 (IEEE) of `s`: a short stable tag.
fn crc32(s: &str) -> u32 {
    let mut crc = !0u32;
    for b in s.bytes() {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
