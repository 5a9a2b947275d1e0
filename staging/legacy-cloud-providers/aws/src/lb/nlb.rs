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
    Action, ActionTypeEnum, Certificate, Listener, LoadBalancer as Nlb, LoadBalancerAttribute,
    LoadBalancerSchemeEnum, LoadBalancerTypeEnum, ProtocolEnum, SubnetMapping, Tag, TargetDescription,
    TargetGroup, TargetGroupAttribute, TargetTypeEnum,
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
pub const RULE_MTU: &str = "kubernetes.io/rule/nlb/mtu";

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

/// AWS-44, in upstream's order (`buildNLBHealthCheckConfiguration`): the defaults (TCP on the
/// traffic port, or HTTP on the health-check NodePort for `externalTrafficPolicy: Local`), then
/// the protocol, path and port annotations, then the Shared health-probe mode
/// (`shared_probe`, only for Services that are not `Local`), which overrides those three, then
/// the interval and threshold annotations.
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
        None => TgHealth {
            protocol: "TCP".into(),
            port: "traffic-port".into(),
            path: None,
            interval: 30,
            healthy: 3,
            unhealthy: 3,
        },
    };
    if let Some(p) = &opts.hc_protocol {
        h.protocol = p.clone();
        h.path = match p.as_str() {
            "TCP" => None,
            _ => h.path.or_else(|| Some("/".into())),
        };
    }
    if let Some(p) = &opts.hc_path
        && h.protocol != "TCP"
    {
        h.path = Some(p.clone());
    }
    if let Some(p) = &opts.hc_port {
        h.port = p.clone();
    }
    if let Some((port, path)) = shared_probe {
        h.protocol = "HTTP".into();
        h.port = port.to_string();
        h.path = Some(path);
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

/// AWS-43, byte for byte upstream's `buildTargetGroupName`: `k8s-<ns ≤8>-<name ≤8>-<first 10
/// hex of SHA-1(cluster ID ‖ namespace ‖ name ‖ port ‖ NodePort ‖ target protocol ‖ "instance" ‖
/// health-check protocol ‖ health-check interval)>` (non-alphanumerics dropped first).
pub fn target_group_name(
    cluster_id: &str,
    svc: &Service,
    port: &LbPort,
    target_protocol: &str,
    h: &TgHealth,
) -> String {
    let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    // The fields one after another with nothing between them, as upstream's
    // buildTargetGroupName writes them into the hasher.
    let mut hasher = sha1::Sha1::new();
    for part in [
        cluster_id,
        ns,
        name,
        &port.port.to_string(),
        &port.node_port.to_string(),
        target_protocol,
        "instance",
        &h.protocol,
        &h.interval.to_string(),
    ] {
        hasher.update(part.as_bytes());
    }
    let digest = hex::encode(hasher.finalize());
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

/// Which of an NLB's node-group rules a reconciliation manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NlbRules {
    /// Client and health-check rules.
    ClientAndHealth,
    /// Client rules only: health-check rules are neither made nor revoked (upstream, when the
    /// client rule covers them).
    ClientOnly,
}

/// Whether an existing target group serves a port as upstream's `ensureLoadBalancerv2` keeps
/// it: on the NodePort, with the target protocol, and with the health-check protocol and
/// interval (which AWS cannot change in place) of `h`. Anything else is replaced.
fn target_group_fits(tg: &TargetGroup, node_port: i32, target_protocol: &str, h: &TgHealth) -> bool {
    tg.port() == Some(node_port)
        && tg.protocol().map(|p| p.as_str()) == Some(target_protocol)
        && tg
            .health_check_protocol()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case(&h.protocol))
        && tg.health_check_interval_seconds() == Some(h.interval)
}

fn tags(pairs: &[(String, String)]) -> Vec<Tag> {
    pairs
        .iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

/// How many NLBs of one name [`AwsCloud::delete_nlb`] deletes at most in one call.
const MAX_NLBS_OF_ONE_NAME: usize = 5;

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

    /// The managed NLB security group's name, byte for byte upstream's
    /// `GetSecurityGroupNameForNLB`: `k8s-<ns ≤8>-<name ≤8>-<first 10 hex of SHA-256(cluster
    /// name ‖ name ‖ namespace ‖ UID)>`, the cluster name being `--cluster-name`.
    pub fn managed_group_name(cluster_name: &str, svc: &Service) -> String {
        let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        let uid = svc.metadata.uid.as_deref().unwrap_or_default();
        let mut hasher = sha2::Sha256::new();
        for part in [cluster_name, name, ns, uid] {
            hasher.update(part.as_bytes());
        }
        let digest = hex::encode(hasher.finalize());
        format!("k8s-{}-{}-{}", alnum(ns, 8), alnum(name, 8), &digest[..10])
    }

    /// Creates or updates the NLB of `svc`; returns its DNS name (empty until active or
    /// provisioning). `cluster_name` is `--cluster-name` (it names the managed group).
    pub(crate) async fn ensure_nlb(
        &self,
        cluster_name: &str,
        name: &str,
        svc: &Service,
        opts: &LbOptions,
        ports: &[LbPort],
        instances: &[Arc<InstanceInfo>],
    ) -> CloudResult<String> {
        let key = service_key(svc);
        let resource_tags = self.resource_tags(&key, &opts.additional_tags);
        let ranges = load_balancer_source_ranges(svc).map_err(|e| CloudError::msg(e.to_string()))?;
        let client_cidrs: Vec<String> = ranges.iter().map(|r| r.to_string()).collect();

        let mut lb = self.describe_nlb(name).await?;
        // Security groups: only in managed mode, and never on an NLB made without any (AWS
        // cannot add groups to such an NLB; upstream leaves it alone too).
        // The group this provider manages for the NLB (managed mode without BYO groups).
        let mut managed_group: Option<String> = None;
        let managed_mode = self.config.nlb_security_group_mode == "Managed";
        let no_groups_nlb = lb.as_ref().is_some_and(|l| l.security_groups().is_empty());
        if managed_mode && no_groups_nlb {
            tracing::debug!(
                lb = name,
                "NLB was made without security groups; they are left alone"
            );
        }
        if managed_mode && !no_groups_nlb {
            let (groups, managed_id) = if !opts.security_groups.is_empty() {
                (opts.security_groups.clone(), None)
            } else {
                let id = self
                    .ensure_owned_security_group(
                        &Self::managed_group_name(cluster_name, svc),
                        "[k8s] Managed SecurityGroup for LoadBalancer",
                        &resource_tags,
                    )
                    .await?;
                (vec![id.clone()], Some(id))
            };
            managed_group = managed_id.clone();
            match &lb {
                Some(existing) => {
                    let have: BTreeSet<String> = existing.security_groups().iter().cloned().collect();
                    let want: BTreeSet<String> = groups.iter().cloned().collect();
                    if have != want {
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
                        let replaced: Vec<String> = have.difference(&want).cloned().collect();
                        self.remove_replaced_groups(name, &replaced).await?;
                    }
                }
                None => {
                    let subnets = self.lb_subnets(opts.internal, &opts.subnets).await?;
                    lb = Some(
                        self.create_nlb(name, opts, &subnets, &resource_tags, Some(groups))
                            .await?,
                    );
                }
            }
            if let Some(id) = managed_id {
                let mut rules = Vec::new();
                for cidr in &client_cidrs {
                    for p in ports {
                        rules.push(CidrRule {
                            protocol: p.protocol.to_ascii_lowercase(),
                            from: p.port,
                            to: p.port,
                            cidr: cidr.clone(),
                            description: String::new(),
                        });
                    }
                    rules.push(CidrRule {
                        protocol: "icmp".into(),
                        from: 3,
                        to: 4,
                        cidr: cidr.clone(),
                        description: String::new(),
                    });
                }
                self.sync_cidr_rules(&id, &rules).await?;
            }
        }
        let lb = match lb {
            Some(l) => l,
            None => {
                let subnets = self.lb_subnets(opts.internal, &opts.subnets).await?;
                self.create_nlb(name, opts, &subnets, &resource_tags, None)
                    .await?
            }
        };
        let arn = lb.load_balancer_arn().unwrap_or_default().to_string();

        // Listeners and target groups: one listener per port, changed in place.
        let vpc = match lb.vpc_id() {
            Some(v) if !v.is_empty() => v.to_string(),
            _ => self.vpc_id().await?,
        };
        let h = health(svc, opts, self.shared_probe(svc));
        let mut existing: BTreeMap<i32, Listener> = self
            .nlb_listeners(name, &arn)
            .await?
            .into_iter()
            .filter_map(|l| Some((l.port()?, l)))
            .collect();
        let mut obsolete_tgs: BTreeSet<String> = BTreeSet::new();
        // The NLB's target groups, found as upstream finds them: by NodePort (and target
        // protocol), never by name. The name only names a new one, so a group made by an
        // older provider (up to Go 1.18 the name lacked the NodePort, up to 1.19 the
        // health-check fields) is kept as long as what cannot change on it still matches.
        let attached = if existing.is_empty() {
            Vec::new()
        } else {
            self.nlb_target_groups(name, &arn).await?
        };
        for p in ports {
            let (listener_proto, target_proto) = tg_protocol(p, opts);
            let reusable = existing
                .contains_key(&p.port)
                .then(|| {
                    attached
                        .iter()
                        .find(|tg| target_group_fits(tg, p.node_port, &target_proto, &h))
                })
                .flatten();
            let (tg_arn, created) = match reusable {
                Some(tg) => {
                    self.sync_tg_health_check(tg, &h).await?;
                    (tg.target_group_arn().unwrap_or_default().to_string(), false)
                }
                None => {
                    let tg_name = target_group_name(&self.cluster_id, svc, p, &target_proto, &h);
                    self.ensure_target_group(&tg_name, &vpc, p, &target_proto, &h, &resource_tags)
                        .await?
                }
            };
            if created {
                // Until a listener points at it, it could leak: swept at the end.
                self.tg_sweep_pending.lock().insert(key.clone());
            }
            self.sync_tg_attributes(&tg_arn, opts).await?;
            self.sync_targets(&tg_arn, p.node_port, instances).await?;
            let want = WantedListener {
                port: p.port,
                protocol: listener_proto,
                target_group: tg_arn,
                certificate: opts.ssl_cert.clone(),
                ssl_policy: opts.ssl_negotiation_policy.clone(),
            };
            match existing.remove(&p.port) {
                Some(l) => {
                    let current = l
                        .default_actions()
                        .first()
                        .and_then(|a| a.target_group_arn())
                        .map(str::to_string);
                    if want.differs_from(&l) {
                        self.modify_listener(name, &l, &want).await?;
                        if current.as_deref() != Some(want.target_group.as_str()) {
                            obsolete_tgs.extend(current);
                        }
                    }
                }
                None => self.create_listener(name, &arn, &want, &resource_tags).await?,
            }
        }
        // Listeners no longer wanted go, with their target groups (AWS-48).
        for (port, l) in existing {
            self.api
                .call(
                    "elbv2_delete_listener",
                    self.elbv2
                        .delete_listener()
                        .listener_arn(l.listener_arn().unwrap_or_default())
                        .send(),
                )
                .await
                .map_err(|e| cloud_error(format!("deleting listener {port} of {name}"), e))?;
            obsolete_tgs.extend(
                l.default_actions()
                    .first()
                    .and_then(|a| a.target_group_arn())
                    .map(str::to_string),
            );
        }
        for tg in obsolete_tgs {
            if let Err(e) = self.delete_target_group(&tg).await {
                // Found again by its tags on the next sync or on deletion.
                tracing::warn!(lb = name, target_group = %tg, error = %e, "could not delete a replaced target group; it will be swept later");
                self.tg_sweep_pending.lock().insert(key.clone());
            }
        }
        if self.tg_sweep_pending.lock().contains(&key) && self.sweep_target_groups(svc, &[]).await? == 0 {
            self.tg_sweep_pending.lock().remove(&key);
        }
        self.sync_nlb_attributes(&arn, opts).await?;
        if !self.config.disable_security_group_ingress {
            // In every security-group mode, as upstream: the nodes admit the clients' CIDRs
            // and, for health checks, the NLB's own subnets (the subnets of its zones).
            let own: Vec<String> = lb
                .availability_zones()
                .iter()
                .filter_map(|z| z.subnet_id().map(str::to_string))
                .collect();
            let health_cidrs: Vec<String> = self
                .describe_subnets(&own)
                .await?
                .into_iter()
                .map(|s| s.cidr)
                .filter(|c| !c.is_empty())
                .collect();
            self.sync_nlb_node_rules(name, ports, &client_cidrs, &health_cidrs, &h, instances)
                .await?;
            // Earlier versions of this provider opened the nodes to the managed group itself
            // (all traffic from the group); that rule goes once the CIDR rules are in place.
            if let Some(g) = &managed_group {
                self.release_node_access(name, g).await?;
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

    /// The listeners of the NLB `arn` (paginated).
    async fn nlb_listeners(&self, name: &str, arn: &str) -> CloudResult<Vec<Listener>> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = self
                .api
                .call(
                    "elbv2_describe_listeners",
                    self.elbv2
                        .describe_listeners()
                        .load_balancer_arn(arn)
                        .set_marker(marker.take())
                        .send(),
                )
                .await
                .map_err(|e| cloud_error(format!("listing listeners of {name}"), e))?;
            out.extend(page.listeners().iter().cloned());
            marker = page.next_marker().filter(|m| !m.is_empty()).map(str::to_string);
            if marker.is_none() {
                return Ok(out);
            }
        }
    }

    async fn create_listener(
        &self,
        name: &str,
        lb_arn: &str,
        want: &WantedListener,
        resource_tags: &[(String, String)],
    ) -> CloudResult<()> {
        let mut req = self
            .elbv2
            .create_listener()
            .load_balancer_arn(lb_arn)
            .port(want.port)
            .protocol(ProtocolEnum::from(want.protocol.as_str()))
            .default_actions(forward(&want.target_group))
            .set_tags(Some(tags(resource_tags)));
        if want.protocol == "TLS" {
            req = req
                .certificates(want.certificate())
                .set_ssl_policy(want.ssl_policy.clone());
        }
        self.api
            .call("elbv2_create_listener", req.send())
            .await
            .map_err(|e| cloud_error(format!("creating listener {} on {name}", want.port), e))?;
        Ok(())
    }

    /// Changes a listener in place (`ModifyListener`: protocol, certificate, SSL policy, target
    /// group), so that a port switching between TCP and TLS never meets `DuplicateListener`
    /// and keeps its listener ARN.
    async fn modify_listener(&self, name: &str, l: &Listener, want: &WantedListener) -> CloudResult<()> {
        // Only what changes: the protocol is sent when it differs.
        let mut req = self
            .elbv2
            .modify_listener()
            .listener_arn(l.listener_arn().unwrap_or_default())
            .port(want.port)
            .default_actions(forward(&want.target_group));
        if !l
            .protocol()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case(&want.protocol))
        {
            req = req.protocol(ProtocolEnum::from(want.protocol.as_str()));
        }
        if want.protocol == "TLS" {
            req = req
                .certificates(want.certificate())
                .set_ssl_policy(want.ssl_policy.clone());
        }
        self.api
            .call("elbv2_modify_listener", req.send())
            .await
            .map_err(|e| cloud_error(format!("updating listener {} of {name}", want.port), e))?;
        tracing::info!(lb = name, port = want.port, protocol = %want.protocol, "updated NLB listener in place");
        Ok(())
    }

    async fn create_nlb(
        &self,
        name: &str,
        opts: &LbOptions,
        subnets: &[super::network::VpcSubnet],
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
            .map(|(i, s)| {
                SubnetMapping::builder()
                    .subnet_id(&s.id)
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
                    // Sent once: a create whose answer was lost is not re-sent blindly. AWS
                    // makes this call idempotent by name, but a cloud that does not (moto made
                    // a second NLB of the same name) would leak one; the next sync looks before
                    // it creates instead.
                    .customize()
                    .config_override(
                        aws_sdk_elasticloadbalancingv2::config::Builder::default()
                            .retry_config(aws_config::retry::RetryConfig::disabled()),
                    )
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

    /// The target groups of the NLB `arn`. No target group at all is "not found" (moto; a
    /// failed first listener): an empty list.
    async fn nlb_target_groups(&self, name: &str, arn: &str) -> CloudResult<Vec<TargetGroup>> {
        let r = self
            .api
            .call(
                "elbv2_describe_target_groups",
                self.elbv2.describe_target_groups().load_balancer_arn(arn).send(),
            )
            .await;
        Ok(not_found_as_none(r, &["TargetGroupNotFound"])
            .map_err(|e| cloud_error(format!("listing target groups of {name}"), e))?
            .map(|o| o.target_groups().to_vec())
            .unwrap_or_default())
    }

    /// Brings the health check of an existing target group to `h` where it can change in
    /// place (port, thresholds, path); one `ModifyTargetGroup` only when something differs.
    async fn sync_tg_health_check(&self, tg: &TargetGroup, h: &TgHealth) -> CloudResult<()> {
        let differs = tg.health_check_port() != Some(h.port.as_str())
            || tg.healthy_threshold_count() != Some(h.healthy)
            || tg.unhealthy_threshold_count() != Some(h.unhealthy)
            || (h.path.is_some() && tg.health_check_path() != h.path.as_deref());
        if !differs {
            return Ok(());
        }
        let name = tg.target_group_name().unwrap_or_default();
        self.api
            .call(
                "elbv2_modify_target_group",
                self.elbv2
                    .modify_target_group()
                    .target_group_arn(tg.target_group_arn().unwrap_or_default())
                    .health_check_port(&h.port)
                    .healthy_threshold_count(h.healthy)
                    .unhealthy_threshold_count(h.unhealthy)
                    .set_health_check_path(h.path.clone())
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("updating the health check of {name}"), e))?;
        Ok(())
    }

    /// The target group named `tg_name` (AWS-43), made when there is none: `(ARN, created)`.
    async fn ensure_target_group(
        &self,
        tg_name: &str,
        vpc: &str,
        port: &LbPort,
        protocol: &str,
        h: &TgHealth,
        resource_tags: &[(String, String)],
    ) -> CloudResult<(String, bool)> {
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
            self.sync_tg_health_check(&tg, h).await?;
            return Ok((tg.target_group_arn().unwrap_or_default().to_string(), false));
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
            .map(|arn| (arn.to_string(), true))
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

    /// Client and health-check rules of the NLB `name` on the target instances' groups
    /// (AWS-52), removed from the other groups of the cluster, and the path-MTU rules of each
    /// touched group recomputed as upstream does (one ICMP 3/4 rule, described
    /// `kubernetes.io/rule/nlb/mtu`, per CIDR of any NLB's client rule in that group).
    async fn sync_nlb_node_rules(
        &self,
        name: &str,
        ports: &[LbPort],
        client_cidrs: &[String],
        health_cidrs: &[String],
        h: &TgHealth,
        instances: &[Arc<InstanceInfo>],
    ) -> CloudResult<()> {
        let (client_d, health_d) = (format!("{RULE_CLIENT}{name}"), format!("{RULE_HEALTH}{name}"));
        let client_protocol = if ports.iter().any(|p| p.protocol == "UDP") {
            "udp"
        } else {
            "tcp"
        };
        let client_ports: BTreeSet<i32> = ports.iter().map(|p| p.node_port).collect();
        let health_ports: BTreeSet<i32> = match h.port.parse::<i32>() {
            Ok(p) => [p].into(),
            Err(_) => client_ports.clone(),
        };
        let mut rules = Vec::new();
        for port in &client_ports {
            for c in client_cidrs {
                rules.push(CidrRule {
                    protocol: client_protocol.into(),
                    from: *port,
                    to: *port,
                    cidr: c.clone(),
                    description: client_d.clone(),
                });
            }
        }
        // The health rules are a subset of the client rule when that admits everyone over TCP
        // on the same ports: then, as upstream, none is made, and health rules that exist (an
        // older provider made them) are left as they are.
        let covered =
            client_cidrs == ["0.0.0.0/0"] && client_protocol == "tcp" && health_ports == client_ports;
        if !covered {
            for port in &health_ports {
                for cidr in health_cidrs {
                    rules.push(CidrRule {
                        protocol: "tcp".into(),
                        from: *port,
                        to: *port,
                        cidr: cidr.clone(),
                        description: health_d.clone(),
                    });
                }
            }
        }
        let refs: Vec<&InstanceInfo> = instances.iter().map(|i| i.as_ref()).collect();
        let node_groups = self.node_security_groups(&refs).await?;
        let managed = if covered {
            NlbRules::ClientOnly
        } else {
            NlbRules::ClientAndHealth
        };
        for g in node_groups.values() {
            self.reconcile_nlb_rules(g, name, &rules, managed).await?;
        }
        for g in self.cluster_security_groups().await? {
            if !node_groups.contains_key(g.group_id().unwrap_or_default()) {
                self.reconcile_nlb_rules(&g, name, &[], NlbRules::ClientAndHealth)
                    .await?;
            }
        }
        Ok(())
    }

    /// Makes the rules of `group` described as the NLB `name`'s client (and, with
    /// [`NlbRules::ClientAndHealth`], health) rules exactly `wanted`, then the group's
    /// path-MTU rules match its client rules (any NLB's). A path-MTU rule in the form of
    /// earlier versions of this provider (`…/mtu=<name>`) is taken over and re-described,
    /// never doubled.
    pub(crate) async fn reconcile_nlb_rules(
        &self,
        group: &SecurityGroup,
        name: &str,
        wanted: &[CidrRule],
        managed: NlbRules,
    ) -> CloudResult<()> {
        let id = group.group_id().unwrap_or_default();
        let mut ours = vec![format!("{RULE_CLIENT}{name}")];
        if managed == NlbRules::ClientAndHealth {
            ours.push(format!("{RULE_HEALTH}{name}"));
        }
        let mut have = super::network::cidr_rules(group);
        let revoke: Vec<CidrRule> = have
            .iter()
            .filter(|r| ours.contains(&r.description) && !wanted.contains(r))
            .cloned()
            .collect();
        let grant: Vec<CidrRule> = wanted.iter().filter(|r| !have.contains(r)).cloned().collect();
        self.revoke_rules(id, &revoke).await?;
        self.grant_rules(id, &grant).await?;
        have.retain(|r| !revoke.contains(r));
        have.extend(grant);

        let client_cidrs: BTreeSet<&str> = have
            .iter()
            .filter(|r| r.description.starts_with(RULE_CLIENT))
            .map(|r| r.cidr.as_str())
            .collect();
        let mtu_have: Vec<&CidrRule> = have
            .iter()
            .filter(|r| r.description == RULE_MTU || r.description.starts_with(&format!("{RULE_MTU}=")))
            .collect();
        let mtu_rule = |cidr: &str| CidrRule {
            protocol: "icmp".into(),
            from: 3,
            to: 4,
            cidr: cidr.into(),
            description: RULE_MTU.into(),
        };
        let stale: Vec<CidrRule> = mtu_have
            .iter()
            .filter(|r| !client_cidrs.contains(r.cidr.as_str()))
            .map(|r| (*r).clone())
            .collect();
        let redescribe: Vec<CidrRule> = mtu_have
            .iter()
            .filter(|r| client_cidrs.contains(r.cidr.as_str()) && r.description != RULE_MTU)
            .map(|r| mtu_rule(&r.cidr))
            .collect();
        let missing: Vec<CidrRule> = client_cidrs
            .iter()
            .filter(|c| !mtu_have.iter().any(|r| r.cidr == **c))
            .map(|c| mtu_rule(c))
            .collect();
        self.revoke_rules(id, &stale).await?;
        self.grant_rules(id, &missing).await?;
        if !redescribe.is_empty() {
            self.api
                .call(
                    "update_security_group_rule_descriptions_ingress",
                    self.ec2
                        .update_security_group_rule_descriptions_ingress()
                        .group_id(id)
                        .set_ip_permissions(Some(redescribe.iter().map(CidrRule::to_permission).collect()))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error(format!("re-describing path-MTU rules on {id}"), e))?;
        }
        Ok(())
    }

    /// Removes the client and health-check rules of the NLB `name` from every group of the VPC
    /// that has them (and the path-MTU rules no client rule needs any more).
    pub(crate) async fn release_nlb_rules(&self, name: &str) -> CloudResult<()> {
        let ours = [
            format!("{RULE_CLIENT}{name}"),
            format!("{RULE_HEALTH}{name}"),
            format!("{RULE_MTU}={name}"),
        ];
        for g in self.vpc_security_groups().await? {
            if super::network::cidr_rules(&g)
                .iter()
                .any(|r| ours.contains(&r.description))
            {
                self.reconcile_nlb_rules(&g, name, &[], NlbRules::ClientAndHealth)
                    .await?;
            }
        }
        Ok(())
    }

    async fn grant_rules(&self, group: &str, rules: &[CidrRule]) -> CloudResult<()> {
        self.authorize_ingress(group, rules.iter().map(CidrRule::to_permission).collect(), || {
            format!("authorizing ingress on {group}")
        })
        .await
    }

    async fn revoke_rules(&self, group: &str, rules: &[CidrRule]) -> CloudResult<()> {
        self.revoke_ingress(group, rules.iter().map(CidrRule::to_permission).collect(), || {
            format!("revoking ingress on {group}")
        })
        .await
    }

    pub(crate) async fn delete_target_group(&self, arn: &str) -> CloudResult<()> {
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

    /// Deletes the target groups of `svc` that no load balancer uses any more: named
    /// `k8s-<ns ≤8>-<name ≤8>-…` (AWS-43), tagged `kubernetes.io/cluster/<id>=owned` and
    /// `kubernetes.io/service-name=<ns>/<name>` — what a failed listener creation, a replaced
    /// listener or a failed delete (`ResourceInUse`) leaves behind. A group whose only load
    /// balancers are in `gone` (just deleted; the API may still list them for a while) counts
    /// as unused. Returns how many are left (still in use).
    pub(crate) async fn sweep_target_groups(&self, svc: &Service, gone: &[String]) -> CloudResult<usize> {
        let key = service_key(svc);
        let prefix = format!(
            "k8s-{}-{}-",
            alnum(svc.metadata.namespace.as_deref().unwrap_or_default(), 8),
            alnum(svc.metadata.name.as_deref().unwrap_or_default(), 8)
        );
        let mut mine = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = self
                .api
                .call(
                    "elbv2_describe_target_groups",
                    self.elbv2
                        .describe_target_groups()
                        .page_size(400)
                        .set_marker(marker.take())
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("listing target groups", e))?;
            mine.extend(
                page.target_groups()
                    .iter()
                    .filter(|t| t.target_group_name().is_some_and(|n| n.starts_with(&prefix)))
                    .cloned(),
            );
            marker = page.next_marker().filter(|m| !m.is_empty()).map(str::to_string);
            if marker.is_none() {
                break;
            }
        }
        // Load balancers these groups name that may be gone already.
        let mut gone: BTreeSet<String> = gone.iter().cloned().collect();
        let named: BTreeSet<String> = mine
            .iter()
            .flat_map(|t| t.load_balancer_arns().iter().cloned())
            .filter(|a| !gone.contains(a))
            .collect();
        for arn in named {
            let r = self
                .api
                .call(
                    "elbv2_describe_load_balancers",
                    self.elbv2
                        .describe_load_balancers()
                        .load_balancer_arns(&arn)
                        .send(),
                )
                .await;
            let found = not_found_as_none(r, &["LoadBalancerNotFound"])
                .map_err(|e| cloud_error("checking the load balancers of target groups", e))?;
            if found.is_none_or(|o| o.load_balancers().is_empty()) {
                gone.insert(arn);
            }
        }
        let unattached: Vec<String> = mine
            .iter()
            .filter(|t| t.load_balancer_arns().iter().all(|a| gone.contains(a)))
            .filter_map(|t| t.target_group_arn().map(str::to_string))
            .collect();
        let mut left = 0;
        for chunk in unattached.chunks(20) {
            let described = self
                .api
                .call(
                    "elbv2_describe_tags",
                    self.elbv2
                        .describe_tags()
                        .set_resource_arns(Some(chunk.to_vec()))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error("reading target group tags", e))?;
            for d in described.tag_descriptions() {
                let tags = super::network::elbv2_tag_map(d.tags());
                if !self.owned_by_cluster(&tags) || tags.get("kubernetes.io/service-name") != Some(&key) {
                    continue;
                }
                let arn = d.resource_arn().unwrap_or_default();
                match self.delete_target_group(arn).await {
                    Ok(()) => {
                        tracing::info!(service = %key, target_group = arn, "deleted an unused target group")
                    }
                    Err(e) => {
                        tracing::info!(service = %key, target_group = arn, error = %e, "unused target group not deletable yet");
                        left += 1;
                    }
                }
            }
        }
        Ok(left)
    }

    /// Deletes the NLB `name`: its listeners, then its target groups (retrying `ResourceInUse`
    /// for a while), and only then the NLB itself — so that while a target group cannot be
    /// deleted the NLB still exists, the deletion fails and is retried (the service controller
    /// skips the deletion of a load balancer it cannot find). Then target groups left over by
    /// earlier failures (by tag), the node rules and the managed group.
    pub(crate) async fn delete_nlb(
        &self,
        cluster_name: &str,
        name: &str,
        svc: &Service,
        keep: &BTreeSet<String>,
    ) -> CloudResult<bool> {
        let managed = self
            .security_group_by_name(&Self::managed_group_name(cluster_name, svc))
            .await?;
        let mut gone: Vec<String> = Vec::new();
        // Node rules first: once the NLB is gone, nothing of it is left on the nodes' groups.
        self.release_nlb_rules(name).await?;
        // Until the name finds nothing: one NLB on AWS (names are unique), more on a cloud where
        // a retried create made a second one of the same name (moto shows one per name at a
        // time).
        while gone.len() < MAX_NLBS_OF_ONE_NAME {
            let Some(lb) = self.describe_nlb(name).await? else {
                break;
            };
            if gone
                .iter()
                .any(|arn| Some(arn.as_str()) == lb.load_balancer_arn())
            {
                // The one just deleted, still listed (eventual consistency).
                break;
            }
            let lb = &lb;
            // A bring-your-own group (managed mode) through which the nodes admitted this NLB:
            // only the node rules go. The managed group is handled below.
            if let Some(primary) = lb.security_groups().first()
                && managed.as_ref().and_then(|g| g.group_id()) != Some(primary.as_str())
            {
                self.release_node_access(name, primary).await?;
            }
            let arn = lb.load_balancer_arn().unwrap_or_default().to_string();
            let tg_arns: Vec<String> = self
                .nlb_target_groups(name, &arn)
                .await?
                .iter()
                .filter_map(|t| t.target_group_arn().map(str::to_string))
                .collect();
            for l in self.nlb_listeners(name, &arn).await? {
                let r = self
                    .api
                    .call(
                        "elbv2_delete_listener",
                        self.elbv2
                            .delete_listener()
                            .listener_arn(l.listener_arn().unwrap_or_default())
                            .send(),
                    )
                    .await;
                not_found_as_none(r, &["ListenerNotFound"])
                    .map_err(|e| cloud_error(format!("deleting a listener of {name}"), e))?;
            }
            for tg in &tg_arns {
                let mut attempt = 0;
                loop {
                    match self.delete_target_group(tg).await {
                        Ok(()) => break,
                        Err(e) if attempt < 5 => {
                            tracing::info!(lb = name, target_group = tg, error = %e, "target group not deletable yet; retrying in 2 s");
                            attempt += 1;
                            tokio::time::sleep(Duration::from_secs(2)).await;
                        }
                        Err(e) => {
                            return Err(CloudError::msg(format!(
                                "NLB {name}: target group {tg} cannot be deleted yet ({e}); the NLB is kept and its deletion retried"
                            )));
                        }
                    }
                }
            }
            self.api
                .call(
                    "elbv2_delete_load_balancer",
                    self.elbv2.delete_load_balancer().load_balancer_arn(&arn).send(),
                )
                .await
                .map_err(|e| cloud_error(format!("deleting NLB {name}"), e))?;
            tracing::info!(lb = name, "deleted NLB");
            gone.push(arn);
        }
        // Target groups earlier failures left behind.
        let key = service_key(svc);
        if self.sweep_target_groups(svc, &gone).await? == 0 {
            self.tg_sweep_pending.lock().remove(&key);
        } else {
            tracing::warn!(service = %key, "unused target groups of the Service could not be deleted yet");
        }
        if let Some(g) = managed
            && !keep.contains(g.group_id().unwrap_or_default())
        {
            self.revoke_references(g.group_id().unwrap_or_default()).await?;
            self.delete_owned_security_group(&g, Duration::from_secs(600))
                .await?;
        }
        Ok(!gone.is_empty())
    }
}

/// A listener as the Service wants it.
#[derive(Debug, Clone)]
struct WantedListener {
    port: i32,
    protocol: String,
    target_group: String,
    certificate: Option<String>,
    ssl_policy: Option<String>,
}

impl WantedListener {
    /// The listener's certificate (TLS listeners).
    fn certificate(&self) -> Certificate {
        Certificate::builder()
            .set_certificate_arn(self.certificate.clone())
            .build()
    }

    /// Whether `l` must be modified: another protocol or target group; for TLS another
    /// certificate or (when the Service names one) SSL policy; for TCP/UDP a certificate left
    /// over. (Upstream also compares the SSL policy when none is asked for, and so rewrites
    /// every TLS listener carrying AWS's default policy on every sync; an SSL policy reported on
    /// a TCP listener — moto does — is no reason to touch it either.)
    fn differs_from(&self, l: &Listener) -> bool {
        let protocol = l.protocol().map(|p| p.as_str()).unwrap_or_default();
        let target = l.default_actions().first().and_then(|a| a.target_group_arn());
        if !protocol.eq_ignore_ascii_case(&self.protocol) || target != Some(self.target_group.as_str()) {
            return true;
        }
        let certificate = l.certificates().first().and_then(|c| c.certificate_arn());
        if self.protocol == "TLS" {
            certificate != self.certificate.as_deref()
                || self
                    .ssl_policy
                    .as_deref()
                    .is_some_and(|p| l.ssl_policy() != Some(p))
        } else {
            certificate.is_some()
        }
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
        // Pinned with Python's hashlib over the same bytes upstream's hasher sees.
        assert_eq!(n, "k8s-producti-mywebser-f17ed1e28d");
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
    fn managed_group_name_is_upstreams() {
        let mut s = svc();
        s.metadata.uid = Some("0b6b3a5c-1111-2222-3333-444455556666".into());
        // Pinned with Python's hashlib: SHA-256 of cluster name ‖ name ‖ namespace ‖ UID.
        assert_eq!(
            AwsCloud::managed_group_name("kubernetes", &s),
            "k8s-producti-mywebser-085b1da6ff"
        );
    }

    #[test]
    fn listeners_change_in_place_only_when_something_differs() {
        let l = |proto: ProtocolEnum, cert: Option<&str>, policy: Option<&str>| {
            let mut b = Listener::builder()
                .port(443)
                .protocol(proto)
                .default_actions(forward("tg-1"))
                .set_ssl_policy(policy.map(str::to_string));
            if let Some(c) = cert {
                b = b.certificates(Certificate::builder().certificate_arn(c).build());
            }
            b.build()
        };
        let want = |proto: &str, cert: Option<&str>, policy: Option<&str>| WantedListener {
            port: 443,
            protocol: proto.into(),
            target_group: "tg-1".into(),
            certificate: cert.map(str::to_string),
            ssl_policy: policy.map(str::to_string),
        };
        assert!(!want("TCP", None, None).differs_from(&l(ProtocolEnum::Tcp, None, None)));
        assert!(want("TLS", Some("c1"), None).differs_from(&l(ProtocolEnum::Tcp, None, None)));
        assert!(want("TCP", None, None).differs_from(&l(ProtocolEnum::Tls, Some("c1"), Some("p"))));
        assert!(!want("TCP", None, None).differs_from(&l(
            ProtocolEnum::Tcp,
            None,
            Some("ELBSecurityPolicy-2016-08")
        )));
        // AWS's default policy on a TLS listener is no reason to rewrite it.
        assert!(!want("TLS", Some("c1"), None).differs_from(&l(
            ProtocolEnum::Tls,
            Some("c1"),
            Some("ELBSecurityPolicy-2016-08")
        )));
        assert!(want("TLS", Some("c2"), None).differs_from(&l(ProtocolEnum::Tls, Some("c1"), None)));
        assert!(want("TLS", Some("c1"), Some("p2")).differs_from(&l(
            ProtocolEnum::Tls,
            Some("c1"),
            Some("p1")
        )));
        let mut other_tg = want("TCP", None, None);
        other_tg.target_group = "tg-2".into();
        assert!(other_tg.differs_from(&l(ProtocolEnum::Tcp, None, None)));
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

    #[test]
    fn shared_health_probe_mode_overrides_protocol_path_and_port_annotations_as_upstream() {
        let o = LbOptions {
            hc_protocol: Some("TCP".into()),
            hc_port: Some("8080".into()),
            hc_path: Some("/mine".into()),
            hc_interval: Some(20),
            hc_healthy: Some(4),
            ..Default::default()
        };
        assert_eq!(
            health(&svc(), &o, Some((10256, "/healthz".into()))),
            TgHealth {
                protocol: "HTTP".into(),
                port: "10256".into(),
                path: Some("/healthz".into()),
                interval: 20,
                healthy: 4,
                unhealthy: 3
            }
        );
    }
}
