//! Security groups of load balancers and the nodes' rules for them.
//!
//! Only security groups tagged `kubernetes.io/cluster/<id>=owned` (or legacy
//! `KubernetesCluster=<id>`) are ever deleted, and rules are only ever revoked from groups that
//! carry the cluster tag, or from the load balancer's own group.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::{
    Filter, IpPermission, IpRange, ResourceType, SecurityGroup, Tag, TagSpecification, UserIdGroupPair,
};
use k8s_cloud_provider::{CloudError, CloudResult};

use crate::{AwsCloud, cloud_error};

/// One wanted ingress rule from a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct CidrRule {
    /// `tcp`, `udp`, `icmp` or `-1`.
    pub protocol: String,
    /// From port (ICMP: type).
    pub from: i32,
    /// To port (ICMP: code).
    pub to: i32,
    /// Source CIDR.
    pub cidr: String,
    /// Rule description (empty = none).
    pub description: String,
}

impl CidrRule {
    pub(crate) fn to_permission(&self) -> IpPermission {
        let mut range = IpRange::builder().cidr_ip(&self.cidr);
        if !self.description.is_empty() {
            range = range.description(&self.description);
        }
        IpPermission::builder()
            .ip_protocol(&self.protocol)
            .from_port(self.from)
            .to_port(self.to)
            .ip_ranges(range.build())
            .build()
    }
}

/// The CIDR rules of a group, flattened (one per CIDR).
pub fn cidr_rules(group: &SecurityGroup) -> Vec<CidrRule> {
    let mut out = Vec::new();
    for p in group.ip_permissions() {
        for r in p.ip_ranges() {
            out.push(CidrRule {
                protocol: p.ip_protocol().unwrap_or("-1").to_string(),
                from: p.from_port().unwrap_or(-1),
                to: p.to_port().unwrap_or(-1),
                cidr: r.cidr_ip().unwrap_or_default().to_string(),
                description: r.description().unwrap_or_default().to_string(),
            });
        }
    }
    out
}

/// `p` split into permissions of one source each (a CIDR, an IPv6 CIDR or a group).
fn single_permissions(p: &IpPermission) -> Vec<IpPermission> {
    let base = || {
        IpPermission::builder()
            .set_ip_protocol(p.ip_protocol().map(str::to_string))
            .set_from_port(p.from_port())
            .set_to_port(p.to_port())
    };
    let mut out: Vec<IpPermission> = Vec::new();
    out.extend(p.ip_ranges().iter().map(|r| base().ip_ranges(r.clone()).build()));
    out.extend(
        p.ipv6_ranges()
            .iter()
            .map(|r| base().ipv6_ranges(r.clone()).build()),
    );
    out.extend(
        p.user_id_group_pairs()
            .iter()
            .map(|g| base().user_id_group_pairs(g.clone()).build()),
    );
    out
}

/// Whether `group` has the single-source permission `p` (protocol, ports and source; a
/// description is not part of a rule's identity).
fn has_permission(group: &SecurityGroup, p: &IpPermission) -> bool {
    group.ip_permissions().iter().any(|have| {
        have.ip_protocol() == p.ip_protocol()
            && have.from_port() == p.from_port()
            && have.to_port() == p.to_port()
            && (p
                .ip_ranges()
                .iter()
                .any(|r| have.ip_ranges().iter().any(|h| h.cidr_ip() == r.cidr_ip()))
                || p.ipv6_ranges()
                    .iter()
                    .any(|r| have.ipv6_ranges().iter().any(|h| h.cidr_ipv6() == r.cidr_ipv6()))
                || p.user_id_group_pairs().iter().any(|g| {
                    have.user_id_group_pairs()
                        .iter()
                        .any(|h| h.group_id() == g.group_id())
                }))
    })
}

pub(crate) fn tags_of(group: &SecurityGroup) -> BTreeMap<String, String> {
    group
        .tags()
        .iter()
        .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
        .collect()
}

/// Page sizes of [`AwsCloud::group_used_by_other_lb`]'s listings: small first pages (most
/// answers are found there), then the API's maximum (400 for both ELB APIs).
const USED_BY_OTHER_PAGE_SIZES: [i32; 3] = [5, 50, 400];

/// The page size of page `page` (0-based) of [`AwsCloud::group_used_by_other_lb`].
fn used_by_other_page_size(page: usize) -> i32 {
    USED_BY_OTHER_PAGE_SIZES[page.min(USED_BY_OTHER_PAGE_SIZES.len() - 1)]
}

impl AwsCloud {
    /// Security groups by ID.
    pub(crate) async fn security_groups(&self, ids: &[String]) -> CloudResult<Vec<SecurityGroup>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let out = self
            .api
            .call(
                "describe_security_groups",
                self.ec2
                    .describe_security_groups()
                    .set_group_ids(Some(ids.to_vec()))
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("describing security groups {ids:?}"), e))?;
        Ok(out.security_groups().to_vec())
    }

    /// The security group named `name` in the VPC, if any.
    pub(crate) async fn security_group_by_name(&self, name: &str) -> CloudResult<Option<SecurityGroup>> {
        let vpc = self.vpc_id().await?;
        let out = self
            .api
            .call(
                "describe_security_groups",
                self.ec2
                    .describe_security_groups()
                    .filters(Filter::builder().name("group-name").values(name).build())
                    .filters(Filter::builder().name("vpc-id").values(&vpc).build())
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("looking up security group {name}"), e))?;
        Ok(out.security_groups().first().cloned())
    }

    /// Ensures an owned security group `name` exists (AWS-49, AWS-57): created with the
    /// cluster and additional tags; an existing one gets missing tags repaired; one tagged
    /// for another cluster is an error. Returns its ID.
    pub(crate) async fn ensure_owned_security_group(
        &self,
        name: &str,
        description: &str,
        tags: &[(String, String)],
    ) -> CloudResult<String> {
        if let Some(existing) = self.security_group_by_name(name).await? {
            let id = existing.group_id().unwrap_or_default().to_string();
            let have = tags_of(&existing);
            if have.keys().any(|k| k.starts_with("kubernetes.io/cluster/")) && !self.tagged_for_cluster(&have)
            {
                return Err(CloudError::msg(format!(
                    "security group {name} ({id}) is tagged for another cluster"
                )));
            }
            // Read-repair like upstream, but gentler: only cluster tags that are absent are
            // added; a `shared` value or any other existing tag is never rewritten.
            let missing: Vec<Tag> = tags
                .iter()
                .filter(|(k, _)| {
                    (k.starts_with("kubernetes.io/cluster/") || k == "KubernetesCluster")
                        && !have.contains_key(k)
                })
                .map(|(k, v)| Tag::builder().key(k).value(v).build())
                .collect();
            if !missing.is_empty() {
                self.api
                    .call(
                        "create_tags",
                        self.ec2
                            .create_tags()
                            .resources(&id)
                            .set_tags(Some(missing))
                            .send(),
                    )
                    .await
                    .map_err(|e| cloud_error(format!("tagging security group {id}"), e))?;
            }
            return Ok(id);
        }
        let vpc = self.vpc_id().await?;
        let spec = TagSpecification::builder()
            .resource_type(ResourceType::SecurityGroup)
            .set_tags(Some(
                tags.iter()
                    .map(|(k, v)| Tag::builder().key(k).value(v).build())
                    .collect(),
            ))
            .build();
        let created = self
            .api
            .call(
                "create_security_group",
                self.ec2
                    .create_security_group()
                    .group_name(name)
                    .description(description)
                    .vpc_id(&vpc)
                    .tag_specifications(spec)
                    .send(),
            )
            .await;
        match created {
            Ok(out) => Ok(out.group_id().unwrap_or_default().to_string()),
            Err(e) if e.is("InvalidGroup.Duplicate") => self
                .security_group_by_name(name)
                .await?
                .and_then(|g| g.group_id().map(str::to_string))
                .ok_or_else(|| CloudError::msg(format!("security group {name} exists but cannot be found"))),
            Err(e) => Err(cloud_error(format!("creating security group {name}"), e)),
        }
    }

    /// Makes the CIDR rules of `group_id` exactly `wanted` (authorize missing, revoke extra).
    /// Only for groups this provider owns.
    pub(crate) async fn sync_cidr_rules(&self, group_id: &str, wanted: &[CidrRule]) -> CloudResult<()> {
        let group = self
            .security_groups(&[group_id.to_string()])
            .await?
            .into_iter()
            .next();
        let have: BTreeSet<CidrRule> = group
            .as_ref()
            .map(cidr_rules)
            .unwrap_or_default()
            .into_iter()
            .map(|mut r| {
                r.description.clear();
                r
            })
            .collect();
        let want: BTreeSet<CidrRule> = wanted
            .iter()
            .cloned()
            .map(|mut r| {
                r.description.clear();
                r
            })
            .collect();
        let add: Vec<IpPermission> = wanted
            .iter()
            .filter(|r| {
                let mut k = (*r).clone();
                k.description.clear();
                !have.contains(&k)
            })
            .map(CidrRule::to_permission)
            .collect();
        let remove: Vec<IpPermission> = have.difference(&want).map(CidrRule::to_permission).collect();
        self.authorize_ingress(group_id, add, || format!("authorizing ingress on {group_id}"))
            .await?;
        self.revoke_ingress(group_id, remove, || format!("revoking ingress on {group_id}"))
            .await
    }

    /// Adds `perms` to the ingress of `group_id` (nothing when empty); a rule EC2 already has
    /// (`InvalidPermission.Duplicate`) is not an error. `context` names the step in errors.
    pub(crate) async fn authorize_ingress(
        &self,
        group_id: &str,
        perms: Vec<IpPermission>,
        context: impl FnOnce() -> String,
    ) -> CloudResult<()> {
        if perms.is_empty() {
            return Ok(());
        }
        self.api
            .call(
                "authorize_security_group_ingress",
                self.ec2
                    .authorize_security_group_ingress()
                    .group_id(group_id)
                    .set_ip_permissions(Some(perms))
                    .send(),
            )
            .await
            .map(|_| ())
            .or_else(|e| {
                if e.is("InvalidPermission.Duplicate") {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| cloud_error(context(), e))
    }

    /// Removes `perms` from the ingress of `group_id` (nothing when empty). `context` names the
    /// step in errors. A rule EC2 no longer has (`InvalidPermission.NotFound`: typically the
    /// SDK's retry of a revocation whose answer was lost) is not an error: the group is read
    /// again and only the rules it still has are revoked, one request more. (An error there
    /// left the caller's later steps undone — the path-MTU rule of the last NLB was left
    /// behind, its client rules being gone when the deletion was retried.)
    pub(crate) async fn revoke_ingress(
        &self,
        group_id: &str,
        perms: Vec<IpPermission>,
        context: impl FnOnce() -> String,
    ) -> CloudResult<()> {
        if perms.is_empty() {
            return Ok(());
        }
        let revoke = |perms: Vec<IpPermission>| {
            self.api.call(
                "revoke_security_group_ingress",
                self.ec2
                    .revoke_security_group_ingress()
                    .group_id(group_id)
                    .set_ip_permissions(Some(perms))
                    .send(),
            )
        };
        match revoke(perms.clone()).await {
            Ok(_) => Ok(()),
            Err(e) if e.is("InvalidPermission.NotFound") => {
                let Some(group) = self
                    .security_groups(&[group_id.to_string()])
                    .await?
                    .into_iter()
                    .next()
                else {
                    return Ok(());
                };
                let left: Vec<IpPermission> = perms
                    .iter()
                    .flat_map(single_permissions)
                    .filter(|p| has_permission(&group, p))
                    .collect();
                if left.is_empty() {
                    return Ok(());
                }
                revoke(left)
                    .await
                    .map(|_| ())
                    .map_err(|e| cloud_error(context(), e))
            }
            Err(e) => Err(cloud_error(context(), e)),
        }
    }

    /// Whether `p` is the permission this provider (and upstream's
    /// `updateInstanceSecurityGroupsForLoadBalancer`) grants a load balancer's group on the
    /// nodes' groups: every protocol and port (`-1`) from `source_group`. Rules of any other
    /// shape that name the group are somebody else's.
    pub(crate) fn is_own_group_permission(p: &IpPermission, source_group: &str) -> bool {
        p.ip_protocol() == Some("-1")
            && p.user_id_group_pairs()
                .iter()
                .any(|g| g.group_id() == Some(source_group))
    }

    /// Whether `group` allows everything from `source_group` (the permission this provider
    /// grants, [`AwsCloud::is_own_group_permission`]).
    pub(crate) fn allows_group(group: &SecurityGroup, source_group: &str) -> bool {
        group
            .ip_permissions()
            .iter()
            .any(|p| Self::is_own_group_permission(p, source_group))
    }

    /// The rules of `group` that name `source_group` and are not this provider's permission
    /// (`protocol ports` each): a user's or another tool's, never revoked here.
    pub(crate) fn foreign_group_rules(group: &SecurityGroup, source_group: &str) -> Vec<String> {
        group
            .ip_permissions()
            .iter()
            .filter(|p| {
                !Self::is_own_group_permission(p, source_group)
                    && p.user_id_group_pairs()
                        .iter()
                        .any(|g| g.group_id() == Some(source_group))
            })
            .map(|p| {
                format!(
                    "{} {}-{}",
                    p.ip_protocol().unwrap_or("-1"),
                    p.from_port().unwrap_or(-1),
                    p.to_port().unwrap_or(-1)
                )
            })
            .collect()
    }

    /// Lets `source_group` reach every port of `group` (node SG rule for a CLB, AWS-51).
    pub(crate) async fn allow_group(&self, group: &SecurityGroup, source_group: &str) -> CloudResult<()> {
        if Self::allows_group(group, source_group) {
            return Ok(());
        }
        let id = group.group_id().unwrap_or_default();
        let perm = IpPermission::builder()
            .ip_protocol("-1")
            .user_id_group_pairs(UserIdGroupPair::builder().group_id(source_group).build())
            .build();
        self.authorize_ingress(id, vec![perm], || format!("allowing {source_group} on {id}"))
            .await
    }

    /// Revokes this provider's permission for `source_group` from `group` (every protocol from
    /// the group, [`AwsCloud::is_own_group_permission`]), as upstream removes only that one.
    /// Other rules naming `source_group` (a port a user opened to the load balancer's group, a
    /// group's reference to itself) are kept.
    pub(crate) async fn disallow_group(&self, group: &SecurityGroup, source_group: &str) -> CloudResult<()> {
        if !Self::allows_group(group, source_group) {
            return Ok(());
        }
        let perm = IpPermission::builder()
            .ip_protocol("-1")
            .user_id_group_pairs(UserIdGroupPair::builder().group_id(source_group).build())
            .build();
        let id = group.group_id().unwrap_or_default();
        self.revoke_ingress(id, vec![perm], || format!("revoking {source_group} from {id}"))
            .await
    }

    /// Whether a load balancer other than `name`, Classic or NLB, has `group` attached.
    ///
    /// The listing stops at the first page that shows one, and the pages grow
    /// ([`USED_BY_OTHER_PAGE_SIZES`]): a Classic ELB's description carries every registered
    /// instance, so with a shared group (`[Global] ElbSecurityGroup`) and 1000 Nodes a full page
    /// of 400 descriptions is 400,000 instance entries, when the first few descriptions
    /// usually answer the question already.
    pub(crate) async fn group_used_by_other_lb(&self, name: &str, group: &str) -> CloudResult<bool> {
        let mut marker = None;
        for page in 0.. {
            let out = self
                .api
                .call(
                    "elb_describe_load_balancers",
                    self.elb
                        .describe_load_balancers()
                        .page_size(used_by_other_page_size(page))
                        .set_marker(marker)
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("listing classic ELBs", e))?;
            if out.load_balancer_descriptions().iter().any(|lb| {
                lb.load_balancer_name() != Some(name) && lb.security_groups().iter().any(|g| g == group)
            }) {
                return Ok(true);
            }
            marker = out.next_marker().filter(|m| !m.is_empty()).map(str::to_string);
            if marker.is_none() {
                break;
            }
        }
        let mut marker = None;
        for page in 0.. {
            let out = self
                .api
                .call(
                    "elbv2_describe_load_balancers",
                    self.elbv2
                        .describe_load_balancers()
                        .page_size(used_by_other_page_size(page))
                        .set_marker(marker)
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("listing NLBs", e))?;
            if out.load_balancers().iter().any(|lb| {
                lb.load_balancer_name() != Some(name) && lb.security_groups().iter().any(|g| g == group)
            }) {
                return Ok(true);
            }
            marker = out.next_marker().filter(|m| !m.is_empty()).map(str::to_string);
            if marker.is_none() {
                break;
            }
        }
        Ok(false)
    }

    /// Revokes the rules of the cluster's groups that admit `lb_group`, the group through
    /// which the load balancer `name` reached the nodes (a bring-your-own group, which itself is
    /// never edited or deleted). Kept while another load balancer still has `lb_group`, so two
    /// Services sharing one BYO group do not cut each other off.
    pub(crate) async fn release_node_access(&self, name: &str, lb_group: &str) -> CloudResult<()> {
        let admitting: Vec<SecurityGroup> = self
            .groups_referencing(lb_group)
            .await?
            .into_iter()
            .filter(|g| self.tagged_for_cluster(&tags_of(g)))
            .collect();
        if admitting.is_empty() {
            return Ok(());
        }
        if self.group_used_by_other_lb(name, lb_group).await? {
            tracing::info!(
                lb = name,
                group = lb_group,
                "another load balancer still uses the group; node rules kept"
            );
            return Ok(());
        }
        for g in &admitting {
            self.disallow_group(g, lb_group).await?;
        }
        Ok(())
    }

    /// The groups with an ingress rule naming `group` as its source (EC2 filter
    /// `ip-permission.group-id`, paginated; no listing of the whole VPC).
    pub(crate) async fn groups_referencing(&self, group: &str) -> CloudResult<Vec<SecurityGroup>> {
        self.describe_groups(&[("ip-permission.group-id", group)], || {
            format!("finding the groups that reference {group}")
        })
        .await
    }

    /// The security groups matching every `(filter name, value)` (all pages; `context` names
    /// the step in errors).
    async fn describe_groups(
        &self,
        filters: &[(&str, &str)],
        context: impl FnOnce() -> String,
    ) -> CloudResult<Vec<SecurityGroup>> {
        let filters = filters
            .iter()
            .map(|(name, value)| Filter::builder().name(*name).values(*value).build())
            .collect();
        self.api
            .call(
                "describe_security_groups",
                self.ec2
                    .describe_security_groups()
                    .set_filters(Some(filters))
                    .into_paginator()
                    .items()
                    .send()
                    .try_collect(),
            )
            .await
            .map_err(|e| cloud_error(context(), e))
    }

    /// The rules that name `group` in other groups, read only: the cluster-tagged groups that
    /// hold this provider's permission for it ([`AwsCloud::is_own_group_permission`]), and the
    /// rules it did not make (`<group id>: <rule>`: rules of other shapes, and any rule of a
    /// group without the cluster tag, which belongs to someone else). A group's reference to
    /// itself is neither (it goes with the group).
    pub(crate) async fn references(&self, group: &str) -> CloudResult<(Vec<SecurityGroup>, Vec<String>)> {
        let mut own = Vec::new();
        let mut foreign = Vec::new();
        for g in self.groups_referencing(group).await? {
            let gid = g.group_id().unwrap_or_default().to_string();
            if gid == group {
                continue;
            }
            if !self.tagged_for_cluster(&tags_of(&g)) {
                foreign.push(format!(
                    "{gid}: every rule naming {group} (not this cluster's group)"
                ));
                continue;
            }
            foreign.extend(
                Self::foreign_group_rules(&g, group)
                    .into_iter()
                    .map(|r| format!("{gid}: {r} (not this provider's rule)")),
            );
            if Self::allows_group(&g, group) {
                own.push(g);
            }
        }
        Ok((own, foreign))
    }

    /// Revokes this provider's permission for `group` ([`AwsCloud::disallow_group`]) from the
    /// **cluster-tagged** groups (as upstream's `revokeSecurityGroupReferences`); a group without
    /// the cluster tag belongs to someone else and is never modified, nor is a rule of another
    /// shape. Returns the references that remain ([`AwsCloud::references`]): while there are
    /// any, `group` cannot be deleted and is kept.
    pub(crate) async fn revoke_references(&self, group: &str) -> CloudResult<Vec<String>> {
        let (own, foreign) = self.references(group).await?;
        for g in &own {
            self.disallow_group(g, group).await?;
        }
        Ok(foreign)
    }

    /// Deletes `group`, a security group this provider made for a load balancer, after
    /// revoking its own permissions for it ([`AwsCloud::revoke_references`]) — unless rules it
    /// did not make still name the group: then the group is kept (a warning names them), since
    /// deleting it would mean revoking somebody else's rules. `Ok(false)`: kept.
    pub(crate) async fn release_and_delete_group(
        &self,
        group: &SecurityGroup,
        patience: std::time::Duration,
    ) -> CloudResult<bool> {
        let id = group.group_id().unwrap_or_default();
        let remaining = self.revoke_references(id).await?;
        if !remaining.is_empty() {
            tracing::warn!(
                group = id,
                rules = ?remaining,
                "security group kept: rules this provider did not make still name it"
            );
            return Ok(false);
        }
        self.delete_owned_security_group(group, patience).await?;
        Ok(true)
    }

    /// Every security group of the VPC (paginated).
    pub(crate) async fn vpc_security_groups(&self) -> CloudResult<Vec<SecurityGroup>> {
        let vpc = self.vpc_id().await?;
        self.describe_groups(&[("vpc-id", &vpc)], || "listing security groups".into())
            .await
    }

    /// The security groups of the VPC tagged for this cluster (upstream's
    /// `getTaggedSecurityGroups`; EC2 filters by tag key).
    pub(crate) async fn cluster_security_groups(&self) -> CloudResult<Vec<SecurityGroup>> {
        let vpc = self.vpc_id().await?;
        let mut keys = vec![self.cluster_tag_key()];
        if self.config.legacy_tags() {
            keys.push("KubernetesCluster".into());
        }
        let mut out = Vec::new();
        for key in keys {
            let groups = self
                .describe_groups(&[("vpc-id", &vpc), ("tag-key", &key)], || {
                    "listing the cluster's security groups".into()
                })
                .await?;
            out.extend(
                groups
                    .into_iter()
                    .filter(|g| self.tagged_for_cluster(&tags_of(g))),
            );
        }
        out.sort_by(|a, b| a.group_id().cmp(&b.group_id()));
        out.dedup_by(|a, b| a.group_id() == b.group_id());
        Ok(out)
    }

    /// The node security group of each instance (AWS-51): the one tagged for the cluster, else
    /// the only one. Several tagged, or several untagged with none tagged, is an error naming
    /// the instance and the groups (cp-aws#666).
    pub(crate) async fn node_security_groups(
        &self,
        instances: &[&crate::instances::InstanceInfo],
    ) -> CloudResult<BTreeMap<String, SecurityGroup>> {
        let ids: BTreeSet<String> = instances
            .iter()
            .flat_map(|i| i.security_groups.iter().cloned())
            .collect();
        let groups: BTreeMap<String, SecurityGroup> = self
            .security_groups(&ids.into_iter().collect::<Vec<_>>())
            .await?
            .into_iter()
            .map(|g| (g.group_id().unwrap_or_default().to_string(), g))
            .collect();
        let mut out = BTreeMap::new();
        for i in instances {
            let mine: Vec<&SecurityGroup> =
                i.security_groups.iter().filter_map(|id| groups.get(id)).collect();
            let tagged: Vec<&&SecurityGroup> = mine
                .iter()
                .filter(|g| self.tagged_for_cluster(&tags_of(g)))
                .collect();
            let chosen = match (tagged.as_slice(), mine.as_slice()) {
                ([one], _) => **one,
                ([], [one]) => *one,
                ([], []) => continue,
                (many, _) if many.len() > 1 => {
                    return Err(CloudError::msg(format!(
                        "instance {} has several security groups tagged for the cluster ({}); keep the tag on one",
                        i.id,
                        many.iter()
                            .filter_map(|g| g.group_id())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                (_, all) => {
                    return Err(CloudError::msg(format!(
                        "instance {} has several security groups ({}) and none is tagged {}",
                        i.id,
                        all.iter()
                            .filter_map(|g| g.group_id())
                            .collect::<Vec<_>>()
                            .join(", "),
                        self.cluster_tag_key()
                    )));
                }
            };
            out.insert(chosen.group_id().unwrap_or_default().to_string(), chosen.clone());
        }
        Ok(out)
    }

    /// Deletes an owned security group, retrying `DependencyViolation` (the load balancer's
    /// network interfaces drain for a while after deletion) every 5 s for up to `patience`.
    pub(crate) async fn delete_owned_security_group(
        &self,
        group: &SecurityGroup,
        patience: std::time::Duration,
    ) -> CloudResult<()> {
        let id = group.group_id().unwrap_or_default().to_string();
        if !self.owned_by_cluster(&tags_of(group)) {
            tracing::info!(group = %id, "not deleting security group: not owned by this cluster");
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            match self
                .api
                .call(
                    "delete_security_group",
                    self.ec2.delete_security_group().group_id(&id).send(),
                )
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.code_starts_with("InvalidGroup.NotFound") => return Ok(()),
                Err(e) if e.is("DependencyViolation") && tokio::time::Instant::now() < deadline => {
                    tracing::info!(group = %id, "security group still in use; retrying its deletion in 5 s");
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                }
                Err(e) => return Err(cloud_error(format!("deleting security group {id}"), e)),
            }
        }
    }
}
