//! The staged AWS cloud provider (the counterpart of `legacy-cloud-providers/aws` and of
//! `cloud-provider-aws`), on the AWS SDK for Rust.
//!
//! Implemented (spec Part A, newest behaviour): the cloud config ([`config`], A1), start-up
//! without IMDS when region, VPC, subnet and cluster ID are configured (AWS-01…06, IMDS only as
//! a fallback for the region and the self instance), `InstancesV2`, `Instances` and `Zones`
//! (AWS-07…24, [`instances`]), routes (AWS-59…63, [`routes`]), throttling back-off and metrics
//! (AWS-73…78, [`api`]), Classic ELB and NLB load balancers with their security groups and
//! all 30 Service annotations (AWS-25…58, [`lb`], [`annotations`]).
//!
//! Deliberate differences from upstream:
//! - look-ups are coalesced with read-ahead and cached 10 s ([`instances`]), instead of one
//!   batched `DescribeInstances` per node;
//! - `Throttling` counts for the back-off like `RequestLimitExceeded`;
//! - `[ServiceOverride]` accepts the 1.20 and the newest service names; `SigningName` is
//!   accepted but the SDK signs with the service's own name (it is `ec2` / `elasticloadbalancing`
//!   for every known override);
//! - `DescribeInstanceTopology` labels (`topology.k8s.aws/network-node-layer-N`) are not
//!   supported yet (no test server implements the call);
//! - a Fargate node is never reported shut down (upstream's answer is inverted).

pub mod annotations;
pub mod api;
pub mod config;
pub mod doctor;
pub mod instances;
pub mod lb;
pub mod orphans;
pub mod routes;
pub mod sts;
pub mod tags;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use aws_config::{BehaviorVersion, Region, retry::RetryConfig, timeout::TimeoutConfig};
use k8s_cloud_provider::{
    CloudError, CloudProvider, CloudResult, InitContext, InstanceMetadata, Instances, InstancesV2, Routes,
    Zone, Zones, node::helpers::node_name, registry::Factory,
};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use parking_lot::Mutex;
use tracing::{info, warn};

use crate::{
    api::{AwsApi, AwsError},
    config::{AwsService, CloudConfig},
    instances::{
        CACHE_TTL, InstanceCache, InstanceInfo, LookupError, METADATA_MAX_AGE, NodeKey, ReadAhead,
        instance_id_from_provider_id, name_key, node_key, provider_id_for,
    },
};

/// The application name every AWS request of the CCM carries in its user agent
/// (`app/rust-cloud-provider`).
pub const APP_NAME: &str = "rust-cloud-provider";

/// The provider name.
pub const PROVIDER_NAME: &str = "aws";
/// Instance IDs of Fargate nodes start with this (AWS-13).
pub const FARGATE_PREFIX: &str = "fargate-";
/// Node label with the zone ID (AWS-21).
pub const LABEL_ZONE_ID: &str = "topology.k8s.aws/zone-id";

/// Start-up errors.
#[derive(Debug, thiserror::Error)]
pub enum AwsInitError {
    /// The config file is invalid.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The region could not be worked out.
    #[error("could not determine the AWS region: set [Global] Region in the cloud config ({0})")]
    Region(String),
    /// The self-instance look-up failed.
    #[error("could not look up the instance the cloud-controller-manager runs on: {0}")]
    SelfInstance(String),
    /// No cluster ID.
    #[error(
        "AWS cloud failed to find ClusterID: set [Global] KubernetesClusterID, or tag the instance with kubernetes.io/cluster/<id>"
    )]
    NoClusterId,
    /// `[Global] RoleARN` is not an ARN.
    #[error("{0}")]
    RoleArn(String),
    /// More than one cluster tag on the self instance.
    #[error("found multiple cluster tags on the instance the cloud-controller-manager runs on: {0:?}")]
    MultipleClusterTags(Vec<String>),
}

/// The AWS cloud.
pub struct AwsCloud {
    config: CloudConfig,
    region: String,
    cluster_id: String,
    api: AwsApi,
    ec2: aws_sdk_ec2::Client,
    elb: aws_sdk_elasticloadbalancing::Client,
    elbv2: aws_sdk_elasticloadbalancingv2::Client,
    /// STS with the provider's credentials (`doctor`'s `GetCallerIdentity`).
    sts: aws_sdk_sts::Client,
    instances: Arc<InstanceCache>,
    /// Zone name → (zone ID, zone type), from `DescribeAvailabilityZones`.
    zones: Mutex<BTreeMap<String, (String, String)>>,
    route_table: Mutex<Option<String>>,
    self_network: tokio::sync::OnceCell<SelfNetwork>,
    vpc_network: Mutex<Option<(std::time::Instant, Arc<lb::network::VpcNetwork>)>>,
    /// Services (`ns/name`) whose NLB target groups may have leaked and are to be swept.
    tg_sweep_pending: Mutex<std::collections::BTreeSet<String>>,
    /// Services (by UID) whose type switch made the new load balancer while their status still
    /// showed the old one: the old one is deleted in the sync after the status moved
    /// ([`LoadBalancer::sync_again_after_status`]).
    switch_pending: Mutex<std::collections::BTreeSet<String>>,
    /// Held while the NLB rules of the node security groups are read and changed: the
    /// path-MTU rule of a group is shared by every NLB with a client rule there, so two
    /// Services reconciled at once (a node sync beside a Service's own sync) must not each
    /// decide from what the other is changing (one left a path-MTU rule no NLB needed).
    nlb_rules: tokio::sync::Mutex<()>,
}

/// Where the cluster lives, as upstream works it out at start (AWS-04): the VPC of load
/// balancers and security groups, the last-resort load-balancer subnet and the zone `GetZone`
/// answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelfNetwork {
    /// The cluster's VPC.
    pub vpc_id: String,
    /// The subnet of the instance the CCM runs on (or `[Global] SubnetID`); "" when unknown.
    pub subnet_id: String,
    /// The zone of the instance the CCM runs on (or `[Global] Zone`); "" when unknown.
    pub zone: String,
}

impl std::fmt::Debug for AwsCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsCloud")
            .field("region", &self.region)
            .field("cluster_id", &self.cluster_id)
            .finish_non_exhaustive()
    }
}

fn imds_client(config: &CloudConfig) -> aws_config::imds::Client {
    let mut b = aws_config::imds::Client::builder()
        .connect_timeout(Duration::from_secs(1))
        .read_timeout(Duration::from_secs(2))
        .max_attempts(2);
    if let Some(o) = config.override_for(AwsService::Imds, "") {
        match b.clone().endpoint(&o.url) {
            Ok(with_endpoint) => b = with_endpoint,
            Err(e) => warn!(url = %o.url, error = %e, "ignoring the ec2imds override URL"),
        }
    }
    b.build()
}

async fn imds_get(client: &aws_config::imds::Client, path: &str) -> Result<String, String> {
    client
        .get(path)
        .await
        .map(|s| s.as_ref().to_string())
        .map_err(|e| format!("IMDS {path}: {e}"))
}

impl AwsCloud {
    /// Builds the provider from a cloud config (AWS-01…05).
    pub async fn new(config: CloudConfig) -> Result<Self, AwsInitError> {
        let region = match config.configured_region() {
            Some(r) => r,
            None => {
                let doc = imds_get(
                    &imds_client(&config),
                    "/latest/dynamic/instance-identity/document",
                )
                .await
                .map_err(AwsInitError::Region)?;
                let v: serde_json::Value = serde_json::from_str(&doc)
                    .map_err(|e| AwsInitError::Region(format!("IMDS identity document: {e}")))?;
                v["region"]
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| AwsInitError::Region("IMDS identity document has no region".into()))?
            }
        };
        for o in config.unused_overrides() {
            info!(
                section = %format!("[ServiceOverride {:?}]", o.id),
                service = %o.service,
                region = %o.region,
                "cloud config: this provider makes no calls to this service; the override is kept and unused"
            );
        }
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(region.clone()))
            .retry_config(RetryConfig::standard().with_max_attempts(3))
            .timeout_config(
                TimeoutConfig::builder()
                    .operation_attempt_timeout(Duration::from_secs(30))
                    .build(),
            );
        // Every request says which program made it (`app/rust-cloud-provider` in its user
        // agent): CloudTrail's userAgent tells this CCM's calls apart, and the tests check the
        // IAM policy against the calls moto saw with it.
        if let Ok(app) = aws_config::AppName::new(APP_NAME) {
            loader = loader.app_name(app);
        }
        let mut sdk = loader.load().await;
        if !config.role_arn.is_empty() {
            // An STS override applies to the AssumeRole calls only, never to the other clients.
            let sts_sdk = match config.override_for(AwsService::Sts, &region) {
                Some(o) => sdk.to_builder().endpoint_url(&o.url).build(),
                None => sdk.clone(),
            };
            let provider = sts::AssumeRoleWithSource::new(&sts_sdk, &config.role_arn, &config.source_arn)
                .map_err(AwsInitError::RoleArn)?;
            sdk = sdk
                .into_builder()
                .credentials_provider(aws_credential_types::provider::SharedCredentialsProvider::new(
                    provider,
                ))
                .build();
        }
        let api = AwsApi::default();
        let mut ec2_conf = aws_sdk_ec2::config::Builder::from(&sdk)
            .interceptor(api.attempt_counter())
            .interceptor(api.write_guard());
        if let Some(o) = config.override_for(AwsService::Ec2, &region) {
            info!(url = %o.url, signing_region = %o.signing_region, "using the EC2 endpoint of [ServiceOverride {:?}]", o.id);
            ec2_conf = ec2_conf
                .endpoint_url(&o.url)
                .region(Region::new(o.signing_region.clone()));
        }
        let ec2 = aws_sdk_ec2::Client::from_conf(ec2_conf.build());
        let mut elb_conf = aws_sdk_elasticloadbalancing::config::Builder::from(&sdk)
            .interceptor(api.attempt_counter())
            .interceptor(api.write_guard());
        if let Some(o) = config.override_for(AwsService::Elb, &region) {
            info!(url = %o.url, "using the ELB endpoint of [ServiceOverride {:?}]", o.id);
            elb_conf = elb_conf
                .endpoint_url(&o.url)
                .region(Region::new(o.signing_region.clone()));
        }
        let elb = aws_sdk_elasticloadbalancing::Client::from_conf(elb_conf.build());
        let mut elbv2_conf = aws_sdk_elasticloadbalancingv2::config::Builder::from(&sdk)
            .interceptor(api.attempt_counter())
            .interceptor(api.write_guard());
        if let Some(o) = config.override_for(AwsService::Elbv2, &region) {
            info!(url = %o.url, "using the ELBv2 endpoint of [ServiceOverride {:?}]", o.id);
            elbv2_conf = elbv2_conf
                .endpoint_url(&o.url)
                .region(Region::new(o.signing_region.clone()));
        }
        let elbv2 = aws_sdk_elasticloadbalancingv2::Client::from_conf(elbv2_conf.build());
        let mut sts_conf = aws_sdk_sts::config::Builder::from(&sdk)
            .interceptor(api.attempt_counter())
            .interceptor(api.write_guard());
        if let Some(o) = config.override_for(AwsService::Sts, &region) {
            sts_conf = sts_conf
                .endpoint_url(&o.url)
                .region(Region::new(o.signing_region.clone()));
        }
        let sts = aws_sdk_sts::Client::from_conf(sts_conf.build());

        let cluster_id = match config.cluster_id() {
            Some(id) => id.to_string(),
            None => {
                // AWS-04/05: the instance we run on, through IMDS.
                let id = imds_get(&imds_client(&config), "/latest/meta-data/instance-id")
                    .await
                    .map_err(AwsInitError::SelfInstance)?;
                let cache = InstanceCache::new(ec2.clone(), api.clone(), String::new());
                let me = cache
                    .describe_ids(std::slice::from_ref(&id))
                    .await
                    .map_err(|e| AwsInitError::SelfInstance(e.to_string()))?
                    .into_iter()
                    .next()
                    .ok_or_else(|| AwsInitError::SelfInstance(format!("instance {id} not found in EC2")))?;
                cluster_id_from_tags(&me.tags)?
            }
        };
        let instances = Arc::new(InstanceCache::new(ec2.clone(), api.clone(), cluster_id.clone()));
        info!(region = %region, cluster_id = %cluster_id, "AWS cloud provider initialised");
        Ok(Self {
            config,
            region,
            cluster_id,
            api,
            ec2,
            elb,
            elbv2,
            sts,
            instances,
            zones: Mutex::new(BTreeMap::new()),
            route_table: Mutex::new(None),
            self_network: tokio::sync::OnceCell::new(),
            vpc_network: Mutex::new(None),
            tg_sweep_pending: Mutex::new(std::collections::BTreeSet::new()),
            switch_pending: Mutex::new(std::collections::BTreeSet::new()),
            nlb_rules: tokio::sync::Mutex::new(()),
        })
    }

    /// The cluster's VPC, self subnet and self zone (AWS-04), worked out on first use and kept:
    ///
    /// 1. `[Global] VPC` (with `SubnetID` and `Zone` as configured; upstream's "outside AWS"
    ///    mode);
    /// 2. else the VPC of `[Global] SubnetID`;
    /// 3. else the instance the CCM runs on, through IMDS (`instance-id`) and
    ///    `DescribeInstances`: its VPC, subnet and zone.
    ///
    /// Upstream also uses IMDS when `VPC` is set without `SubnetID`/`RoleARN`, and then takes
    /// the instance's VPC over the configured one; here a configured VPC always wins. A failure
    /// is not remembered: the next call tries again.
    pub async fn self_network(&self) -> CloudResult<&SelfNetwork> {
        self.self_network
            .get_or_try_init(|| async {
                let configured_zone = self.config.zone.clone();
                if !self.config.vpc.is_empty() {
                    return Ok(SelfNetwork {
                        vpc_id: self.config.vpc.clone(),
                        subnet_id: self.config.subnet_id.clone(),
                        zone: configured_zone,
                    });
                }
                if !self.config.subnet_id.is_empty() {
                    let out = self
                        .api
                        .call(
                            "describe_subnets",
                            self.ec2
                                .describe_subnets()
                                .subnet_ids(&self.config.subnet_id)
                                .send(),
                        )
                        .await
                        .map_err(|e| {
                            cloud_error(
                                format!("finding the VPC of [Global] SubnetID {:?}", self.config.subnet_id),
                                e,
                            )
                        })?;
                    let subnet = out.subnets().first().ok_or_else(|| {
                        CloudError::msg(format!(
                            "[Global] SubnetID {:?}: no such subnet",
                            self.config.subnet_id
                        ))
                    })?;
                    return Ok(SelfNetwork {
                        vpc_id: subnet.vpc_id().unwrap_or_default().to_string(),
                        subnet_id: self.config.subnet_id.clone(),
                        zone: if configured_zone.is_empty() {
                            subnet.availability_zone().unwrap_or_default().to_string()
                        } else {
                            configured_zone
                        },
                    });
                }
                let id = imds_get(&imds_client(&self.config), "/latest/meta-data/instance-id")
                    .await
                    .map_err(|e| {
                        CloudError::msg(format!(
                            "cannot tell the cluster's VPC: [Global] VPC and SubnetID are not set and the instance metadata service did not answer ({e})"
                        ))
                    })?;
                let me = self
                    .instances
                    .get(&NodeKey::Id(id.clone()), METADATA_MAX_AGE)
                    .await
                    .map_err(|e| match e {
                        LookupError::Aws(a) => CloudError::wrap(format!("looking up the CCM's instance {id}"), a),
                        other => CloudError::msg(other.to_string()),
                    })?
                    .ok_or_else(|| {
                        CloudError::msg(format!(
                            "cannot tell the cluster's VPC: the instance the CCM runs on ({id}, from IMDS) is not in EC2"
                        ))
                    })?;
                info!(instance = %me.id, vpc = %me.vpc_id, subnet = %me.subnet_id, "cluster VPC from the instance the CCM runs on");
                Ok(SelfNetwork {
                    vpc_id: me.vpc_id.clone(),
                    subnet_id: me.subnet_id.clone(),
                    zone: if configured_zone.is_empty() { me.zone.clone() } else { configured_zone },
                })
            })
            .await
    }

    /// The region.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The cluster ID.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The shared API wrapper (metrics, back-off).
    pub fn api(&self) -> &AwsApi {
        &self.api
    }

    /// The instances of `ids` that EC2 knows (by the `instance-id` filter, 200 at a time, all
    /// pages): an ID it does not know is left out instead of failing the whole call.
    pub(crate) async fn instances_by_id(
        &self,
        ids: &[String],
    ) -> CloudResult<Vec<aws_sdk_ec2::types::Instance>> {
        let mut found = Vec::new();
        for chunk in ids.chunks(200) {
            let reservations = self
                .api
                .call(
                    "describe_instances",
                    self.ec2
                        .describe_instances()
                        .filters(
                            aws_sdk_ec2::types::Filter::builder()
                                .name("instance-id")
                                .set_values(Some(chunk.to_vec()))
                                .build(),
                        )
                        .into_paginator()
                        .items()
                        .send()
                        .try_collect(),
                )
                .await
                .map_err(|e| cloud_error("looking up instances by ID", e))?;
            found.extend(reservations.iter().flat_map(|r| r.instances()).cloned());
        }
        Ok(found)
    }

    /// The instance for a Node; `Ok(None)` when EC2 says there is none.
    async fn instance_for(&self, node: &Node, max_age: Duration) -> CloudResult<Option<Arc<InstanceInfo>>> {
        self.lookup(&cache_key(node)?, max_age).await
    }

    /// The existence and shutdown checks' look-up (the node-lifecycle controller's): at most
    /// [`CACHE_TTL`] old, and a miss reads ahead only the NotReady Nodes, the only ones that
    /// controller asks about.
    async fn health_lookup(&self, node: &Node) -> CloudResult<Option<Arc<InstanceInfo>>> {
        self.lookup_reading_ahead(&cache_key(node)?, CACHE_TTL, ReadAhead::NotReadyNodes)
            .await
    }

    /// [`AwsCloud::health_lookup`] by provider ID.
    async fn health_lookup_by_provider_id(
        &self,
        provider_id: &str,
    ) -> CloudResult<Option<Arc<InstanceInfo>>> {
        self.lookup_reading_ahead(
            &provider_id_key(provider_id)?,
            CACHE_TTL,
            ReadAhead::NotReadyNodes,
        )
        .await
    }

    async fn lookup(&self, key: &NodeKey, max_age: Duration) -> CloudResult<Option<Arc<InstanceInfo>>> {
        self.lookup_reading_ahead(key, max_age, ReadAhead::AllNodes).await
    }

    /// [`AwsCloud::lookup`], saying which other Nodes a cache miss reads ahead.
    async fn lookup_reading_ahead(
        &self,
        key: &NodeKey,
        max_age: Duration,
        read_ahead: ReadAhead,
    ) -> CloudResult<Option<Arc<InstanceInfo>>> {
        if let NodeKey::Id(id) = key
            && id.starts_with(FARGATE_PREFIX)
        {
            return self.fargate_lookup(id).await;
        }
        self.instances
            .get_reading_ahead(key, max_age, read_ahead)
            .await
            .map_err(|e| match e {
                LookupError::Aws(a) => CloudError::wrap(format!("looking up {key:?}"), a),
                other => CloudError::msg(other.to_string()),
            })
    }

    /// A Fargate node (AWS-13): its attached network interface in the cluster's VPC, found by
    /// the private IP in its ID (`fargate-10.0.1.5` or `fargate-ip-10-0-1-5.<domain>`), never
    /// by `DescribeInstances`. No interface = gone; several = an error (no verdict). Zone and
    /// addresses are the interface's; the type is "". Unlike upstream (whose
    /// `InstanceShutdown` answers true while the interface *exists*), a Fargate node is never
    /// reported shut down.
    async fn fargate_lookup(&self, id: &str) -> CloudResult<Option<Arc<InstanceInfo>>> {
        use aws_sdk_ec2::types::Filter;
        let endpoint = id.trim_start_matches(FARGATE_PREFIX);
        let ip = match endpoint.strip_prefix("ip-") {
            Some(rest) => rest.split('.').next().unwrap_or_default().replace('-', "."),
            None => endpoint.to_string(),
        };
        let vpc = self.self_network().await?.vpc_id.clone();
        let out = self
            .api
            .call(
                "describe_network_interfaces",
                self.ec2
                    .describe_network_interfaces()
                    .filters(Filter::builder().name("vpc-id").values(&vpc).build())
                    .filters(Filter::builder().name("private-ip-address").values(&ip).build())
                    .send(),
            )
            .await
            .map_err(|e| {
                CloudError::wrap(
                    format!("looking up the network interface of Fargate node {id}"),
                    e,
                )
            })?;
        // Upstream filters `attachment.status=attached` on the server; the same check here (moto
        // has no such filter).
        let enis: Vec<&aws_sdk_ec2::types::NetworkInterface> = out
            .network_interfaces()
            .iter()
            .filter(|e| {
                e.attachment()
                    .and_then(|a| a.status())
                    .is_some_and(|s| s.as_str() == "attached")
            })
            .collect();
        let eni = match enis.as_slice() {
            [] => return Ok(None),
            [one] => *one,
            many => {
                return Err(CloudError::msg(format!(
                    "Fargate node {id}: {} network interfaces have the address {ip} in {vpc}",
                    many.len()
                )));
            }
        };
        Ok(Some(Arc::new(InstanceInfo {
            id: id.to_string(),
            zone: eni.availability_zone().unwrap_or_default().to_string(),
            state: Some("running".into()),
            private_ip: eni.private_ip_address().unwrap_or_default().to_string(),
            private_dns_name: eni.private_dns_name().unwrap_or_default().to_string(),
            vpc_id: eni.vpc_id().unwrap_or_default().to_string(),
            subnet_id: eni.subnet_id().unwrap_or_default().to_string(),
            enis: vec![crate::instances::Eni {
                device_index: Some(0),
                status: "in-use".into(),
                private_ips: vec![eni.private_ip_address().unwrap_or_default().to_string()],
                ipv6: eni
                    .ipv6_addresses()
                    .iter()
                    .filter_map(|a| a.ipv6_address().map(str::to_string))
                    .collect(),
            }],
            fargate: true,
            ..Default::default()
        })))
    }

    /// The instance for a node name: the informer's providerID first, then AWS-08's rules.
    async fn instance_for_name(
        &self,
        name: &str,
        max_age: Duration,
    ) -> CloudResult<Option<Arc<InstanceInfo>>> {
        if let Some(store) = self.instances.nodes()
            && let Some(node) = store.get(name)
        {
            return self.instance_for(&node, max_age).await;
        }
        self.lookup(&name_key(name), max_age).await
    }

    async fn zone_id(&self, zone: &str) -> Option<String> {
        self.zone_details(zone).await.map(|(id, _)| id)
    }

    /// The ID and type (`availability-zone`, `local-zone`, `wavelength-zone`, …) of a zone;
    /// `DescribeAvailabilityZones` (all zones, opted in or not) is asked again only when a zone
    /// not seen before appears.
    pub(crate) async fn zone_details(&self, zone: &str) -> Option<(String, String)> {
        if let Some(d) = self.zones.lock().get(zone) {
            return Some(d.clone());
        }
        match self
            .api
            .call(
                "describe_availability_zones",
                self.ec2
                    .describe_availability_zones()
                    .all_availability_zones(true)
                    .send(),
            )
            .await
        {
            Ok(out) => {
                let mut zones = self.zones.lock();
                for z in out.availability_zones() {
                    if let (Some(n), Some(i)) = (z.zone_name(), z.zone_id()) {
                        zones.insert(
                            n.to_string(),
                            (
                                i.to_string(),
                                z.zone_type().unwrap_or("availability-zone").to_string(),
                            ),
                        );
                    }
                }
                zones.get(zone).cloned()
            }
            Err(e) => {
                warn!(error = %e, "could not read availability zones");
                None
            }
        }
    }

    fn metadata_of(&self, i: &InstanceInfo) -> CloudResult<InstanceMetadata> {
        let addresses = i
            .node_addresses(&self.config.node_ip_families)
            .map_err(CloudError::msg)?;
        Ok(InstanceMetadata::new(provider_id_for(&i.zone, &i.id))
            .with_instance_type(i.instance_type.clone())
            .with_node_addresses(addresses)
            .with_zone(i.zone.clone(), self.region.clone()))
    }
}

fn cluster_id_from_tags(tags: &BTreeMap<String, String>) -> Result<String, AwsInitError> {
    let new: Vec<String> = tags
        .keys()
        .filter_map(|k| k.strip_prefix("kubernetes.io/cluster/"))
        .map(str::to_string)
        .collect();
    match new.as_slice() {
        [one] => Ok(one.clone()),
        [] => tags
            .get("KubernetesCluster")
            .cloned()
            .ok_or(AwsInitError::NoClusterId),
        many => Err(AwsInitError::MultipleClusterTags(many.to_vec())),
    }
}

/// The factory the cloud-controller-manager calls with the `--cloud-config` contents.
pub fn factory() -> Factory {
    Arc::new(|config: Option<Vec<u8>>| {
        Box::pin(async move {
            let config = CloudConfig::parse(config.as_deref())?;
            Ok(Arc::new(AwsCloud::new(config).await?) as Arc<dyn CloudProvider>)
        })
    })
}

#[async_trait]
impl CloudProvider for AwsCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        self.instances.set_nodes(ctx.nodes);
        if let Some(dry_run) = ctx.dry_run {
            // Shadow mode: from now on no AWS write of any client is sent (see `WriteGuard`).
            let _ = self.api.dry_run.set(dry_run);
        }
        Ok(())
    }

    fn register_metrics(&self, metrics: &k8s_controller_manager::metrics::Metrics) {
        self.api.metrics.register(metrics);
    }

    fn instances(&self) -> Option<&dyn Instances> {
        Some(self)
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }

    fn zones(&self) -> Option<&dyn Zones> {
        Some(self)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        Some(self)
    }

    fn load_balancer(&self) -> Option<&dyn k8s_cloud_provider::LoadBalancer> {
        Some(self)
    }

    fn has_cluster_id(&self) -> bool {
        !self.cluster_id.is_empty()
    }
}

fn exists(i: &InstanceInfo) -> bool {
    // AWS-22: gone when terminated or without a state.
    !matches!(i.state.as_deref(), None | Some("terminated"))
}

/// The instance-cache key of a Node (its provider ID, else its name), as a cloud error.
fn cache_key(node: &Node) -> CloudResult<NodeKey> {
    node_key(node).map_err(|e| CloudError::msg(format!("node {}: {e}", node_name(node))))
}

/// The instance-cache key of a provider ID, as a cloud error.
fn provider_id_key(provider_id: &str) -> CloudResult<NodeKey> {
    instance_id_from_provider_id(provider_id)
        .map(NodeKey::Id)
        .map_err(|e| CloudError::msg(e.to_string()))
}

#[async_trait]
impl InstancesV2 for AwsCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.health_lookup(node).await?.is_some_and(|i| exists(&i)))
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        Ok(self
            .health_lookup(node)
            .await?
            .is_some_and(|i| i.state.as_deref() == Some("stopped")))
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let i = self
            .instance_for(node, METADATA_MAX_AGE)
            .await?
            .ok_or(CloudError::InstanceNotFound)?;
        let mut md = self.metadata_of(&i)?;
        let has_label = node
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(LABEL_ZONE_ID));
        if !has_label && let Some(id) = self.zone_id(&i.zone).await {
            md.additional_labels.insert(LABEL_ZONE_ID.into(), id);
        }
        Ok(Some(md))
    }
}

impl AwsCloud {
    async fn by_provider_id(
        &self,
        provider_id: &str,
        max_age: Duration,
    ) -> CloudResult<Option<Arc<InstanceInfo>>> {
        self.lookup(&provider_id_key(provider_id)?, max_age).await
    }

    async fn existing_by_name(&self, name: &str) -> CloudResult<Arc<InstanceInfo>> {
        self.instance_for_name(name, METADATA_MAX_AGE)
            .await?
            .ok_or(CloudError::InstanceNotFound)
    }
}

#[async_trait]
impl Instances for AwsCloud {
    async fn node_addresses(&self, name: &str) -> CloudResult<Vec<NodeAddress>> {
        let i = self.existing_by_name(name).await?;
        i.node_addresses(&self.config.node_ip_families)
            .map_err(CloudError::msg)
    }
    async fn node_addresses_by_provider_id(&self, provider_id: &str) -> CloudResult<Vec<NodeAddress>> {
        let i = self
            .by_provider_id(provider_id, METADATA_MAX_AGE)
            .await?
            .ok_or(CloudError::InstanceNotFound)?;
        i.node_addresses(&self.config.node_ip_families)
            .map_err(CloudError::msg)
    }
    /// AWS-24: `/<az>/<instance-id>`.
    async fn instance_id(&self, name: &str) -> CloudResult<String> {
        let i = self.existing_by_name(name).await?;
        Ok(format!("/{}/{}", i.zone, i.id))
    }
    async fn instance_type(&self, name: &str) -> CloudResult<String> {
        Ok(self.existing_by_name(name).await?.instance_type.clone())
    }
    async fn instance_type_by_provider_id(&self, provider_id: &str) -> CloudResult<String> {
        Ok(self
            .by_provider_id(provider_id, METADATA_MAX_AGE)
            .await?
            .ok_or(CloudError::InstanceNotFound)?
            .instance_type
            .clone())
    }
    async fn instance_exists_by_provider_id(&self, provider_id: &str) -> CloudResult<bool> {
        Ok(self
            .health_lookup_by_provider_id(provider_id)
            .await?
            .is_some_and(|i| exists(&i)))
    }
    async fn instance_shutdown_by_provider_id(&self, provider_id: &str) -> CloudResult<bool> {
        Ok(self
            .health_lookup_by_provider_id(provider_id)
            .await?
            .is_some_and(|i| i.state.as_deref() == Some("stopped")))
    }
}

#[async_trait]
impl Zones for AwsCloud {
    /// AWS-20: the zone of the instance the CCM runs on (`[Global] Zone` when set).
    async fn get_zone(&self) -> CloudResult<Zone> {
        let zone = if self.config.zone.is_empty() {
            self.self_network().await?.zone.clone()
        } else {
            self.config.zone.clone()
        };
        if zone.is_empty() {
            return Err(CloudError::msg(
                "cannot tell the zone of the CCM's own instance: set [Global] Zone",
            ));
        }
        Ok(Zone::new(zone, self.region.clone()))
    }
    async fn get_zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Zone> {
        let i = self
            .by_provider_id(provider_id, METADATA_MAX_AGE)
            .await?
            .ok_or(CloudError::InstanceNotFound)?;
        Ok(Zone::new(i.zone.clone(), self.region.clone()))
    }
    async fn get_zone_by_node_name(&self, name: &str) -> CloudResult<Zone> {
        let i = self.existing_by_name(name).await?;
        Ok(Zone::new(i.zone.clone(), self.region.clone()))
    }
}

/// Maps an AWS error to a cloud error (for modules of this crate).
pub(crate) fn cloud_error(context: impl std::fmt::Display, e: AwsError) -> CloudError {
    CloudError::wrap(context, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_id_from_instance_tags() {
        let t = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(
            cluster_id_from_tags(&t(&[("kubernetes.io/cluster/c1", "owned")])).unwrap(),
            "c1"
        );
        assert_eq!(
            cluster_id_from_tags(&t(&[("KubernetesCluster", "old")])).unwrap(),
            "old"
        );
        assert!(matches!(
            cluster_id_from_tags(&t(&[])),
            Err(AwsInitError::NoClusterId)
        ));
        assert!(matches!(
            cluster_id_from_tags(&t(&[
                ("kubernetes.io/cluster/a", "owned"),
                ("kubernetes.io/cluster/b", "owned")
            ])),
            Err(AwsInitError::MultipleClusterTags(_))
        ));
    }
}
