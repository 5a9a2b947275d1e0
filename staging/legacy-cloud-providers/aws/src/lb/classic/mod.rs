//! Classic ELB (spec A6.2): listeners (TCP/HTTP, TLS by `ssl-cert`/`ssl-ports`/
//! `backend-protocol`), health check, attributes, proxy-protocol and SSL-negotiation policies,
//! subnets and security groups on existing load balancers, instance registration by diff, and
//! the node security-group rule "all traffic from the load balancer's group".

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use aws_sdk_elasticloadbalancing::types::{
    AccessLog, ConnectionDraining, ConnectionSettings, CrossZoneLoadBalancing, HealthCheck, Instance,
    Listener, LoadBalancerAttributes, LoadBalancerDescription, PolicyAttribute, Tag,
};
use k8s_cloud_provider::{
    CloudError, CloudResult,
    service::helpers::{load_balancer_source_ranges, service_health_check_path_port, service_key},
};
use k8s_openapi::api::core::v1::Service;

use aws_sdk_ec2::types::SecurityGroup;

use super::{LbPort, network::CidrRule, not_found_as_none};
use crate::{AwsCloud, annotations::LbOptions, cloud_error, instances::InstanceInfo};

mod listeners;
mod policies;

use listeners::to_listener;
pub use listeners::{ListenerSpec, listeners};

/// Proxy-protocol policy name (AWS-36).
pub const PROXY_PROTOCOL_POLICY: &str = "k8s-proxyprotocol-enabled";
/// Prefix of SSL-negotiation policies (AWS-37).
pub const SSL_POLICY_PREFIX: &str = "k8s-SSLNegotiationPolicy-";

/// The health check of AWS-38: `(target, healthy, unhealthy, timeout, interval)`.
pub fn health_check(
    svc: &Service,
    opts: &LbOptions,
    ports: &[LbPort],
    shared_probe: Option<(i32, String)>,
) -> (String, i32, i32, i32, i32) {
    let first_node_port = ports.first().map(|p| p.node_port).unwrap_or(0);
    let (mut proto, mut port, mut path) = match service_health_check_path_port(svc) {
        Some((path, port)) => ("HTTP".to_string(), port.to_string(), path.to_string()),
        None => match shared_probe {
            Some((port, path)) => ("HTTP".to_string(), port.to_string(), path),
            None => {
                let p = if matches!(opts.backend_protocol.as_deref(), Some("https" | "ssl")) {
                    "SSL"
                } else {
                    "TCP"
                };
                (p.to_string(), first_node_port.to_string(), String::new())
            }
        },
    };
    if let Some(p) = &opts.hc_protocol {
        proto = p.clone();
        if proto == "TCP" || proto == "SSL" {
            path.clear();
        } else if path.is_empty() {
            path = "/".into();
        }
    }
    if let Some(p) = &opts.hc_port {
        port = if p == "traffic-port" {
            first_node_port.to_string()
        } else {
            p.clone()
        };
    }
    if let Some(p) = &opts.hc_path
        && (proto == "HTTP" || proto == "HTTPS")
    {
        path = p.clone();
    }
    let target = if proto == "HTTP" || proto == "HTTPS" {
        format!("{proto}:{port}{path}")
    } else {
        format!("{proto}:{port}")
    };
    (
        target,
        opts.hc_healthy.unwrap_or(2),
        opts.hc_unhealthy.unwrap_or(6),
        opts.hc_timeout.unwrap_or(5),
        opts.hc_interval.unwrap_or(10),
    )
}

impl AwsCloud {
    pub(crate) async fn describe_classic(&self, name: &str) -> CloudResult<Option<LoadBalancerDescription>> {
        let r = self
            .api
            .call(
                "elb_describe_load_balancers",
                self.elb
                    .describe_load_balancers()
                    .load_balancer_names(name)
                    .send(),
            )
            .await;
        let out = not_found_as_none(r, &["LoadBalancerNotFound"])
            .map_err(|e| cloud_error(format!("describing classic ELB {name}"), e))?;
        Ok(out.and_then(|o| o.load_balancer_descriptions().first().cloned()))
    }

    /// The kube-proxy health probe shared by all load balancers (`(port, path)`) when
    /// `ClusterServiceLoadBalancerHealthProbeMode = Shared` and `svc` has no health-check
    /// NodePort of its own (Classic ELBs and NLBs alike).
    pub(crate) fn shared_probe(&self, svc: &Service) -> Option<(i32, String)> {
        if self.config.cluster_service_load_balancer_health_probe_mode != "Shared"
            || service_health_check_path_port(svc).is_some()
        {
            return None;
        }
        let port = match self.config.cluster_service_shared_load_balancer_health_probe_port {
            0 => 10256,
            p => p,
        };
        let path = match self
            .config
            .cluster_service_shared_load_balancer_health_probe_path
            .as_str()
        {
            "" => "/healthz".to_string(),
            p => p.to_string(),
        };
        Some((port, path))
    }

    /// Creates or updates the Classic ELB of `svc`; returns its DNS name.
    pub(crate) async fn ensure_classic(
        &self,
        name: &str,
        svc: &Service,
        opts: &LbOptions,
        ports: &[LbPort],
        instances: &[Arc<InstanceInfo>],
    ) -> CloudResult<String> {
        let key = service_key(svc);
        let wanted_listeners = listeners(ports, opts)?;
        let subnets = self.lb_subnets(opts.internal, &opts.subnets).await?;
        let tags = self.resource_tags(&key, &opts.additional_tags);

        // Security groups (AWS-49/50).
        let mut groups: Vec<String> = Vec::new();
        let mut owned_group = None;
        if !opts.security_groups.is_empty() {
            groups.extend(opts.security_groups.iter().cloned());
        } else if !self.config.elb_security_group.is_empty() {
            groups.push(self.config.elb_security_group.clone());
        } else {
            let id = self
                .ensure_owned_security_group(
                    &format!("k8s-elb-{name}"),
                    &format!("Security group for Kubernetes ELB {name} ({key})"),
                    &tags,
                )
                .await?;
            groups.push(id.clone());
            owned_group = Some(id);
        }
        for g in &opts.extra_security_groups {
            if !groups.contains(g) {
                groups.push(g.clone());
            }
        }
        if let Some(id) = &owned_group {
            let ranges = load_balancer_source_ranges(svc).map_err(|e| CloudError::msg(e.to_string()))?;
            let mut rules = Vec::new();
            for range in &ranges {
                let cidr = range.to_string();
                for p in ports {
                    rules.push(CidrRule {
                        protocol: "tcp".into(),
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
                    cidr,
                    description: String::new(),
                });
            }
            self.sync_cidr_rules(id, &rules).await?;
        }

        let existing = self.describe_classic(name).await?;
        let dns = match &existing {
            None => {
                let mut req = self
                    .elb
                    .create_load_balancer()
                    .load_balancer_name(name)
                    .set_subnets(Some(subnets.iter().map(|s| s.id.clone()).collect()))
                    .set_security_groups(Some(groups.clone()))
                    .set_tags(Some(
                        tags.iter()
                            .map(|(k, v)| Tag::builder().key(k).value(v).build())
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|e| CloudError::msg(e.to_string()))?,
                    ));
                for l in &wanted_listeners {
                    req = req.listeners(to_listener(l)?);
                }
                if opts.internal {
                    req = req.scheme("internal");
                }
                let out = self
                    .api
                    .call("elb_create_load_balancer", req.send())
                    .await
                    .map_err(|e| cloud_error(format!("creating classic ELB {name}"), e))?;
                tracing::info!(lb = name, service = %key, "created classic ELB");
                out.dns_name().unwrap_or_default().to_string()
            }
            Some(lb) => {
                self.sync_classic_listeners(name, lb, &wanted_listeners).await?;
                self.sync_classic_subnets(name, lb, &subnets).await?;
                let have_groups: BTreeSet<String> = lb.security_groups().iter().cloned().collect();
                let want_groups: BTreeSet<String> = groups.iter().cloned().collect();
                if have_groups != want_groups {
                    self.api
                        .call(
                            "elb_apply_security_groups",
                            self.elb
                                .apply_security_groups_to_load_balancer()
                                .load_balancer_name(name)
                                .set_security_groups(Some(groups.clone()))
                                .send(),
                        )
                        .await
                        .map_err(|e| cloud_error(format!("setting the security groups of {name}"), e))?;
                    let replaced: Vec<String> = have_groups.difference(&want_groups).cloned().collect();
                    self.remove_replaced_groups(name, &key, &replaced).await?;
                }
                self.add_missing_classic_tags(name, &opts.additional_tags).await?;
                lb.dns_name().unwrap_or_default().to_string()
            }
        };

        // Health check (AWS-38): rewritten only when a field differs (a new moto ELB has none).
        let (target, healthy, unhealthy, timeout, interval) =
            health_check(svc, opts, ports, self.shared_probe(svc));
        let current = existing.as_ref().and_then(|lb| lb.health_check());
        let differs = current.is_none_or(|h| {
            h.target() != target
                || h.healthy_threshold() != healthy
                || h.unhealthy_threshold() != unhealthy
                || h.timeout() != timeout
                || h.interval() != interval
        });
        if differs {
            let hc = HealthCheck::builder()
                .target(&target)
                .healthy_threshold(healthy)
                .unhealthy_threshold(unhealthy)
                .timeout(timeout)
                .interval(interval)
                .build()
                .map_err(|e| CloudError::msg(e.to_string()))?;
            self.api
                .call(
                    "elb_configure_health_check",
                    self.elb
                        .configure_health_check()
                        .load_balancer_name(name)
                        .health_check(hc)
                        .send(),
                )
                .await
                .map_err(|e| cloud_error(format!("configuring the health check of {name}"), e))?;
        }

        self.sync_classic_attributes(name, opts).await?;
        self.sync_classic_policies(name, opts, &wanted_listeners, existing.as_ref())
            .await?;
        self.sync_classic_instances(name, existing.as_ref(), instances)
            .await?;
        if !self.config.disable_security_group_ingress
            && let Some(lb_group) = groups.first()
        {
            // `groups` is already in upstream's order (annotation, own/global, extras).
            self.sync_node_group_access(lb_group, instances).await?;
        }
        Ok(dns)
    }

    /// Moves the Classic ELB to `subnets`: new subnets in zones the ELB is not in are attached
    /// first, then each subnet replaced within a zone is detached before its successor is
    /// attached (an ELB has one subnet per zone), then subnets no longer wanted are detached —
    /// so the ELB always keeps at least one subnet.
    async fn sync_classic_subnets(
        &self,
        name: &str,
        lb: &LoadBalancerDescription,
        subnets: &[super::network::VpcSubnet],
    ) -> CloudResult<()> {
        let have: BTreeSet<String> = lb.subnets().iter().cloned().collect();
        let want: BTreeSet<String> = subnets.iter().map(|s| s.id.clone()).collect();
        if have == want {
            return Ok(());
        }
        let removed: Vec<String> = have.difference(&want).cloned().collect();
        let zone_of: std::collections::BTreeMap<String, String> = self
            .describe_subnets(&removed)
            .await?
            .into_iter()
            .map(|s| (s.id, s.zone))
            .collect();
        let mut free = Vec::new();
        let mut replacing = Vec::new();
        for s in subnets.iter().filter(|s| !have.contains(&s.id)) {
            match zone_of.iter().find(|(_, z)| **z == s.zone) {
                Some((old, _)) => replacing.push((old.clone(), s.id.clone())),
                None => free.push(s.id.clone()),
            }
        }
        self.attach_classic_subnets(name, free).await?;
        let mut detached = BTreeSet::new();
        for (old, new) in replacing {
            self.detach_classic_subnets(name, vec![old.clone()]).await?;
            detached.insert(old);
            self.attach_classic_subnets(name, vec![new]).await?;
        }
        let rest: Vec<String> = removed.into_iter().filter(|r| !detached.contains(r)).collect();
        self.detach_classic_subnets(name, rest).await
    }

    async fn attach_classic_subnets(&self, name: &str, subnets: Vec<String>) -> CloudResult<()> {
        if subnets.is_empty() {
            return Ok(());
        }
        self.api
            .call(
                "elb_attach_load_balancer_to_subnets",
                self.elb
                    .attach_load_balancer_to_subnets()
                    .load_balancer_name(name)
                    .set_subnets(Some(subnets))
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("attaching subnets to {name}"), e))?;
        Ok(())
    }

    async fn detach_classic_subnets(&self, name: &str, subnets: Vec<String>) -> CloudResult<()> {
        if subnets.is_empty() {
            return Ok(());
        }
        self.api
            .call(
                "elb_detach_load_balancer_from_subnets",
                self.elb
                    .detach_load_balancer_from_subnets()
                    .load_balancer_name(name)
                    .set_subnets(Some(subnets))
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("detaching subnets from {name}"), e))?;
        Ok(())
    }

    /// Adds the `additional-resource-tags` the ELB lacks (or has with another value); no call
    /// when it has them all.
    async fn add_missing_classic_tags(
        &self,
        name: &str,
        wanted: &std::collections::BTreeMap<String, String>,
    ) -> CloudResult<()> {
        if wanted.is_empty() {
            return Ok(());
        }
        let out = self
            .api
            .call(
                "elb_describe_tags",
                self.elb.describe_tags().load_balancer_names(name).send(),
            )
            .await
            .map_err(|e| cloud_error(format!("reading the tags of {name}"), e))?;
        let have: std::collections::BTreeMap<&str, &str> = out
            .tag_descriptions()
            .iter()
            .flat_map(|d| d.tags())
            .map(|t| (t.key(), t.value().unwrap_or_default()))
            .collect();
        let missing = wanted
            .iter()
            .filter(|(k, v)| have.get(k.as_str()) != Some(&v.as_str()))
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CloudError::msg(e.to_string()))?;
        if missing.is_empty() {
            return Ok(());
        }
        self.api
            .call(
                "elb_add_tags",
                self.elb
                    .add_tags()
                    .load_balancer_names(name)
                    .set_tags(Some(missing))
                    .send(),
            )
            .await
            .map_err(|e| cloud_error(format!("tagging {name}"), e))?;
        Ok(())
    }

    /// Registers missing and deregisters extra instances (AWS-40).
    pub(crate) async fn sync_classic_instances(
        &self,
        name: &str,
        lb: Option<&LoadBalancerDescription>,
        instances: &[Arc<InstanceInfo>],
    ) -> CloudResult<()> {
        let have: BTreeSet<String> = lb
            .map(|l| {
                l.instances()
                    .iter()
                    .filter_map(|i| i.instance_id().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let want: BTreeSet<String> = instances.iter().map(|i| i.id.clone()).collect();
        let register: Vec<Instance> = want
            .difference(&have)
            .map(|id| Instance::builder().instance_id(id).build())
            .collect();
        let deregister: Vec<Instance> = have
            .difference(&want)
            .map(|id| Instance::builder().instance_id(id).build())
            .collect();
        if !register.is_empty() {
            self.api
                .call(
                    "elb_register_instances",
                    self.elb
                        .register_instances_with_load_balancer()
                        .load_balancer_name(name)
                        .set_instances(Some(register))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error(format!("registering instances with {name}"), e))?;
        }
        if !deregister.is_empty() {
            self.api
                .call(
                    "elb_deregister_instances",
                    self.elb
                        .deregister_instances_from_load_balancer()
                        .load_balancer_name(name)
                        .set_instances(Some(deregister))
                        .send(),
                )
                .await
                .map_err(|e| cloud_error(format!("deregistering instances from {name}"), e))?;
        }
        Ok(())
    }

    /// The node rule "all traffic from `lb_group`" on the target instances' groups, removed
    /// from cluster groups that no longer host targets (AWS-51).
    pub(crate) async fn sync_node_group_access(
        &self,
        lb_group: &str,
        instances: &[Arc<InstanceInfo>],
    ) -> CloudResult<()> {
        let refs: Vec<&InstanceInfo> = instances.iter().map(|i| i.as_ref()).collect();
        let node_groups = self.node_security_groups(&refs).await?;
        for g in node_groups.values() {
            self.allow_group(g, lb_group).await?;
        }
        // Cluster groups that admit the load balancer but host no target any more (only the
        // groups referencing it are asked for, not the whole VPC).
        for g in self.groups_referencing(lb_group).await? {
            if !node_groups.contains_key(g.group_id().unwrap_or_default())
                && self.tagged_for_cluster(&super::network::tags_of(&g))
            {
                self.disallow_group(&g, lb_group).await?;
            }
        }
        Ok(())
    }

    /// Handles `groups`, just detached from the load balancer `name` of the Service `service`
    /// (`namespace/name`): a group this provider made for it ([`AwsCloud::made_for_classic`],
    /// [`AwsCloud::made_for_nlb`]) is deleted after this provider's rules naming it are revoked
    /// ([`AwsCloud::release_and_delete_group`]); for any other group, even one tagged `owned`
    /// (a Service's former `extra-security-groups`), only the node rules admitting it are
    /// revoked ([`AwsCloud::release_node_access`]).
    pub(crate) async fn remove_replaced_groups(
        &self,
        name: &str,
        service: &str,
        groups: &[String],
    ) -> CloudResult<()> {
        for g in self.security_groups(groups).await? {
            let id = g.group_id().unwrap_or_default().to_string();
            let made = self.made_for_classic(&g, name) || self.made_for_nlb(&g, service);
            if !made || id == self.config.elb_security_group {
                self.release_node_access(name, &id).await?;
                continue;
            }
            self.release_and_delete_group(&g, Duration::from_secs(600))
                .await?;
        }
        Ok(())
    }

    /// Whether `group` is the security group this provider (or upstream's) made for the
    /// Classic ELB `name`: named `k8s-elb-<name>`, owned by this cluster, with the description
    /// it is created with. Only such a group is ever deleted with the load balancer; any other
    /// group on it (a Service's `security-groups` / `extra-security-groups`, the cloud config's
    /// `ElbSecurityGroup`, a group a user attached, even when tagged `owned`, like EKS' cluster
    /// group) is left as it is.
    pub(crate) fn made_for_classic(&self, group: &SecurityGroup, name: &str) -> bool {
        group.group_name() == Some(format!("k8s-elb-{name}").as_str())
            && group
                .description()
                .is_some_and(|d| d.starts_with(&format!("Security group for Kubernetes ELB {name}")))
            && self.owned_by_cluster(&super::network::tags_of(group))
    }

    /// Deletes the Classic ELB `name` and what this provider made for it (AWS-39, A6.5): this
    /// provider's permissions for the group it made (`k8s-elb-<name>`,
    /// [`AwsCloud::made_for_classic`]) are revoked from the cluster's groups, the load balancer
    /// is deleted, then that group (retrying `DependencyViolation`). When rules this provider
    /// did not make name that group, the service controller's deletion fails before anything
    /// is changed, and `orphans` deletes the load balancer but keeps the group ([`super::Deleter`]).
    /// No other group on the load balancer is deleted; `keep` (the Service's bring-your-own
    /// groups) are not even described. Without a group it made, the service controller revokes
    /// the nodes' permission for the load balancer's first group.
    pub(crate) async fn delete_classic(
        &self,
        name: &str,
        keep: &BTreeSet<String>,
        deleter: super::Deleter,
    ) -> CloudResult<bool> {
        let lb = self.describe_classic(name).await?;
        let mut candidates: Vec<String> = lb
            .as_ref()
            .map(|l| l.security_groups().to_vec())
            .unwrap_or_default();
        if let Some(g) = self.security_group_by_name(&format!("k8s-elb-{name}")).await?
            && let Some(id) = g.group_id()
            && !candidates.iter().any(|c| c == id)
        {
            candidates.push(id.to_string());
        }
        // The shared group of the cloud config and kept groups are never deleted: not even
        // described.
        candidates.retain(|id| *id != self.config.elb_security_group && !keep.contains(id));
        let mut doomed = Vec::new();
        for g in self.security_groups(&candidates).await? {
            if self.made_for_classic(&g, name) {
                doomed.push(g);
            } else {
                tracing::info!(
                    lb = name,
                    group = g.group_id().unwrap_or_default(),
                    "security group of the classic ELB not made for it; kept"
                );
            }
        }
        // A group it made that rules it did not make still name cannot be deleted (and those
        // rules are never revoked here): the service controller then changes nothing and
        // fails, retried until they are removed (the load balancer is deleted only then: once
        // it is gone, the service controller would drop the Service and the group with it);
        // `orphans` deletes the load balancer and keeps the group.
        let mut kept = BTreeMap::new();
        // The cluster groups holding this provider's permission for each group to delete,
        // read once: revoked below unless the group is kept.
        let mut holders = Vec::new();
        for g in &doomed {
            let id = g.group_id().unwrap_or_default();
            let (own, foreign) = self.references(id).await?;
            if foreign.is_empty() {
                holders.push((id.to_string(), own));
            } else {
                kept.insert(id.to_string(), foreign);
            }
        }
        if deleter == super::Deleter::ServiceController
            && let Some((id, rules)) = kept.iter().next()
        {
            return Err(CloudError::msg(format!(
                "classic ELB {name} is not deleted yet: its security group {id} is named by rules this cloud-controller-manager did not make ({}); the deletion goes on once they are removed",
                rules.join("; ")
            )));
        }
        for (id, rules) in &kept {
            tracing::warn!(
                lb = name,
                group = %id,
                rules = ?rules,
                "security group kept: rules this provider did not make still name it"
            );
        }
        for (id, own) in &holders {
            for holder in own {
                self.disallow_group(holder, id).await?;
            }
        }
        doomed.retain(|g| !kept.contains_key(g.group_id().unwrap_or_default()));
        // A kept (bring-your-own) group through which the nodes admitted this load balancer:
        // only the node rules go (spec A6.5 step 3).
        if let Some(primary) = lb.as_ref().and_then(|l| l.security_groups().first())
            && deleter == super::Deleter::ServiceController
            && doomed.is_empty()
            && kept.is_empty()
        {
            self.release_node_access(name, primary).await?;
        }
        let existed = lb.is_some();
        if existed {
            self.api
                .call(
                    "elb_delete_load_balancer",
                    self.elb.delete_load_balancer().load_balancer_name(name).send(),
                )
                .await
                .map_err(|e| cloud_error(format!("deleting classic ELB {name}"), e))?;
            tracing::info!(lb = name, "deleted classic ELB");
        }
        for g in &doomed {
            self.delete_owned_security_group(g, Duration::from_secs(600))
                .await?;
        }
        Ok(existed)
    }
}

/// The load balancer's group through which the nodes admit it, as upstream's
/// `sortELBSecurityGroupList` orders them: the `security-groups` annotation's groups first (in
/// its order), then the others, then the `extra-security-groups` (in its order); the first wins.
pub fn primary_group(lb: &LoadBalancerDescription, opts: &LbOptions) -> Option<String> {
    let rank = |g: &String| {
        if let Some(i) = opts.security_groups.iter().position(|x| x == g) {
            i
        } else if let Some(j) = opts.extra_security_groups.iter().position(|x| x == g) {
            opts.security_groups.len() + 1 + j
        } else {
            opts.security_groups.len()
        }
    };
    let mut groups = lb.security_groups().to_vec();
    groups.sort_by_key(|g| rank(g));
    groups.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::policies::same_access_log;
    use super::*;
    use k8s_openapi::api::core::v1::ServiceSpec;

    fn ports() -> Vec<LbPort> {
        vec![
            LbPort {
                name: Some("http".into()),
                port: 80,
                node_port: 30080,
                protocol: "TCP".into(),
            },
            LbPort {
                name: Some("https".into()),
                port: 443,
                node_port: 30443,
                protocol: "TCP".into(),
            },
        ]
    }

    fn opts(ssl: bool, backend: Option<&str>, ssl_ports: Option<Vec<&str>>) -> LbOptions {
        LbOptions {
            ssl_cert: ssl.then(|| "arn:aws:acm:us-east-1:123:certificate/c".to_string()),
            backend_protocol: backend.map(str::to_string),
            ssl_ports: ssl_ports.map(|v| v.into_iter().map(str::to_string).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn listener_protocols_follow_aws_34() {
        let l = listeners(&ports(), &opts(false, None, None)).unwrap();
        assert_eq!(
            (
                l[0].protocol.as_str(),
                l[0].instance_protocol.as_str(),
                l[0].instance_port
            ),
            ("TCP", "TCP", 30080)
        );
        let l = listeners(&ports(), &opts(false, Some("http"), None)).unwrap();
        assert_eq!(
            (l[1].protocol.as_str(), l[1].instance_protocol.as_str()),
            ("HTTP", "HTTP")
        );
        for (backend, fe, be) in [
            (None, "SSL", "TCP"),
            (Some("http"), "HTTPS", "HTTP"),
            (Some("https"), "HTTPS", "HTTPS"),
            (Some("ssl"), "SSL", "SSL"),
            (Some("tcp"), "SSL", "TCP"),
        ] {
            let l = listeners(&ports(), &opts(true, backend, Some(vec!["443"]))).unwrap();
            assert_eq!(
                (l[1].protocol.as_str(), l[1].instance_protocol.as_str()),
                (fe, be),
                "{backend:?}"
            );
            assert!(l[1].certificate.is_some());
            assert!(l[0].certificate.is_none(), "port 80 is not in ssl-ports");
        }
        let l = listeners(&ports(), &opts(true, None, Some(vec!["https"]))).unwrap();
        assert_eq!(l[1].protocol, "SSL", "ssl-ports may name ports");
    }

    #[test]
    fn access_log_changes_are_seen() {
        let log = |enabled: bool, bucket: &str, prefix: &str, interval: Option<i32>| {
            AccessLog::builder()
                .enabled(enabled)
                .s3_bucket_name(bucket)
                .s3_bucket_prefix(prefix)
                .set_emit_interval(interval)
                .build()
        };
        let a = log(true, "logs", "p", Some(5));
        assert!(same_access_log(Some(&a), Some(&log(true, "logs", "p", Some(5)))));
        assert!(!same_access_log(
            Some(&a),
            Some(&log(true, "other", "p", Some(5)))
        ));
        assert!(!same_access_log(Some(&a), Some(&log(true, "logs", "q", Some(5)))));
        assert!(!same_access_log(
            Some(&a),
            Some(&log(true, "logs", "p", Some(60)))
        ));
        assert!(same_access_log(
            Some(&log(false, "x", "", None)),
            Some(&log(false, "", "", None))
        ));
    }

    #[test]
    fn health_checks_follow_aws_38() {
        let mut svc = Service {
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            health_check(&svc, &LbOptions::default(), &ports(), None),
            ("TCP:30080".into(), 2, 6, 5, 10)
        );
        assert_eq!(
            health_check(&svc, &opts(false, Some("https"), None), &ports(), None).0,
            "SSL:30080"
        );
        assert_eq!(
            health_check(
                &svc,
                &LbOptions::default(),
                &ports(),
                Some((10256, "/healthz".into()))
            )
            .0,
            "HTTP:10256/healthz"
        );
        let spec = svc.spec.as_mut().unwrap();
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(32000);
        assert_eq!(
            health_check(&svc, &LbOptions::default(), &ports(), None).0,
            "HTTP:32000/healthz"
        );
        let o = LbOptions {
            hc_protocol: Some("HTTP".into()),
            hc_port: Some("traffic-port".into()),
            hc_path: Some("/ready".into()),
            hc_healthy: Some(3),
            hc_interval: Some(30),
            ..Default::default()
        };
        assert_eq!(
            health_check(&svc, &o, &ports(), None),
            ("HTTP:30080/ready".into(), 3, 6, 5, 30)
        );
    }
}
