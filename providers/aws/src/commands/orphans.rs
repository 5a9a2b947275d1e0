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
//! Pod in `kube-system`; when both are known they must agree. Before anything is deleted:
//! - the kubeconfig's cluster is checked to be the cloud config's (the Nodes' instances carry
//!   its cluster tag, [`AwsCloud::verify_cluster`]); otherwise nothing is deleted;
//! - `--cluster-cidr` must be the running CCM's when its Pod states one;
//! - the confirmation prompt waits `--prompt-timeout` at most (nothing is deleted then);
//! - the Services are listed after the cloud's resources (a load balancer seen was made for a
//!   Service the listing shows), and again right before each deletion: when any changed, the
//!   orphans are found again and whatever is no longer one is kept.
//!
//! Exit code: 0 when the listing (and every deletion) succeeded, 1 otherwise.

use std::{io::Write, process::ExitCode};

use clap::{ArgAction, Args, FromArgMatches};
use k8s_cloud_provider::app::ProviderCommand;
use k8s_legacy_cloud_provider_aws::{
    AwsCloud,
    orphans::{Orphan, OrphanKind},
};
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
    /// How long the confirmation prompt of --delete waits for an answer (a Go duration); with
    /// no answer by then nothing is deleted. What is listed ages while the prompt waits.
    #[arg(long = "prompt-timeout", default_value = "2m", value_parser = parse_timeout)]
    pub prompt_timeout: std::time::Duration,
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    k8s_controller_manager::duration::parse_go_duration(s)
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

/// What the running CCM's Pod states: its `--cluster-name` (the default `kubernetes` without
/// the flag), its `--cluster-cidr` (`None` without the flag) and the Pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct RunningCcm {
    cluster_name: String,
    cluster_cidr: Option<String>,
    pod: String,
}

/// The CCM Pods of `kube-system` (a container whose command or arguments name
/// `cloud-controller-manager`): `Ok(None)` when there is none, an error when they disagree on
/// `--cluster-name` or `--cluster-cidr`.
async fn running_ccm(client: &kube::Client) -> Result<Option<RunningCcm>, String> {
    let pods = Api::<Pod>::namespaced(client.clone(), "kube-system")
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing the Pods of kube-system to find the CCM's flags: {e}"))?;
    let mut seen: Vec<RunningCcm> = Vec::new();
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
            let flag = |flag: &str| -> Option<String> {
                let mut value = None;
                for (i, w) in words.iter().enumerate() {
                    if let Some(v) = w.strip_prefix(&format!("{flag}=")) {
                        value = Some(v.to_string());
                    } else if *w == flag
                        && let Some(v) = words.get(i + 1)
                    {
                        value = Some(v.to_string());
                    }
                }
                value
            };
            seen.push(RunningCcm {
                cluster_name: flag("--cluster-name").unwrap_or_else(|| "kubernetes".into()),
                cluster_cidr: flag("--cluster-cidr"),
                pod: format!("Pod kube-system/{pod_name}"),
            });
        }
    }
    seen.sort();
    seen.dedup_by(|a, b| a.cluster_name == b.cluster_name && a.cluster_cidr == b.cluster_cidr);
    match seen.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        many => Err(format!(
            "the CCM Pods of kube-system run with different flags ({}); nothing is deleted",
            many.iter()
                .map(|r| format!(
                    "--cluster-name={:?} --cluster-cidr={:?} in {}",
                    r.cluster_name,
                    r.cluster_cidr.as_deref().unwrap_or(""),
                    r.pod
                ))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Checks `--cluster-cidr` against the running CCM's: the same set of CIDRs, when its Pod
/// states one. A wider range typed by mistake would make a NAT instance's default route an
/// orphan.
fn check_cluster_cidr(stated: &[ipnet::IpNet], running: Option<&RunningCcm>) -> Result<(), String> {
    let Some(running) = running else {
        eprintln!("warning: no CCM Pod in kube-system to check --cluster-cidr against; it is used as given");
        return Ok(());
    };
    let Some(theirs) = &running.cluster_cidr else {
        eprintln!(
            "warning: the CCM in {} runs without --cluster-cidr; --cluster-cidr is used as given",
            running.pod
        );
        return Ok(());
    };
    let mut want: Vec<ipnet::IpNet> = Vec::new();
    for c in theirs.split(',').filter(|c| !c.trim().is_empty()) {
        want.push(c.trim().parse().map_err(|e| {
            format!(
                "the CCM in {} runs with --cluster-cidr={theirs:?}, which is not a CIDR list ({e}); nothing is checked or deleted",
                running.pod
            )
        })?);
    }
    let mut have = stated.to_vec();
    have.sort();
    want.sort();
    if have != want {
        return Err(format!(
            "--cluster-cidr={} but the CCM in {} runs with --cluster-cidr={theirs}; nothing is deleted",
            stated
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            running.pod
        ));
    }
    Ok(())
}

/// The cluster name `--delete` uses (see the module docs), given the running CCM (or the
/// error that finding it gave).
fn cluster_name_for_delete(
    flags: &OrphansFlags,
    running: &Result<Option<RunningCcm>, String>,
) -> Result<String, String> {
    let running = match running {
        Ok(r) => r.clone(),
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
        (Some(stated), Some(r)) if *stated != r.cluster_name => Err(format!(
            "--cluster-name={stated} but the CCM in {} runs with --cluster-name={}; nothing is deleted",
            r.pod, r.cluster_name
        )),
        (Some(stated), _) => Ok(stated.clone()),
        (None, Some(r)) => {
            println!("Cluster name {:?}, as the CCM in {} runs with.", r.cluster_name, r.pod);
            Ok(r.cluster_name)
        }
        (None, None) => Err(
            "--delete needs the CCM's cluster name: give --cluster-name (no CCM Pod was found in kube-system to read it from); nothing is deleted"
                .into(),
        ),
    }
}

/// What a listing of Services was: each Service's UID and resource version.
type ServicesSeen = std::collections::BTreeSet<(String, String)>;

fn services_seen(services: &[Service]) -> ServicesSeen {
    services
        .iter()
        .map(|s| {
            (
                s.metadata.uid.clone().unwrap_or_default(),
                s.metadata.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

async fn list_services(client: &kube::Client) -> Result<Vec<Service>, String> {
    Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| {
            format!("listing the cluster's Services (nothing is listed or deleted without them): {e}")
        })
}

/// The orphans among the load balancers, target groups and security groups, with the
/// Services they were found against: found with a listing of the Services, which is repeated
/// after the cloud's resources were listed, and found again while it changed meanwhile (a load
/// balancer made for a Service created during the first listing is then wanted).
async fn find_stable(aws: &AwsCloud, client: &kube::Client) -> Result<(Vec<Orphan>, ServicesSeen), String> {
    let mut services = list_services(client).await?;
    for _ in 0..5 {
        let found = aws
            .find_orphans(&services)
            .await
            .map_err(|e| format!("listing cloud resources: {e}"))?;
        let again = list_services(client).await?;
        if services_seen(&again) == services_seen(&services) {
            return Ok((found, services_seen(&again)));
        }
        services = again;
    }
    Err("the cluster's Services kept changing while the cloud's resources were listed (5 times); nothing is listed or deleted, try again".into())
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
            "delete the classic ELB, revoke the node-group permission the CCM gave it and delete the security group the CCM made for it (k8s-elb-<name>); other groups on it are left as they are"
        }
        OrphanKind::NetworkLoadBalancer => {
            "revoke its node-group rules, delete its listeners and target groups, then the NLB"
        }
        OrphanKind::TargetGroup => "delete the target group",
        OrphanKind::SecurityGroup => {
            "check no load balancer or network interface uses it, revoke the CCM's permissions for it from the cluster's groups, delete it (kept when other rules name it)"
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

/// Asks for confirmation on the terminal, waiting `timeout` at most: `Ok(true)` for yes.
async fn confirm(count: usize, timeout: std::time::Duration) -> Result<bool, String> {
    print!("Delete these {count} resources? [y/N] ");
    let _ = std::io::stdout().flush();
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A thread of its own: a blocking read of the terminal, abandoned when the time is up.
    std::thread::spawn(move || {
        let mut answer = String::new();
        let _ = tx.send(std::io::stdin().read_line(&mut answer).map(|_| answer));
    });
    match tokio::time::timeout(timeout, rx).await {
        Err(_) => Err(format!(
            "no answer within --prompt-timeout={}s; nothing is deleted",
            timeout.as_secs()
        )),
        Ok(Err(_)) => Err("reading the confirmation failed; nothing is deleted".into()),
        Ok(Ok(Err(e))) => Err(format!("reading the confirmation: {e}; nothing is deleted")),
        Ok(Ok(Ok(answer))) => Ok(matches!(answer.trim(), "y" | "Y" | "yes")),
    }
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
    let running = running_ccm(&client).await;
    if !cluster_cidrs.is_empty() {
        match &running {
            Ok(r) => check_cluster_cidr(&cluster_cidrs, r.as_ref())?,
            Err(e) => eprintln!("warning: --cluster-cidr not checked against the CCM's: {e}"),
        }
    }
    let cluster_name = if flags.delete {
        Some(cluster_name_for_delete(flags, &running)?)
    } else {
        None
    };
    let aws = super::aws_cloud(flags.access.cloud_config_bytes()?).await?;
    let list_nodes = || async {
        Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(|e| {
                format!("listing the cluster's Nodes (no route is listed or deleted without them): {e}")
            })
    };
    if flags.delete {
        let nodes = list_nodes().await?;
        let checked = aws.verify_cluster(&nodes).await.map_err(|e| e.to_string())?;
        println!("Same cluster: {checked}.");
    }
    let (mut found, mut seen) = find_stable(&aws, &client).await?;
    let mut routes = Vec::new();
    if cluster_cidrs.is_empty() {
        eprintln!("Routes were not checked: give --cluster-cidr (the CCM's) to include them.");
    } else {
        let nodes = list_nodes().await?;
        routes = aws
            .find_orphan_routes(&nodes, &cluster_cidrs)
            .await
            .map_err(|e| format!("listing routes: {e}"))?;
    }
    let all: Vec<Orphan> = found.iter().chain(&routes).cloned().collect();
    if all.is_empty() {
        println!(
            "No orphans: every cluster-owned load balancer, target group and security group is in use or wanted by a Service, every checked route leads to a Node."
        );
        return Ok(true);
    }
    print!("{}", table(&all));
    let Some(cluster_name) = cluster_name else {
        println!("{} orphan(s). Run again with --delete to delete them.", all.len());
        return Ok(true);
    };
    print!("{}", plan(&all));
    if !flags.yes && !confirm(all.len(), flags.prompt_timeout).await? {
        println!("Nothing deleted.");
        return Ok(true);
    }
    let mut ok = true;
    for kind in DELETION_ORDER {
        for o in all.iter().filter(|o| o.kind == kind) {
            let result = if kind == OrphanKind::Route {
                match list_nodes().await {
                    Ok(nodes) => aws
                        .delete_orphan_route(o, &nodes)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                }
            } else {
                // The Services again: when any changed since the orphans were found, they are
                // found again, and one that is no longer an orphan is kept.
                let now = list_services(&client).await?;
                if services_seen(&now) != seen {
                    (found, seen) = find_stable(&aws, &client).await?;
                }
                if !found.iter().any(|f| f.kind == o.kind && f.id == o.id) {
                    println!(
                        "not deleted {} {} ({}): not found as an orphan again after the cluster's Services changed (gone already, or wanted again)",
                        o.kind, o.name, o.id
                    );
                    continue;
                }
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
