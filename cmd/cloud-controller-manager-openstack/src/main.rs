//! `cloud-controller-manager-openstack`: the cloud-controller-manager with the OpenStack provider
//! linked in (and no other).

fn main() -> std::process::ExitCode {
    k8s_cloud_provider::app::main(cloud_provider_openstack::provider_spec())
}
