//! `cloud-controller-manager-sample`: the framework's cloud-controller-manager with the sample
//! provider linked in. Every flag of the Go `cloud-controller-manager` is there
//! (`--cloud-config`, `--controllers`, `--leader-elect`, …); `--help` lists them.

mod config;
mod credentials;
mod loadbalancer;
mod pool_usage;
mod provider;

#[cfg(test)]
mod kit_tests;

fn main() -> std::process::ExitCode {
    k8s_cloud_provider::app::main(provider::provider_spec())
}
