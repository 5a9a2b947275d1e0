//! `cloud-controller-manager-aws`: the cloud-controller-manager with the aws provider linked in
//! (and no other).

fn main() -> std::process::ExitCode {
    k8s_cloud_provider::app::main(cloud_provider_aws::provider_spec())
}
