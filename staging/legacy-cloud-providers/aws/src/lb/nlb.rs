//! Network Load Balancers with instance targets (spec A6.3): one listener and one target group
//! per service port (names of AWS-43), health checks, targets on the NodePort (deregister
//! before register, chunks of 100), load-balancer and target-group attributes, node
//! security-group rules for clients, health checks and path-MTU discovery, and the opt-in
//! managed security group (`NLBSecurityGroupMode = Managed`).
//!
//! Deliberate difference: the path-MTU rule's description carries the load balancer's name
//! (`kubernetes.io/rule/nlb/mtu=<name>`), and when an NLB goes away a path-MTU rule that
//! another NLB still needs (same client CIDR) is handed over rather than revoked (see
//! `AwsCloud::release_nlb_rules`), so deleting one NLB never removes another's rule.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use aws_sdk_ec2::types::SecurityGroup;
use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Certificate, LoadBalancer as Nlb, LoadBalancerAttribute, LoadBalancerSchemeEnum,
    LoadBalancerTypeEnum, ProtocolEnum, SubnetMapping, Tag, TargetDescription, TargetGroupAttribute,
    TargetTypeEnum,
};
use k8s_cloud_provider::{
    CloudError, CloudResult,
    service::helpers::{load_balancer_source_ranges, service_health_check_path_port, service_key},
};
use k8s_openapi::api::core::v1::Service;
use sha1::Digest as _;

use super::{LbPort, network::CidrRule, not_found_as_none};
use crate::{AwsCloud, annotations::LbOptions, cloud_error, instances::InstanceInfo};

/// Description prefix of the client rules on node groups.
pub const RULE_CLIENT: &str = "kubernetes.io/rule/nlb/client=";
/// Description prefix of the health-check rules.
pub const RULE_HEALTH: &str = "kubernetes.io/rule/nlb/health=";
/// Description prefix of the path-MTU rules.
pub const RULE_MTU: &str = "kubernetes.io/rule/nlb/mtu=";

fn alnum(s: &str, max: usize) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(max)
        .collect()
}

/// The health check of one target group: `(protocol, port, path, interval, healthy, unhealthy)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TgHealth {
    /// TCP, HTTP or HTTPS.
    pub protocol: String,
    /// `traffic-port` or a number.
    pub port: String,
    /// Path for HTTP(S).
    pub path: Option<String>,
    /// Interval (s).
    pub interval: i32,
    /// Healthy threshold.
    pub healthy: i32,
    /// Unhealthy threshold.
    pub unhealthy: i32,
}

/// AWS-44.
pub fn health(svc: &Service, opts: &LbOptions, shared_probe: Option<(i32, String)>) -> TgHealth {
    let mut h = match service_health_check_path_port(svc) {
        Some((path, port)) => TgHealth {
            protocol: "HTTP".into(),
            port: port.to_string(),
            path: Some(path.into()),
            interval: 10,
            healthy: 2,
            unhealthy: 2,
        },
        None => match shared_probe {
            Some((port, path)) => TgHealth {
                protocol: "HTTP".into(),
                port: port.to_string(),
                path: Some(path),
                interval: 30,
                healthy: 3,
                unhealthy: 3,
            },
            None => TgHealth {
                protocol: "TCP".into(),
                port: "traffic-port".into(),
                path: None,
                interval: 30,
                healthy: 3,
                unhealthy: 3,
            },
        },
    };
    if let Some(p) = &opts.hc_protocol {
        h.protocol = p.clone();
        h.path = match p.as_str() {
            "TCP" => None,
            _ => h.path.or_else(|| Some("/".into())),
        };
    }
    if let Some(p) = &opts.hc_port {
        h.port = p.clone();
    }
    if let Some(p) = &opts.hc_path
        && h.protocol != "TCP"
    {
        h.path = Some(p.clone());
    }
    if let Some(i) = opts.hc_interval {
        h.interval = i;
    }
    if let Some(v) = opts.hc_healthy {
        h.healthy = v;
    }
    if let Some(v) = opts.hc_unhealthy {
        h.unhealthy = v;
    }
    h
}

/// AWS-43: `k8s-<ns ≤8>-<name ≤8>-<first 10 hex of SHA-1(…)>`.
pub fn target_group_name(
    cluster_id: &str,
    svc: &Service,
    port: &LbPort,
    target_protocol: &str,
    h: &TgHealth,
) -> String {
    let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let input = format!(
        "{cluster_id}\n{ns}\n{name}\n{}\n{}\n{target_protocol}\ninstance\n{}\n{}",
        port.port, port.node_port, h.protocol, h.interval
    );
    let digest = hex::encode(sha1::Sha1::digest(input.as_bytes()));
    format!("k8s-{}-{}-{}", alnum(ns, 8), alnum(name, 8), &digest[..10])
}

fn tg_protocol(port: &LbPort, opts: &LbOptions) -> (String, String) {
    let tls = port.protocol != "UDP" && opts.is_ssl_port(port.port, port.name.as_deref());
    let listener = if tls {
        "TLS".to_string()
    } else {
        port.protocol.clone()
    };
    let target = if tls && opts.backend_protocol.as_deref() == Some("ssl") {
        "TLS".to_string()
    } else {
        port.protocol.clone()
    };
    (listener, target)
}

fn tags(pairs: &[(String, String)]) -> Vec<Tag> {
    pairs
        .iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

impl AwsCloud {
    pub(crate) async fn describe_nlb(&self, name: &str) -> CloudResult<Option<Nlb>> {
        let r = self
            .api
            .call(
                "elbv2_describe_load_balancers",
                self.elbv2.describe_load_balancers().names(name).send(),
            )
            .await;
        let out = not_found_as_none(r, &["LoadBalancerNotFound"])
            .map_err(|e| cloud_error(format!("describing NLB {name}"), e))?;
        Ok(out.and_then(|o| o.load_balancers().first().cloned()))
    }

    fn managed_group_name(&self, svc: &Service) -> String {
        let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let uid = svc.metadata.uid.as_deref().unwrap_or_default();
        let digest = hex::encode(sha2::Sha256::digest(
            format!("{}\n{name}\n{ns}\n{uid}", self.cluster_id).as_bytes(),
        ));
        format!("k8s-{}-{}-{}", alnum(ns, 8), alnum(name, 8), &digest[..10])
    }

    /// Creates or updates the NLB of `svc`; returns its DNS name (empty until active or
    /// provisioning).
    pub(crate) async fn ensure_nlb(
        &self,
        name: &str,
        svc: &Service,
        opts: &LbOptions,
        ports: &[LbPort],
        instances: &[Arc<InstanceInfo>],
    ) -> CloudResult<String> {
        let key = service_key(svc);
        let resource_tags = self.resource_tags(&key, &opts.additional_tags);
        let subnets = self.lb_subnets(opts.internal, &opts.subnets).await?;
        let ranges = load_balancer_source_ranges(svc).map_err(|e| CloudError::msg(e.to_string()))?;
        let managed = self.config.nlb_security_group_mode == "Managed";

        let mut lb = self.describe_nlb(name).await?;
        let mut group: Option<String> = None;
        if managed {
            let groups = if !opts.security_groups.is_empty() {
                opts.security_groups.clone()
            } else {
                let id = self
                    .ensure_owned_security_group(
                        &self.managed_group_name(svc),
                        "[k8s] Managed SecurityGroup for LoadBalancer",
                        &resource_tags,
                    )
                    .await?;
                let mut rules = Vec::new();
                for r in &ranges {
                    for p in ports {
                        rules.push(CidrRule {
                            protocol: p.protocol.to_ascii_lowercase(),
                            from: p.port,
                            to: p.port,
                            cidr: r.to_string(),
                            description: String::new(),
                        });
                    }
                    rules.push(CidrRule {
                        protocol: "icmp".into(),
                        from: 3,
                        to: 4,
                        cidr: r.to_string(),
                        description: String::new(),
                    });
                }
                self.sync_cidr_rules(&id, &rules).await?;
                vec![id]
            };
            group = groups.first().cloned();
            if let Some(existing) = &lb {
                let have: BTreeSet<String> = existing.security_groups().iter().cloned().collect();
                if !have.is_empty() && have != groups.iter().cloned().collect::<BTreeSet<_>>() {
                    self.api
                        .call(
                            "elbv2_set_security_groups",
                            self.elbv2
                                .set_security_groups()
                                .load_balancer_arn(existing.load_balancer_arn().unwrap_or_default())
                                .set_security_groups(Some(groups.clone()))
                                .send(),
                        )
                        .await
                        .map_err(|e| cloud_error(format!("setting security groups of {name}"), e))?;
                    // AWS-53: owned groups detached from the NLB (the managed group after a
                    // switch to BYO groups) are cleaned up.
                    let replaced: Vec<String> = have
                        .difference(&groups.iter().cloned().collect())
                        .cloned()
                        .collect();
                    self.remove_replaced_groups(name, &replaced).await?;
                }
            } else {
                lb = Some(
                    self.create_nlb(name, opts, &subnets, &resource_tags, Some(groups))
                        .await?,
                );
            }
        }
        let lb = match lb {
            Some(l) => l,
            None => {
                self.create_nlb(name, opts, &subnets, &resource_tags, None)
                    .await?
            }
        };
        let arn = lb.load_balancer_arn().unwrap_or_default().to_string();

        // Listeners and target groups.
        let vpc = self.vpc_id().await?;
        let shared = self.shared_probe(svc);
        let listeners = self
            .api
            .call(
                "elbv2_describe_listeners",
                self.elbv2.describe_listeners().load_balancer_arn(&arn).send(),
            )
            .await
            .map_err(|e| cloud_error(format!("listing listeners of {name}"), e))?;
        let mut existing: BTreeMap<(i32, String), (String, Option<String>)> = listeners
            .listeners()
            .iter()
            .filter_map(|l| {
                let tg = l
                    .default_actions()
                    .first()
                    .and_then(|a| a.target_group_arn())
                    .map(str::to_string);
                Some((
                    (l.port()?, l.protocol()?.as_str().to_string()),
                    (l.listener_arn()?.to_string(), tg),
                ))
            })
            .collect();
        let mut obsolete_tgs: BTreeSet<String> = BTreeSet::new();
        let mut wanted_keys = BTreeSet::new();
        let h = health(svc, opts, shared);
        for p in ports {
            let (listener_proto, target_proto) = tg_protocol(p, opts);
            let tg_name = target_group_name(&self.cluster_id, svc, p, &target_proto, &h);
            let tg_arn = self
                .ensure_target_group(&tg_name, &vpc, p, &target_proto, &h, &resource_tags)
                .await?;
            self.sync_tg_attributes(&tg_arn, opts).await?;
            self.sync_targets(&tg_arn, p.node_port, instances).await?;
            let lkey = (p.port, listener_proto.clone());
            wanted_keys.insert(lkey.clone());
            match existing.remove(&lkey) {
                Some((listener_arn, current)) => {
                    if current.as_deref() != Some(tg_arn.as_str()) {
                        self.api
                            .call(
                                "elbv2_modify_listener",
                                self.elbv2
                                    .modify_listener()
                                    .listener_arn(&listener_arn)
                                    .default_actions(forward(&tg_arn))
                                    .send(),
                            )
                            .await
                            .map_err(|e| {
                                cloud_error(format!("pointing listener {} of {name} at {tg_name}", p.port), e)
                            })?;
                        obsolete_tgs.extend(current);
                    }
                }
                None => {
                    let mut req = self
                        .elbv2
                        .create_listener()
                        .load_balancer_arn(&arn)
                        .port(p.port)
                        .protocol(ProtocolEnum::from(listener_proto.as_str()))
                        .default_actions(forward(&tg_arn))
                        .set_tags(Some(tags(&resource_tags)));
                    if listener_proto == "TLS" {
                        req = req
                            .certificates(
                                Certificate::builder()
                                    .set_certificate_arn(opts.ssl_cert.clone())
                                    .build(),
                            )
                            .set_ssl_policy(opts.ssl_negotiation_policy.clone());
                    }
                    self.api
                        .call("elbv2_create_listener", req.send())
                        .await
                        .map_err(|e| cloud_error(format!("creating listener {} on {name}", p.port), e))?;
                }
            }
        }
        // Listeners no longer wanted go, with their target groups (AWS-48).
        for (lkey, (listener_arn, tg)) in existing {
            if wanted_keys.contains(&lkey) {
                continue;
            }
            self.api
                .call(
                    "elbv2_delete_listener",
                    self.elbv2.delete_listener().listener_arn(&listener_arn).send(),
                )
                .await
                .map_err(|e| cloud_error(format!("deleting listener {} of {name}", lkey.0), e))?;
            obsolete_tgs.extend(tg);
        }
        for tg in obsolete_tgs {
            self.delete_target_group(&tg).await?;
        }
        self.sync_nlb_attributes(&arn, opts).await?;
        if !self.config.disable_security_group_ingress {
            match &group {
                Some(g) => self.sync_node_group_access(g, instances).await?,
                None => {
                    self.sync_nlb_node_rules(
                        name,
                        ports,
                        &ranges.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
                        &subnets,
                        &h,
                        instances,
                    )
                    .await?
                }
            }
        }
        let active = lb
            .state()
            .and_then(|s| s.code())
            .is_none_or(|c| matches!(c.as_str(), "active" | "provisioning"));
        Ok(if active {
            lb.dns_name().unwrap_or_default().to_string()
        } else {
            String::new()
        })
    }

    async fn create_nlb(
        &self,
        name: &str,
        opts: &LbOptions,
        subnets: &[(String, String, String)],
        resource_tags: &[(String, String)],
        groups: Option<Vec<String>>,
    ) -> CloudResult<Nlb> {
        for (what, list) in [
            ("eip-allocations", &opts.eip_allocations),
            ("private-ipv4-addresses", &opts.private_ipv4_addresses),
        ] {
            if !list.is_empty() && list.len() != subnets.len() {
                return Err(CloudError::msg(format!(
                    "annotation service.beta.kubernetes.io/aws-load-balancer-{what}: {} values for {} subnets; give one per subnet",
                    list.len(),
                    subnets.len()
                )));
            }
        }
        let mappings: Vec<SubnetMapping> = subnets
            .iter()
            .enumerate()
            .map(|(i, (id, _, _))| {
                SubnetMapping::builder()
                    .subnet_id(id)
                    .set_allocation_id(opts.eip_allocations.get(i).cloned())
                    .set_private_ipv4_address(opts.private_ipv4_addresses.get(i).cloned())
                    .build()
            })
            .collect();
        let out = self
            .api
            .call(
                "elbv2_create_load_balancer",
                self.elbv2
                    .create_load_balancer()
                    .name(name)
                    .r#type(LoadBalancerTypeEnum::Network)
                    .scheme(if opts.internal {
                        LoadBalancerSchemeEnum::Internal
                    } else {
                        LoadBalancerSchemeEnum::InternetFacing
                    })
                    .set_subnet_mappings(Some(mappings))
                    .set_security_groups(groups)
                    .set_tags(Some(tags(resource_tags)))
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("creating NLB {name}"), e))?;
        tracing::info!(lb = name, "created NLB");
        out.load_balancers()
            .first()
            .cloned()
            .ok_or_else(|| CloudError::msg(format!("CreateLoadBalancer {name} returned nothing")))
    }

    async fn ensure_target_group(
        &self,
        tg_name: &str,
        vpc: &str,
        port: &LbPort,
        protocol: &str,
        h: &TgHealth,
        resource_tags: &[(String, String)],
    ) -> CloudResult<String> {
        let r = self
            .api
            .call(
                "elbv2_describe_target_groups",
                self.elbv2.describe_target_groups().names(tg_name).send(),
            )
            .await;
        let found = not_found_as_none(r, &["TargetGroupNotFound"])
            .map_err(|e| cloud_error(format!("describing target group {tg_name}"), e))?;
        if let Some(tg) = found.and_then(|o| o.target_groups().first().cloned()) {
            let arn = tg.target_group_arn().unwrap_or_default().to_string();
            let differs = tg.health_check_port() != Some(h.port.as_str())
                || tg.healthy_threshold_count() != Some(h.healthy)
                || tg.unhealthy_threshold_count() != Some(h.unhealthy)
                || (h.path.is_some() && tg.health_check_path() != h.path.as_deref());
            if differs {
                self.api
                    .call(
                        "elbv2_modify_target_group",
                        self.elbv2
                            .modify_target_group()
                            .target_group_arn(&arn)
                            .health_check_port(&h.port)
                            .healthy_threshold_count(h.healthy)
                            .unhealthy_threshold_count(h.unhealthy)
                            .set_health_check_path(h.path.clone())
                            .send(),
                    )
                    .await
                    .map_err(|e| cloud_error(format!("updating the health check of {tg_name}"), e))?;
            }
            return Ok(arn);
        }
        let out = self
            .api
            .call(
                "elbv2_create_target_group",
                self.elbv2
                    .create_target_group()
                    .name(tg_name)
                    .protocol(ProtocolEnum::from(protocol))
                    .port(port.node_port)
                    .vpc_id(vpc)
                    .target_type(TargetTypeEnum::Instance)
                    .health_check_protocol(ProtocolEnum::from(h.protocol.as_str()))
                    .health_check_port(&h.port)
                    .set_health_check_path(h.path.clone())
                    .health_check_interval_seconds(h.interval)
                    .healthy_threshold_count(h.healthy)
                    .unhealthy_threshold_count(h.unhealthy)
                    .set_tags(Some(tags(resource_tags)))
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("creating target group {tg_name}"), e))?;
        out.target_groups()
            .first()
            .and_then(|t| t.target_group_arn())
            .map(str::to_string)
            .ok_or_else(|| CloudError::msg(format!("CreateTargetGroup {tg_name} returned nothing")))
    }

    async fn sync_tg_attributes(&self, arn: &str, opts: &LbOptions) -> CloudResult<()> {
        if opts.target_group_attributes.is_empty() {
            return Ok(());
        }
        let current = self
            .api
            .call(
                "elbv2_describe_target_group_attributes",
                self.elbv2
                    .describe_target_group_attributes()
                    .target_group_arn(arn)
                    .send(),
            )
            .await
            .map_err(|e| cloud_error("reading target group attributes", e))?;
        let have: BTreeMap<String, String> = current
            .attributes()
            .iter()
            .filter_map(|a| Some((a.key()?.to_string(), a.value()?.to_string())))
            .collect();
        let changes: Vec<TargetGroupAttribute> = opts
            .target_group_attributes
            .iter()
            .filter(|(k, v)| have.get(*k) != Some(v))
            .map(|(k, v)| TargetGroupAttribute::builder().key(k).value(v).build())
            .collect();
        if !changes.is_empty() {
            self.api
                .call(
                    "elbv2_modify_target_group_attributes",
                    self.elbv2
                        .modify_target_group_attributes()
                        .target_group_arn(arn)
                        .set_attributes(Some(changes))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("setting target group attributes", e))?;
        }
        Ok(())
    }

    /// Targets = every instance on the NodePort; deregister first, then register, 100 at a time.
    async fn sync_targets(
        &self,
        arn: &str,
        node_port: i32,
        instances: &[Arc<InstanceInfo>],
    ) -> CloudResult<()> {
        let health = self
            .api
            .call(
                "elbv2_describe_target_health",
                self.elbv2.describe_target_health().target_group_arn(arn).send(),
            )
            .await
            .map_err(|e| cloud_error("reading target health", e))?;
        let have: BTreeSet<(String, i32)> = health
            .target_health_descriptions()
            .iter()
            .filter(|d| {
                d.target_health()
                    .and_then(|h| h.reason())
                    .is_none_or(|r| r.as_str() != "Target.DeregistrationInProgress")
            })
            .filter_map(|d| {
                d.target()
                    .and_then(|t| Some((t.id()?.to_string(), t.port().unwrap_or(node_port))))
            })
            .collect();
        let want: BTreeSet<(String, i32)> = instances.iter().map(|i| (i.id.clone(), node_port)).collect();
        let target = |(id, port): &(String, i32)| TargetDescription::builder().id(id).port(*port).build();
        let remove: Vec<TargetDescription> = have.difference(&want).map(target).collect();
        let add: Vec<TargetDescription> = want.difference(&have).map(target).collect();
        for chunk in remove.chunks(100) {
            self.api
                .call(
                    "elbv2_deregister_targets",
                    self.elbv2
                        .deregister_targets()
                        .target_group_arn(arn)
                        .set_targets(Some(chunk.to_vec()))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("deregistering targets", e))?;
        }
        for chunk in add.chunks(100) {
            self.api
                .call(
                    "elbv2_register_targets",
                    self.elbv2
                        .register_targets()
                        .target_group_arn(arn)
                        .set_targets(Some(chunk.to_vec()))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("registering targets", e))?;
        }
        Ok(())
    }

    async fn sync_nlb_attributes(&self, arn: &str, opts: &LbOptions) -> CloudResult<()> {
        let mut want: BTreeMap<String, String> = BTreeMap::new();
        want.insert(
            "load_balancing.cross_zone.enabled".into(),
            opts.cross_zone.unwrap_or(false).to_string(),
        );
        want.insert(
            "access_logs.s3.enabled".into(),
            opts.access_log_enabled.unwrap_or(false).to_string(),
        );
        if opts.access_log_enabled == Some(true) {
            want.insert(
                "access_logs.s3.bucket".into(),
                opts.access_log_bucket.clone().unwrap_or_default(),
            );
            want.insert(
                "access_logs.s3.prefix".into(),
                opts.access_log_prefix.clone().unwrap_or_default(),
            );
        }
        let current = self
            .api
            .call(
                "elbv2_describe_load_balancer_attributes",
                self.elbv2
                    .describe_load_balancer_attributes()
                    .load_balancer_arn(arn)
                    .send(),
            )
            .await
            .map_err(|e| cloud_error("reading NLB attributes", e))?;
        let have: BTreeMap<String, String> = current
            .attributes()
            .iter()
            .filter_map(|a| Some((a.key()?.to_string(), a.value()?.to_string())))
            .collect();
        let changes: Vec<LoadBalancerAttribute> = want
            .iter()
            .filter(|(k, v)| have.get(*k) != Some(v))
            .map(|(k, v)| LoadBalancerAttribute::builder().key(k).value(v).build())
            .collect();
        if !changes.is_empty() {
            self.api
                .call(
                    "elbv2_modify_load_balancer_attributes",
                    self.elbv2
                        .modify_load_balancer_attributes()
                        .load_balancer_arn(arn)
                        .set_attributes(Some(changes))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("setting NLB attributes", e))?;
        }
        Ok(())
    }

    /// Client, health-check and path-MTU rules on the target instances' groups (AWS-52); the
    /// same rules are removed from other cluster groups.
    async fn sync_nlb_node_rules(
        &self,
        name: &str,
        ports: &[LbPort],
        client_cidrs: &[String],
        subnets: &[(String, String, String)],
        h: &TgHealth,
        instances: &[Arc<InstanceInfo>],
    ) -> CloudResult<()> {
        let (client_d, health_d, mtu_d) = (
            format!("{RULE_CLIENT}{name}"),
            format!("{RULE_HEALTH}{name}"),
            format!("{RULE_MTU}{name}"),
        );
        let mut rules = Vec::new();
        for p in ports {
            for c in client_cidrs {
                rules.push(CidrRule {
                    protocol: p.protocol.to_ascii_lowercase(),
                    from: p.node_port,
                    to: p.node_port,
                    cidr: c.clone(),
                    description: client_d.clone(),
                });
            }
        }
        let covered = client_cidrs == ["0.0.0.0/0"]
            && ports.iter().all(|p| p.protocol == "TCP")
            && h.port == "traffic-port";
        if !covered {
            let hc_ports: BTreeSet<i32> = match h.port.parse::<i32>() {
                Ok(p) => [p].into(),
                Err(_) => ports.iter().map(|p| p.node_port).collect(),
            };
            for port in hc_ports {
                for (_, _, cidr) in subnets {
                    rules.push(CidrRule {
                        protocol: "tcp".into(),
                        from: port,
                        to: port,
                        cidr: cidr.clone(),
                        description: health_d.clone(),
                    });
                }
            }
        }
        for c in client_cidrs {
            rules.push(CidrRule {
                protocol: "icmp".into(),
                from: 3,
                to: 4,
                cidr: c.clone(),
                description: mtu_d.clone(),
            });
        }
        let refs: Vec<&InstanceInfo> = instances.iter().map(|i| i.as_ref()).collect();
        let node_groups = self.node_security_groups(&refs).await?;
        for g in node_groups.values() {
            // Stale rules of this NLB (a port changed) go first.
            let stale: Vec<CidrRule> = super::network::cidr_rules(g)
                .into_iter()
                .filter(|r| [&client_d, &health_d, &mtu_d].contains(&&r.description) && !rules.contains(r))
                .collect();
            if !stale.is_empty() {
                self.release_nlb_rules(g, name).await?;
                let refreshed = self
                    .security_groups(&[g.group_id().unwrap_or_default().to_string()])
                    .await?;
                if let Some(g) = refreshed.first() {
                    self.add_cidr_rules(g, &rules).await?;
                }
                continue;
            }
            self.add_cidr_rules(g, &rules).await?;
        }
        for g in self.vpc_security_groups().await? {
            let id = g.group_id().unwrap_or_default();
            let tags = g
                .tags()
                .iter()
                .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
                .collect();
            if !node_groups.contains_key(id) && self.tagged_for_cluster(&tags) {
                self.release_nlb_rules(&g, name).await?;
            }
        }
        Ok(())
    }

    /// Removes the client, health-check and path-MTU rules of the NLB `name` from `group`.
    ///
    /// EC2 keeps one rule per (protocol, ports, CIDR), so when two NLBs allow clients from the
    /// same CIDR their identical ICMP 3/4 rule exists once, described with the name of the NLB
    /// that added it first. Such a rule is handed over to another NLB that still has a client
    /// rule from that CIDR (its description is rewritten to that NLB's) instead of being
    /// revoked, so deleting one NLB never breaks path-MTU discovery for another.
    pub(crate) async fn release_nlb_rules(&self, group: &SecurityGroup, name: &str) -> CloudResult<()> {
        let client_d = format!("{RULE_CLIENT}{name}");
        let mtu_d = format!("{RULE_MTU}{name}");
        self.revoke_described(group, &client_d).await?;
        self.revoke_described(group, &format!("{RULE_HEALTH}{name}"))
            .await?;
        let rules = super::network::cidr_rules(group);
        let mut handed_over = Vec::new();
        for mtu in rules.iter().filter(|r| r.description == mtu_d) {
            let heir = rules.iter().find_map(|r| {
                let other = r.description.strip_prefix(RULE_CLIENT)?;
                (other != name && r.cidr == mtu.cidr).then_some(other)
            });
            if let Some(heir) = heir {
                handed_over.push(CidrRule {
                    description: format!("{RULE_MTU}{heir}"),
                    ..mtu.clone()
                });
            }
        }
        if handed_over.is_empty() {
            return self.revoke_described(group, &mtu_d).await;
        }
        let id = group.group_id().unwrap_or_default();
        self.api
            .call(
                "update_security_group_rule_descriptions_ingress",
                self.ec2
                    .update_security_group_rule_descriptions_ingress()
                    .group_id(id)
                    .set_ip_permissions(Some(handed_over.iter().map(CidrRule::to_permission).collect()))
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("handing over path-MTU rules on {id}"), e))?;
        tracing::info!(
            group = id,
            lb = name,
            rules = handed_over.len(),
            "handed path-MTU rules over to other NLBs"
        );
        // Whatever is still described as ours has no heir.
        let refreshed = self.security_groups(&[id.to_string()]).await?;
        match refreshed.first() {
            Some(g) => self.revoke_described(g, &mtu_d).await,
            None => Ok(()),
        }
    }

    async fn delete_target_group(&self, arn: &str) -> CloudResult<()> {
        let r = self
            .api
            .call(
                "elbv2_delete_target_group",
                self.elbv2.delete_target_group().target_group_arn(arn).send(),
            )
            .await;
        not_found_as_none(r, &["TargetGroupNotFound"])
            .map(|_| ())
            .map_err(|e| cloud_error(format!("deleting target group {arn}"), e))
    }

    /// Deletes the NLB `name`, its target groups, its node rules and its managed group.
    pub(crate) async fn delete_nlb(
        &self,
        name: &str,
        svc: &Service,
        keep: &BTreeSet<String>,
    ) -> CloudResult<bool> {
        let lb = self.describe_nlb(name).await?;
        let mut existed = false;
        if let Some(lb) = &lb {
            existed = true;
            // A bring-your-own group (managed mode) through which the nodes admitted this NLB:
            // only the node rules go. The managed group is handled below.
            let managed = self.security_group_by_name(&self.managed_group_name(svc)).await?;
            if let Some(primary) = lb.security_groups().first()
                && managed.as_ref().and_then(|g| g.group_id()) != Some(primary.as_str())
            {
                self.release_node_access(name, primary).await?;
            }
            let arn = lb.load_balancer_arn().unwrap_or_default().to_string();
            let tgs = self
                .api
                .call(
                    "elbv2_describe_target_groups",
                    self.elbv2.describe_target_groups().load_balancer_arn(&arn).send(),
                )
                .await
                .map_err(|e| cloud_error(format!("listing target groups of {name}"), e))?;
            self.api
                .call(
                    "elbv2_delete_load_balancer",
                    self.elbv2.delete_load_balancer().load_balancer_arn(&arn).send(),
                )
                .await
                .map_err(|e| cloud_error(format!("deleting NLB {name}"), e))?;
            tracing::info!(lb = name, "deleted NLB");
            for tg in tgs.target_groups() {
                if let Some(tg_arn) = tg.target_group_arn() {
                    self.delete_target_group(tg_arn).await?;
                }
            }
        }
        for g in self.vpc_security_groups().await? {
            self.release_nlb_rules(&g, name).await?;
        }
        if let Some(g) = self.security_group_by_name(&self.managed_group_name(svc)).await?
            && !keep.contains(g.group_id().unwrap_or_default())
        {
            let id = g.group_id().unwrap_or_default().to_string();
            for other in self.vpc_security_groups().await? {
                if Self::allows_group(&other, &id) {
                    self.disallow_group(&other, &id).await?;
                }
            }
            self.delete_owned_security_group(&g, Duration::from_secs(600))
                .await?;
        }
        Ok(existed)
    }
}

fn forward(tg_arn: &str) -> Action {
    Action::builder()
        .r#type(ActionTypeEnum::Forward)
        .target_group_arn(tg_arn)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceSpec;
    use kube::api::ObjectMeta;

    fn svc() -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("my-web_service".into()),
                namespace: Some("production".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn target_group_names_follow_aws_43_and_change_with_protocol_or_health_check() {
        let p = LbPort {
            name: None,
            port: 80,
            node_port: 30080,
            protocol: "TCP".into(),
        };
        let h = health(&svc(), &LbOptions::default(), None);
        let n = target_group_name("c1", &svc(), &p, "TCP", &h);
        assert!(n.starts_with("k8s-producti-mywebser-"), "{n}");
        assert!(n.len() <= 32, "{n}");
        assert_eq!(n, target_group_name("c1", &svc(), &p, "TCP", &h), "stable");
        assert_ne!(n, target_group_name("c1", &svc(), &p, "UDP", &h));
        let h2 = TgHealth {
            interval: 10,
            ..h.clone()
        };
        assert_ne!(n, target_group_name("c1", &svc(), &p, "TCP", &h2));
    }

    #[test]
    fn health_checks_follow_aws_44() {
        let mut s = svc();
        assert_eq!(
            health(&s, &LbOptions::default(), None),
            TgHealth {
                protocol: "TCP".into(),
                port: "traffic-port".into(),
                path: None,
                interval: 30,
                healthy: 3,
                unhealthy: 3
            }
        );
        let spec = s.spec.as_mut().unwrap();
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(31000);
        assert_eq!(
            health(&s, &LbOptions::default(), None),
            TgHealth {
                protocol: "HTTP".into(),
                port: "31000".into(),
                path: Some("/healthz".into()),
                interval: 10,
                healthy: 2,
                unhealthy: 2
            }
        );
        let o = LbOptions {
            hc_protocol: Some("HTTPS".into()),
            hc_path: Some("/ok".into()),
            hc_interval: Some(20),
            ..Default::default()
        };
        let h = health(&svc(), &o, None);
        assert_eq!(
            (h.protocol.as_str(), h.path.as_deref(), h.interval),
            ("HTTPS", Some("/ok"), 20)
        );
    }
}
