//! `cloud-controller-manager-vsphere doctor`: pre-flight checks before a CCM takes over a
//! cluster — the cloud config parses, every vCenter's credentials log in, the account sees the
//! datacenters and holds the read privileges on them, every Node's VM is found
//! ([`legacy::VsphereCloud::doctor`]), and the API server answers and the RBAC of the CCM's
//! credentials covers every request the controllers make
//! ([`k8s_cloud_provider::doctor::rbac_checks`]). One line per check with a fix for each
//! failure; the exit code is the number of failures.

use k8s_cloud_provider::{
    app::ProviderCommand,
    doctor::{Check, DoctorFlags, cluster_findings, run_command},
};

use crate::legacy;

/// The command as the vSphere binary registers it.
pub fn provider_command() -> ProviderCommand {
    ProviderCommand {
        name: "doctor",
        about: "Check the cloud config, vCenter logins, privileges, Nodes and RBAC before running the CCM",
        flags: <DoctorFlags as clap::Args>::augment_args,
        run: |matches| Box::pin(run_command(matches, |flags| async move { doctor(&flags).await })),
    }
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
    let cluster = cluster_findings(flags, "cloud-controller-manager-vsphere/doctor").await;
    checks.extend(cluster.checks);
    let cloud = legacy::VsphereCloud::new(config);
    if let Some(client) = cluster.client {
        // Credentials may come from a Secret: the provider reads it with the CCM's client.
        cloud.set_kube_client(client);
    }
    checks.extend(cloud.doctor(&cluster.nodes).await);
    cloud.logout().await;
    checks
}
