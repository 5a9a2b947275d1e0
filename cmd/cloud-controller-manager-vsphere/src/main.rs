//! `cloud-controller-manager-vsphere`: the cloud-controller-manager with the vsphere provider linked in
//! (and no other).

fn main() -> std::process::ExitCode {
    k8s_cloud_provider::app::main(cloud_provider_vsphere::provider_spec())
}
