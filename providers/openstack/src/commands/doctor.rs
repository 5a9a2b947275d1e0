//! `cloud-controller-manager-openstack doctor`: pre-flight checks before a CCM takes over a
//! cluster (from OCCM, or a first install) — the cloud config parses and is complete, keystone
//! authenticates, the catalog has the endpoints and they answer, the IDs the config names exist,
//! the quotas leave room, every Node's server exists
//! ([`k8s_legacy_cloud_provider_openstack::OpenStackCloud::doctor`]), the API server answers and
//! the RBAC of the CCM's credentials covers every request the controllers make
//! ([`k8s_cloud_provider::doctor::rbac_checks`]). Prints one line per check with a fix for each
//! failure; the exit code is the number of failures. Reads only.

use k8s_cloud_provider::{
    app::ProviderCommand,
    doctor::{Check, DoctorFlags, cluster_findings, run_command},
};
use k8s_legacy_cloud_provider_openstack::config::OpenStackConfig;

/// The command as the OpenStack binary registers it.
pub fn provider_command() -> ProviderCommand {
    ProviderCommand {
        name: "doctor",
        about: "Check the cloud config, keystone, the catalog, the configured IDs, quotas, Nodes and RBAC before running the CCM",
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
    match OpenStackConfig::parse(bytes.as_deref()).and_then(|c| c.validate().map(|()| c)) {
        Ok(c) => {
            checks.push(Check::pass(
                "cloud config",
                flags
                    .access
                    .cloud_config
                    .as_ref()
                    .map_or("given".to_string(), |p| format!("{} parses", p.display())),
            ));
            for w in &c.warnings {
                checks.push(Check::warn("cloud config", w.clone()));
            }
        }
        Err(e) => {
            checks.push(Check::fail(
                "cloud config",
                format!("{e} (fix: the named key in --cloud-config)"),
            ));
            return checks;
        }
    }
    // The API server and RBAC first: the cloud checks need the Nodes.
    let cluster = cluster_findings(flags, "cloud-controller-manager-openstack/doctor").await;
    checks.extend(cluster.checks);
    match super::openstack_cloud(bytes).await {
        Ok(cloud) => checks.extend(cloud.doctor(&cluster.nodes).await),
        Err(e) => checks.push(Check::fail("cloud provider", e)),
    }
    checks
}
