//! Commands of `cloud-controller-manager-aws` besides running the controllers.

pub mod doctor;
pub mod orphans;

use std::{path::PathBuf, sync::Arc};

use clap::Args;
use k8s_controller_manager::client::{build_client, load_config};
use k8s_legacy_cloud_provider_aws::AwsCloud;

/// How a command reaches the cluster and the cloud: the CCM's own flags of the same names.
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

    /// A Kubernetes client (user agent `cloud-controller-manager-aws/<command>`).
    pub async fn kube_client(&self, command: &str) -> Result<kube::Client, String> {
        let config = load_config(self.kubeconfig.as_deref(), self.master.as_deref())
            .await
            .map_err(|e| format!("Kubernetes client: {e}"))?;
        build_client(
            config,
            20.0,
            30,
            &format!("cloud-controller-manager-aws/{command}"),
        )
        .map_err(|e| format!("Kubernetes client: {e}"))
    }
}

/// Builds the AWS provider from a cloud config, as the CCM does.
pub async fn aws_cloud(config: Option<Vec<u8>>) -> Result<Arc<AwsCloud>, String> {
    let cloud = (k8s_legacy_cloud_provider_aws::factory())(config)
        .await
        .map_err(|e| format!("building the AWS cloud from --cloud-config: {e}"))?;
    let any: Arc<dyn std::any::Any + Send + Sync> = cloud;
    any.downcast::<AwsCloud>()
        .map_err(|_| "the AWS factory built another provider".to_string())
}
