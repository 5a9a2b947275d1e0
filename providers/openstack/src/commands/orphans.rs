//! `cloud-controller-manager-openstack orphans`: lists the Octavia load balancers and floating
//! IPs this cluster made that no Service wants any more; with `--delete` (after a confirmation,
//! or `--yes`) deletes them, reading each again (and every Service) right before. The rules are
//! those of [`k8s_legacy_cloud_provider_openstack::orphans`]. Reads every Service of the cluster
//! first: if that fails, nothing is listed or deleted. `--cluster-name` is the CCM's (its load
//! balancers are named after it); another cluster's resources never match. `--delete` first
//! checks that the kubeconfig's cluster is one of the cloud config's project
//! ([`OpenStackCloud::verify_cluster`](k8s_legacy_cloud_provider_openstack::OpenStackCloud::verify_cluster):
//! its Nodes' servers are there); otherwise nothing is deleted.
//!
//! Output: one line per orphan, tab-separated: kind, name, ID, the Service it was made for, why.
//! Exit code: 0 when the listing (and every deletion) succeeded, 1 otherwise.

use std::{io::Write, process::ExitCode};

use clap::{ArgAction, Args, FromArgMatches};
use k8s_cloud_provider::app::{ClusterAccessFlags, ProviderCommand};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{Api, api::ListParams};

/// Find the load balancers, floating IPs and security groups this cluster made that no Service wants, and
/// optionally delete them.
#[derive(Debug, Clone, Args)]
pub struct OrphansFlags {
    /// Cluster and cloud access.
    #[command(flatten)]
    pub access: ClusterAccessFlags,
    /// The --cluster-name the CCM runs with (its load balancers are named
    /// kube_service_<cluster>_<namespace>_<name>).
    #[arg(long = "cluster-name", default_value = "kubernetes")]
    pub cluster_name: String,
    /// Delete the orphans (asks for confirmation on the terminal unless --yes).
    #[arg(long = "delete", action = ArgAction::SetTrue)]
    pub delete: bool,
    /// Do not ask before deleting.
    #[arg(long = "yes", short = 'y', action = ArgAction::SetTrue)]
    pub yes: bool,
}

/// The command as the OpenStack binary registers it.
pub fn provider_command() -> ProviderCommand {
    ProviderCommand {
        name: "orphans",
        about: "List (and with --delete, delete) the Octavia load balancers, floating IPs and security groups (manage-security-groups) this cluster made that no Service wants any more",
        flags: <OrphansFlags as Args>::augment_args,
        run: |matches| Box::pin(async move { run(matches).await }),
    }
}

async fn run(matches: clap::ArgMatches) -> ExitCode {
    let flags = match OrphansFlags::from_arg_matches(&matches) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match orphans(&flags).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn orphans(flags: &OrphansFlags) -> Result<bool, String> {
    let client = flags
        .access
        .kube_client("cloud-controller-manager-openstack/orphans")
        .await?;
    let cloud = super::openstack_cloud(flags.access.cloud_config_bytes()?).await?;
    let services = || async {
        Api::<Service>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(|e| {
                format!("listing the cluster's Services (nothing is listed or deleted without them): {e}")
            })
    };
    if flags.delete {
        // Before anything is listed for deletion: the kubeconfig's cluster is one of the cloud
        // config's project (its Nodes' servers are there).
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(|e| format!("listing the cluster's Nodes (nothing is deleted without them): {e}"))?;
        let checked = cloud.verify_cluster(&nodes).await.map_err(|e| e.to_string())?;
        println!("Same cluster: {checked}.");
    }
    let cluster = &flags.cluster_name;
    let found = cloud
        .orphans(cluster, &services().await?)
        .await
        .map_err(|e| format!("listing cloud resources: {e}"))?;
    if found.is_empty() {
        println!(
            "No orphans: every load balancer, floating IP and security group cluster {cluster:?} made is wanted by a Service."
        );
        return Ok(true);
    }
    for o in &found {
        println!("{}\t{}\t{}\t{}\t{}", o.kind, o.name, o.id, o.owner, o.reason);
    }
    if !flags.delete {
        println!(
            "{} orphan(s). Run again with --delete to delete them.",
            found.len()
        );
        return Ok(true);
    }
    if !flags.yes {
        print!("Delete these {} resources? [y/N] ", found.len());
        let _ = std::io::stdout().flush();
        let mut answer = String::new();
        std::io::stdin()
            .read_line(&mut answer)
            .map_err(|e| format!("reading the confirmation: {e}"))?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("Nothing deleted.");
            return Ok(true);
        }
    }
    let mut ok = true;
    // In the listing's order: floating IPs, load balancers, then security groups (as a Service's deletion).
    for o in &found {
        let result = match services().await {
            Ok(now) => cloud
                .delete_orphan(cluster, &now, o)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => println!("deleted {} {} ({})", o.kind, o.name, o.id),
            Err(e) => {
                ok = false;
                println!("FAILED to delete {} {} ({}): {e}", o.kind, o.name, o.id);
            }
        }
    }
    Ok(ok)
}
