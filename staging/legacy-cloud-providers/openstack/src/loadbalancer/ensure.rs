//! Creating and updating a Service's load balancer: listeners, pools, members, monitors and
//! the floating IP.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use k8s_cloud_provider::{
    CloudError, CloudResult,
    service::helpers::{is_allow_all, load_balancer_backends, load_balancer_source_ranges},
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service as KubeService};
use serde_json::{Value, json};

use super::{octavia::*, options::*, status_for};
use crate::{
    OpenStackCloud,
    client::{Service, decode},
    cloud_error,
};

impl OpenStackCloud {
    /// Creates or updates everything; returns the status and the backends left out for want of
    /// an InternalIP.
    pub(super) async fn ensure(
        &self,
        cluster: &str,
        service: &KubeService,
        nodes: &[Arc<Node>],
    ) -> CloudResult<(LoadBalancerStatus, Vec<String>)> {
        let opts = ServiceOptions::from_service(self, service)?;
        let ports = service_ports(service)?;
        let name = load_balancer_name(cluster, service);
        let ranges = load_balancer_source_ranges(service).map_err(|e| CloudError::msg(e.to_string()))?;
        let allowed_cidrs: Vec<String> = if is_allow_all(&ranges) {
            Vec::new()
        } else {
            ranges.iter().map(ToString::to_string).collect()
        };
        // Members: each backend's first InternalIP of the Service's primary family (a Node
        // without one is left out, with a log). No backend at all is an error, as in OCCM: the
        // members there are never wiped for it.
        let ipv6 = service_wants_ipv6(service);
        let backends = load_balancer_backends(nodes);
        if backends.is_empty() {
            return Err(CloudError::msg(format!(
                "there are no available nodes for LoadBalancer service {}/{}: the load balancer's members are left as they are",
                service.metadata.namespace.as_deref().unwrap_or("default"),
                service.metadata.name.as_deref().unwrap_or_default()
            )));
        }
        let mut members: BTreeMap<String, String> = BTreeMap::new();
        let mut skipped = Vec::new();
        for n in backends {
            let node = n.metadata.name.clone().unwrap_or_default();
            match member_address(&n, ipv6) {
                Some(ip) => {
                    members.insert(node, ip);
                }
                None => {
                    let family = if ipv6 { "IPv6" } else { "IPv4" };
                    tracing::warn!(
                        node,
                        family,
                        "no InternalIP of the Service's family: not a load balancer member"
                    );
                    skipped.push(node);
                }
            }
        }
        if members.is_empty() {
            return Err(CloudError::msg(format!(
                "no backend Node has an InternalIP of the Service's IP family ({}): the load balancer's members are left as they are",
                if ipv6 { "IPv6" } else { "IPv4" }
            )));
        }

        let (lb, created) = match self.find_load_balancer(&name).await? {
            Some(lb) => (lb, false),
            None => {
                let ns = service.metadata.namespace.as_deref().unwrap_or("default");
                let svc = service.metadata.name.as_deref().unwrap_or_default();
                let mut body = json!({
                    "name": name,
                    "description": format!("Kubernetes external service {ns}/{svc} from cluster {cluster}"),
                    "tags": [name],
                });
                if !opts.port_id.is_empty() {
                    body["vip_port_id"] = json!(opts.port_id);
                } else if !opts.subnet_id.is_empty() {
                    body["vip_subnet_id"] = json!(opts.subnet_id);
                } else {
                    body["vip_network_id"] = json!(opts.network_id);
                }
                let provider = &self.config.load_balancer.lb_provider;
                if !provider.is_empty() {
                    body["provider"] = json!(provider);
                }
                if !opts.flavor_id.is_empty() {
                    body["flavor_id"] = json!(opts.flavor_id);
                }
                if !opts.availability_zone.is_empty() {
                    body["availability_zone"] = json!(opts.availability_zone);
                }
                let v = self
                    .client
                    .post(
                        Service::LoadBalancer,
                        &format!("{LBAAS}/loadbalancers"),
                        &json!({"loadbalancer": body}),
                    )
                    .await
                    .map_err(|e| cloud_error(format!("creating load balancer {name}"), e))?;
                let created: OctaviaLoadBalancer = decode(&v, "loadbalancer", "loadbalancers")
                    .map_err(|e| cloud_error("creating load balancer", e))?;
                tracing::info!(lb = %created.id, %name, "created Octavia load balancer");
                (created, true)
            }
        };
        let lb = match self.wait_settled(&lb.id).await? {
            None => {
                return Err(CloudError::msg(format!(
                    "load balancer {name} ({}) disappeared",
                    lb.id
                )));
            }
            // As OCCM: a load balancer that went into ERROR when it was made is deleted, and
            // made again by the retried sync. Also one found in ERROR that never served (the
            // Service shows no address yet: its creating sync was cut short).
            Some(l) if l.is_error() && (created || !has_ingress(service)) => {
                self.delete_load_balancer(&l, self.config.load_balancer.cascade_delete)
                    .await?;
                return Err(CloudError::msg(format!(
                    "load balancer {name} ({}) went into ERROR in Octavia when it was made (see Octavia's logs for why); it was deleted and is made again",
                    l.id
                )));
            }
            // One that served may still serve: never deleted on doubt, nor changed (Octavia
            // refuses changes to it anyway).
            Some(l) if l.is_error() => {
                return Err(CloudError::msg(format!(
                    "load balancer {name} ({}) is in ERROR in Octavia: left as it is (it may still serve); repair it in Octavia (e.g. a failover), or delete the Service to delete it",
                    l.id
                )));
            }
            Some(l) => l,
        };

        let listeners: Vec<Listener> = self
            .client
            .list(
                Service::LoadBalancer,
                &format!("{LBAAS}/listeners?loadbalancer_id={}", lb.id),
                "listeners",
            )
            .await
            .map_err(|e| cloud_error(format!("listing listeners of {}", lb.id), e))?;
        let mut kept = BTreeSet::new();
        for (i, port) in ports.iter().enumerate() {
            let listener = match listeners
                .iter()
                .find(|l| l.protocol == port.protocol && l.protocol_port == port.port)
            {
                Some(l) => {
                    // One update with every field that differs.
                    let mut change = serde_json::Map::new();
                    let current = l.allowed_cidrs.clone().unwrap_or_default();
                    if current.iter().collect::<BTreeSet<_>>()
                        != allowed_cidrs.iter().collect::<BTreeSet<_>>()
                    {
                        change.insert(
                            "allowed_cidrs".into(),
                            if allowed_cidrs.is_empty() {
                                Value::Null
                            } else {
                                json!(allowed_cidrs)
                            },
                        );
                    }
                    for (field, want) in &opts.listener_settings {
                        if l.settings.get(*field).and_then(Value::as_i64) != Some(*want) {
                            change.insert((*field).into(), json!(want));
                        }
                    }
                    if !change.is_empty() {
                        self.lb_put(
                            &lb.id,
                            &format!("{LBAAS}/listeners/{}", l.id),
                            json!({"listener": change}),
                            "listener",
                        )
                        .await?;
                    }
                    l.clone()
                }
                None => {
                    let mut body = json!({
                        "name": cut(format!("listener_{i}_{name}")),
                        "protocol": port.protocol,
                        "protocol_port": port.port,
                        "loadbalancer_id": lb.id,
                        "tags": [name],
                    });
                    if !allowed_cidrs.is_empty() {
                        body["allowed_cidrs"] = json!(allowed_cidrs);
                    }
                    for (field, value) in &opts.listener_settings {
                        body[*field] = json!(value);
                    }
                    let v = self
                        .lb_post(
                            &lb.id,
                            &format!("{LBAAS}/listeners"),
                            json!({"listener": body}),
                            "listener",
                        )
                        .await?;
                    decode(&v, "listener", "listeners").map_err(|e| cloud_error("creating listener", e))?
                }
            };
            kept.insert(listener.id.clone());
            let pool_protocol = opts.proxy_protocol.unwrap_or(port.protocol.as_str());
            let existing = match &listener.default_pool_id {
                Some(id) if !id.is_empty() => {
                    let p: Pool = self
                        .client
                        .get_as(Service::LoadBalancer, &format!("{LBAAS}/pools/{id}"), "pool")
                        .await
                        .map_err(|e| cloud_error(format!("reading pool {id}"), e))?;
                    if p.protocol != pool_protocol {
                        // Octavia cannot change a pool's protocol (PROXY protocol switched on or
                        // off): the pool is made again, as OCCM does.
                        self.lb_delete(&lb.id, &format!("{LBAAS}/pools/{id}"), "pool")
                            .await?;
                        tracing::info!(pool = %id, from = %p.protocol, to = pool_protocol, "pool protocol changed: pool made again");
                        None
                    } else {
                        Some(p)
                    }
                }
                _ => None,
            };
            let pool = match existing {
                Some(p) => {
                    let id = &p.id;
                    if p.lb_algorithm != opts.lb_method {
                        self.lb_put(
                            &lb.id,
                            &format!("{LBAAS}/pools/{id}"),
                            json!({"pool": {"lb_algorithm": opts.lb_method}}),
                            "pool algorithm",
                        )
                        .await?;
                    }
                    p
                }
                None => {
                    let body = json!({"pool": {
                        "name": cut(format!("pool_{i}_{name}")),
                        "protocol": pool_protocol,
                        "lb_algorithm": opts.lb_method,
                        "listener_id": listener.id,
                        "tags": [name],
                    }});
                    let v = self
                        .lb_post(&lb.id, &format!("{LBAAS}/pools"), body, "pool")
                        .await?;
                    decode(&v, "pool", "pools").map_err(|e| cloud_error("creating pool", e))?
                }
            };
            // Members: one batch update when the set differs.
            let current: Vec<Member> = self
                .client
                .list(
                    Service::LoadBalancer,
                    &format!("{LBAAS}/pools/{}/members", pool.id),
                    "members",
                )
                .await
                .map_err(|e| cloud_error(format!("listing members of pool {}", pool.id), e))?;
            let have: BTreeSet<(String, String, i32, String)> = current
                .iter()
                .map(|m| {
                    (
                        m.name.clone(),
                        m.address.clone(),
                        m.protocol_port,
                        m.subnet_id.clone().unwrap_or_default(),
                    )
                })
                .collect();
            let want: BTreeSet<(String, String, i32, String)> = members
                .iter()
                .map(|(n, ip)| {
                    (
                        n.clone(),
                        ip.clone(),
                        port.node_port,
                        opts.members_subnet().to_string(),
                    )
                })
                .collect();
            if have != want {
                let body: Vec<Value> = want
                    .iter()
                    .map(|(n, ip, p, subnet)| json!({"name": n, "address": ip, "protocol_port": p, "subnet_id": subnet}))
                    .collect();
                self.lb_put(
                    &lb.id,
                    &format!("{LBAAS}/pools/{}/members", pool.id),
                    json!({"members": body}),
                    "pool members",
                )
                .await?;
                tracing::info!(pool = %pool.id, members = want.len(), "updated load balancer members");
            }
            // Health monitor.
            let (delay, timeout, max_retries, max_retries_down) = opts.monitor;
            match (&pool.healthmonitor_id, opts.health_monitor) {
                (None, true) => {
                    let kind = if port.protocol == "UDP" {
                        "UDP-CONNECT"
                    } else {
                        "TCP"
                    };
                    let body = json!({"healthmonitor": {
                        "name": cut(format!("monitor_{i}_{name}")),
                        "pool_id": pool.id,
                        "type": kind,
                        "delay": delay,
                        "timeout": timeout,
                        "max_retries": max_retries,
                        "max_retries_down": max_retries_down,
                        "tags": [name],
                    }});
                    self.lb_post(&lb.id, &format!("{LBAAS}/healthmonitors"), body, "health monitor")
                        .await?;
                }
                (Some(id), false) if !id.is_empty() => {
                    self.lb_delete(&lb.id, &format!("{LBAAS}/healthmonitors/{id}"), "health monitor")
                        .await?;
                }
                (Some(id), true) if !id.is_empty() => {
                    // Settings changed after the monitor was made (annotations or config).
                    let path = format!("{LBAAS}/healthmonitors/{id}");
                    let m: Value = self
                        .client
                        .get_as(Service::LoadBalancer, &path, "healthmonitor")
                        .await
                        .map_err(|e| cloud_error(format!("reading health monitor {id}"), e))?;
                    let want = json!({"delay": delay, "timeout": timeout, "max_retries": max_retries, "max_retries_down": max_retries_down});
                    let differs = ["delay", "timeout", "max_retries", "max_retries_down"]
                        .iter()
                        .any(|k| m[*k].as_i64() != want[*k].as_i64());
                    if differs {
                        self.lb_put(&lb.id, &path, json!({"healthmonitor": want}), "health monitor")
                            .await?;
                    }
                }
                _ => {}
            }
        }
        // Listeners of ports the Service no longer has: pool first (its members and monitor go
        // with it), then the listener.
        for l in listeners.iter().filter(|l| !kept.contains(&l.id)) {
            if let Some(pool) = l.default_pool_id.as_deref().filter(|p| !p.is_empty()) {
                self.lb_delete(&lb.id, &format!("{LBAAS}/pools/{pool}"), "pool")
                    .await?;
            }
            self.lb_delete(&lb.id, &format!("{LBAAS}/listeners/{}", l.id), "listener")
                .await?;
            tracing::info!(listener = %l.id, port = l.protocol_port, "deleted listener of a removed port");
        }

        // Floating IP.
        let address = if opts.internal {
            // A floating IP made for the Service goes (detached when it is to be kept); a
            // user's own is left alone.
            self.release_floating_ip(cluster, service, &lb, opts.keep_floating_ip, false)
                .await?;
            lb.vip_address.clone()
        } else if !opts.floating_network_id.is_empty() {
            self.ensure_floating_ip(cluster, service, &lb, &opts).await?
        } else {
            // No floating network configured: a floating IP someone put on the VIP port, else
            // the VIP.
            match self.floating_ip_on_port(&lb.vip_port_id).await? {
                Some(f) => f.floating_ip_address,
                None => lb.vip_address.clone(),
            }
        };
        Ok((status_for(&address, opts.hostname.as_deref()), skipped))
    }
}

/// Whether the Service's status shows a load-balancer address.
fn has_ingress(service: &KubeService) -> bool {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}
