//! `cloud-controller-manager-vsphere doctor`: pre-flight checks before a CCM takes over a
//! cluster — the cloud config parses, every vCenter's credentials log in, the account sees the
//! datacenters and holds the read privileges on them, every Node's VM is found
//! ([`legacy::VsphereCloud::doctor`]), and the API server answers and the RBAC of the CCM's
//! credentials covers every request the controllers make
//! ([`k8s_cloud_provider::doctor::rbac_checks`]). One line per check with a fix for each
//! failure; the exit code is the number of failures.

use std::process::ExitCode;

use clap::{Args, FromArgMatches};
use k8s_cloud_provider::{
    app::{ClusterAccessFlags, ProviderCommand},
    doctor::{CONTROLLER_MANAGER_ACCESS, Check, exit_code, rbac_checks, table},
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::ListParams};

use crate::legacy;

/// The command's flags.
#[derive(Debug, Clone, Args)]
pub struct DoctorFlags {
    /// Cluster and cloud access.
    #[command(flatten)]
    pub access: ClusterAccessFlags,
    /// The namespace of the leader-election Lease (the CCM's --leader-elect-resource-namespace).
    #[arg(long = "leader-elect-resource-namespace", default_value = "kube-system")]
    pub lease_namespace: String,
}

/// The command as the vSphere binary registers it.
pub fn provider_command() -> ProviderCommand {
    ProviderCommand {
        name: "doctor",
        about: "Check the cloud config, vCenter logins, privileges, Nodes and RBAC before running the CCM",
        flags: <DoctorFlags as Args>::augment_args,
        run: |matches| Box::pin(async move { run(matches).await }),
    }
}

async fn run(matches: clap::ArgMatches) -> ExitCode {
    let flags = match DoctorFlags::from_arg_matches(&matches) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let checks = doctor(&flags).await;
    print!("{}", table(&checks));
    let failures = exit_code(&checks);
    println!("{} check(s), {failures} failure(s).", checks.len());
    ExitCode::from(failures)
}

async fn doctor(flags: &DoctorFlags) -> Vec<Check> {
    let mut checks = Vec::new();
    let bytes = match flags.access.cloud_config_bytes() {
        Ok(b) => b,
        Err(e) => {
            checks.push(Check::fail("cloud config", e));
            return checks;
        }
    };
    let config =
        match legacy::config::VsphereConfig::parse(bytes.as_deref()).and_then(|c| c.apply_process_env()) {
            Ok(c) => {
                checks.push(Check::pass(
                    "cloud config",
                    format!(
                        "{} parses: {} vCenter(s)",
                        flags
                            .access
                            .cloud_config
                            .as_ref()
                            .map_or("the configuration".to_string(), |p| p.display().to_string()),
                        c.vcenters.len()
                    ),
                ));
                c
            }
            Err(e) => {
                checks.push(Check::fail(
                    "cloud config",
                    format!("{e} (fix: the named key in --cloud-config)"),
                ));
                return checks;
            }
        };
    let client = match flags
        .access
        .kube_client("cloud-controller-manager-vsphere/doctor")
        .await
    {
        Ok(c) => Some(c),
        Err(e) => {
            checks.push(Check::fail(
                "api server",
                format!("{e} (fix: --kubeconfig / --master)"),
            ));
            None
        }
    };
    let mut nodes = Vec::new();
    if let Some(client) = &client {
        checks.extend(rbac_checks(client, CONTROLLER_MANAGER_ACCESS, &flags.lease_namespace).await);
        if let Ok(list) = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            nodes = list.items;
        }
    }
    let cloud = legacy::VsphereCloud::new(config);
    if let Some(client) = client {
        // Credentials may come from a Secret: the provider reads it with the CCM's client.
        cloud.set_kube_client(client);
    }
    checks.extend(cloud.doctor(&nodes).await);
    cloud.logout().await;
    checks
}
