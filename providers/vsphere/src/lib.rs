//! The out-of-tree vsphere cloud provider (phase 2 of the extraction: builds on
//! `k8s-legacy-cloud-provider-vsphere`).
//!
//! [`provider_spec`] is what `cloud-controller-manager-vsphere` runs.

pub use k8s_legacy_cloud_provider_vsphere as legacy;

pub mod doctor;

/// The provider name (`--cloud-provider` default).
pub const PROVIDER_NAME: &str = legacy::PROVIDER_NAME;

/// The provider as the cloud-controller-manager application needs it.
pub fn provider_spec() -> k8s_cloud_provider::app::ProviderSpec {
    // As cloud-provider-vsphere: a changed config file restarts the process.
    k8s_cloud_provider::app::ProviderSpec::new(PROVIDER_NAME, legacy::factory())
        .with_version(env!("CARGO_PKG_VERSION"))
        .restart_on_config_change()
        .with_command(doctor::provider_command())
}

/// `cloud-controller-manager-vsphere convert-config <old.conf> [-o <new.yaml>]`: writes the CPI
/// YAML for an in-tree or CPI INI file (stdout by default; a file is created with mode 0600
/// since it may hold passwords), with a comment for every in-tree key that has no equivalent.
pub fn convert_config_main(args: &[std::ffi::OsString]) -> std::process::ExitCode {
    use std::process::ExitCode;
    let usage = "usage: cloud-controller-manager-vsphere convert-config <old.conf> [-o <new.yaml>]";
    let mut input = None;
    let mut output = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") | Some("--output") => output = it.next().cloned(),
            Some("-h") | Some("--help") => {
                println!("{usage}");
                return ExitCode::SUCCESS;
            }
            _ if input.is_none() => input = Some(a.clone()),
            _ => {
                eprintln!("error: unexpected argument {a:?}; {usage}");
                return ExitCode::FAILURE;
            }
        }
    }
    let Some(input) = input else {
        eprintln!("error: no input file; {usage}");
        return ExitCode::FAILURE;
    };
    let bytes = match std::fs::read(&input) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: reading {}: {e}", std::path::Path::new(&input).display());
            return ExitCode::FAILURE;
        }
    };
    let config = match legacy::config::VsphereConfig::parse(Some(&bytes)).and_then(|c| c.apply_env(|_| None))
    {
        Ok(c) if c.format == legacy::config::Format::Yaml => {
            eprintln!(
                "error: {} is already YAML",
                std::path::Path::new(&input).display()
            );
            return ExitCode::FAILURE;
        }
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let yaml = legacy::config::to_cpi_yaml(&config);
    match output {
        None => print!("{yaml}"),
        Some(path) => {
            use std::{io::Write, os::unix::fs::OpenOptionsExt};
            let written = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&path)
                .and_then(|mut f| f.write_all(yaml.as_bytes()));
            if let Err(e) = written {
                eprintln!("error: writing {}: {e}", std::path::Path::new(&path).display());
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
