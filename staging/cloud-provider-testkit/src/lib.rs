//! Test a cloud provider built on [`k8s_cloud_provider`] against a real Kubernetes API server,
//! in a vendor's own CI.
//!
//! - [`ControlPlane::start`]: a throw-away etcd and kube-apiserver on 127.0.0.1 (random free
//!   ports, a temporary directory, an admin token in `system:masters`, RBAC, ServiceAccount
//!   token signing), both killed when the [`ControlPlane`] is dropped;
//! - [`ControlPlane::run_ccm`]: the cloud-controller-manager with a [`ProviderSpec`],
//!   in-process, exactly as a provider's binary runs it ([`k8s_cloud_provider::app::run`]),
//!   until [`RunningCcm::stop`];
//! - [`objects`]: Nodes as a kubelet with `--cloud-provider=external` registers them,
//!   `LoadBalancer` Services; [`wait_for`]: waiting for what the controllers do.
//!
//! The binaries are `etcd` and `kube-apiserver`: from the environment variables `ETCD_BIN` and
//! `KUBE_APISERVER_BIN` when set, else from `PATH`.
//!
//! ```no_run
//! # async fn t(spec: k8s_cloud_provider::app::ProviderSpec) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use k8s_cloud_provider_testkit::{ControlPlane, objects, wait_for};
//! use k8s_openapi::api::core::v1::Node;
//!
//! let cp = ControlPlane::start().await?;
//! let ccm = cp.run_ccm(spec, &["--cloud-config=testdata/cloud.conf"])?;
//! let nodes: kube::Api<Node> = kube::Api::all(cp.client().await?);
//! nodes.create(&Default::default(), &objects::node("node-a")).await?;
//! let provider_id = wait_for("node-a initialised", Duration::from_secs(30), || async {
//!     nodes.get("node-a").await.ok()?.spec?.provider_id
//! })
//! .await?;
//! ccm.stop().await?;
//! # Ok(())
//! # }
//! ```

use std::{
    future::Future,
    net::TcpListener,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use k8s_cloud_provider::app::AppError;
pub use k8s_cloud_provider::app::ProviderSpec;
use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

pub mod objects;

/// What can go wrong (`#[non_exhaustive]`: variants may be added in a minor release).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestkitError {
    /// A server binary was not found.
    #[error(
        "{binary} not found: set {variable} to its path or put it on PATH (any kube-apiserver from 1.34 on, and the etcd it supports)"
    )]
    BinaryNotFound {
        /// `etcd` or `kube-apiserver`.
        binary: &'static str,
        /// The environment variable that names it.
        variable: &'static str,
    },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A server exited or did not get ready.
    #[error("{server}: {reason}; the last lines of its log ({log}):\n{tail}")]
    Server {
        /// `etcd` or `kube-apiserver`.
        server: &'static str,
        /// What happened.
        reason: String,
        /// Its log file.
        log: String,
        /// The log's last lines.
        tail: String,
    },
    /// The Kubernetes client could not be built.
    #[error("Kubernetes client: {0}")]
    Client(String),
    /// The CCM's command line was refused.
    #[error("the cloud-controller-manager's flags: {0}")]
    Flags(String),
    /// The CCM stopped with an error.
    #[error("the cloud-controller-manager stopped: {0}")]
    Ccm(#[from] AppError),
    /// The CCM's task panicked or was cancelled.
    #[error("the cloud-controller-manager's task: {0}")]
    Task(String),
    /// [`wait_for`] ran out of time.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
    /// Generating a key failed.
    #[error("generating the ServiceAccount signing key: {0}")]
    Key(String),
}

/// Results of this crate.
pub type Result<T, E = TestkitError> = std::result::Result<T, E>;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestkitError {
    let what = what.into();
    move |source| TestkitError::Io { what, source }
}

/// The path of a server binary: `$variable` when set, else the first `binary` on `PATH`.
fn find_binary(binary: &'static str, variable: &'static str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(variable).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(TestkitError::BinaryNotFound { binary, variable })
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(binary))
        .find(|p| p.is_file())
        .ok_or(TestkitError::BinaryNotFound { binary, variable })
}

/// A free TCP port of 127.0.0.1 (bound, then released for the server to take).
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("finding a free port"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(io("finding a free port"))
}

/// The last `n` lines of a file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A server process, killed when dropped.
struct Server {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Server {
    fn spawn(name: &'static str, binary: &Path, args: &[String], log: PathBuf) -> Result<Self> {
        let file = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let err = file
            .try_clone()
            .map_err(io(format!("opening {}", log.display())))?;
        let child = Command::new(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(io(format!("starting {}", binary.display())))?;
        Ok(Self { name, child, log })
    }

    /// An error when the process has exited.
    fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.failed(format!("exited ({status})"))),
            Err(e) => Err(self.failed(format!("cannot be waited for: {e}"))),
        }
    }

    fn failed(&self, reason: String) -> TestkitError {
        TestkitError::Server {
            server: self.name,
            reason,
            log: self.log.display().to_string(),
            tail: tail(&self.log, 30),
        }
    }
}

/// A throw-away Kubernetes control plane: etcd and kube-apiserver on random free ports of
/// 127.0.0.1, RBAC on, a static admin token (group `system:masters`), ServiceAccount token
/// signing (so that `TokenRequest` and the CCM's `--use-service-account-credentials` work).
/// Both processes are killed, and the directory removed, when it is dropped.
pub struct ControlPlane {
    // Field order is drop order: the API server goes before etcd, the directory last.
    apiserver: Server,
    etcd: Server,
    server: String,
    admin_token: String,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
    _etcd_data: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver and waits (up to 60 s) until the API server is ready.
    pub async fn start() -> Result<Self> {
        Self::start_with(&[]).await
    }

    /// Like [`ControlPlane::start`], with extra kube-apiserver flags (a flag given here
    /// replaces the kit's).
    pub async fn start_with(extra_apiserver_args: &[&str]) -> Result<Self> {
        let etcd_bin = find_binary("etcd", "ETCD_BIN")?;
        let apiserver_bin = find_binary("kube-apiserver", "KUBE_APISERVER_BIN")?;
        let dir = tempfile::Builder::new()
            .prefix("ccm-testkit-")
            .tempdir()
            .map_err(io("creating a temporary directory"))?;
        let d = dir.path();
        // etcd's data on tmpfs when there is one (etcd 3.4 cannot skip fsync).
        let etcd_data = match Path::new("/dev/shm").is_dir() {
            true => Some(
                tempfile::Builder::new()
                    .prefix("ccm-testkit-etcd-")
                    .tempdir_in("/dev/shm")
                    .map_err(io("creating etcd's directory"))?,
            ),
            false => None,
        };
        let etcd_dir = etcd_data
            .as_ref()
            .map_or_else(|| d.join("etcd"), |t| t.path().to_path_buf());
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = Server::spawn(
            "etcd",
            &etcd_bin,
            &[
                format!("--data-dir={}", etcd_dir.display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                "--log-level=warn".into(),
            ],
            d.join("etcd.log"),
        )?;

        // The ServiceAccount token signing key (ECDSA P-256).
        let key = rcgen::KeyPair::generate().map_err(|e| TestkitError::Key(e.to_string()))?;
        let (sa_key, sa_pub) = (d.join("sa.key"), d.join("sa.pub"));
        std::fs::write(&sa_key, key.serialize_pem()).map_err(io("writing the signing key"))?;
        std::fs::write(&sa_pub, key.public_key_pem()).map_err(io("writing the signing key"))?;
        let admin_token: String = (0..32)
            .map(|_| char::from(b'a' + rand::random_range(0..26u8)))
            .collect();
        std::fs::write(
            d.join("tokens.csv"),
            format!("{admin_token},admin,admin,\"system:masters\"\n"),
        )
        .map_err(io("writing the token file"))?;
        let secure_port = free_port()?;
        let ours = [
            format!("--etcd-servers={client_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
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
        ];
        let flag = |a: &str| a.split('=').next().unwrap_or_default().to_string();
        let args: Vec<String> = ours
            .into_iter()
            .filter(|a| !extra_apiserver_args.iter().any(|e| flag(e) == flag(a)))
            .chain(extra_apiserver_args.iter().map(|a| a.to_string()))
            .collect();
        let apiserver = Server::spawn(
            "kube-apiserver",
            &apiserver_bin,
            &args,
            d.join("kube-apiserver.log"),
        )?;
        let server = format!("https://127.0.0.1:{secure_port}");
        let kubeconfig = d.join("admin.kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&server, &admin_token))
            .map_err(io("writing the kubeconfig"))?;
        let mut cp = Self {
            apiserver,
            etcd,
            server,
            admin_token,
            kubeconfig,
            dir,
            _etcd_data: etcd_data,
        };
        cp.wait_ready(Duration::from_secs(60)).await?;
        Ok(cp)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let client = self.client().await?;
        let deadline = Instant::now() + timeout;
        loop {
            self.etcd.check_running()?;
            self.apiserver.check_running()?;
            let ready = client
                .request_text(
                    http::Request::get("/readyz")
                        .body(Vec::new())
                        .map_err(|e| TestkitError::Client(e.to_string()))?,
                )
                .await;
            if ready.is_ok_and(|t| t == "ok") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.apiserver.failed(format!("not ready within {timeout:?}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The API server's URL (`https://127.0.0.1:<port>`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The admin token (group `system:masters`).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// A kubeconfig file for the admin (the server's certificate is not verified).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The temporary directory (logs: `etcd.log`, `kube-apiserver.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client as the admin.
    pub async fn client(&self) -> Result<Client> {
        let kubeconfig =
            Kubeconfig::read_from(&self.kubeconfig).map_err(|e| TestkitError::Client(e.to_string()))?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| TestkitError::Client(e.to_string()))?;
        Client::try_from(config).map_err(|e| TestkitError::Client(e.to_string()))
    }

    /// Runs the cloud-controller-manager with `spec` in-process, as the provider's binary runs
    /// it ([`k8s_cloud_provider::app::run`]), against this control plane: `--kubeconfig` (the
    /// admin's), `--leader-elect=false` and `--secure-port=0` come first, then `args` (which may
    /// give them again: the last value wins). Flags the command refuses are an error here.
    pub fn run_ccm(&self, spec: ProviderSpec, args: &[&str]) -> Result<RunningCcm> {
        let mut argv: Vec<String> = vec![
            "cloud-controller-manager".into(),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ];
        argv.extend(args.iter().map(|a| a.to_string()));
        let options = k8s_cloud_provider::app::parse_from(&spec, argv)
            .map_err(|e| TestkitError::Flags(e.to_string().trim().to_string()))?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(k8s_cloud_provider::app::run(options, spec, shutdown.clone()));
        Ok(RunningCcm { shutdown, task })
    }
}

/// A kubeconfig for `server` with `token`, the server's certificate not verified (it is the
/// API server's own self-signed one).
fn kubeconfig_yaml(server: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testkit\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: testkit\n  context:\n    cluster: testkit\n    user: admin\ncurrent-context: testkit\n"
    )
}

/// A cloud-controller-manager running in-process ([`ControlPlane::run_ccm`]). Dropping it
/// stops it without waiting.
pub struct RunningCcm {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), AppError>>,
}

impl std::fmt::Debug for RunningCcm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningCcm")
            .field("running", &!self.task.is_finished())
            .finish()
    }
}

impl RunningCcm {
    /// Whether it still runs (it stops on its own only on an error, e.g. a factory that
    /// failed).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Stops it as SIGTERM does (the controllers drain) and returns how it ended.
    pub async fn stop(mut self) -> Result<()> {
        self.shutdown.cancel();
        let task = &mut self.task;
        match task.await {
            Ok(result) => result.map_err(TestkitError::from),
            Err(e) => Err(TestkitError::Task(e.to_string())),
        }
    }
}

impl Drop for RunningCcm {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Calls `probe` every 100 ms until it returns `Some`, for at most `timeout`; the error names
/// `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(TestkitError::Timeout(timeout, what.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_its_variable() {
        let e = find_binary("no-such-server-binary", "NO_SUCH_SERVER_BIN").unwrap_err();
        assert!(e.to_string().contains("NO_SUCH_SERVER_BIN"), "{e}");
    }

    #[tokio::test]
    async fn wait_for_returns_the_value_or_names_what_it_waited_for() {
        let mut n = 0;
        let v = wait_for("three", Duration::from_secs(5), || {
            n += 1;
            let n = n;
            async move { (n == 3).then_some(n) }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
        let e = wait_for("never", Duration::from_millis(150), || async { None::<()> })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("waiting for never"), "{e}");
    }
}
