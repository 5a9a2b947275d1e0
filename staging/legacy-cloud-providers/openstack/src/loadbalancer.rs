//! LoadBalancer Services as Octavia load balancers (cloud-provider-openstack's
//! `openstack_loadbalancer.go`): one load balancer named
//! `kube_service_<cluster>_<namespace>_<name>`, one listener per Service port (matched by
//! protocol and port, named `listener_<i>_<lb>`), its default pool (`pool_<i>_<lb>`) with one
//! member per backend Node (its first InternalIP, the port's NodePort, named after the Node),
//! an optional health monitor (`monitor_<i>_<lb>`), and for external Services a neutron
//! floating IP on the VIP port. Octavia is asynchronous: every change waits for the load
//! balancer to be `ACTIVE` again.
//!
//! Annotations read (upstream names): `loadbalancer.openstack.org/subnet-id`, `…/network-id`,
//! `…/port-id`, `…/floating-network-id`, `…/lb-method`, `…/enable-health-monitor`,
//! `…/keep-floatingip`, `…/flavor-id`, `…/availability-zone`, and
//! `service.beta.kubernetes.io/openstack-internal-load-balancer`. A bad value is an error naming
//! the annotation and the value; nothing is created or changed then.
//!
//! Only load balancers with this cluster's name for the Service are touched, and deletion removes
//! the floating IP only when it is on that load balancer's VIP port.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use k8s_cloud_provider::{
    CloudError, CloudResult, LoadBalancer,
    service::helpers::{is_allow_all, load_balancer_backends, load_balancer_source_ranges},
};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service as KubeService};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    OpenStackCloud,
    client::{Service, decode, query_escape},
    cloud_error,
    config::check_lb_method,
};

/// `loadbalancer.openstack.org/subnet-id`.
pub const ANNOTATION_SUBNET_ID: &str = "loadbalancer.openstack.org/subnet-id";
/// `loadbalancer.openstack.org/network-id`.
pub const ANNOTATION_NETWORK_ID: &str = "loadbalancer.openstack.org/network-id";
/// `loadbalancer.openstack.org/port-id`: an existing port to use as the VIP.
pub const ANNOTATION_PORT_ID: &str = "loadbalancer.openstack.org/port-id";
/// `loadbalancer.openstack.org/floating-network-id`.
pub const ANNOTATION_FLOATING_NETWORK_ID: &str = "loadbalancer.openstack.org/floating-network-id";
/// `loadbalancer.openstack.org/lb-method`.
pub const ANNOTATION_LB_METHOD: &str = "loadbalancer.openstack.org/lb-method";
/// `loadbalancer.openstack.org/enable-health-monitor`.
pub const ANNOTATION_HEALTH_MONITOR: &str = "loadbalancer.openstack.org/enable-health-monitor";
/// `loadbalancer.openstack.org/keep-floatingip`.
pub const ANNOTATION_KEEP_FLOATING_IP: &str = "loadbalancer.openstack.org/keep-floatingip";
/// `loadbalancer.openstack.org/flavor-id`.
pub const ANNOTATION_FLAVOR_ID: &str = "loadbalancer.openstack.org/flavor-id";
/// `loadbalancer.openstack.org/availability-zone`.
pub const ANNOTATION_AVAILABILITY_ZONE: &str = "loadbalancer.openstack.org/availability-zone";
/// `service.beta.kubernetes.io/openstack-internal-load-balancer`.
pub const ANNOTATION_INTERNAL: &str = "service.beta.kubernetes.io/openstack-internal-load-balancer";

/// How long to wait for Octavia to finish one change.
pub const PROVISIONING_TIMEOUT: Duration = Duration::from_secs(300);

/// Octavia and neutron names are at most 255 characters.
fn cut(s: String) -> String {
    if s.len() <= 255 {
        return s;
    }
    let mut end = 255;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The load balancer's name: `kube_service_<cluster>_<namespace>_<name>`.
pub fn load_balancer_name(cluster: &str, service: &KubeService) -> String {
    cut(format!(
        "kube_service_{cluster}_{}_{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    ))
}

/// What a Service asks for, from its annotations and `[LoadBalancer]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceOptions {
    /// VIP and member subnet.
    pub subnet_id: String,
    /// VIP network.
    pub network_id: String,
    /// VIP port.
    pub port_id: String,
    /// Floating IP network (empty: none).
    pub floating_network_id: String,
    /// No floating IP.
    pub internal: bool,
    /// Pool algorithm.
    pub lb_method: String,
    /// Health monitors on.
    pub health_monitor: bool,
    /// Keep the floating IP when the Service goes.
    pub keep_floating_ip: bool,
    /// Octavia flavor.
    pub flavor_id: String,
    /// Octavia availability zone.
    pub availability_zone: String,
}

/// One Service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The Service port.
    pub port: i32,
    /// The NodePort.
    pub node_port: i32,
}

fn annotation<'a>(service: &'a KubeService, key: &str) -> Option<&'a str> {
    service
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn annotation_bool(service: &KubeService, key: &str, default: bool) -> CloudResult<bool> {
    match annotation(service, key) {
        None => Ok(default),
        Some(v) => k8s_cloud_provider::service::helpers::parse_go_bool(v)
            .ok_or_else(|| CloudError::msg(format!("annotation {key}: {v:?} is not a boolean (true/false)"))),
    }
}

impl ServiceOptions {
    /// Reads the annotations over the configured defaults.
    pub fn from_service(cloud: &OpenStackCloud, service: &KubeService) -> CloudResult<Self> {
        let c = &cloud.config.load_balancer;
        let text = |key: &str, default: &str| annotation(service, key).unwrap_or(default).trim().to_string();
        let lb_method = match annotation(service, ANNOTATION_LB_METHOD) {
            Some(v) => check_lb_method(v)
                .map_err(|m| CloudError::msg(format!("annotation {ANNOTATION_LB_METHOD}: {m}")))?,
            None => c.lb_method.clone(),
        };
        let o = Self {
            subnet_id: text(ANNOTATION_SUBNET_ID, &c.subnet_id),
            network_id: text(ANNOTATION_NETWORK_ID, &c.network_id),
            port_id: text(ANNOTATION_PORT_ID, ""),
            floating_network_id: text(ANNOTATION_FLOATING_NETWORK_ID, &c.floating_network_id),
            internal: annotation_bool(service, ANNOTATION_INTERNAL, c.internal_lb)?,
            lb_method,
            health_monitor: annotation_bool(service, ANNOTATION_HEALTH_MONITOR, c.monitor.create)?,
            keep_floating_ip: annotation_bool(service, ANNOTATION_KEEP_FLOATING_IP, false)?,
            flavor_id: text(ANNOTATION_FLAVOR_ID, &c.flavor_id),
            availability_zone: text(ANNOTATION_AVAILABILITY_ZONE, &c.availability_zone),
        };
        if o.subnet_id.is_empty() && o.network_id.is_empty() && o.port_id.is_empty() {
            return Err(CloudError::msg(format!(
                "no VIP subnet: set [LoadBalancer] subnet-id (or network-id) or the {ANNOTATION_SUBNET_ID} annotation"
            )));
        }
        if o.subnet_id.is_empty() {
            return Err(CloudError::msg(format!(
                "no member subnet: set [LoadBalancer] subnet-id or the {ANNOTATION_SUBNET_ID} annotation"
            )));
        }
        Ok(o)
    }
}

/// The Service's ports; an unsupported protocol or a port without NodePort is an error.
pub fn service_ports(service: &KubeService) -> CloudResult<Vec<PortSpec>> {
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() {
        return Err(CloudError::msg("the Service has no ports"));
    }
    ports
        .iter()
        .map(|p| {
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            if !matches!(protocol.as_str(), "TCP" | "UDP" | "SCTP") {
                return Err(CloudError::msg(format!(
                    "spec.ports[{}].protocol {protocol:?} is not supported (TCP, UDP, SCTP)",
                    p.name.as_deref().unwrap_or_default()
                )));
            }
            let node_port = p
                .node_port
                .filter(|n| *n > 0)
                .ok_or_else(|| CloudError::msg(format!("spec.ports port {} has no nodePort yet", p.port)))?;
            Ok(PortSpec {
                protocol,
                port: p.port,
                node_port,
            })
        })
        .collect()
}

/// An Octavia load balancer.
#[derive(Debug, Clone, Deserialize)]
pub struct OctaviaLoadBalancer {
    /// UUID.
    pub id: String,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// `ACTIVE`, `PENDING_*`, `ERROR`, `DELETED`.
    #[serde(default)]
    pub provisioning_status: String,
    /// VIP address.
    #[serde(default)]
    pub vip_address: String,
    /// VIP port.
    #[serde(default)]
    pub vip_port_id: String,
}

#[derive(Debug, Clone, Deserialize)]
struct Listener {
    id: String,
    protocol: String,
    protocol_port: i32,
    #[serde(default)]
    default_pool_id: Option<String>,
    #[serde(default)]
    allowed_cidrs: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
struct Pool {
    id: String,
    #[serde(default)]
    lb_algorithm: String,
    #[serde(default)]
    healthmonitor_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct Member {
    #[serde(default)]
    name: String,
    address: String,
    protocol_port: i32,
    #[serde(default)]
    subnet_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct FloatingIp {
    id: String,
    floating_ip_address: String,
}

const LBAAS: &str = "/v2/lbaas";

impl OpenStackCloud {
    async fn find_load_balancer(&self, name: &str) -> CloudResult<Option<OctaviaLoadBalancer>> {
        let path = format!("{LBAAS}/loadbalancers?name={}", query_escape(name));
        let v = self
            .client
            .get(Service::LoadBalancer, &path)
            .await
            .map_err(|e| cloud_error(format!("listing load balancers named {name}"), e))?;
        let mut lbs: Vec<OctaviaLoadBalancer> =
            decode(&v, "loadbalancers", &path).map_err(|e| cloud_error("listing load balancers", e))?;
        lbs.retain(|lb| lb.name == name && lb.provisioning_status != "DELETED");
        match lbs.len() {
            0 => Ok(None),
            1 => Ok(lbs.pop()),
            n => Err(CloudError::msg(format!(
                "{n} Octavia load balancers are named {name}; delete the extra ones by hand"
            ))),
        }
    }

    /// Waits until the load balancer is `ACTIVE` (or gone, with `gone_ok`).
    async fn wait_active(&self, id: &str, gone_ok: bool) -> CloudResult<Option<OctaviaLoadBalancer>> {
        let start = Instant::now();
        let mut delay = Duration::from_millis(200);
        loop {
            let path = format!("{LBAAS}/loadbalancers/{id}");
            match self
                .client
                .get_as::<OctaviaLoadBalancer>(Service::LoadBalancer, &path, "loadbalancer")
                .await
            {
                Ok(lb) if lb.provisioning_status == "ACTIVE" => return Ok(Some(lb)),
                Ok(lb) if lb.provisioning_status == "ERROR" => {
                    return Err(CloudError::msg(format!("Octavia load balancer {id} is in ERROR")));
                }
                Ok(lb) if lb.provisioning_status == "DELETED" && gone_ok => return Ok(None),
                Ok(_) => {}
                Err(e) if e.is_not_found() && gone_ok => return Ok(None),
                Err(e) => return Err(cloud_error(format!("reading load balancer {id}"), e)),
            }
            if start.elapsed() > PROVISIONING_TIMEOUT {
                return Err(CloudError::retry_after(
                    format!(
                        "Octavia load balancer {id} is still provisioning after {PROVISIONING_TIMEOUT:?}"
                    ),
                    Duration::from_secs(30),
                ));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(3));
        }
    }

    async fn lb_post(&self, lb_id: &str, path: &str, body: Value, what: &str) -> CloudResult<Value> {
        let v = self
            .client
            .post(Service::LoadBalancer, path, &body)
            .await
            .map_err(|e| cloud_error(format!("creating {what}"), e))?;
        self.wait_active(lb_id, false).await?;
        Ok(v)
    }

    async fn lb_put(&self, lb_id: &str, path: &str, body: Value, what: &str) -> CloudResult<()> {
        self.client
            .put(Service::LoadBalancer, path, &body)
            .await
            .map_err(|e| cloud_error(format!("updating {what}"), e))?;
        self.wait_active(lb_id, false).await?;
        Ok(())
    }

    async fn lb_delete(&self, lb_id: &str, path: &str, what: &str) -> CloudResult<()> {
        self.client
            .delete(Service::LoadBalancer, path)
            .await
            .map_err(|e| cloud_error(format!("deleting {what}"), e))?;
        self.wait_active(lb_id, false).await?;
        Ok(())
    }

    async fn floating_ip_on_port(&self, port_id: &str) -> CloudResult<Option<FloatingIp>> {
        if port_id.is_empty() {
            return Ok(None);
        }
        let path = format!("/floatingips?port_id={}", query_escape(port_id));
        let mut fips: Vec<FloatingIp> = self
            .client
            .get_as(Service::Network, &path, "floatingips")
            .await
            .map_err(|e| cloud_error(format!("listing floating IPs of port {port_id}"), e))?;
        Ok(fips.pop())
    }

    /// Creates or updates everything; returns the status and the backends left out for want of
    /// an InternalIP.
    async fn ensure(
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
        // Members: the backends' first InternalIP (nodes without one are left out, with a log).
        let mut members: BTreeMap<String, String> = BTreeMap::new();
        let mut skipped = Vec::new();
        for n in load_balancer_backends(nodes) {
            let node = n.metadata.name.clone().unwrap_or_default();
            let ip = n
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
                .map(|a| a.address.clone());
            match ip {
                Some(ip) => {
                    members.insert(node, ip);
                }
                None => {
                    tracing::warn!(node, "no InternalIP: not a load balancer member");
                    skipped.push(node);
                }
            }
        }

        let lb = match self.find_load_balancer(&name).await? {
            Some(lb) => lb,
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
                created
            }
        };
        let lb = self
            .wait_active(&lb.id, false)
            .await?
            .ok_or_else(|| CloudError::msg(format!("load balancer {} disappeared", lb.id)))?;

        let listeners: Vec<Listener> = self
            .client
            .get_as(
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
                    let current = l.allowed_cidrs.clone().unwrap_or_default();
                    if current.iter().collect::<BTreeSet<_>>()
                        != allowed_cidrs.iter().collect::<BTreeSet<_>>()
                    {
                        self.lb_put(
                            &lb.id,
                            &format!("{LBAAS}/listeners/{}", l.id),
                            json!({"listener": {"allowed_cidrs": if allowed_cidrs.is_empty() { Value::Null } else { json!(allowed_cidrs) }}}),
                            "listener allowed CIDRs",
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
            let pool = match &listener.default_pool_id {
                Some(id) if !id.is_empty() => {
                    let p: Pool = self
                        .client
                        .get_as(Service::LoadBalancer, &format!("{LBAAS}/pools/{id}"), "pool")
                        .await
                        .map_err(|e| cloud_error(format!("reading pool {id}"), e))?;
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
                _ => {
                    let body = json!({"pool": {
                        "name": cut(format!("pool_{i}_{name}")),
                        "protocol": port.protocol,
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
                .get_as(
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
                .map(|(n, ip)| (n.clone(), ip.clone(), port.node_port, opts.subnet_id.clone()))
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
            match (&pool.healthmonitor_id, opts.health_monitor) {
                (None, true) => {
                    let m = &self.config.load_balancer.monitor;
                    let kind = if port.protocol == "UDP" {
                        "UDP-CONNECT"
                    } else {
                        "TCP"
                    };
                    let body = json!({"healthmonitor": {
                        "name": cut(format!("monitor_{i}_{name}")),
                        "pool_id": pool.id,
                        "type": kind,
                        "delay": m.delay.as_secs().max(1),
                        "timeout": m.timeout.as_secs().max(1),
                        "max_retries": m.max_retries.max(1),
                        "max_retries_down": m.max_retries_down.max(1),
                        "tags": [name],
                    }});
                    self.lb_post(&lb.id, &format!("{LBAAS}/healthmonitors"), body, "health monitor")
                        .await?;
                }
                (Some(id), false) if !id.is_empty() => {
                    self.lb_delete(&lb.id, &format!("{LBAAS}/healthmonitors/{id}"), "health monitor")
                        .await?;
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
        let mut address = lb.vip_address.clone();
        if !opts.internal && !opts.floating_network_id.is_empty() {
            let fip = match self.floating_ip_on_port(&lb.vip_port_id).await? {
                Some(f) => f,
                None => {
                    let ns = service.metadata.namespace.as_deref().unwrap_or("default");
                    let svc = service.metadata.name.as_deref().unwrap_or_default();
                    let body = json!({"floatingip": {
                        "floating_network_id": opts.floating_network_id,
                        "port_id": lb.vip_port_id,
                        "description": format!("Floating IP for Kubernetes external service {ns}/{svc} from cluster {cluster}"),
                    }});
                    let v = self
                        .client
                        .post(Service::Network, "/floatingips", &body)
                        .await
                        .map_err(|e| {
                            cloud_error(
                                format!("creating a floating IP for VIP port {}", lb.vip_port_id),
                                e,
                            )
                        })?;
                    let f: FloatingIp = decode(&v, "floatingip", "floatingips")
                        .map_err(|e| cloud_error("creating floating IP", e))?;
                    tracing::info!(fip = %f.floating_ip_address, port = %lb.vip_port_id, "created floating IP");
                    f
                }
            };
            address = fip.floating_ip_address;
        }
        Ok((status_for(&address), skipped))
    }
}

fn status_for(address: &str) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            ip: Some(address.to_string()),
            ..Default::default()
        }]),
    }
}

#[async_trait]
impl LoadBalancer for OpenStackCloud {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        service: &KubeService,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let Some(lb) = self
            .find_load_balancer(&load_balancer_name(cluster, service))
            .await?
        else {
            return Ok(None);
        };
        let address = match self.floating_ip_on_port(&lb.vip_port_id).await? {
            Some(f) => f.floating_ip_address,
            None => lb.vip_address,
        };
        Ok(Some(status_for(&address)))
    }

    fn get_load_balancer_name(&self, cluster: &str, service: &KubeService) -> String {
        load_balancer_name(cluster, service)
    }

    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &KubeService,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        self.ensure(cluster, service, nodes)
            .await
            .map(|(status, _)| status)
    }

    async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &KubeService,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        // As upstream, a Node without an InternalIP is no member; a node sync that met one (a
        // Node whose addresses arrive just after its provider ID) fails after applying the rest,
        // so the Service is synced again shortly, not at the next periodic node sync.
        let (_, skipped) = self.ensure(cluster, service, nodes).await?;
        if skipped.is_empty() {
            return Ok(());
        }
        Err(CloudError::retry_after(
            format!(
                "nodes without an InternalIP are not members yet: {}",
                skipped.join(", ")
            ),
            Duration::from_secs(5),
        ))
    }

    async fn ensure_load_balancer_deleted(&self, cluster: &str, service: &KubeService) -> CloudResult<()> {
        let name = load_balancer_name(cluster, service);
        let Some(lb) = self.find_load_balancer(&name).await? else {
            return Ok(());
        };
        let keep = annotation_bool(service, ANNOTATION_KEEP_FLOATING_IP, false)?;
        if !keep && let Some(fip) = self.floating_ip_on_port(&lb.vip_port_id).await? {
            self.client
                .delete(Service::Network, &format!("/floatingips/{}", fip.id))
                .await
                .map_err(|e| cloud_error(format!("deleting floating IP {}", fip.floating_ip_address), e))?;
            tracing::info!(fip = %fip.floating_ip_address, "deleted floating IP");
        }
        // An immutable (PENDING_*) load balancer cannot be deleted: wait for it first.
        self.wait_active(&lb.id, true).await?;
        let cascade = if self.config.load_balancer.cascade_delete {
            "?cascade=true"
        } else {
            ""
        };
        self.client
            .delete(
                Service::LoadBalancer,
                &format!("{LBAAS}/loadbalancers/{}{cascade}", lb.id),
            )
            .await
            .map_err(|e| cloud_error(format!("deleting load balancer {name}"), e))?;
        self.wait_active(&lb.id, true).await?;
        tracing::info!(lb = %lb.id, %name, "deleted Octavia load balancer");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{ServicePort, ServiceSpec},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    fn svc(ports: Vec<ServicePort>) -> KubeService {
        KubeService {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(ports),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn names_and_ports() {
        let s = svc(vec![ServicePort {
            port: 80,
            node_port: Some(30080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]);
        assert_eq!(
            load_balancer_name("kubernetes", &s),
            "kube_service_kubernetes_shop_web"
        );
        assert_eq!(
            service_ports(&s).unwrap(),
            [PortSpec {
                protocol: "TCP".into(),
                port: 80,
                node_port: 30080
            }]
        );
        assert_eq!(cut("x".repeat(300)).len(), 255);
        let bad = svc(vec![ServicePort {
            port: 80,
            node_port: Some(30080),
            protocol: Some("HTTP".into()),
            ..Default::default()
        }]);
        assert!(service_ports(&bad).unwrap_err().to_string().contains("HTTP"));
        assert!(service_ports(&svc(vec![])).is_err());
    }
}
