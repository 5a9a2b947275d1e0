//! Subnets and security groups for load balancers (AWS-29, AWS-49…54, AWS-57).
//!
//! Only security groups tagged `kubernetes.io/cluster/<id>=owned` (or legacy
//! `KubernetesCluster=<id>`) are ever deleted, and rules are only ever revoked from groups that
//! carry the cluster tag, or from the load balancer's own group.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use aws_sdk_ec2::types::{
    Filter, IpPermission, IpRange, ResourceType, RouteTable, SecurityGroup, Tag, TagSpecification,
    UserIdGroupPair,
};
use k8s_cloud_provider::{CloudError, CloudResult};

use crate::{AwsCloud, api::AwsError, cloud_error};

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

/// The tags of a Classic ELB as a map.
pub(crate) fn elb_tag_map<'a>(
    tags: impl IntoIterator<Item = &'a aws_sdk_elasticloadbalancing::types::Tag>,
) -> BTreeMap<String, String> {
    tags.into_iter()
        .map(|t| (t.key().to_string(), t.value().unwrap_or_default().to_string()))
        .collect()
}

/// The tags of an ELBv2 resource (load balancer, target group) as a map.
pub(crate) fn elbv2_tag_map<'a>(
    tags: impl IntoIterator<Item = &'a aws_sdk_elasticloadbalancingv2::types::Tag>,
) -> BTreeMap<String, String> {
    tags.into_iter()
        .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
        .collect()
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
    pub(crate) fn cluster_tag_key(&self) -> String {
        format!("kubernetes.io/cluster/{}", self.cluster_id)
    }

    /// Whether a tag set marks the resource as belonging to this cluster (AWS-55).
    pub(crate) fn tagged_for_cluster(&self, tags: &BTreeMap<String, String>) -> bool {
        tags.contains_key(&self.cluster_tag_key()) || tags.get("KubernetesCluster") == Some(&self.cluster_id)
    }

    /// Whether a tag set marks the resource as owned by this cluster (safe to delete, AWS-56).
    pub(crate) fn owned_by_cluster(&self, tags: &BTreeMap<String, String>) -> bool {
        tags.get(&self.cluster_tag_key()).map(String::as_str) == Some("owned")
            || tags.get("KubernetesCluster") == Some(&self.cluster_id)
    }

    /// The tags of resources this provider creates: cluster ownership, the Service, extras.
    pub(crate) fn resource_tags(
        &self,
        service_key: &str,
        extra: &BTreeMap<String, String>,
    ) -> Vec<(String, String)> {
        let mut tags: BTreeMap<String, String> = extra.clone();
        tags.insert(self.cluster_tag_key(), "owned".into());
        tags.insert("kubernetes.io/service-name".into(), service_key.into());
        if self.config.legacy_tags() {
            tags.insert("KubernetesCluster".into(), self.cluster_id.clone());
        }
        tags.into_iter().collect()
    }

    /// The VPC of the cluster ([`AwsCloud::self_network`]).
    pub(crate) async fn vpc_id(&self) -> CloudResult<String> {
        Ok(self.self_network().await?.vpc_id.clone())
    }

    /// The subnets and route tables of the cluster's VPC, kept for [`VPC_NETWORK_TTL`] so that
    /// many Services synced together ask EC2 once (paginated).
    pub(crate) async fn vpc_network(&self) -> CloudResult<Arc<VpcNetwork>> {
        if let Some((at, net)) = self.vpc_network.lock().clone()
            && at.elapsed() < VPC_NETWORK_TTL
        {
            return Ok(net);
        }
        let vpc = self.vpc_id().await?;
        let vpc_filter = Filter::builder().name("vpc-id").values(&vpc).build();
        // Every page, through the SDK's paginators (each page is an attempt the back-off counts).
        let subnets: Vec<VpcSubnet> = self
            .api
            .call(
                "describe_subnets",
                self.ec2
                    .describe_subnets()
                    .filters(vpc_filter.clone())
                    .into_paginator()
                    .items()
                    .send()
                    .try_collect(),
            )
            .await
            .map_err(|e| cloud_error(format!("listing the subnets of {vpc}"), e))?
            .iter()
            .map(VpcSubnet::from_sdk)
            .collect();
        let route_tables = self
            .api
            .call(
                "describe_route_tables",
                self.ec2
                    .describe_route_tables()
                    .filters(vpc_filter)
                    .into_paginator()
                    .items()
                    .send()
                    .try_collect(),
            )
            .await
            .map_err(|e| cloud_error(format!("listing the route tables of {vpc}"), e))?;
        let net = Arc::new(VpcNetwork {
            vpc_id: vpc,
            subnets,
            route_tables,
        });
        *self.vpc_network.lock() = Some((std::time::Instant::now(), net.clone()));
        Ok(net)
    }

    /// Subnets for a load balancer (AWS-29), as upstream picks them:
    ///
    /// - the `subnets` annotation: IDs (`subnet-…`) and `Name` tags in the VPC; a name that
    ///   matches no subnet or several is an error naming them (upstream only counts);
    /// - else the VPC's subnets tagged for this cluster or for no cluster (the CCM's own subnet
    ///   when there are none), public ones only for internet-facing load balancers, one per
    ///   zone — preferring the role tag, then the cluster tag, then the smallest ID — and only
    ///   in zones of type `availability-zone` (local, wavelength and outpost zones cannot hold
    ///   a CLB or NLB).
    pub(crate) async fn lb_subnets(&self, internal: bool, wanted: &[String]) -> CloudResult<Vec<VpcSubnet>> {
        let net = self.vpc_network().await?;
        if !wanted.is_empty() {
            return self.named_subnets(&net, wanted).await;
        }
        let mut candidates: Vec<&VpcSubnet> = net
            .subnets
            .iter()
            .filter(|s| {
                self.tagged_for_cluster(&s.tags)
                    || !s.tags.keys().any(|k| k.starts_with("kubernetes.io/cluster/"))
            })
            .collect();
        let self_subnet;
        if candidates.is_empty() {
            let own = self.self_network().await?.subnet_id.clone();
            tracing::warn!(subnet = %own, "no tagged subnets found; falling back to the CCM's own subnet");
            self_subnet = self.describe_subnets(std::slice::from_ref(&own)).await?;
            candidates = self_subnet.iter().collect();
        }
        let role = if internal {
            "kubernetes.io/role/internal-elb"
        } else {
            "kubernetes.io/role/elb"
        };
        let mut by_zone: BTreeMap<&str, &VpcSubnet> = BTreeMap::new();
        for s in candidates {
            if s.zone.is_empty() || s.id.is_empty() {
                continue;
            }
            if !internal && !net.is_public(&s.id) {
                continue;
            }
            let better = match by_zone.get(s.zone.as_str()) {
                None => true,
                Some(have) => {
                    let rank = |x: &VpcSubnet| {
                        (
                            !x.tags.contains_key(role),
                            !self.tagged_for_cluster(&x.tags),
                            x.id.clone(),
                        )
                    };
                    rank(s) < rank(have)
                }
            };
            if better {
                by_zone.insert(&s.zone, s);
            }
        }
        let mut chosen = Vec::new();
        for (zone, s) in by_zone {
            match self.zone_details(zone).await {
                Some((_, kind)) if kind != "availability-zone" => {
                    tracing::debug!(zone, kind = %kind, subnet = %s.id, "skipping a subnet outside a regular availability zone");
                }
                _ => chosen.push(s.clone()),
            }
        }
        if chosen.is_empty() {
            return Err(CloudError::msg(format!(
                "could not find any suitable {}subnets in {} for the load balancer: tag subnets with {role} or set the subnets annotation",
                if internal { "" } else { "public " },
                net.vpc_id
            )));
        }
        Ok(chosen)
    }

    /// The subnets of the `subnets` annotation.
    async fn named_subnets(&self, net: &VpcNetwork, wanted: &[String]) -> CloudResult<Vec<VpcSubnet>> {
        const ANNOTATION: &str = "annotation service.beta.kubernetes.io/aws-load-balancer-subnets";
        let ids: Vec<String> = wanted
            .iter()
            .filter(|w| w.starts_with("subnet-"))
            .cloned()
            .collect();
        let by_id = self.describe_subnets(&ids).await?;
        let mut chosen = Vec::new();
        for w in wanted {
            if w.starts_with("subnet-") {
                match by_id.iter().find(|s| &s.id == w) {
                    Some(s) => chosen.push(s.clone()),
                    None => {
                        return Err(CloudError::msg(format!(
                            "{ANNOTATION}: subnet {w:?} does not exist"
                        )));
                    }
                }
                continue;
            }
            let named: Vec<&VpcSubnet> = net
                .subnets
                .iter()
                .filter(|s| s.tags.get("Name") == Some(w))
                .collect();
            match named.as_slice() {
                [one] => chosen.push((*one).clone()),
                [] => {
                    return Err(CloudError::msg(format!(
                        "{ANNOTATION}: no subnet in {} has the Name tag {w:?}",
                        net.vpc_id
                    )));
                }
                many => {
                    return Err(CloudError::msg(format!(
                        "{ANNOTATION}: the Name {w:?} is ambiguous, {} subnets in {} have it ({}); use subnet IDs",
                        many.len(),
                        net.vpc_id,
                        many.iter().map(|s| s.id.as_str()).collect::<Vec<_>>().join(", ")
                    )));
                }
            }
        }
        Ok(chosen)
    }

    /// Subnets by ID (any VPC), answered from the VPC cache when it has them all.
    pub(crate) async fn describe_subnets(&self, ids: &[String]) -> CloudResult<Vec<VpcSubnet>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        if let Some((_, net)) = self.vpc_network.lock().clone() {
            let found: Vec<VpcSubnet> = net
                .subnets
                .iter()
                .filter(|s| ids.contains(&s.id))
                .cloned()
                .collect();
            if found.len() == ids.len() {
                return Ok(found);
            }
        }
        let r = self
            .api
            .call(
                "describe_subnets",
                self.ec2
                    .describe_subnets()
                    .set_subnet_ids(Some(ids.to_vec()))
                    .send(),
            )
            .await;
        let out = not_found_as_none(r, &["InvalidSubnetID.NotFound"])
            .map_err(|e| cloud_error(format!("describing subnets {ids:?}"), e))?;
        Ok(out
            .map(|o| o.subnets().iter().map(VpcSubnet::from_sdk).collect())
            .unwrap_or_default())
    }

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
    /// step in errors.
    pub(crate) async fn revoke_ingress(
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
                "revoke_security_group_ingress",
                self.ec2
                    .revoke_security_group_ingress()
                    .group_id(group_id)
                    .set_ip_permissions(Some(perms))
                    .send(),
            )
            .await
            .map(|_| ())
            .map_err(|e| cloud_error(context(), e))
    }

    /// Whether `group` allows everything from `source_group`.
    pub(crate) fn allows_group(group: &SecurityGroup, source_group: &str) -> bool {
        group.ip_permissions().iter().any(|p| {
            p.user_id_group_pairs()
                .iter()
                .any(|g| g.group_id() == Some(source_group))
        })
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

    /// Removes every rule referencing `source_group` from `group`.
    pub(crate) async fn disallow_group(&self, group: &SecurityGroup, source_group: &str) -> CloudResult<()> {
        let perms: Vec<IpPermission> = group
            .ip_permissions()
            .iter()
            .filter(|p| {
                p.user_id_group_pairs()
                    .iter()
                    .any(|g| g.group_id() == Some(source_group))
            })
            .map(|p| {
                IpPermission::builder()
                    .ip_protocol(p.ip_protocol().unwrap_or("-1"))
                    .set_from_port(p.from_port())
                    .set_to_port(p.to_port())
                    .user_id_group_pairs(UserIdGroupPair::builder().group_id(source_group).build())
                    .build()
            })
            .collect();
        let id = group.group_id().unwrap_or_default();
        self.revoke_ingress(id, perms, || format!("revoking {source_group} from {id}"))
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

    /// Revokes the rules naming `group` as source from the **cluster-tagged** groups (as
    /// upstream's `revokeSecurityGroupReferences`); a group without the cluster tag belongs to
    /// someone else and is never modified.
    pub(crate) async fn revoke_references(&self, group: &str) -> CloudResult<()> {
        for g in self.groups_referencing(group).await? {
            if !self.tagged_for_cluster(&tags_of(&g)) {
                tracing::info!(
                    group = g.group_id().unwrap_or_default(),
                    source = group,
                    "security group without the cluster tag references a load-balancer group; left alone"
                );
                continue;
            }
            self.disallow_group(&g, group).await?;
        }
        Ok(())
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

/// How long the VPC's subnets and route tables are kept between load-balancer syncs.
pub const VPC_NETWORK_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// One subnet of the VPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VpcSubnet {
    /// `subnet-…`
    pub id: String,
    /// Availability zone name.
    pub zone: String,
    /// IPv4 CIDR.
    pub cidr: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
}

impl VpcSubnet {
    fn from_sdk(s: &aws_sdk_ec2::types::Subnet) -> Self {
        Self {
            id: s.subnet_id().unwrap_or_default().to_string(),
            zone: s.availability_zone().unwrap_or_default().to_string(),
            cidr: s.cidr_block().unwrap_or_default().to_string(),
            tags: s
                .tags()
                .iter()
                .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
                .collect(),
        }
    }
}

/// The subnets and route tables of the cluster's VPC.
#[derive(Debug, Clone, Default)]
pub struct VpcNetwork {
    /// The VPC.
    pub vpc_id: String,
    /// Its subnets.
    pub subnets: Vec<VpcSubnet>,
    /// Its route tables.
    pub route_tables: Vec<RouteTable>,
}

impl VpcNetwork {
    /// Whether `subnet` routes through an internet gateway: its explicitly associated route
    /// table, else the VPC's main table (upstream's `isSubnetPublic`).
    pub fn is_public(&self, subnet: &str) -> bool {
        let explicit = self
            .route_tables
            .iter()
            .find(|t| t.associations().iter().any(|a| a.subnet_id() == Some(subnet)));
        let table = explicit.or_else(|| {
            self.route_tables
                .iter()
                .find(|t| t.associations().iter().any(|a| a.main() == Some(true)))
        });
        table.is_some_and(|t| {
            t.routes()
                .iter()
                .any(|r| r.gateway_id().is_some_and(|g| g.starts_with("igw")))
        })
    }
}

/// Maps an AWS "not found" error to `Ok(None)`.
pub(crate) fn not_found_as_none<T>(r: Result<T, AwsError>, codes: &[&str]) -> Result<Option<T>, AwsError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if codes.iter().any(|c| e.is(c)) => Ok(None),
        Err(e) => Err(e),
    }
}
