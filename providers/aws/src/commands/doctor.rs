//! `cloud-controller-manager-aws doctor`: pre-flight checks before a CCM takes over a cluster —
//! the cloud config parses and the provider starts, the credentials work, the IAM permissions
//! and cluster tags the provider needs ([`k8s_legacy_cloud_provider_aws::AwsCloud::doctor`]), every Node's instance exists,
//! the API server answers and the RBAC of the CCM's credentials covers every request the
//! controllers make ([`k8s_cloud_provider::doctor::rbac_checks`]). Prints one line per check
//! with a fix for each failure; the exit code is the number of failures.

use std::process::ExitCode;

use clap::{Args, FromArgMatches};
use k8s_cloud_provider::{
    app::ProviderCommand,
    doctor::{CONTROLLER_MANAGER_ACCESS, Check, exit_code, rbac_checks, table},
};
use k8s_legacy_cloud_provider_aws::config::CloudConfig;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::ListParams};

/// The command's flags.
#[derive(Debug, Clone, Args)]
pub struct DoctorFlags {
    /// Cluster and cloud access.
    #[command(flatten)]
    pub access: super::ClusterAccessFlags,
    /// The namespace of the leader-election Lease (the CCM's --leader-elect-resource-namespace).
    #[arg(long = "leader-elect-resource-namespace", default_value = "kube-system")]
    pub lease_namespace: String,
}

/// The command as the AWS binary registers it.
pub fn provider_command() -> ProviderCommand {
    ProviderCommand {
        name: "doctor",
        about: "Check the cloud config, AWS credentials, IAM permissions, cluster tags, Nodes and RBAC before running the CCM",
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
    let client = match flags
        .access
        .kube_client("cloud-controller-manager-aws/doctor")
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
    match super::aws_cloud(bytes).await {
        Ok(aws) => checks.extend(aws.doctor(&nodes).await),
        Err(e) => checks.push(Check::fail("cloud provider", e)),
    }
    checks
}
