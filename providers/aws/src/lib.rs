//! The out-of-tree aws cloud provider (phase 2 of the extraction: builds on
//! `k8s-legacy-cloud-provider-aws`).
//!
//! [`provider_spec`] is what `cloud-controller-manager-aws` runs.

pub mod commands;
pub mod controllers;

pub use k8s_legacy_cloud_provider_aws as legacy;

/// The provider name (`--cloud-provider` default).
pub const PROVIDER_NAME: &str = legacy::PROVIDER_NAME;

/// The provider as the cloud-controller-manager application needs it. The default set of
/// controllers is upstream cloud-provider-aws's: the cloud-node, cloud-node-lifecycle, service
/// and node-route controllers (the route controller starts only with `--cluster-cidr` and
/// `--configure-cloud-routes`, which defaults to true — most AWS clusters set it to false).
/// Unlike upstream, a CCM started without `--cluster-cidr` skips the route controller with a
/// warning instead of refusing to start, unless `--controllers` names it.
///
/// It adds upstream's tagging controller ([`controllers::tagging`]), off by default
/// (`--controllers=*,tagging`), with its flags, and the `doctor` and `orphans` commands
/// ([`commands`]).
pub fn provider_spec() -> k8s_cloud_provider::app::ProviderSpec {
    let mut spec = k8s_cloud_provider::app::ProviderSpec::new(PROVIDER_NAME, legacy::factory())
        .with_version(env!("CARGO_PKG_VERSION"))
        .with_controller(controllers::tagging::provider_controller())
        .with_command(commands::doctor::provider_command())
        .with_command(commands::orphans::provider_command());
    spec.skip_default_route_controller_without_cluster_cidr = true;
    spec
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_with_the_providers_controllers_is_consistent() {
        // clap checks (in debug builds, at parse time) that argument IDs are unique; a
        // provider controller's flag named like a framework flag would fail here.
        k8s_cloud_provider::app::command(&super::provider_spec()).debug_assert();
    }
}
