//! `cloud-controller-manager-aws orphans`: lists the load balancers, target groups and security
//! groups tagged as owned by the cluster that no Service owns any more, the rules of the
//! cluster's security groups that admit a security group or an NLB that no longer exists, and (with
//! `--cluster-cidr`) the routes to instances that are gone or run no Node
//! ([`k8s_legacy_cloud_provider_aws::orphans`]); with `--delete` (after a confirmation, or
//! `--yes`) deletes them the way the service controller would, checking ownership again on
//! each. Reads every Service of the cluster first: if that fails, nothing is listed or deleted.
//!
//! Exit code: 0 when the listing (and every deletion) succeeded, 1 otherwise.

use std::{io::Write, process::ExitCode};

use clap::{ArgAction, Args, FromArgMatches};
use k8s_cloud_provider::app::ProviderCommand;
use k8s_legacy_cloud_provider_aws::orphans::{Orphan, OrphanKind};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{Api, api::ListParams};

/// The command's flags.
#[derive(Debug, Clone, Args)]
pub struct OrphansFlags {
    /// Cluster and cloud access.
    #[command(flatten)]
    pub access: super::ClusterAccessFlags,
    /// The CCM's --cluster-name (part of the names of NLB security groups).
    #[arg(long = "cluster-name", default_value = "kubernetes")]
    pub cluster_name: String,
    /// The CCM's --cluster-cidr (comma-separated): routes of the cluster's route table within it
    /// that point at a gone instance or at no Node are orphans too. Without it routes are not
    /// checked.
    #[arg(long = "cluster-cidr", value_delimiter = ',')]
    pub cluster_cidr: Vec<String>,
    /// Delete the orphans (asks for confirmation on the terminal unless --yes).
    #[arg(long = "delete", action = ArgAction::SetTrue)]
    pub delete: bool,
    /// Do not ask before deleting.
    #[arg(long = "yes", short = 'y', action = ArgAction::SetTrue)]
    pub yes: bool,
}

/// The command as the AWS binary registers it.
pub fn provider_command() -> ProviderCommand {
    ProviderCommand {
        name: "orphans",
        about: "List (and with --delete, delete) cluster-owned load balancers, target groups and security groups no Service owns",
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

/// Prints the orphans as a table.
pub fn table(orphans: &[Orphan]) -> String {
    let rows: Vec<[String; 5]> = orphans
        .iter()
        .map(|o| {
            [
                o.kind.to_string(),
                o.name.clone(),
                o.id.clone(),
                o.owner.clone(),
                o.reason.clone(),
            ]
        })
        .collect();
    let header = ["KIND", "NAME", "ID", "OWNER", "REASON"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| if i == 4 { c.clone() } else { format!("{c:<w$}") })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `Ok(true)`: listed (and, with `--delete`, deleted) without an error.
async fn orphans(flags: &OrphansFlags) -> Result<bool, String> {
    let cluster_cidrs = flags
        .cluster_cidr
        .iter()
        .filter(|c| !c.is_empty())
        .map(|c| {
            c.parse::<ipnet::IpNet>()
                .map_err(|e| format!("--cluster-cidr: {c:?} is not a CIDR: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let aws = super::aws_cloud(flags.access.cloud_config_bytes()?).await?;
    let client = flags
        .access
        .kube_client("cloud-controller-manager-aws/orphans")
        .await?;
    let services = Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| {
            format!("listing the cluster's Services (nothing is listed or deleted without them): {e}")
        })?
        .items;
    let mut found = aws
        .find_orphans(&flags.cluster_name, &services)
        .await
        .map_err(|e| format!("listing cloud resources: {e}"))?;
    if cluster_cidrs.is_empty() {
        eprintln!("Routes were not checked: give --cluster-cidr (the CCM's) to include them.");
    } else {
        let nodes: std::collections::BTreeSet<String> = Api::<Node>::all(client)
            .list(&ListParams::default())
            .await
            .map_err(|e| {
                format!("listing the cluster's Nodes (no route is listed or deleted without them): {e}")
            })?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        found.extend(
            aws.find_orphan_routes(&flags.cluster_name, &nodes, &cluster_cidrs)
                .await
                .map_err(|e| format!("listing routes: {e}"))?,
        );
    }
    if found.is_empty() {
        println!(
            "No orphans: every cluster-owned load balancer, target group and security group belongs to a Service, every checked route to a Node."
        );
        return Ok(true);
    }
    print!("{}", table(&found));
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
    for kind in [
        OrphanKind::ClassicLoadBalancer,
        OrphanKind::NetworkLoadBalancer,
        OrphanKind::TargetGroup,
        OrphanKind::SecurityGroup,
        OrphanKind::SecurityGroupRule,
        OrphanKind::Route,
    ] {
        for o in found.iter().filter(|o| o.kind == kind) {
            match aws.delete_orphan(&flags.cluster_name, o).await {
                Ok(()) => println!("deleted {} {} ({})", o.kind, o.name, o.id),
                Err(e) => {
                    ok = false;
                    println!("FAILED to delete {} {} ({}): {e}", o.kind, o.name, o.id);
                }
            }
        }
    }
    Ok(ok)
}
