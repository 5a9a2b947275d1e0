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

mod listeners;
mod rules;
mod target_groups;

use listeners::WantedListener;
pub use target_groups::{TgHealth, health, older_release_local_health, target_group_name};
use target_groups::{target_group_fits, target_group_health_is, tg_protocol};

/// Description prefix of the client rules on node groups.
pub const RULE_CLIENT: &str = "kubernetes.io/rule/nlb/client=";
/// Description prefix of the health-check rules.
pub const RULE_HEALTH: &str = "kubernetes.io/rule/nlb/health=";
/// Description prefix of the path-MTU rules.
pub const RULE_MTU: &str = "kubernetes.io/rule/nlb/mtu";
/// The description of the security group made for an NLB in `NLBSecurityGroupMode = Managed`
/// (upstream's).
const MANAGED_GROUP_DESCRIPTION: &str = "[k8s] Managed SecurityGroup for LoadBalancer";

fn alnum(s: &str, max: usize) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(max)
        .collect()
}

fn tags(pairs: &[(String, String)]) -> Vec<Tag> {
    pairs
        .iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

/// How many times one sync tries to make an NLB (each attempt sent once, the NLB looked up by
/// name between attempts).
const NLB_CREATE_ATTEMPTS: u32 = 3;

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

    /// Whether `group` is a security group this provider (or upstream's, in
    /// `NLBSecurityGroupMode = Managed`) made for an NLB of the Service `service`
    /// (`namespace/name`): owned by this cluster, tagged with the Service, with the managed
    /// group's description. Its name is not needed (it hashes the Service's UID and the
    /// cluster name, which a deleted Service no longer gives).
    pub(crate) fn made_for_nlb(&self, group: &SecurityGroup, service: &str) -> bool {
        let tags = crate::lb::network::tags_of(group);
        group.description() == Some(MANAGED_GROUP_DESCRIPTION)
            && tags.get("kubernetes.io/service-name").map(String::as_str) == Some(service)
            && self.owned_by_cluster(&tags)
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
                        MANAGED_GROUP_DESCRIPTION,
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
                        self.remove_replaced_groups(name, &key, &replaced).await?;
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
        let older_local = older_release_local_health(svc, opts, &h);
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
                    let fits = |tg: &&TargetGroup| target_group_fits(tg, p.node_port, &target_proto, &h);
                    // A Local Service's group as Go up to 1.20 made it, kept as it is.
                    let older = |tg: &&TargetGroup| {
                        older_local.as_ref().is_some_and(|old| {
                            target_group_fits(tg, p.node_port, &target_proto, old)
                                && target_group_health_is(tg, old)
                        })
                    };
                    attached.iter().find(fits).map(|tg| (tg, &h)).or_else(|| {
                        attached
                            .iter()
                            .find(older)
                            .map(|tg| (tg, older_local.as_ref().unwrap_or(&h)))
                    })
                })
                .flatten();
            let (tg_arn, created) = match reusable {
                Some((tg, h)) => {
                    self.sync_tg_health_check(tg, h).await?;
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
        // Each attempt is sent once (the SDK does not re-send it): a create whose answer was
        // lost is not re-sent blindly. AWS makes this call idempotent by name, but a cloud that
        // does not (moto made a second NLB of the same name) would leak one. After a transient
        // failure the NLB is looked up by name first, and made again only if it is not there.
        let mut attempt = 1;
        let out = loop {
            let sent = self
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
                        .set_subnet_mappings(Some(mappings.clone()))
                        .set_security_groups(groups.clone())
                        .set_tags(Some(tags(resource_tags)))
                        .customize()
                        .config_override(
                            aws_sdk_elasticloadbalancingv2::config::Builder::default()
                                .retry_config(aws_config::retry::RetryConfig::disabled()),
                        )
                        .send(),
                )
                .await;
            match sent {
                Ok(out) => break out,
                Err(e) if e.is_transient() && attempt < NLB_CREATE_ATTEMPTS => {
                    tracing::info!(lb = name, attempt, error = %e.message, "creating the NLB failed; looking it up before trying again");
                    tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
                    if let Some(lb) = self.describe_nlb(name).await? {
                        tracing::info!(lb = name, "the NLB was made by the create whose answer was lost");
                        return Ok(lb);
                    }
                    attempt += 1;
                }
                Err(e) => return Err(cloud_error(format!("creating NLB {name}"), e)),
            }
        };
        tracing::info!(lb = name, "created NLB");
        out.load_balancers()
            .first()
            .cloned()
            .ok_or_else(|| CloudError::msg(format!("CreateLoadBalancer {name} returned nothing")))
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

    /// Deletes the NLB `name`: its listeners, then its target groups (retrying `ResourceInUse`
    /// for a while), and only then the NLB itself — so that while a target group cannot be
    /// deleted the NLB still exists, the deletion fails and is retried (the service controller
    /// skips the deletion of a load balancer it cannot find). Then target groups left over by
    /// earlier failures (by tag), the node rules and the managed group (see [`super::Deleter`]
    /// for what the service controller and `orphans` do differently).
    pub(crate) async fn delete_nlb(
        &self,
        cluster_name: &str,
        name: &str,
        svc: &Service,
        keep: &BTreeSet<String>,
        deleter: super::Deleter,
    ) -> CloudResult<bool> {
        // The managed group: by its name (cluster name and the Service's UID), else among the
        // NLB's groups the one made for this Service (tag and description, what upstream
        // goes by; a deleted Service's UID, and so the name, is not known to `orphans`).
        let key = service_key(svc);
        let mut managed = self
            .security_group_by_name(&Self::managed_group_name(cluster_name, svc))
            .await?
            .filter(|g| self.made_for_nlb(g, &key));
        if managed.is_none()
            && let Some(lb) = self.describe_nlb(name).await?
        {
            managed = self
                .security_groups(lb.security_groups())
                .await?
                .into_iter()
                .find(|g| self.made_for_nlb(g, &key));
        }
        // A managed group that rules this provider did not make still name: see
        // `delete_classic` (the service controller changes nothing and retries).
        if let Some(g) = &managed
            && deleter == super::Deleter::ServiceController
            && !keep.contains(g.group_id().unwrap_or_default())
        {
            let id = g.group_id().unwrap_or_default();
            let (_, foreign) = self.references(id).await?;
            if !foreign.is_empty() {
                return Err(CloudError::msg(format!(
                    "NLB {name} is not deleted yet: its managed security group {id} is named by rules this cloud-controller-manager did not make ({}); the deletion goes on once they are removed",
                    foreign.join("; ")
                )));
            }
        }
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
                && deleter == super::Deleter::ServiceController
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
        if self.sweep_target_groups(svc, &gone).await? == 0 {
            self.tg_sweep_pending.lock().remove(&key);
        } else {
            tracing::warn!(service = %key, "unused target groups of the Service could not be deleted yet");
        }
        if let Some(g) = managed
            && !keep.contains(g.group_id().unwrap_or_default())
        {
            self.release_and_delete_group(&g, Duration::from_secs(600))
                .await?;
        }
        Ok(!gone.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::listeners::forward;
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
    fn a_local_services_group_as_go_1_20_made_it_is_known_only_when_nothing_was_asked_for() {
        let mut s = svc();
        let none = LbOptions::default();
        assert_eq!(
            older_release_local_health(&s, &none, &health(&s, &none, None)),
            None,
            "Cluster policy: the defaults did not change"
        );
        let spec = s.spec.as_mut().unwrap();
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(31000);
        assert_eq!(
            older_release_local_health(&s, &none, &health(&s, &none, None)),
            Some(TgHealth {
                protocol: "HTTP".into(),
                port: "31000".into(),
                path: Some("/healthz".into()),
                interval: 30,
                healthy: 3,
                unhealthy: 3
            })
        );
        for asked in [
            LbOptions {
                hc_interval: Some(10),
                ..Default::default()
            },
            LbOptions {
                hc_healthy: Some(2),
                ..Default::default()
            },
            LbOptions {
                hc_path: Some("/healthz".into()),
                ..Default::default()
            },
        ] {
            assert_eq!(
                older_release_local_health(&s, &asked, &health(&s, &asked, None)),
                None,
                "{asked:?}"
            );
        }
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
