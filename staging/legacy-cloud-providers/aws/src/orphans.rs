//! Finding (and deleting) the load-balancer resources this cluster owns that no Service owns
//! any more — what a cloud-controller-manager leaves behind when a Service's cleanup finalizer
//! was removed by hand, when it was stopped for good, or when a bug skipped a deletion. Not
//! part of upstream; the `orphans` command of `cloud-controller-manager-aws` runs it.
//!
//! Only resources tagged `kubernetes.io/cluster/<id>=owned` (or the legacy
//! `KubernetesCluster=<id>`) and `kubernetes.io/service-name=<namespace>/<name>` are looked at:
//! Classic ELBs, NLBs, their target groups, and their security groups (`k8s-elb-<lb name>` and
//! the NLB's managed group). Resources of the AWS Load Balancer Controller (`elbv2.k8s.aws/…`
//! tags) are never considered. A resource is an orphan when no Service of the given list wants
//! it; a Service wants the resources of its load-balancer name (`a` + its UID) when it is
//! `type: LoadBalancer` or still carries the cleanup finalizer (its deletion is the CCM's job),
//! of the kind its annotations name — both kinds when they do not parse (doubt keeps).

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::Filter;
use k8s_cloud_provider::{
    CloudError, CloudResult, Routes,
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
    /// Node it pointed at (`node/<name>`; `node/` when its instance is gone), for rules the
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
    /// Service keys that want an NLB (their target groups are theirs).
    network_services: BTreeSet<String>,
    /// Security-group names in use by wanted load balancers.
    groups: BTreeSet<String>,
    /// Service keys that exist, for the reasons.
    services: BTreeSet<String>,
}

impl AwsCloud {
    fn wanted(&self, cluster_name: &str, services: &[Service]) -> Wanted {
        let mut w = Wanted::default();
        for svc in services {
            let key = service_key(svc);
            w.services.insert(key.clone());
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
                w.groups.insert(format!("k8s-elb-{name}"));
                w.classic.insert(name.clone());
            }
            if matches!(kind, None | Some(LbKind::Network)) {
                w.groups.insert(Self::managed_group_name(cluster_name, svc));
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

    /// The cluster-owned load-balancer resources no Service of `services` (every Service of
    /// the cluster) owns, sorted by kind and name. `cluster_name` is `--cluster-name` (it is
    /// part of the NLB security group's name).
    pub async fn find_orphans(&self, cluster_name: &str, services: &[Service]) -> CloudResult<Vec<Orphan>> {
        let w = self.wanted(cluster_name, services);
        let mut found = Vec::new();

        // Classic ELBs (paged; tags read 20 at a time).
        let mut names = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let out = self
                .api
                .call(
                    "elb_describe_load_balancers",
                    self.elb
                        .describe_load_balancers()
                        .set_marker(marker.clone())
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("listing classic ELBs", e))?;
            names.extend(
                out.load_balancer_descriptions()
                    .iter()
                    .filter_map(|d| d.load_balancer_name().map(str::to_string)),
            );
            marker = out.next_marker().filter(|m| !m.is_empty()).map(str::to_string);
            if marker.is_none() {
                break;
            }
        }
        for chunk in names.chunks(20) {
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
                if let Some(service) = self.ours(&tags)
                    && !w.classic.contains(name)
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

        // NLBs and target groups.
        let mut arns: BTreeMap<String, (OrphanKind, String, Vec<String>)> = BTreeMap::new();
        let mut marker: Option<String> = None;
        loop {
            let out = self
                .api
                .call(
                    "elbv2_describe_load_balancers",
                    self.elbv2
                        .describe_load_balancers()
                        .set_marker(marker.clone())
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("listing NLBs", e))?;
            for lb in out.load_balancers() {
                if lb.r#type().map(|t| t.as_str()) == Some("network") {
                    arns.insert(
                        lb.load_balancer_arn().unwrap_or_default().to_string(),
                        (
                            OrphanKind::NetworkLoadBalancer,
                            lb.load_balancer_name().unwrap_or_default().to_string(),
                            vec![],
                        ),
                    );
                }
            }
            marker = out.next_marker().filter(|m| !m.is_empty()).map(str::to_string);
            if marker.is_none() {
                break;
            }
        }
        let mut marker: Option<String> = None;
        loop {
            let out = self
                .api
                .call(
                    "elbv2_describe_target_groups",
                    self.elbv2
                        .describe_target_groups()
                        .set_marker(marker.clone())
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("listing target groups", e))?;
            for tg in out.target_groups() {
                arns.insert(
                    tg.target_group_arn().unwrap_or_default().to_string(),
                    (
                        OrphanKind::TargetGroup,
                        tg.target_group_name().unwrap_or_default().to_string(),
                        tg.load_balancer_arns().to_vec(),
                    ),
                );
            }
            marker = out.next_marker().filter(|m| !m.is_empty()).map(str::to_string);
            if marker.is_none() {
                break;
            }
        }
        let existing_nlbs: BTreeSet<String> = arns
            .values()
            .filter(|(kind, _, _)| *kind == OrphanKind::NetworkLoadBalancer)
            .map(|(_, name, _)| name.clone())
            .collect();
        let keys: Vec<String> = arns.keys().cloned().collect();
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
                let (Some(service), Some((kind, name, lbs))) = (self.ours(&tags), arns.get(arn)) else {
                    continue;
                };
                match kind {
                    OrphanKind::NetworkLoadBalancer if !w.network.contains(name) => {
                        orphan_nlbs.insert(arn.to_string());
                        found.push(Orphan {
                            kind: *kind,
                            name: name.clone(),
                            id: arn.to_string(),
                            reason: Self::reason(&w, &service, &format!("NLB named {name}")),
                            owner: service,
                        });
                    }
                    OrphanKind::TargetGroup => {
                        target_groups.push((arn.to_string(), name.clone(), lbs.clone(), service))
                    }
                    _ => {}
                }
            }
        }
        // A target group is an orphan when its Service wants no NLB and every load balancer
        // it is attached to is an orphan too (it goes with them).
        for (arn, name, lbs, service) in target_groups {
            if !w.network_services.contains(&service) && lbs.iter().all(|lb| orphan_nlbs.contains(lb)) {
                found.push(Orphan {
                    kind: OrphanKind::TargetGroup,
                    name,
                    id: arn,
                    reason: Self::reason(&w, &service, "NLB"),
                    owner: service,
                });
            }
        }

        // Security groups of load balancers, in the cluster's VPC.
        let vpc = self.vpc_id().await?;
        let mut token: Option<String> = None;
        let mut vpc_groups = BTreeSet::new();
        let mut cluster_groups = Vec::new();
        loop {
            let out = self
                .api
                .call(
                    "describe_security_groups",
                    self.ec2
                        .describe_security_groups()
                        .filters(Filter::builder().name("vpc-id").values(&vpc).build())
                        .set_next_token(token.clone())
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("listing security groups", e))?;
            for g in out.security_groups() {
                let tags = crate::lb::network::tags_of(g);
                let name = g.group_name().unwrap_or_default();
                let id = g.group_id().unwrap_or_default();
                vpc_groups.insert(id.to_string());
                if self.tagged_for_cluster(&tags) {
                    cluster_groups.push(g.clone());
                }
                let Some(service) = self.ours(&tags) else { continue };
                if id == self.config.elb_security_group || w.groups.contains(name) {
                    continue;
                }
                found.push(Orphan {
                    kind: OrphanKind::SecurityGroup,
                    name: name.to_string(),
                    id: id.to_string(),
                    reason: Self::reason(&w, &service, &format!("load balancer with security group {name}")),
                    owner: service,
                });
            }
            token = out.next_token().filter(|t| !t.is_empty()).map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        let orphan_groups: BTreeSet<String> = found
            .iter()
            .filter(|o| o.kind == OrphanKind::SecurityGroup)
            .map(|o| o.id.clone())
            .collect();
        for g in cluster_groups {
            let gid = g.group_id().unwrap_or_default();
            if orphan_groups.contains(gid) {
                continue; // its rules go with it
            }
            found.extend(Self::orphan_rules(
                &g,
                &vpc,
                &vpc_groups,
                &existing_nlbs,
                &w.network,
            ));
        }
        found.sort();
        found.dedup();
        Ok(found)
    }

    /// The rules of the cluster group `g` that admit a source that is gone: a security group of
    /// this account and VPC that does not exist (`vpc_groups` are the VPC's groups; rules
    /// through a peering connection or naming another account or VPC are never looked at), or
    /// an NLB named in a rule's description (`kubernetes.io/rule/nlb/{client,health,mtu}=<name>`)
    /// that does not exist and that no Service wants.
    fn orphan_rules(
        g: &aws_sdk_ec2::types::SecurityGroup,
        vpc: &str,
        vpc_groups: &BTreeSet<String>,
        existing_nlbs: &BTreeSet<String>,
        wanted_nlbs: &BTreeSet<String>,
    ) -> Vec<Orphan> {
        let gid = g.group_id().unwrap_or_default();
        let mut out = Vec::new();
        for pair in g.ip_permissions().iter().flat_map(|p| p.user_id_group_pairs()) {
            let Some(source) = pair.group_id() else { continue };
            let same_account = pair.user_id().is_none_or(|u| Some(u) == g.owner_id());
            let same_vpc = pair.vpc_id().is_none_or(|v| v == vpc);
            if pair.vpc_peering_connection_id().is_some() || !same_account || !same_vpc {
                continue;
            }
            if !vpc_groups.contains(source) {
                let id = format!("{gid}/{source}");
                out.push(Orphan {
                    kind: OrphanKind::SecurityGroupRule,
                    name: id.clone(),
                    id,
                    owner: format!("group/{source}"),
                    reason: format!("rules of {gid} admit security group {source}, which no longer exists"),
                });
            }
        }
        let mtu = format!("{}=", crate::lb::nlb::RULE_MTU);
        for rule in crate::lb::network::cidr_rules(g) {
            let d = rule.description.as_str();
            let Some(nlb) = d
                .strip_prefix(crate::lb::nlb::RULE_CLIENT)
                .or_else(|| d.strip_prefix(crate::lb::nlb::RULE_HEALTH))
                .or_else(|| d.strip_prefix(mtu.as_str()))
                .filter(|n| !n.is_empty())
            else {
                continue;
            };
            if !existing_nlbs.contains(nlb) && !wanted_nlbs.contains(nlb) {
                let id = format!("{gid}/nlb={nlb}");
                out.push(Orphan {
                    kind: OrphanKind::SecurityGroupRule,
                    name: id.clone(),
                    id,
                    owner: format!("nlb/{nlb}"),
                    reason: format!("rules of {gid} admit the clients and health checks of NLB {nlb}, which no longer exists"),
                });
            }
        }
        out
    }

    /// Deletes one orphan found by [`AwsCloud::find_orphans`] the way the service controller
    /// deletes a load balancer: a Classic ELB or NLB with its listeners, the node security
    /// group rules that admitted it and its owned security groups; a target group; a security
    /// group after the rules of other cluster groups that name it. Ownership is checked again
    /// on every resource before it is deleted. Delete load balancers before target groups and
    /// security groups (the order [`AwsCloud::find_orphans`] returns).
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
                    self.delete_classic(&orphan.id, &BTreeSet::new()).await?;
                }
            }
            OrphanKind::NetworkLoadBalancer => {
                if self.elbv2_owned(&orphan.id).await? {
                    self.delete_nlb(cluster_name, &orphan.name, &svc, &BTreeSet::new())
                        .await?;
                }
            }
            OrphanKind::TargetGroup => {
                // Gone already when it went with its NLB.
                if self.elbv2_owned(&orphan.id).await? {
                    self.delete_target_group(&orphan.id).await?;
                }
            }
            OrphanKind::Route => {
                // Deleted only if it is still what was listed: a blackhole, or the same target.
                let target = orphan.owner.strip_prefix("node/").unwrap_or_default();
                let now = Routes::list_routes(self, cluster_name).await?;
                let Some(route) = now.iter().find(|r| r.destination_cidr == orphan.id) else {
                    return Ok(());
                };
                if !(route.blackhole || (!target.is_empty() && route.target_node == target)) {
                    return Err(CloudError::msg(format!(
                        "route {} changed since it was listed (now to {:?}); not deleted",
                        orphan.id, route.target_node
                    )));
                }
                Routes::delete_route(self, cluster_name, route).await?;
            }
            OrphanKind::SecurityGroupRule => self.delete_orphan_rules(&orphan.id).await?,
            OrphanKind::SecurityGroup => {
                let out = self
                    .api
                    .call(
                        "describe_security_groups",
                        self.ec2
                            .describe_security_groups()
                            .filters(Filter::builder().name("group-id").values(&orphan.id).build())
                            .send(),
                    )
                    .await
                    .map_err(|e| cloud_error(format!("describing security group {}", orphan.id), e))?;
                let Some(g) = out.security_groups().first() else {
                    return Ok(()); // gone with its load balancer
                };
                if self.ours(&crate::lb::network::tags_of(g)).is_none() {
                    return Err(CloudError::msg(format!(
                        "security group {} is not owned by this cluster's load balancers; not deleted",
                        orphan.id
                    )));
                }
                self.revoke_references(&orphan.id).await?;
                self.delete_owned_security_group(g, std::time::Duration::from_secs(120))
                    .await?;
            }
        }
        Ok(())
    }

    /// The routes of the cluster's route table whose destination lies within one of
    /// `cluster_cidrs` (the Nodes' pod CIDRs come from there) and that point at an instance
    /// that is gone (terminated: a blackhole) or that none of `nodes` runs on. Routes outside
    /// the cluster CIDRs (a NAT instance's default route, VPN routes, …) are never looked at.
    pub async fn find_orphan_routes(
        &self,
        cluster_name: &str,
        nodes: &BTreeSet<String>,
        cluster_cidrs: &[ipnet::IpNet],
    ) -> CloudResult<Vec<Orphan>> {
        let mut found = Vec::new();
        for r in Routes::list_routes(self, cluster_name).await? {
            let Ok(destination) = r.destination_cidr.parse::<ipnet::IpNet>() else {
                continue;
            };
            if !cluster_cidrs.iter().any(|c| c.contains(&destination)) {
                continue;
            }
            let reason = if r.blackhole {
                "its target instance no longer exists (blackhole)".to_string()
            } else if !nodes.contains(&r.target_node) {
                format!("no Node named {}", r.target_node)
            } else {
                continue;
            };
            found.push(Orphan {
                kind: OrphanKind::Route,
                name: r.destination_cidr.clone(),
                id: r.destination_cidr.clone(),
                owner: format!("node/{}", r.target_node),
                reason,
            });
        }
        found.sort();
        Ok(found)
    }

    /// Revokes the rules an [`OrphanKind::SecurityGroupRule`] orphan names, after checking
    /// again that the group is the cluster's and that the source is still gone.
    async fn delete_orphan_rules(&self, id: &str) -> CloudResult<()> {
        let (gid, source) = id.split_once('/').ok_or_else(|| {
            CloudError::msg(format!(
                "security-group rule orphan {id:?} is not <group>/<source>"
            ))
        })?;
        let group = |gid: &str| {
            let gid = gid.to_string();
            async move {
                self.api
                    .call(
                        "describe_security_groups",
                        self.ec2
                            .describe_security_groups()
                            .filters(Filter::builder().name("group-id").values(&gid).build())
                            .send(),
                    )
                    .await
                    .map(|o| o.security_groups().first().cloned())
                    .map_err(|e| cloud_error(format!("describing security group {gid}"), e))
            }
        };
        let Some(g) = group(gid).await? else {
            return Ok(()); // the group is gone, and its rules with it
        };
        if !self.tagged_for_cluster(&crate::lb::network::tags_of(&g)) {
            return Err(CloudError::msg(format!(
                "security group {gid} is not tagged for this cluster; its rules are not touched"
            )));
        }
        match source.strip_prefix("nlb=") {
            Some(nlb) => {
                let r = self
                    .api
                    .call(
                        "elbv2_describe_load_balancers",
                        self.elbv2.describe_load_balancers().names(nlb).send(),
                    )
                    .await;
                let exists = not_found_as_none(r, &["LoadBalancerNotFound"])
                    .map_err(|e| cloud_error(format!("looking up NLB {nlb}"), e))?
                    .is_some_and(|o| !o.load_balancers().is_empty());
                if exists {
                    return Err(CloudError::msg(format!(
                        "NLB {nlb} exists again; its rules are not revoked"
                    )));
                }
                self.release_nlb_rules(nlb).await
            }
            None => {
                if group(source).await?.is_some() {
                    return Err(CloudError::msg(format!(
                        "security group {source} exists; the rules of {gid} that admit it are not revoked"
                    )));
                }
                // By rule ID: a rule naming a group that no longer exists cannot be revoked by
                // its contents (EC2 answers InvalidGroup.NotFound for the source).
                let rules = self
                    .api
                    .call(
                        "describe_security_group_rules",
                        self.ec2
                            .describe_security_group_rules()
                            .filters(Filter::builder().name("group-id").values(gid).build())
                            .into_paginator()
                            .items()
                            .send()
                            .try_collect(),
                    )
                    .await
                    .map_err(|e| cloud_error(format!("listing the rules of security group {gid}"), e))?;
                let ids: Vec<String> = rules
                    .iter()
                    .filter(|r| {
                        r.is_egress() == Some(false)
                            && r.referenced_group_info().and_then(|i| i.group_id()) == Some(source)
                    })
                    .filter_map(|r| r.security_group_rule_id().map(str::to_string))
                    .collect();
                if ids.is_empty() {
                    return Ok(());
                }
                tracing::info!(group = gid, source, rules = ?ids, "revoking rules that admit a security group that no longer exists");
                self.api
                    .call(
                        "revoke_security_group_ingress",
                        self.ec2
                            .revoke_security_group_ingress()
                            .group_id(gid)
                            .set_security_group_rule_ids(Some(ids))
                            .send(),
                    )
                    .await
                    .map(|_| ())
                    .map_err(|e| cloud_error(format!("revoking the rules of {gid} that admit {source}"), e))
            }
        }
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

#[cfg(test)]
mod tests {
    use aws_sdk_ec2::types::{IpPermission, IpRange, SecurityGroup, UserIdGroupPair};

    use super::*;

    fn pair(group: &str, user: Option<&str>, vpc: Option<&str>, peering: Option<&str>) -> IpPermission {
        IpPermission::builder()
            .ip_protocol("tcp")
            .from_port(1)
            .to_port(1)
            .user_id_group_pairs(
                UserIdGroupPair::builder()
                    .group_id(group)
                    .set_user_id(user.map(str::to_string))
                    .set_vpc_id(vpc.map(str::to_string))
                    .set_vpc_peering_connection_id(peering.map(str::to_string))
                    .build(),
            )
            .build()
    }

    fn cidr(description: &str) -> IpPermission {
        IpPermission::builder()
            .ip_protocol("tcp")
            .from_port(2)
            .to_port(2)
            .ip_ranges(
                IpRange::builder()
                    .cidr_ip("10.0.0.0/8")
                    .description(description)
                    .build(),
            )
            .build()
    }

    #[test]
    fn only_rules_naming_a_missing_group_of_this_account_and_vpc_or_a_gone_nlb_are_orphans() {
        let g = SecurityGroup::builder()
            .group_id("sg-nodes")
            .owner_id("111")
            .ip_permissions(pair("sg-alive", None, None, None))
            .ip_permissions(pair("sg-gone", Some("111"), Some("vpc-1"), None))
            .ip_permissions(pair("sg-peered", None, None, Some("pcx-1")))
            .ip_permissions(pair("sg-other-account", Some("222"), None, None))
            .ip_permissions(pair("sg-other-vpc", None, Some("vpc-2"), None))
            .ip_permissions(cidr("kubernetes.io/rule/nlb/client=agone"))
            .ip_permissions(cidr("kubernetes.io/rule/nlb/health=aalive"))
            .ip_permissions(cidr("kubernetes.io/rule/nlb/mtu=awanted"))
            .ip_permissions(cidr("kubernetes.io/rule/nlb/mtu"))
            .ip_permissions(cidr("somebody else's rule"))
            .build();
        let vpc_groups = BTreeSet::from(["sg-nodes".to_string(), "sg-alive".to_string()]);
        let existing = BTreeSet::from(["aalive".to_string()]);
        let wanted = BTreeSet::from(["awanted".to_string()]);
        let found: Vec<(String, String)> =
            AwsCloud::orphan_rules(&g, "vpc-1", &vpc_groups, &existing, &wanted)
                .into_iter()
                .map(|o| (o.id, o.owner))
                .collect();
        assert_eq!(
            found,
            [
                ("sg-nodes/sg-gone".to_string(), "group/sg-gone".to_string()),
                ("sg-nodes/nlb=agone".to_string(), "nlb/agone".to_string()),
            ]
        );
    }
}
