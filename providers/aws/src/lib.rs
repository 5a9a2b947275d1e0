//! The out-of-tree aws cloud provider (phase 2 of the extraction: builds on
//! `k8s-legacy-cloud-provider-aws`).
//!
//! [`provider_spec`] is what `cloud-controller-manager-aws` runs.

pub use k8s_legacy_cloud_provider_aws as legacy;

/// The provider name (`--cloud-provider` default).
pub const PROVIDER_NAME: &str = legacy::PROVIDER_NAME;

/// The provider as the cloud-controller-manager application needs it. As in upstream's
/// cloud-provider-aws, the node-route controller is off unless named in `--controllers`
/// (e.g. `--controllers=*,route`): most AWS clusters use a CNI that needs no VPC routes.
pub fn provider_spec() -> k8s_cloud_provider::app::ProviderSpec {
    let mut spec = k8s_cloud_provider::app::ProviderSpec::new(PROVIDER_NAME, legacy::factory());
    spec.disabled_by_default
        .push(k8s_cloud_provider::controllers::route::NAME.to_string());
    spec
}
