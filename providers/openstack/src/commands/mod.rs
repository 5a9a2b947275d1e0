//! Commands of `cloud-controller-manager-openstack` besides running the controllers.

pub mod doctor;
pub mod orphans;

use std::sync::Arc;

use k8s_legacy_cloud_provider_openstack::OpenStackCloud;

/// Builds the OpenStack provider from a cloud config, as the CCM does.
pub async fn openstack_cloud(config: Option<Vec<u8>>) -> Result<Arc<OpenStackCloud>, String> {
    let cloud = (k8s_legacy_cloud_provider_openstack::factory())(config)
        .await
        .map_err(|e| format!("building the OpenStack cloud from --cloud-config: {e}"))?;
    let any: Arc<dyn std::any::Any + Send + Sync> = cloud;
    any.downcast::<OpenStackCloud>()
        .map_err(|_| "the OpenStack factory built another provider".to_string())
}
