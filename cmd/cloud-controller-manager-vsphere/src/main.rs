//! `cloud-controller-manager-vsphere`: the cloud-controller-manager with the vSphere provider
//! linked in (and no other).
//!
//! `cloud-controller-manager-vsphere convert-config <old.conf> [-o <new.yaml>]` converts an
//! in-tree or CPI INI configuration to the CPI YAML instead of running.

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "convert-config") {
        return cloud_provider_vsphere::convert_config_main(&args[2..]);
    }
    k8s_cloud_provider::app::main(cloud_provider_vsphere::provider_spec())
}
