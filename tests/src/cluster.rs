//! `TestCluster`: a real etcd + kube-apiserver (the version hack/kube/go.mod pins) on 127.0.0.1.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::{Namespace, ServiceAccount},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::{
    paths,
    process::{ManagedProcess, free_port},
};

/// A throw-away Kubernetes control plane: etcd and kube-apiserver on random free ports of
/// 127.0.0.1, with RBAC on, a static admin token, and service-account token signing (so
/// `TokenRequest` works). Both processes are killed when the handle drops.
pub struct TestCluster {
    // Field order is drop order: the API server goes before etcd.
    apiserver: ManagedProcess,
    etcd: ManagedProcess,
    server: String,
    admin_token: String,
    kubeconfig: PathBuf,
    etcd_url: String,
    apiserver_bin: PathBuf,
    apiserver_args: Vec<String>,
    apiserver_starts: usize,
    dir: TempDir,
    _etcd_tmpfs: Option<TempDir>,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl TestCluster {
    /// Starts etcd and kube-apiserver and waits until `/readyz` answers `ok`.
    pub async fn start() -> Result<Self> {
        Self::start_with(&[]).await
    }

    /// A dual-stack cluster (Service IPs from `10.0.0.0/20` and `fd00:10::/108`): Services may
    /// ask for `ipFamilies: [IPv6]`.
    pub async fn start_dual_stack() -> Result<Self> {
        Self::start_with(&["--service-cluster-ip-range=10.0.0.0/20,fd00:10::/108"]).await
    }

    /// Like [`Self::start`], with extra kube-apiserver flags (a flag given again replaces ours).
    pub async fn start_with(extra_apiserver_args: &[&str]) -> Result<Self> {
        crate::init();
        let etcd_bin = paths::test_bin("etcd")?;
        let apiserver_bin = paths::test_bin("kube-apiserver")?;
        let dir = tempfile::Builder::new().prefix("rcp-cluster-").tempdir()?;
        let d = dir.path();

        // etcd 3.4 cannot skip fsync; keep its data on tmpfs when there is one.
        let etcd_tmpfs = if Path::new("/dev/shm").is_dir() {
            sweep_dead_etcd_dirs();
            Some(
                tempfile::Builder::new()
                    .prefix(&format!("rcp-etcd-{}-", std::process::id()))
                    .tempdir_in("/dev/shm")?,
            )
        } else {
            None
        };
        let etcd_data = etcd_tmpfs
            .as_ref()
            .map(|t| t.path().to_path_buf())
            .unwrap_or_else(|| d.join("etcd"));
        let (client_port, peer_port) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = ManagedProcess::spawn(
            "etcd",
            &etcd_bin,
            &[
                format!("--data-dir={}", etcd_data.display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                "--log-level=warn".into(),
            ],
            &[],
            &d.join("etcd.log"),
            Signal::SIGKILL,
        )?;

        let sa_key = d.join("sa.key");
        let sa_pub = d.join("sa.pub");
        run_quiet(
            Command::new("openssl")
                .args(["genrsa", "-out"])
                .arg(&sa_key)
                .arg("2048"),
        )?;
        run_quiet(
            Command::new("openssl")
                .args(["rsa", "-in"])
                .arg(&sa_key)
                .args(["-pubout", "-out"])
                .arg(&sa_pub),
        )?;
        let admin_token = random_token();
        crate::secrets::register(&admin_token);
        std::fs::write(
            d.join("tokens.csv"),
            format!("{admin_token},admin,admin,\"system:masters\"\n"),
        )?;

        // Every write is audited (`audit.log`, JSON lines; see [`TestCluster::audit_writes`]):
        // with the request body for the objects the CCM writes, so tests can count its writes
        // and tell which fields it sent.
        std::fs::write(d.join("audit-policy.yaml"), AUDIT_POLICY)?;
        let secure_port = free_port();
        let apiserver_args: Vec<String> = vec![
            format!("--audit-policy-file={}", d.join("audit-policy.yaml").display()),
            format!("--audit-log-path={}", d.join("audit.log").display()),
            format!("--etcd-servers={client_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            // Current releases refuse a loopback address in the `kubernetes` Service's
            // endpoints; nothing here reaches the API server through that Service.
            "--endpoint-reconciler-type=none".into(),
            format!("--secure-port={secure_port}"),
            format!("--cert-dir={}", d.join("certs").display()),
            format!("--token-auth-file={}", d.join("tokens.csv").display()),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--api-audiences=https://kubernetes.default.svc".into(),
            "--authorization-mode=RBAC".into(),
            "--service-cluster-ip-range=10.0.0.0/20".into(),
            "--enable-priority-and-fairness=false".into(),
            "--max-requests-inflight=2000".into(),
            "--max-mutating-requests-inflight=1000".into(),
            "--v=1".into(),
        ]
        .into_iter()
        // A flag given again replaces ours (list flags such as --authorization-mode would
        // otherwise add up).
        .filter(|ours: &String| {
            let flag = ours.split('=').next().unwrap_or_default();
            !extra_apiserver_args
                .iter()
                .any(|a| a.split('=').next() == Some(flag))
        })
        .chain(extra_apiserver_args.iter().map(|a| a.to_string()))
        .collect();
        let apiserver = ManagedProcess::spawn(
            "kube-apiserver",
            &apiserver_bin,
            &apiserver_args,
            &[],
            &d.join("kube-apiserver.log"),
            Signal::SIGKILL,
        )?;

        let server = format!("https://127.0.0.1:{secure_port}");
        let kubeconfig = d.join("admin.kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&server, "admin", &admin_token, None))?;
        let mut cluster = Self {
            apiserver,
            etcd,
            server,
            admin_token,
            kubeconfig,
            etcd_url: client_url,
            apiserver_bin,
            apiserver_args,
            apiserver_starts: 1,
            dir,
            _etcd_tmpfs: etcd_tmpfs,
        };
        cluster.wait_ready(Duration::from_secs(60)).await?;
        Ok(cluster)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let http = reqwest::Client::builder()
            .tls_danger_accept_invalid_certs(true)
            .timeout(Duration::from_secs(2))
            .build()?;
        let deadline = Instant::now() + timeout;
        loop {
            self.etcd.check_running()?;
            self.apiserver.check_running()?;
            let answer = http
                .get(format!("{}/readyz", self.server))
                .bearer_auth(&self.admin_token)
                .send()
                .await;
            if let Ok(resp) = answer
                && resp.status().is_success()
                && resp.text().await.unwrap_or_default() == "ok"
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver not ready within {timeout:?}; log tail:\n{}",
                    crate::process::tail(self.apiserver.log_path(), 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills kube-apiserver with SIGKILL (etcd keeps running); [`TestCluster::start_apiserver`]
    /// starts it again.
    pub fn kill_apiserver(&mut self) {
        self.apiserver.stop();
    }

    /// Starts kube-apiserver again (same port, flags, certificates and etcd) and waits until it
    /// is ready; returns how long that took.
    pub async fn start_apiserver(&mut self) -> Result<Duration> {
        let started = Instant::now();
        self.apiserver_starts += 1;
        self.apiserver = ManagedProcess::spawn(
            "kube-apiserver",
            &self.apiserver_bin,
            &self.apiserver_args,
            &[],
            &self
                .dir
                .path()
                .join(format!("kube-apiserver-{}.log", self.apiserver_starts)),
            Signal::SIGKILL,
        )?;
        self.wait_ready(Duration::from_secs(120)).await?;
        Ok(started.elapsed())
    }

    /// Writes `writes` times to an unrelated etcd key (the revision moves on) and compacts
    /// etcd at the newest revision, through etcd's JSON gateway. A watch that resumes from a
    /// resource version from before then gets `410 Gone` (`too old resource version`).
    /// Returns the compacted revision.
    pub async fn compact_etcd(&self, writes: usize) -> Result<i64> {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let http = reqwest::Client::new();
        let mut revision = 0i64;
        for i in 0..writes.max(1) {
            let answer: serde_json::Value = http
                .post(format!("{}/v3/kv/put", self.etcd_url))
                .json(&serde_json::json!({"key": b64("/rcp-test/bump"), "value": b64(&i.to_string())}))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            revision = answer["header"]["revision"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .context("etcd put answered no revision")?;
        }
        http.post(format!("{}/v3/kv/compaction", self.etcd_url))
            .json(&serde_json::json!({"revision": revision.to_string(), "physical": true}))
            .send()
            .await?
            .error_for_status()
            .context("compacting etcd")?;
        Ok(revision)
    }

    /// The writes the API server has audited so far (`create`, `update`, `patch`, `delete`;
    /// one JSON audit event each, stage `ResponseComplete`), oldest first. Those to Nodes,
    /// Services and Leases (with their subresources) carry `requestObject`, the body as sent.
    pub fn audit_writes(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["stage"] == "ResponseComplete")
            .collect()
    }

    /// The API server URL (`https://127.0.0.1:<port>`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The admin bearer token (group `system:masters`).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// A kubeconfig file for the admin, usable by kubectl and by our binaries.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The admin kubeconfig, written as `proxied.kubeconfig`, reaching the API server through
    /// a (TLS) fault proxy on 127.0.0.1:`port` instead.
    pub fn kubeconfig_via_proxy(&self, port: u16) -> Result<std::path::PathBuf> {
        let admin = std::fs::read_to_string(&self.kubeconfig)?;
        let proxied = self.dir().join("proxied.kubeconfig");
        std::fs::write(
            &proxied,
            admin.replace(&self.server, &format!("https://127.0.0.1:{port}")),
        )?;
        Ok(proxied)
    }

    /// The key the API server signs service-account tokens with (what kube-controller-manager's
    /// token controller needs).
    pub fn service_account_key(&self) -> PathBuf {
        self.dir.path().join("sa.key")
    }

    /// The API server's self-signed serving certificate (it is its own CA): what Pods get as
    /// `ca.crt` to trust it.
    pub fn serving_cert(&self) -> PathBuf {
        self.dir.path().join("certs").join("apiserver.crt")
    }

    /// The temporary directory holding the cluster's files and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The kube-apiserver log so far.
    pub fn apiserver_log(&self) -> String {
        self.apiserver.log()
    }

    /// An admin client.
    pub async fn client(&self) -> Result<Client> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// Writes a kubeconfig that acts as `user` (in `groups`) by impersonation through the admin
    /// token, so RBAC decisions are made for that user. Returns its path.
    pub fn kubeconfig_for_user(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        let path = self.dir.path().join(format!("user-{user}.kubeconfig"));
        let yaml = kubeconfig_yaml(&self.server, user, &self.admin_token, Some((user, groups)));
        std::fs::write(&path, yaml)?;
        Ok(path)
    }

    /// Creates (if needed) the service account `namespace/name`, mints a token for it with the
    /// TokenRequest API and writes a kubeconfig using that token. Returns its path.
    pub async fn kubeconfig_for_service_account(&self, namespace: &str, name: &str) -> Result<PathBuf> {
        let client = self.client().await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        if namespaces.get_opt(namespace).await?.is_none() {
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: Some(namespace.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            namespaces.create(&PostParams::default(), &ns).await?;
        }
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        if sas.get_opt(name).await?.is_none() {
            let sa = ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            sas.create(&PostParams::default(), &sa).await?;
        }
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(vec!["https://kubernetes.default.svc".into()]),
                expiration_seconds: Some(3600),
                ..Default::default()
            }),
            ..Default::default()
        };
        let answer: TokenRequest = sas
            .create_subresource("token", name, &PostParams::default(), &request)
            .await
            .with_context(|| format!("TokenRequest for service account {namespace}/{name}"))?;
        let token = answer
            .status
            .and_then(|s| s.token)
            .context("TokenRequest answered without a token")?;
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let path = self.dir.path().join(format!("sa-{namespace}-{name}.kubeconfig"));
        std::fs::write(&path, kubeconfig_yaml(&self.server, &user, &token, None))?;
        Ok(path)
    }

    /// Applies a deployment kustomization, `deploy/<kustomization>` (e.g. `aws/base`; `common`
    /// for a provider without one, such as the fake), rendered by kubectl's kustomize
    /// (ServiceAccount, least-privilege RBAC, DaemonSet), and returns a kubeconfig
    /// acting as its ServiceAccount `kube-system/cloud-controller-manager`. A CCM started with
    /// it has exactly the rights the shipped manifests grant, so a missing rule fails the test
    /// that needs it. (No kubelet runs here: the DaemonSet never starts a pod.)
    /// Applied once per cluster; later calls return the same file.
    pub fn ccm_kubeconfig(&self, kustomization: &str) -> Result<PathBuf> {
        let path = self
            .dir
            .path()
            .join(format!("ccm-{}.kubeconfig", kustomization.replace('/', "-")));
        if path.exists() {
            return Ok(path);
        }
        let base = paths::workspace_root().join("deploy").join(kustomization);
        let rendered = self
            .kubectl(&["kustomize", &base.display().to_string()])
            .with_context(|| format!("rendering {}", base.display()))?;
        self.kubectl_stdin(&["apply", "-f", "-"], &rendered)
            .with_context(|| format!("applying {}", base.display()))?;
        // TokenRequest through kubectl's raw mode (works with any kubectl version).
        let request = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"audiences":["https://kubernetes.default.svc"],"expirationSeconds":86400}}"#;
        let answer = self.kubectl_stdin(
            &[
                "create",
                "--raw",
                "/api/v1/namespaces/kube-system/serviceaccounts/cloud-controller-manager/token",
                "-f",
                "-",
            ],
            request,
        )?;
        let answer: serde_json::Value = serde_json::from_str(&answer).context("TokenRequest answer")?;
        let token = answer["status"]["token"]
            .as_str()
            .context("TokenRequest answered without a token")?;
        crate::secrets::register(token);
        let user = "system:serviceaccount:kube-system:cloud-controller-manager";
        std::fs::write(&path, kubeconfig_yaml(&self.server, user, token, None))?;
        Ok(path)
    }

    /// Runs the machine's kubectl against this cluster as admin and returns its stdout.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        kubectl(&self.kubeconfig, args, None)
    }

    /// Removes from the ClusterRole `role` the rule whose resources are exactly `[resource]`
    /// (e.g. `services/status`), as an operator with a stale RBAC manifest would have it.
    pub fn remove_cluster_role_rule(&self, role: &str, resource: &str) -> Result<()> {
        let json: serde_json::Value =
            serde_json::from_str(&self.kubectl(&["get", "clusterrole", role, "-o", "json"])?)?;
        let index = json["rules"]
            .as_array()
            .and_then(|rules| {
                rules
                    .iter()
                    .position(|r| r["resources"] == serde_json::json!([resource]))
            })
            .with_context(|| format!("ClusterRole {role} has no rule for exactly {resource}"))?;
        self.kubectl(&[
            "patch",
            "clusterrole",
            role,
            "--type=json",
            &format!("-p=[{{\"op\":\"remove\",\"path\":\"/rules/{index}\"}}]"),
        ])?;
        Ok(())
    }

    /// Runs helm (built by hack/install-test-deps.sh from its Go module) against this cluster,
    /// with its own cache, config and data directories in the cluster's directory.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        helm(&self.dir().join("helm"), Some(&self.kubeconfig), args)
    }

    /// Runs kubectl with `stdin` piped in (e.g. `apply -f -`).
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Result<String> {
        kubectl(&self.kubeconfig, args, Some(stdin))
    }
}

impl Drop for TestCluster {
    /// Searches every Event of the cluster for the registered secrets (see [`crate::secrets`]).
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        if let Ok(events) = self.kubectl(&["get", "events", "--all-namespaces", "-o", "json"]) {
            crate::secrets::assert_none_in("the cluster's Events", &events);
        }
    }
}

/// Builds a kube client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client> {
    crate::init();
    let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Runs helm (built by hack/install-test-deps.sh from its Go module) with its cache, config
/// and data directories under `home`, against `kubeconfig`'s cluster when given; its stdout, or
/// an error with its stderr.
pub fn helm(home: &Path, kubeconfig: Option<&Path>, args: &[&str]) -> Result<String> {
    let mut cmd = Command::new(paths::test_bin("helm")?);
    if let Some(kubeconfig) = kubeconfig {
        cmd.arg("--kubeconfig").arg(kubeconfig);
    }
    let out = cmd
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .context("starting helm")?;
    if !out.status.success() {
        bail!(
            "helm {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Result<String> {
    use std::io::Write;
    let mut cmd = Command::new(paths::test_bin("kubectl")?);
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(std::process::Stdio::piped());
    }
    let mut child = cmd.spawn().context("starting kubectl")?;
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .context("kubectl stdin")?
            .write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn kubeconfig_yaml(server: &str, user: &str, token: &str, impersonate: Option<(&str, &[&str])>) -> String {
    let mut auth = format!("    token: {token}\n");
    if let Some((as_user, groups)) = impersonate {
        auth.push_str(&format!("    as: {as_user}\n"));
        if !groups.is_empty() {
            auth.push_str("    as-groups:\n");
            for g in groups {
                auth.push_str(&format!("    - {g}\n"));
            }
        }
    }
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    \
         insecure-skip-tls-verify: true\nusers:\n- name: {user}\n  user:\n{auth}contexts:\n- name: test\n  \
         context:\n    cluster: test\n    user: {user}\ncurrent-context: test\n"
    )
}

/// Removes `/dev/shm/rcp-etcd-<pid>-*` directories of test processes that no longer exist
/// (a test process killed with SIGKILL cannot clean up after itself).
fn sweep_dead_etcd_dirs() {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("rcp-etcd-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn random_token() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..32)
        .map(|_| format!("{:x}", rng.random_range(0..16u8)))
        .collect()
}

fn run_quiet(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// What the test API server audits: every write, with the request body for the objects the
/// CCM writes (Nodes, Services, Leases and their `status`), the metadata alone for the rest.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted, Panic]
rules:
- level: Request
  verbs: [create, update, patch, delete]
  resources:
  - group: \"\"
    resources: [nodes, nodes/status, services, services/status]
  - group: coordination.k8s.io
    resources: [leases]
- level: Metadata
  verbs: [create, update, patch, delete]
- level: None
";
