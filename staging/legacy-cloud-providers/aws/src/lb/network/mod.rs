//! The VPC's subnets and security groups for load balancers (AWS-29, AWS-49…54, AWS-57), and
//! the cluster's tags. The security groups are in `security_groups.rs`.

use std::{collections::BTreeMap, sync::Arc};

use aws_sdk_ec2::types::{Filter, RouteTable};
use k8s_cloud_provider::{CloudError, CloudResult};

use crate::{AwsCloud, api::AwsError, cloud_error};

mod security_groups;

pub(crate) use security_groups::tags_of;
pub use security_groups::{CidrRule, cidr_rules};

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
