//! Finding (and deleting) the resources this cluster owns that nothing alive uses any more —
//! what a cloud-controller-manager leaves behind when a Service's cleanup finalizer was removed
//! by hand, when it was stopped for good, or when a bug skipped a deletion. Not part of
//! upstream; the `orphans` command of `cloud-controller-manager-aws` runs it.
//!
//! Ownership and liveness are decided by IDs and tags only, never by a name computed from a
//! cluster name the operator may have mistyped. The rules, all of which must hold:
//!
//! - **Ownership.** Only resources tagged `kubernetes.io/cluster/<cluster ID>=owned` (or the
//!   legacy `KubernetesCluster=<cluster ID>`) and `kubernetes.io/service-name=<ns>/<name>` are
//!   looked at; the cluster ID is the CCM's (cloud config, or the instance's tags). Resources
//!   of the AWS Load Balancer Controller (`elbv2.k8s.aws/…` tags) never are.
//! - **Classic ELBs and NLBs.** An orphan when no Service wants a load balancer of its name and
//!   no Service is served by it: a Service wants `a` + its UID (without dashes, 32 characters)
//!   when it is `type: LoadBalancer` or still carries the cleanup finalizer, of the kind its
//!   annotations name — both kinds when they do not parse (doubt keeps); and any Service (of
//!   any type or class, external ones included) is served by the load balancers whose DNS name
//!   its `status.loadBalancer.ingress` still shows — the old one during a switch between kinds,
//!   after a failed switch, or while another controller takes the Service over.
//! - **Target groups.** An orphan when its Service wants no NLB and every load balancer it is
//!   attached to is an orphan too (it goes with them).
//! - **Security groups.** Only groups this provider made for a load balancer are ever looked
//!   at: a Classic ELB's `k8s-elb-<name>` (name, owned tag and the description it is made
//!   with), an NLB's managed group (owned and Service tags, the managed description). Any other
//!   group, even one tagged `owned` (EKS' cluster group, a Service's `extra-security-groups`),
//!   is never an orphan and never deleted. Such a group is an orphan when no load balancer that
//!   stays (any Classic ELB, NLB or ALB of the account and region that is not itself an orphan)
//!   has it, no network interface but a load balancer's uses it, it is not `[Global]
//!   ElbSecurityGroup`, and its Service wants nothing of it: `k8s-elb-<name>` is wanted while a
//!   Service wants the Classic ELB `<name>`, the NLB's managed group while its Service wants an
//!   NLB. Deleting one revokes only this provider's permission for it (every protocol from the
//!   group) from the cluster's groups; when rules of any other shape, or of groups without the
//!   cluster tag, still name it, it is kept and so are they.
//! - **Rules of the cluster's security groups** admitting a source that is gone: this
//!   provider's permission (every protocol) for a security group of this account and VPC that
//!   no longer exists (rules through a peering connection or naming another account or VPC,
//!   and rules of any other shape, are never looked at), or an NLB named in the rule's
//!   description (`kubernetes.io/rule/nlb/{client,health,mtu}=<name>`) that does not exist and
//!   that no Service wants.
//! - **Routes** (with the cluster CIDR): see [`routes`].
//!
//! The account is checked to be the cluster's before anything is deleted
//! ([`AwsCloud::verify_cluster`]: the Nodes' instances carry this cluster ID's tag).
//! Deletion ([`AwsCloud::delete_orphan`], [`AwsCloud::delete_orphan_route`]) reads every
//! candidate again right before deleting it and refuses when it is no longer an orphan. Its
//! order never removes what a load balancer that stays needs: load balancers first, then
//! target groups, then security groups (a group still used by a load balancer is refused
//! before any rule admitting it is revoked), then rules admitting gone sources, then routes.

use std::collections::{BTreeMap, BTreeSet};

use k8s_cloud_provider::{
    CloudError, CloudResult,
    service::helpers::{default_load_balancer_name, service_key},
};
use k8s_openapi::api::core::v1::Service;

use crate::{
    AwsCloud,
    annotations::{LbKind, LbOptions, is_external},
    cloud_error,
    lb::network::{elb_tag_map, elbv2_tag_map, not_found_as_none},
};

/// The finalizer of the service controller's load-balancer cleanup.
const CLEANUP_FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
/// The Service tag on every load-balancer resource this provider creates.
const SERVICE_TAG: &str = "kubernetes.io/service-name";
/// [`SeenLb::kind`] of a target group.
const TARGET_GROUP: &str = "target-group";

mod groups;
pub mod routes;

/// What kind of resource an [`Orphan`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OrphanKind {
    /// A Classic ELB.
    ClassicLoadBalancer,
    /// A Network Load Balancer.
    NetworkLoadBalancer,
    /// An NLB target group.
    TargetGroup,
    /// A load balancer's security group.
    SecurityGroup,
    /// Rules of a cluster security group that admit a source that is gone: a security group
    /// that no longer exists, or an NLB (its client, health-check and path-MTU rules) that no
    /// longer exists and that no Service wants.
    SecurityGroupRule,
    /// A route of the cluster's route table (within the cluster CIDR) to an instance that is
    /// gone or that no Node runs on.
    Route,
}

impl std::fmt::Display for OrphanKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ClassicLoadBalancer => "classic-elb",
            Self::NetworkLoadBalancer => "nlb",
            Self::TargetGroup => "target-group",
            Self::SecurityGroup => "security-group",
            Self::SecurityGroupRule => "sg-rule",
            Self::Route => "route",
        })
    }
}

/// A cluster-owned resource no Service owns.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Orphan {
    /// Its kind (deletion order: load balancers, target groups, security groups).
    pub kind: OrphanKind,
    /// Its name.
    pub name: String,
    /// Its ID: the name (Classic ELB), the ARN (NLB, target group), the group ID, for a route
    /// its destination CIDR (also its name), for security-group rules
    /// `<group id>/<missing source group id>` or `<group id>/nlb=<NLB name>` (also the name).
    pub id: String,
    /// What it was made for: the Service (`namespace/name`, from its tag), for a route the
    /// instance it points at (`instance/<id>`; `instance/` when EC2 names none), for rules the
    /// source that is gone (`group/<id>`, `nlb/<name>`).
    pub owner: String,
    /// Why no Service owns it.
    pub reason: String,
}

/// What the Services of the cluster want.
#[derive(Debug, Default)]
struct Wanted {
    /// Load-balancer names wanted as Classic ELBs.
    classic: BTreeSet<String>,
    /// Load-balancer names wanted as NLBs.
    network: BTreeSet<String>,
    /// Service keys that want an NLB, or whose kind is in doubt (their target groups and
    /// security groups, but a Classic ELB's `k8s-elb-…`, are theirs).
    network_services: BTreeSet<String>,
    /// Service keys that exist, for the reasons.
    services: BTreeSet<String>,
    /// The hostnames (lower case) and IPs the Services' `status.loadBalancer.ingress` show:
    /// the load balancers serving them now, whatever their annotations say.
    serving: BTreeSet<String>,
}

impl Wanted {
    /// Whether a Service is served by the load balancer with this DNS name.
    fn serves(&self, dns_name: &str) -> bool {
        !dns_name.is_empty() && self.serving.contains(&dns_name.to_ascii_lowercase())
    }
}

/// One load balancer of the account and region (any type), as a listing saw it.
#[derive(Debug, Clone)]
pub(crate) struct SeenLb {
    /// Its name.
    pub(crate) name: String,
    /// The name (Classic ELB) or ARN (ELBv2).
    pub(crate) id: String,
    /// `classic`, or the ELBv2 type (`network`, `application`, `gateway`).
    pub(crate) kind: String,
    /// Its security groups.
    pub(crate) groups: Vec<String>,
    /// For target groups: the load balancers (ARNs) it is attached to; empty otherwise.
    pub(crate) attached_to: Vec<String>,
    /// Its DNS name (empty for target groups).
    pub(crate) dns_name: String,
}

impl AwsCloud {
    fn wanted(&self, services: &[Service]) -> Wanted {
        let mut w = Wanted::default();
        for svc in services {
            let key = service_key(svc);
            w.services.insert(key.clone());
            for ingress in svc
                .status
                .iter()
                .flat_map(|s| s.load_balancer.iter())
                .flat_map(|lb| lb.ingress.iter().flatten())
            {
                w.serving
                    .extend(ingress.hostname.iter().map(|h| h.to_ascii_lowercase()));
                w.serving.extend(ingress.ip.iter().cloned());
            }
            let is_lb = svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
            let has_finalizer = svc
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.iter().any(|f| f == CLEANUP_FINALIZER));
            if !(is_lb || has_finalizer) || is_external(svc) {
                continue;
            }
            let name = default_load_balancer_name(svc);
            let kind = LbOptions::parse(svc)
                .ok()
                .map(|o| o.kind.unwrap_or(LbKind::Classic));
            if matches!(kind, None | Some(LbKind::Classic)) {
                w.classic.insert(name.clone());
            }
            if matches!(kind, None | Some(LbKind::Network)) {
                w.network.insert(name);
                w.network_services.insert(key);
            }
        }
        w
    }

    /// Whether a tag set belongs to the load-balancer resources of this provider and cluster.
    fn ours(&self, tags: &BTreeMap<String, String>) -> Option<String> {
        if !self.owned_by_cluster(tags) || tags.keys().any(|k| k.starts_with("elbv2.k8s.aws/")) {
            return None;
        }
        tags.get(SERVICE_TAG).cloned()
    }

    fn reason(w: &Wanted, service: &str, what: &str) -> String {
        if w.services.contains(service) {
            format!("Service {service} exists but wants no {what}")
        } else {
            format!("Service {service} does not exist")
        }
    }

    /// Every Classic ELB, ELBv2 load balancer (of any type) and target group of the account
    /// and region (all pages).
    pub(crate) async fn all_load_balancers(&self) -> CloudResult<Vec<SeenLb>> {
        let classic = self
            .api
            .call(
                "elb_describe_load_balancers",
                self.elb
                    .describe_load_balancers()
                    .into_paginator()
                    .items()
                    .send()
                    .try_collect(),
            )
            .await
            .map_err(|e| cloud_error("listing classic ELBs", e))?;
        let v2 = self
            .api
            .call(
                "elbv2_describe_load_balancers",
                self.elbv2
                    .describe_load_balancers()
                    .into_paginator()
                    .items()
                    .send()
                    .try_collect(),
            )
            .await
            .map_err(|e| cloud_error("listing ELBv2 load balancers", e))?;
        let target_groups = self
            .api
            .call(
                "elbv2_describe_target_groups",
                self.elbv2
                    .describe_target_groups()
                    .into_paginator()
                    .items()
                    .send()
                    .try_collect(),
            )
            .await
            .map_err(|e| cloud_error("listing target groups", e))?;
        let classic = classic.into_iter().map(|d| SeenLb {
            name: d.load_balancer_name().unwrap_or_default().to_string(),
            id: d.load_balancer_name().unwrap_or_default().to_string(),
            kind: "classic".into(),
            groups: d.security_groups().to_vec(),
            attached_to: vec![],
            dns_name: d.dns_name().unwrap_or_default().to_string(),
        });
        let v2 = v2.into_iter().map(|lb| SeenLb {
            name: lb.load_balancer_name().unwrap_or_default().to_string(),
            id: lb.load_balancer_arn().unwrap_or_default().to_string(),
            kind: lb.r#type().map(|t| t.as_str().to_string()).unwrap_or_default(),
            groups: lb.security_groups().to_vec(),
            attached_to: vec![],
            dns_name: lb.dns_name().unwrap_or_default().to_string(),
        });
        let target_groups = target_groups.into_iter().map(|tg| SeenLb {
            name: tg.target_group_name().unwrap_or_default().to_string(),
            id: tg.target_group_arn().unwrap_or_default().to_string(),
            kind: TARGET_GROUP.into(),
            groups: vec![],
            attached_to: tg.load_balancer_arns().to_vec(),
            dns_name: String::new(),
        });
        Ok(classic.chain(v2).chain(target_groups).collect())
    }

    /// The cluster-owned resources that no Service of `services` (every Service of the
    /// cluster) owns and nothing alive uses, sorted by kind and name (the rules: module docs).
    /// Routes are found by [`AwsCloud::find_orphan_routes`].
    pub async fn find_orphans(&self, services: &[Service]) -> CloudResult<Vec<Orphan>> {
        let w = self.wanted(services);
        let seen = self.all_load_balancers().await?;
        let mut found = Vec::new();

        // Classic ELBs (tags read 20 at a time).
        let classic_dns: BTreeMap<&str, &str> = seen
            .iter()
            .filter(|l| l.kind == "classic")
            .map(|l| (l.name.as_str(), l.dns_name.as_str()))
            .collect();
        let classic: Vec<String> = classic_dns.keys().map(|n| n.to_string()).collect();
        for chunk in classic.chunks(20) {
            let out = self
                .api
                .call(
                    "elb_describe_tags",
                    self.elb
                        .describe_tags()
                        .set_load_balancer_names(Some(chunk.to_vec()))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("reading classic ELB tags", e))?;
            for d in out.tag_descriptions() {
                let tags = elb_tag_map(d.tags());
                let name = d.load_balancer_name().unwrap_or_default();
                let serving = classic_dns.get(name).is_some_and(|dns| w.serves(dns));
                if let Some(service) = self.ours(&tags)
                    && !w.classic.contains(name)
                    && !serving
                {
                    found.push(Orphan {
                        kind: OrphanKind::ClassicLoadBalancer,
                        name: name.to_string(),
                        id: name.to_string(),
                        reason: Self::reason(&w, &service, &format!("classic ELB named {name}")),
                        owner: service,
                    });
                }
            }
        }

        // NLBs and target groups (tags read 20 at a time).
        let v2: BTreeMap<&str, &SeenLb> = seen
            .iter()
            .filter(|l| l.kind == "network" || l.kind == TARGET_GROUP)
            .map(|l| (l.id.as_str(), l))
            .collect();
        let keys: Vec<String> = v2.keys().map(|k| k.to_string()).collect();
        let mut orphan_nlbs = BTreeSet::new();
        let mut target_groups = Vec::new();
        for chunk in keys.chunks(20) {
            let out = self
                .api
                .call(
                    "elbv2_describe_tags",
                    self.elbv2
                        .describe_tags()
                        .set_resource_arns(Some(chunk.to_vec()))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("reading NLB and target group tags", e))?;
            for d in out.tag_descriptions() {
                let tags = elbv2_tag_map(d.tags());
                let arn = d.resource_arn().unwrap_or_default();
                let (Some(service), Some(lb)) = (self.ours(&tags), v2.get(arn)) else {
                    continue;
                };
                if lb.kind == TARGET_GROUP {
                    target_groups.push(((*lb).clone(), service));
                } else if !w.network.contains(&lb.name) && !w.serves(&lb.dns_name) {
                    orphan_nlbs.insert(arn.to_string());
                    found.push(Orphan {
                        kind: OrphanKind::NetworkLoadBalancer,
                        name: lb.name.clone(),
                        id: arn.to_string(),
                        reason: Self::reason(&w, &service, &format!("NLB named {}", lb.name)),
                        owner: service,
                    });
                }
            }
        }
        for (tg, service) in target_groups {
            if !w.network_services.contains(&service)
                && tg.attached_to.iter().all(|lb| orphan_nlbs.contains(lb))
            {
                found.push(Orphan {
                    kind: OrphanKind::TargetGroup,
                    name: tg.name,
                    id: tg.id,
                    reason: Self::reason(&w, &service, "NLB"),
                    owner: service,
                });
            }
        }

        // Security groups and the rules admitting gone sources.
        let leaving: BTreeSet<String> = found.iter().map(|o| o.id.clone()).collect();
        self.find_orphan_groups(&w, &seen, &leaving, &mut found).await?;
        found.sort();
        found.dedup();
        Ok(found)
    }

    /// Checks that the cluster whose Nodes are `nodes` (every Node, from the kubeconfig) is the
    /// cluster of this cloud config's cluster ID, before anything is deleted: every Node with an
    /// AWS provider ID must run on an instance of this account and region that carries the
    /// cluster tag (`kubernetes.io/cluster/<id>`, or legacy `KubernetesCluster=<id>`), and
    /// there must be at least one. A kubeconfig of one cluster paired with the cloud config of
    /// another would otherwise make every load balancer of the other cluster an orphan.
    /// Returns a one-line summary of what was checked.
    pub async fn verify_cluster(&self, nodes: &[k8s_openapi::api::core::v1::Node]) -> CloudResult<String> {
        let id = self.cluster_id();
        let mut by_instance: BTreeMap<String, String> = BTreeMap::new();
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let Some(pid) = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) else {
                continue;
            };
            if !pid.starts_with("aws://") {
                continue;
            }
            let instance = crate::instances::instance_id_from_provider_id(pid).map_err(|e| {
                CloudError::msg(format!(
                    "Node {name}: spec.providerID {pid:?}: {e}; nothing is deleted"
                ))
            })?;
            by_instance.insert(instance, name);
        }
        if by_instance.is_empty() {
            return Err(CloudError::msg(format!(
                "no Node of the kubeconfig's cluster has an AWS provider ID, so it cannot be checked to be the cluster {id:?} of the cloud config; nothing is deleted"
            )));
        }
        let ids: Vec<String> = by_instance.keys().cloned().collect();
        let found: BTreeMap<String, crate::instances::InstanceInfo> = self
            .instances_by_id(&ids)
            .await
            .map_err(|e| CloudError::msg(format!("reading the Nodes' instances to check the cluster: {e}")))?
            .iter()
            .map(|i| {
                let info = crate::instances::InstanceInfo::from_sdk(i);
                (info.id.clone(), info)
            })
            .collect();
        let mut problems = Vec::new();
        for (instance, node) in &by_instance {
            match found.get(instance) {
                None => problems.push(format!(
                    "Node {node}'s instance {instance} is not in this account and region"
                )),
                Some(i) if !i.belongs_to(id) => problems.push(format!(
                    "Node {node}'s instance {instance} does not carry the tag kubernetes.io/cluster/{id}"
                )),
                Some(_) => {}
            }
        }
        if !problems.is_empty() {
            let shown: Vec<&str> = problems.iter().take(3).map(String::as_str).collect();
            return Err(CloudError::msg(format!(
                "the kubeconfig's cluster does not look like the cluster {id:?} of the cloud config: {}{}; nothing is deleted",
                shown.join("; "),
                if problems.len() > 3 {
                    format!(" (and {} more)", problems.len() - 3)
                } else {
                    String::new()
                }
            )));
        }
        Ok(format!(
            "the instances of the cluster's {} Node(s) carry the tag kubernetes.io/cluster/{id}",
            by_instance.len()
        ))
    }

    /// Deletes one orphan found by [`AwsCloud::find_orphans`] the way the service controller
    /// deletes a load balancer: a Classic ELB or NLB with its listeners and the node security
    /// group rules that admitted it; a target group; a security group after the rules of other
    /// cluster groups that name it; rules admitting a gone source. Every resource is read again
    /// first: ownership, and that it is still unused. Delete in the order of
    /// [`OrphanKind`]'s variants (load balancers first). Routes: [`AwsCloud::delete_orphan_route`].
    /// `cluster_name` is the CCM's `--cluster-name` (an NLB's managed group is found by it, as
    /// well as by its attachment).
    pub async fn delete_orphan(&self, cluster_name: &str, orphan: &Orphan) -> CloudResult<()> {
        let (namespace, name) = orphan.owner.split_once('/').unwrap_or(("", &orphan.owner));
        let svc = Service {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some(namespace.to_string()),
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        match orphan.kind {
            OrphanKind::ClassicLoadBalancer => {
                if self.classic_owned(&orphan.id).await? {
                    self.delete_classic(&orphan.id, &BTreeSet::new(), crate::lb::Deleter::Orphans)
                        .await?;
                }
            }
            OrphanKind::NetworkLoadBalancer => {
                if self.elbv2_owned(&orphan.id).await? {
                    self.delete_nlb(
                        cluster_name,
                        &orphan.name,
                        &svc,
                        &BTreeSet::new(),
                        crate::lb::Deleter::Orphans,
                    )
                    .await?;
                }
            }
            OrphanKind::TargetGroup => {
                // Gone already when it went with its NLB.
                if self.elbv2_owned(&orphan.id).await? {
                    self.delete_target_group(&orphan.id).await?;
                }
            }
            OrphanKind::SecurityGroup => self.delete_orphan_group(orphan).await?,
            OrphanKind::SecurityGroupRule => self.delete_orphan_rules(&orphan.id).await?,
            OrphanKind::Route => {
                return Err(CloudError::msg(format!(
                    "route {}: routes are deleted with delete_orphan_route (it needs the cluster's Nodes)",
                    orphan.id
                )));
            }
        }
        Ok(())
    }

    /// Whether the Classic ELB exists and is this cluster's (`Ok(false)`: gone); an ELB of
    /// somebody else is an error.
    async fn classic_owned(&self, name: &str) -> CloudResult<bool> {
        let r = self
            .api
            .call(
                "elb_describe_tags",
                self.elb.describe_tags().load_balancer_names(name).send(),
            )
            .await;
        let Some(out) = not_found_as_none(r, &["LoadBalancerNotFound"])
            .map_err(|e| cloud_error(format!("reading the tags of classic ELB {name}"), e))?
        else {
            return Ok(false);
        };
        let tags = elb_tag_map(out.tag_descriptions().iter().flat_map(|d| d.tags()));
        match self.ours(&tags) {
            Some(_) => Ok(true),
            None => Err(CloudError::msg(format!(
                "classic ELB {name} is not owned by this cluster's load balancers; not deleted"
            ))),
        }
    }

    /// Whether the NLB or target group exists and is this cluster's (`Ok(false)`: gone).
    async fn elbv2_owned(&self, arn: &str) -> CloudResult<bool> {
        let r = self
            .api
            .call(
                "elbv2_describe_tags",
                self.elbv2.describe_tags().resource_arns(arn).send(),
            )
            .await;
        let Some(out) = not_found_as_none(r, &["LoadBalancerNotFound", "TargetGroupNotFound"])
            .map_err(|e| cloud_error(format!("reading the tags of {arn}"), e))?
        else {
            return Ok(false);
        };
        if out.tag_descriptions().is_empty() {
            return Ok(false);
        }
        let tags = elbv2_tag_map(out.tag_descriptions().iter().flat_map(|d| d.tags()));
        match self.ours(&tags) {
            Some(_) => Ok(true),
            None => Err(CloudError::msg(format!(
                "{arn} is not owned by this cluster's load balancers; not deleted"
            ))),
        }
    }
}
