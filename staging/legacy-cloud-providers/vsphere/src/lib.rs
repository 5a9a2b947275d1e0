//! The staged vsphere cloud provider (the counterpart of `legacy-cloud-providers/vsphere`).
//!
//! Work in progress: the provider object exists and registers under its name, but it offers
//! no capability yet (no instances, load balancers or routes), so the cloud-controller-manager
//! skips every controller when run with it.

use std::sync::Arc;

use k8s_cloud_provider::{CloudProvider, registry::Factory};

/// The provider name.
pub const PROVIDER_NAME: &str = "vsphere";

/// The vsphere provider (no capabilities yet).
#[derive(Debug, Default)]
pub struct VsphereCloud;

impl CloudProvider for VsphereCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }
}

/// The factory the cloud-controller-manager calls with the `--cloud-config` contents.
pub fn factory() -> Factory {
    Arc::new(|_config: Option<Vec<u8>>| {
        Box::pin(async move { Ok(Arc::new(VsphereCloud) as Arc<dyn CloudProvider>) })
    })
}
