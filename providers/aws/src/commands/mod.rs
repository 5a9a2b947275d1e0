//! Commands of `cloud-controller-manager-aws` besides running the controllers.

pub mod doctor;
pub mod orphans;

use std::sync::Arc;

use k8s_legacy_cloud_provider_aws::AwsCloud;

/// How a command reaches the cluster and the cloud: the CCM's own flags of the same names.
pub use k8s_cloud_provider::app::ClusterAccessFlags;

/// Builds the AWS provider from a cloud config, as the CCM does.
pub async fn aws_cloud(config: Option<Vec<u8>>) -> Result<Arc<AwsCloud>, String> {
    let cloud = (k8s_legacy_cloud_provider_aws::factory())(config)
        .await
        .map_err(|e| format!("building the AWS cloud from --cloud-config: {e}"))?;
    let any: Arc<dyn std::any::Any + Send + Sync> = cloud;
    any.downcast::<AwsCloud>()
        .map_err(|_| "the AWS factory built another provider".to_string())
}
