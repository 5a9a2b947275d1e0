//! `cloud-controller-manager-aws orphans`: lists the load balancers, target groups and security
//! groups tagged as owned by the cluster that nothing alive uses any more, the rules of the
//! cluster's security groups that admit a security group or an NLB that no longer exists, and
//! (with `--cluster-cidr`) the routes to instances no Node runs on; with `--delete` (after a
//! confirmation, or `--yes`) deletes them, reading each again right before. The ownership
//! rules are those of [`k8s_legacy_cloud_provider_aws::orphans`]: IDs and tags only. Reads
//! every Service (and, for routes, every Node) of the cluster first: if that fails, nothing is
//! listed or deleted.
//!
//! `--delete` needs the CCM's cluster name: `--cluster-name`, or read from the running CCM's
//! Pod in `kube-system`; when both are known they must agree.
//!
//! Exit code: 0 when the listing (and every deletion) succeeded, 1 otherwise.

use std::{io::Write, process::ExitCode};

use clap::{ArgAction, Args, FromArgMatches};
use k8s_cloud_provider::app::ProviderCommand;
use k8s_legacy_cloud_provider_aws::orphans::{Orphan, OrphanKind};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::{Api, api::ListParams};

/// Find cloud resources this cluster owns that nothing uses any more, and optionally delete them.
#[derive(Debug, Clone, Args)]
pub struct OrphansFlags {
    /// Cluster and cloud access.
    #[command(flatten)]
    pub access: super::ClusterAccessFlags,
    /// The --cluster-name the CCM runs with. Needed by --delete (it names the NLB security
    /// groups the CCM manages); without it, it is read from the CCM's Pod in kube-system, and
    /// when both are known they must agree. The listing does not use it.
    #[arg(long = "cluster-name")]
    pub cluster_name: Option<String>,
    /// The CCM's --cluster-cidr (comma-separated): routes of the cluster's route table within it
    /// that are blackholes or point at an instance no Node runs on are orphans too. Without it
    /// routes are not checked.
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
        about: "List (and with --delete, delete) the load balancers, target groups, security groups, rules and routes this cluster owns that nothing uses any more",
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

/// The `--cluster-name` of the CCM Pods of `kube-system` (a container whose command or
/// arguments name `cloud-controller-manager`): `Ok(None)` when there is none, the default
/// `kubernetes` for a CCM without the flag, an error when they disagree.
async fn running_ccm_cluster_name(client: &kube::Client) -> Result<Option<(String, String)>, String> {
    let pods = Api::<Pod>::namespaced(client.clone(), "kube-system")
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing the Pods of kube-system to find the CCM's --cluster-name: {e}"))?;
    let mut seen: Vec<(String, String)> = Vec::new();
    for pod in pods.items {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            let words: Vec<&str> = c
                .command
                .iter()
                .flatten()
                .chain(c.args.iter().flatten())
                .map(String::as_str)
                .collect();
            if !words.iter().any(|w| w.contains("cloud-controller-manager")) {
                continue;
            }
            let mut name = "kubernetes".to_string();
            for (i, w) in words.iter().enumerate() {
                if let Some(v) = w.strip_prefix("--cluster-name=") {
                    name = v.to_string();
                } else if *w == "--cluster-name"
                    && let Some(v) = words.get(i + 1)
                {
                    name = v.to_string();
                }
            }
            seen.push((name, format!("Pod kube-system/{pod_name}")));
        }
    }
    seen.sort();
    seen.dedup_by(|a, b| a.0 == b.0);
    match seen.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        many => Err(format!(
            "the CCM Pods of kube-system run with different --cluster-name values ({}); nothing is deleted",
            many.iter()
                .map(|(n, p)| format!("{n:?} in {p}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The cluster name `--delete` uses (see the module docs).
async fn cluster_name_for_delete(flags: &OrphansFlags, client: &kube::Client) -> Result<String, String> {
    let running = match running_ccm_cluster_name(client).await {
        Ok(r) => r,
        Err(e) if flags.cluster_name.is_some() => {
            eprintln!("warning: {e}");
            None
        }
        Err(e) => {
            return Err(format!(
                "--delete needs the CCM's cluster name: give --cluster-name ({e}); nothing is deleted"
            ));
        }
    };
    match (&flags.cluster_name, running) {
        (Some(stated), Some((running, pod))) if *stated != running => Err(format!(
            "--cluster-name={stated} but the CCM in {pod} runs with --cluster-name={running}; nothing is deleted"
        )),
        (Some(stated), _) => Ok(stated.clone()),
        (None, Some((running, pod))) => {
            println!("Cluster name {running:?}, as the CCM in {pod} runs with.");
            Ok(running)
        }
        (None, None) => Err(
            "--delete needs the CCM's cluster name: give --cluster-name (no CCM Pod was found in kube-system to read it from); nothing is deleted"
                .into(),
        ),
    }
}

/// The kinds in the order they are deleted: load balancers before what they use, security
/// groups before the rules of gone sources, routes last.
const DELETION_ORDER: [OrphanKind; 6] = [
    OrphanKind::ClassicLoadBalancer,
    OrphanKind::NetworkLoadBalancer,
    OrphanKind::TargetGroup,
    OrphanKind::SecurityGroup,
    OrphanKind::SecurityGroupRule,
    OrphanKind::Route,
];

/// What deleting one kind does, for the plan.
fn plan_step(kind: OrphanKind) -> &'static str {
    match kind {
        OrphanKind::ClassicLoadBalancer => {
            "delete the classic ELB, then revoke the node-group rules that admitted it and delete its own security group"
        }
        OrphanKind::NetworkLoadBalancer => {
            "revoke its node-group rules, delete its listeners and target groups, then the NLB"
        }
        OrphanKind::TargetGroup => "delete the target group",
        OrphanKind::SecurityGroup => {
            "check no load balancer or network interface uses it, revoke the cluster-group rules that admit it, delete it"
        }
        OrphanKind::SecurityGroupRule => "check the source is still gone, revoke the rules",
        OrphanKind::Route => {
            "check the route still points at the same instance and no Node runs on it, delete it"
        }
    }
}

/// The numbered deletion plan.
pub fn plan(orphans: &[Orphan]) -> String {
    let mut out = String::from("Deletion plan (each is read again just before it is deleted):\n");
    let mut n = 0;
    for kind in DELETION_ORDER {
        for o in orphans.iter().filter(|o| o.kind == kind) {
            n += 1;
            out.push_str(&format!(
                "{n:>3}. {} {} ({}): {}\n",
                o.kind,
                o.name,
                o.id,
                plan_step(kind)
            ));
        }
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
    let client = flags
        .access
        .kube_client("cloud-controller-manager-aws/orphans")
        .await?;
    let cluster_name = if flags.delete {
        Some(cluster_name_for_delete(flags, &client).await?)
    } else {
        None
    };
    let aws = super::aws_cloud(flags.access.cloud_config_bytes()?).await?;
    let services = Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| {
            format!("listing the cluster's Services (nothing is listed or deleted without them): {e}")
        })?
        .items;
    let mut found = aws
        .find_orphans(&services)
        .await
        .map_err(|e| format!("listing cloud resources: {e}"))?;
    let list_nodes = || async {
        Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(|e| {
                format!("listing the cluster's Nodes (no route is listed or deleted without them): {e}")
            })
    };
    if cluster_cidrs.is_empty() {
        eprintln!("Routes were not checked: give --cluster-cidr (the CCM's) to include them.");
    } else {
        let nodes = list_nodes().await?;
        found.extend(
            aws.find_orphan_routes(&nodes, &cluster_cidrs)
                .await
                .map_err(|e| format!("listing routes: {e}"))?,
        );
    }
    if found.is_empty() {
        println!(
            "No orphans: every cluster-owned load balancer, target group and security group is in use or wanted by a Service, every checked route leads to a Node."
        );
        return Ok(true);
    }
    print!("{}", table(&found));
    let Some(cluster_name) = cluster_name else {
        println!(
            "{} orphan(s). Run again with --delete to delete them.",
            found.len()
        );
        return Ok(true);
    };
    print!("{}", plan(&found));
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
    for kind in DELETION_ORDER {
        for o in found.iter().filter(|o| o.kind == kind) {
            let result = if kind == OrphanKind::Route {
                match list_nodes().await {
                    Ok(nodes) => aws
                        .delete_orphan_route(o, &nodes)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                }
            } else {
                aws.delete_orphan(&cluster_name, o)
                    .await
                    .map_err(|e| e.to_string())
            };
            match result {
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
