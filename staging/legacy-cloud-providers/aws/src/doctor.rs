//! The AWS checks of `cloud-controller-manager-aws doctor` (not part of upstream): the
//! credentials (STS `GetCallerIdentity`), the IAM permissions the controllers use (read calls
//! made for real, writes with EC2's `DryRun` where EC2 has it), the cluster tags the provider
//! relies on (subnets per zone, route table, the Nodes' security groups) and every Node's
//! instance. Nothing is created, changed or deleted: EC2 answers a `DryRun` request with
//! `DryRunOperation` when the caller may make it, `UnauthorizedOperation` when not.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::{Filter, IpPermission, IpRange, Tag};
use k8s_cloud_provider::{
    doctor::Check,
    node::helpers::{node_name, provider_id},
};
use k8s_openapi::api::core::v1::Node;

use crate::{AwsCloud, api::AwsError, instances::instance_id_from_provider_id};

/// What an answer says about a permission.
fn permission(action: &str, r: Result<(), AwsError>, dry_run: bool) -> Check {
    let name = format!("iam: {action}");
    match r {
        Ok(()) => Check::pass(name, "allowed"),
        Err(e) if dry_run && e.is("DryRunOperation") => Check::pass(name, "allowed (DryRun)"),
        Err(e)
            if e.is("UnauthorizedOperation")
                || e.is("AccessDenied")
                || e.is("AccessDeniedException")
                || e.is("UnauthorizedAccess") =>
        {
            Check::fail(
                name,
                format!("denied: {e} (fix: allow {action} in the CCM's IAM policy)"),
            )
        }
        Err(e) => Check::warn(name, format!("could not tell: {e}")),
    }
}

impl AwsCloud {
    /// Runs the AWS checks for a cluster whose Nodes are `nodes`.
    pub async fn doctor(&self, nodes: &[Node]) -> Vec<Check> {
        let mut checks = vec![Check::pass(
            "cloud provider",
            format!("region {}, cluster ID {}", self.region, self.cluster_id),
        )];
        match self
            .api
            .call("sts_get_caller_identity", self.sts.get_caller_identity().send())
            .await
        {
            Ok(who) => checks.push(Check::pass(
                "credentials",
                who.arn().unwrap_or_default().to_string(),
            )),
            Err(e) => {
                checks.push(Check::fail(
                    "credentials",
                    format!("STS GetCallerIdentity: {e} (fix: the instance role, the AWS_* environment, or [Global] RoleARN)"),
                ));
                return checks;
            }
        }
        let vpc = match self.vpc_id().await {
            Ok(v) => v,
            Err(e) => {
                checks.push(Check::fail("vpc", format!("{e} (fix: [Global] VPC or SubnetID)")));
                return checks;
            }
        };
        checks.push(Check::pass("vpc", vpc.clone()));
        let in_vpc = || Filter::builder().name("vpc-id").values(&vpc).build();

        // Read permissions, by calling.
        let subnets = self
            .api
            .call(
                "describe_subnets",
                self.ec2.describe_subnets().filters(in_vpc()).send(),
            )
            .await;
        checks.push(permission(
            "ec2:DescribeSubnets",
            subnets.as_ref().map(drop).map_err(Clone::clone),
            false,
        ));
        let tables = self
            .api
            .call(
                "describe_route_tables",
                self.ec2.describe_route_tables().filters(in_vpc()).send(),
            )
            .await;
        checks.push(permission(
            "ec2:DescribeRouteTables",
            tables.as_ref().map(drop).map_err(Clone::clone),
            false,
        ));
        let groups = self
            .api
            .call(
                "describe_security_groups",
                self.ec2.describe_security_groups().filters(in_vpc()).send(),
            )
            .await;
        checks.push(permission(
            "ec2:DescribeSecurityGroups",
            groups.as_ref().map(drop).map_err(Clone::clone),
            false,
        ));
        let r = self
            .api
            .call(
                "describe_instances",
                self.ec2.describe_instances().max_results(5).send(),
            )
            .await
            .map(drop);
        checks.push(permission("ec2:DescribeInstances", r, false));
        let r = self
            .api
            .call(
                "describe_availability_zones",
                self.ec2.describe_availability_zones().send(),
            )
            .await
            .map(drop);
        checks.push(permission("ec2:DescribeAvailabilityZones", r, false));
        let r = self
            .api
            .call(
                "elb_describe_load_balancers",
                self.elb.describe_load_balancers().send(),
            )
            .await
            .map(drop);
        checks.push(permission(
            "elasticloadbalancing:DescribeLoadBalancers (classic)",
            r,
            false,
        ));
        let r = self
            .api
            .call(
                "elbv2_describe_load_balancers",
                self.elbv2.describe_load_balancers().send(),
            )
            .await
            .map(drop);
        checks.push(permission(
            "elasticloadbalancing:DescribeLoadBalancers (v2)",
            r,
            false,
        ));

        // Write permissions, with DryRun (EC2 only; ELB has no DryRun).
        let r = self
            .api
            .call(
                "create_tags",
                self.ec2
                    .create_tags()
                    .dry_run(true)
                    .resources(&vpc)
                    .tags(Tag::builder().key("k8s-doctor").value("dry-run").build())
                    .send(),
            )
            .await
            .map(drop);
        checks.push(permission("ec2:CreateTags", r, true));
        let r = self
            .api
            .call(
                "create_security_group",
                self.ec2
                    .create_security_group()
                    .dry_run(true)
                    .vpc_id(&vpc)
                    .group_name("k8s-doctor-dry-run")
                    .description("cloud-controller-manager doctor (DryRun)")
                    .send(),
            )
            .await
            .map(drop);
        checks.push(permission("ec2:CreateSecurityGroup", r, true));
        let any_group = groups
            .as_ref()
            .ok()
            .and_then(|g| g.security_groups().first())
            .and_then(|g| g.group_id())
            .map(str::to_string);
        if let Some(group) = any_group {
            let rule = IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(1)
                .to_port(1)
                .ip_ranges(IpRange::builder().cidr_ip("127.0.0.1/32").build())
                .build();
            let r = self
                .api
                .call(
                    "authorize_security_group_ingress",
                    self.ec2
                        .authorize_security_group_ingress()
                        .dry_run(true)
                        .group_id(&group)
                        .ip_permissions(rule.clone())
                        .send(),
                )
                .await
                .map(drop);
            checks.push(permission("ec2:AuthorizeSecurityGroupIngress", r, true));
            let r = self
                .api
                .call(
                    "revoke_security_group_ingress",
                    self.ec2
                        .revoke_security_group_ingress()
                        .dry_run(true)
                        .group_id(&group)
                        .ip_permissions(rule)
                        .send(),
                )
                .await
                .map(drop);
            checks.push(permission("ec2:RevokeSecurityGroupIngress", r, true));
        }
        checks.push(Check::warn(
            "iam: load-balancer and route writes",
            "not checkable without changing something (ELB has no DryRun): the policy also needs elasticloadbalancing:* writes, ec2:DeleteSecurityGroup, ec2:DeleteTags, and with routes ec2:CreateRoute/DeleteRoute",
        ));

        // Cluster tags.
        let tagged = |tags: &[Tag]| {
            tags.iter().any(|t| {
                t.key() == Some(self.cluster_tag_key().as_str())
                    || (t.key() == Some("KubernetesCluster") && t.value() == Some(self.cluster_id.as_str()))
            })
        };
        let mut zones_tagged: BTreeMap<String, bool> = BTreeMap::new();
        let mut subnet_zone: BTreeMap<String, String> = BTreeMap::new();
        if let Ok(out) = &subnets {
            for s in out.subnets() {
                let zone = s.availability_zone().unwrap_or_default().to_string();
                subnet_zone.insert(s.subnet_id().unwrap_or_default().to_string(), zone.clone());
                *zones_tagged.entry(zone).or_default() |= tagged(s.tags());
            }
        }
        if let Ok(out) = &tables {
            if out.route_tables().iter().any(|t| tagged(t.tags())) {
                checks.push(Check::pass(
                    "tags: route table",
                    "a route table of the VPC is tagged for the cluster",
                ));
            } else {
                checks.push(Check::warn(
                    "tags: route table",
                    format!(
                        "no route table of the VPC is tagged {} (needed only with --configure-cloud-routes)",
                        self.cluster_tag_key()
                    ),
                ));
            }
        }
        let cluster_groups: BTreeSet<String> = groups
            .as_ref()
            .map(|g| {
                g.security_groups()
                    .iter()
                    .filter(|g| tagged(g.tags()))
                    .filter_map(|g| g.group_id().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();

        // Every Node's instance.
        let mut by_instance: BTreeMap<String, String> = BTreeMap::new();
        for n in nodes {
            let name = node_name(n).to_string();
            let pid = provider_id(n);
            if pid.is_empty() {
                checks.push(Check::warn(
                    format!("node {name}"),
                    "no providerID yet (the cloud-node controller sets it)",
                ));
                continue;
            }
            match instance_id_from_provider_id(pid) {
                Ok(id) if id.starts_with(crate::FARGATE_PREFIX) => {
                    checks.push(Check::pass(format!("node {name}"), "Fargate"));
                }
                Ok(id) => {
                    by_instance.insert(id, name);
                }
                Err(e) => checks.push(Check::fail(
                    format!("node {name}"),
                    format!("{e} (fix: the Node's spec.providerID)"),
                )),
            }
        }
        let ids: Vec<String> = by_instance.keys().cloned().collect();
        let mut found = BTreeSet::new();
        let mut zones_with_nodes = BTreeSet::new();
        match self.instances_by_id(&ids).await {
            Ok(instances) => {
                for i in &instances {
                    let id = i.instance_id().unwrap_or_default().to_string();
                    let Some(node) = by_instance.get(&id) else {
                        continue;
                    };
                    let state = i
                        .state()
                        .and_then(|s| s.name())
                        .map(|s| s.as_str().to_string())
                        .unwrap_or_default();
                    if state == "terminated" {
                        continue;
                    }
                    found.insert(id.clone());
                    if let Some(zone) = i.subnet_id().and_then(|s| subnet_zone.get(s)) {
                        zones_with_nodes.insert(zone.clone());
                    }
                    let node_groups: Vec<&str> =
                        i.security_groups().iter().filter_map(|g| g.group_id()).collect();
                    let tagged_groups = node_groups
                        .iter()
                        .filter(|g| cluster_groups.contains(**g))
                        .count();
                    if node_groups.len() > 1 && tagged_groups != 1 {
                        checks.push(Check::warn(
                                format!("node {node}"),
                                format!("instance {id} ({state}) has {} security groups, {tagged_groups} tagged {}: load balancers open the one tagged group (fix: tag exactly one)", node_groups.len(), self.cluster_tag_key()),
                            ));
                    } else {
                        checks.push(Check::pass(
                            format!("node {node}"),
                            format!("instance {id} ({state})"),
                        ));
                    }
                }
            }
            Err(e) => checks.push(Check::warn(
                "nodes",
                format!("could not look up the Nodes' instances: {e}"),
            )),
        }
        for (id, node) in &by_instance {
            if !found.contains(id) {
                checks.push(Check::fail(
                    format!("node {node}"),
                    format!("instance {id} not found in EC2 (or terminated): the node-lifecycle controller will delete this Node (fix: its providerID, or remove the Node)"),
                ));
            }
        }
        for zone in zones_with_nodes {
            if zones_tagged.get(&zone).copied().unwrap_or(false) {
                checks.push(Check::pass(
                    format!("tags: subnets in {zone}"),
                    "a subnet is tagged for the cluster",
                ));
            } else {
                checks.push(Check::fail(
                    format!("tags: subnets in {zone}"),
                    format!("Nodes run in {zone} but no subnet there is tagged {}=owned|shared: load balancers skip the zone (fix: tag the zone's subnets)", self.cluster_tag_key()),
                ));
            }
        }
        checks
    }
}
