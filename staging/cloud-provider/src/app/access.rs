//! How a provider's own command (`doctor`, `orphans`, …) reaches the cluster and the cloud: the
//! cloud-controller-manager's flags of the same names, so that a command is run with exactly
//! the CCM's configuration and credentials.

use std::path::PathBuf;

use clap::Args;
use k8s_controller_manager::client::{build_client, load_config};

/// `--cloud-config`, `--kubeconfig` and `--master`, as the CCM takes them.
#[derive(Debug, Clone, Args)]
pub struct ClusterAccessFlags {
    /// The path to the cloud provider configuration file (the CCM's --cloud-config).
    #[arg(long = "cloud-config")]
    pub cloud_config: Option<PathBuf>,
    /// Path to kubeconfig file with authorization and master location information: the
    /// credentials the CCM runs with (in-cluster configuration when not set).
    #[arg(long = "kubeconfig")]
    pub kubeconfig: Option<PathBuf>,
    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long = "master")]
    pub master: Option<String>,
}

impl ClusterAccessFlags {
    /// The `--cloud-config` file's contents (`None` without the flag).
    pub fn cloud_config_bytes(&self) -> Result<Option<Vec<u8>>, String> {
        self.cloud_config
            .as_ref()
            .map(|p| std::fs::read(p).map_err(|e| format!("--cloud-config: reading {}: {e}", p.display())))
            .transpose()
    }

    /// A Kubernetes client with `user_agent` (e.g. `cloud-controller-manager-aws/doctor`).
    pub async fn kube_client(&self, user_agent: &str) -> Result<kube::Client, String> {
        let config = load_config(self.kubeconfig.as_deref(), self.master.as_deref())
            .await
            .map_err(|e| format!("Kubernetes client: {e}"))?;
        build_client(config, 20.0, 30, user_agent).map_err(|e| format!("Kubernetes client: {e}"))
    }
}
