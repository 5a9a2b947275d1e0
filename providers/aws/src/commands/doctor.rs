//! `cloud-controller-manager-aws doctor`: pre-flight checks before a CCM takes over a cluster —
//! the cloud config parses and the provider starts, the credentials work, the IAM permissions
//! and cluster tags the provider needs ([`k8s_legacy_cloud_provider_aws::AwsCloud::doctor`]), every Node's instance exists,
//! the API server answers and the RBAC of the CCM's credentials covers every request the
//! controllers make ([`k8s_cloud_provider::doctor::rbac_checks`]). Prints one line per check
//! with a fix for each failure; the exit code is the number of failures.

use k8s_cloud_provider::{
    app::ProviderCommand,
    doctor::{Check, DoctorFlags, cluster_findings, run_command},
};
use k8s_legacy_cloud_provider_aws::config::CloudConfig;

/// The command as the AWS binary registers it.
pub fn provider_command() -> ProviderCommand {
    ProviderCommand {
        name: "doctor",
        about: "Check the cloud config, AWS credentials, IAM permissions, cluster tags, Nodes and RBAC before running the CCM",
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
    match CloudConfig::parse(bytes.as_deref()) {
        Ok(_) => checks.push(Check::pass(
            "cloud config",
            flags.access.cloud_config.as_ref().map_or(
                "none given (defaults; region and cluster ID from IMDS)".to_string(),
                |p| format!("{} parses", p.display()),
            ),
        )),
        Err(e) => {
            checks.push(Check::fail(
                "cloud config",
                format!("{e} (fix: the named key in --cloud-config)"),
            ));
            return checks;
        }
    }
    // The API server and RBAC first: the cloud checks need the Nodes.
    let cluster = cluster_findings(flags, "cloud-controller-manager-aws/doctor").await;
    checks.extend(cluster.checks);
    match super::aws_cloud(bytes).await {
        Ok(aws) => checks.extend(aws.doctor(&cluster.nodes).await),
        Err(e) => checks.push(Check::fail("cloud provider", e)),
    }
    checks
}
