//! The out-of-tree OpenStack cloud provider (phase 2 of the extraction: builds on
//! `k8s-legacy-cloud-provider-openstack`).
//!
//! [`provider_spec`] is what `cloud-controller-manager-openstack` runs.

pub use k8s_legacy_cloud_provider_openstack as legacy;

pub mod commands;

/// The provider name (`--cloud-provider` default).
pub const PROVIDER_NAME: &str = legacy::PROVIDER_NAME;

/// The provider as the cloud-controller-manager application needs it.
pub fn provider_spec() -> k8s_cloud_provider::app::ProviderSpec {
    k8s_cloud_provider::app::ProviderSpec::new(PROVIDER_NAME, legacy::factory())
        .with_version(env!("CARGO_PKG_VERSION"))
        .with_command(commands::doctor::provider_command())
        .with_command(commands::orphans::provider_command())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_with_the_providers_commands_is_consistent() {
        k8s_cloud_provider::app::command(&super::provider_spec()).debug_assert();
    }
}
