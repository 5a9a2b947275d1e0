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
//! - and what every provider's `orphans` does ([`k8s_cloud_provider::orphans`]): the Services
//!   listed before and after the cloud's resources, a deadline for the listing
//!   (`--list-timeout`), a deadline for the prompt (`--prompt-timeout`), the Services listed
//!   again right before each deletion (whatever is no longer an orphan is kept).
//!
//! Exit code: 0 when the listing (and every deletion) succeeded, 1 otherwise.

use std::process::ExitCode;

use clap::{Args, FromArgMatches};
use k8s_cloud_provider::{
    app::ProviderCommand,
    orphans::{OrphanFinder, OrphanRow, OrphansRunFlags},
};
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
    /// Deleting, prompting, deadlines, output.
    #[command(flatten)]
    pub run: OrphansRunFlags,
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

/// The AWS side of `orphans`.
struct AwsOrphans {
    aws: std::sync::Arc<AwsCloud>,
    client: kube::Client,
    /// The CCM's cluster name (`--delete` only).
    cluster_name: Option<String>,
    cluster_cidrs: Vec<ipnet::IpNet>,
}

impl AwsOrphans {
    async fn nodes(&self) -> Result<Vec<Node>, String> {
        Api::<Node>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(|e| {
                format!(
                    "listing the cluster's Nodes (nothing is deleted and no route listed without them): {e}"
                )
            })
    }
}

#[k8s_cloud_provider::async_trait]
impl OrphanFinder for AwsOrphans {
    type Orphan = Orphan;

    fn row(&self, o: &Orphan) -> OrphanRow {
        OrphanRow::new(o.kind.to_string(), &o.name, &o.id, &o.owner, &o.reason)
    }

    fn plan_step(&self, o: &Orphan) -> String {
        plan_step(o.kind).into()
    }

    fn nothing_found(&self) -> String {
        "No orphans: every cluster-owned load balancer, target group and security group is in use or wanted by a Service, every checked route leads to a Node.".into()
    }

    async fn verify_cluster(&self) -> Result<String, String> {
        let nodes = self.nodes().await?;
        self.aws.verify_cluster(&nodes).await.map_err(|e| e.to_string())
    }

    async fn find(&self, services: &[Service]) -> Result<Vec<Orphan>, String> {
        let mut found = self
            .aws
            .find_orphans(services)
            .await
            .map_err(|e| format!("listing cloud resources: {e}"))?;
        if !self.cluster_cidrs.is_empty() {
            let nodes = self.nodes().await?;
            found.extend(
                self.aws
                    .find_orphan_routes(&nodes, &self.cluster_cidrs)
                    .await
                    .map_err(|e| format!("listing routes: {e}"))?,
            );
        }
        // In the order they are deleted.
        found.sort_by_key(|o| DELETION_ORDER.iter().position(|k| *k == o.kind));
        Ok(found)
    }

    async fn delete(&self, o: &Orphan, _services: &[Service]) -> Result<(), String> {
        if o.kind == OrphanKind::Route {
            let nodes = self.nodes().await?;
            return self
                .aws
                .delete_orphan_route(o, &nodes)
                .await
                .map_err(|e| e.to_string());
        }
        let cluster_name = self
            .cluster_name
            .as_deref()
            .ok_or("--delete needs the CCM's cluster name; nothing is deleted")?;
        self.aws
            .delete_orphan(cluster_name, o)
            .await
            .map_err(|e| e.to_string())
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
    let cluster_name = if flags.run.delete {
        Some(cluster_name_for_delete(flags, &running)?)
    } else {
        None
    };
    if cluster_cidrs.is_empty() {
        eprintln!("Routes were not checked: give --cluster-cidr (the CCM's) to include them.");
    }
    let finder = AwsOrphans {
        aws: super::aws_cloud(flags.access.cloud_config_bytes()?).await?,
        client: client.clone(),
        cluster_name,
        cluster_cidrs,
    };
    k8s_cloud_provider::orphans::run(&finder, &client, &flags.run).await
}
