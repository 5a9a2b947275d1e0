//! Orphan security groups, and rules of the cluster's groups that admit a source that is gone
//! (the rules: the module docs of [`super`]).

use std::collections::BTreeSet;

use aws_sdk_ec2::types::Filter;
use k8s_cloud_provider::{CloudError, CloudResult};

use super::{Orphan, OrphanKind, SeenLb, Wanted};
use crate::{
    AwsCloud, cloud_error,
    lb::network::{not_found_as_none, tags_of},
};

/// The name prefix of a Classic ELB's own security group (`k8s-elb-<load balancer name>`).
const CLASSIC_GROUP_PREFIX: &str = "k8s-elb-";

impl AwsCloud {
    /// Adds to `found` the security groups of the VPC that are orphans, given every load
    /// balancer of the account and region (`seen`) and those that are orphans themselves
    /// (`leaving`, by ID), then the rules of the cluster's groups that admit a gone source (an
    /// NLB that is an orphan still exists: its rules go with it, not as orphans of their own).
    pub(super) async fn find_orphan_groups(
        &self,
        w: &Wanted,
        seen: &[SeenLb],
        leaving: &BTreeSet<String>,
        found: &mut Vec<Orphan>,
    ) -> CloudResult<()> {
        let staying: Vec<SeenLb> = seen
            .iter()
            .filter(|l| l.kind != super::TARGET_GROUP && !leaving.contains(&l.id))
            .cloned()
            .collect();
        let vpc = self.vpc_id().await?;
        let groups = self.vpc_security_groups().await?;
        let vpc_groups: BTreeSet<String> = groups
            .iter()
            .filter_map(|g| g.group_id().map(str::to_string))
            .collect();
        let mut orphan_groups = BTreeSet::new();
        for g in &groups {
            let tags = tags_of(g);
            let name = g.group_name().unwrap_or_default();
            let id = g.group_id().unwrap_or_default();
            let Some(service) = self.ours(&tags) else { continue };
            if id == self.config.elb_security_group {
                continue;
            }
            // Only a group this provider made for a load balancer: a Classic ELB's own
            // `k8s-elb-<name>`, or an NLB's managed group (tag and description).
            let wanted = match name.strip_prefix(CLASSIC_GROUP_PREFIX) {
                Some(lb) if self.made_for_classic(g, lb) => w.classic.contains(lb),
                None if self.made_for_nlb(g, &service) => w.network_services.contains(&service),
                _ => continue,
            };
            if wanted || self.group_user(id, &staying).await?.is_some() {
                continue;
            }
            orphan_groups.insert(id.to_string());
            found.push(Orphan {
                kind: OrphanKind::SecurityGroup,
                name: name.to_string(),
                id: id.to_string(),
                reason: format!(
                    "no load balancer uses it, and {}",
                    Self::reason(w, &service, &format!("load balancer with security group {name}"))
                ),
                owner: service,
            });
        }
        let existing_nlbs: BTreeSet<String> = seen
            .iter()
            .filter(|l| l.kind == "network")
            .map(|l| l.name.clone())
            .collect();
        for g in groups.iter().filter(|g| self.tagged_for_cluster(&tags_of(g))) {
            if orphan_groups.contains(g.group_id().unwrap_or_default()) {
                continue; // its rules go with it
            }
            found.extend(Self::orphan_rules(
                g,
                &vpc,
                &vpc_groups,
                &existing_nlbs,
                &w.network,
            ));
        }
        Ok(())
    }

    /// What still uses the security group `group`, if anything: one of `lbs`, or a network
    /// interface that is not a load balancer's (an instance's, a Lambda function's, …; a
    /// load balancer's own interfaces drain for a while after it is deleted).
    async fn group_user(&self, group: &str, lbs: &[SeenLb]) -> CloudResult<Option<String>> {
        if let Some(lb) = lbs.iter().find(|l| l.groups.iter().any(|g| g == group)) {
            return Ok(Some(format!("{} load balancer {}", lb.kind, lb.name)));
        }
        let interfaces = self
            .api
            .call(
                "describe_network_interfaces",
                self.ec2
                    .describe_network_interfaces()
                    .filters(Filter::builder().name("group-id").values(group).build())
                    .into_paginator()
                    .items()
                    .send()
                    .try_collect(),
            )
            .await
            .map_err(|e| {
                cloud_error(
                    format!("finding the network interfaces of security group {group}"),
                    e,
                )
            })?;
        Ok(interfaces
            .iter()
            .find(|i| !i.description().unwrap_or_default().starts_with("ELB "))
            .map(|i| {
                format!(
                    "network interface {} ({})",
                    i.network_interface_id().unwrap_or_default(),
                    i.description().unwrap_or_default()
                )
            }))
    }

    /// Deletes an orphan security group after reading it, and every load balancer, again:
    /// still the cluster's, still unused — a group a load balancer uses is refused before any
    /// rule admitting it is revoked. Then the rules of the cluster's groups that admit it are
    /// revoked and it is deleted.
    pub(super) async fn delete_orphan_group(&self, orphan: &Orphan) -> CloudResult<()> {
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
        let made = match g
            .group_name()
            .unwrap_or_default()
            .strip_prefix(CLASSIC_GROUP_PREFIX)
        {
            Some(lb) => self.made_for_classic(g, lb),
            None => self.made_for_nlb(g, &orphan.owner),
        };
        if self.ours(&tags_of(g)).is_none() || !made {
            return Err(CloudError::msg(format!(
                "security group {} was not made by this cluster's cloud-controller-manager for a load balancer; not deleted",
                orphan.id
            )));
        }
        let lbs = self.all_load_balancers().await?;
        if let Some(user) = self.group_user(&orphan.id, &lbs).await? {
            return Err(CloudError::msg(format!(
                "security group {} is used by {user}; neither it nor the rules admitting it are touched",
                orphan.id
            )));
        }
        if self
            .release_and_delete_group(g, std::time::Duration::from_secs(120))
            .await?
        {
            Ok(())
        } else {
            Err(CloudError::msg(format!(
                "security group {} is named by rules this cluster's cloud-controller-manager did not make (see the warning); it and they are kept",
                orphan.id
            )))
        }
    }

    /// The rules of the cluster group `g` that admit a source that is gone: a security group of
    /// this account and VPC that does not exist (`vpc_groups` are the VPC's groups; rules
    /// through a peering connection or naming another account or VPC are never looked at), or
    /// an NLB named in a rule's description (`kubernetes.io/rule/nlb/{client,health,mtu}=<name>`)
    /// that does not exist and that no Service wants.
    pub(super) fn orphan_rules(
        g: &aws_sdk_ec2::types::SecurityGroup,
        vpc: &str,
        vpc_groups: &BTreeSet<String>,
        existing_nlbs: &BTreeSet<String>,
        wanted_nlbs: &BTreeSet<String>,
    ) -> Vec<Orphan> {
        let gid = g.group_id().unwrap_or_default();
        let mut out = Vec::new();
        // Only this provider's own permission (every protocol from a load balancer's group):
        // a rule of any other shape is somebody else's, even when its source is gone.
        let own = g
            .ip_permissions()
            .iter()
            .filter(|p| p.ip_protocol() == Some("-1"));
        for pair in own.flat_map(|p| p.user_id_group_pairs()) {
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

    /// Revokes the rules an [`OrphanKind::SecurityGroupRule`] orphan names, after checking
    /// again that the group is the cluster's and that the source is still gone.
    pub(super) async fn delete_orphan_rules(&self, id: &str) -> CloudResult<()> {
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
        if !self.tagged_for_cluster(&tags_of(&g)) {
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
                            && r.ip_protocol() == Some("-1")
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
}

#[cfg(test)]
mod tests {
    use aws_sdk_ec2::types::{IpPermission, IpRange, SecurityGroup, UserIdGroupPair};

    use super::*;

    fn pair(group: &str, user: Option<&str>, vpc: Option<&str>, peering: Option<&str>) -> IpPermission {
        IpPermission::builder()
            .ip_protocol("-1")
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
    fn only_own_rules_naming_a_missing_group_of_this_account_and_vpc_or_a_gone_nlb_are_orphans() {
        let g = SecurityGroup::builder()
            .group_id("sg-nodes")
            .owner_id("111")
            .ip_permissions(pair("sg-alive", None, None, None))
            .ip_permissions(pair("sg-gone", Some("111"), Some("vpc-1"), None))
            .ip_permissions(pair("sg-peered", None, None, Some("pcx-1")))
            .ip_permissions(pair("sg-other-account", Some("222"), None, None))
            .ip_permissions(pair("sg-other-vpc", None, Some("vpc-2"), None))
            // A user's port rule naming a gone group: not this provider's, never an orphan.
            .ip_permissions(
                IpPermission::builder()
                    .ip_protocol("tcp")
                    .from_port(443)
                    .to_port(443)
                    .user_id_group_pairs(UserIdGroupPair::builder().group_id("sg-gone-too").build())
                    .build(),
            )
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
