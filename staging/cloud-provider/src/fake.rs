//! A programmable, in-memory cloud provider that records every call (feature `fake`), for the
//! controllers' tests and for provider authors' own tests.
//!
//! ```
//! use k8s_cloud_provider::fake::{FakeCloud, FakeInstance};
//! let cloud = FakeCloud::new();
//! cloud.add_instance("node-1", FakeInstance::new("fake://i-1").instance_type("m5.large").zone("z1", "r1"));
//! cloud.fail("InstanceMetadata", k8s_cloud_provider::fake::FakeError::Other("cloud down".into()));
//! assert_eq!(cloud.calls().len(), 0);
//! ```
//!
//! Instances are found by node name, or by provider ID (whichever the Node carries). Calls are
//! recorded as strings like `InstanceMetadata node-1`, `EnsureLoadBalancer default/web [n1 n2]`,
//! `CreateRoute n1 10.244.1.0/24`.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, Service};
use parking_lot::Mutex;

use crate::{
    cloud::{
        CloudProvider, InstanceMetadata, Instances, InstancesV2, LoadBalancer, Route, Routes, Zone, Zones,
    },
    error::{CloudError, CloudResult},
    node::helpers::provider_id,
    service::helpers::{default_load_balancer_name, service_key},
};

/// One fake machine.
#[derive(Debug, Clone, Default)]
pub struct FakeInstance {
    /// Provider ID (`fake://…`).
    pub provider_id: String,
    /// Instance type.
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// Region.
    pub region: String,
    /// Addresses.
    pub addresses: Vec<NodeAddress>,
    /// Extra labels.
    pub additional_labels: BTreeMap<String, String>,
    /// Whether it is shut down.
    pub shutdown: bool,
    /// The Pod CIDRs the cloud assigned to it (for `--cidr-allocator-type=CloudAllocator`).
    pub pod_cidrs: Vec<String>,
}

impl FakeInstance {
    /// An instance with this provider ID and nothing else.
    pub fn new(provider_id: &str) -> Self {
        Self {
            provider_id: provider_id.into(),
            ..Default::default()
        }
    }
    /// Sets the instance type.
    pub fn instance_type(mut self, t: &str) -> Self {
        self.instance_type = t.into();
        self
    }
    /// Sets zone and region.
    pub fn zone(mut self, zone: &str, region: &str) -> Self {
        self.zone = zone.into();
        self.region = region.into();
        self
    }
    /// Adds an address.
    pub fn address(mut self, type_: &str, address: &str) -> Self {
        self.addresses.push(NodeAddress {
            type_: type_.into(),
            address: address.into(),
        });
        self
    }
    /// Adds an extra label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.additional_labels.insert(k.into(), v.into());
        self
    }
}

/// An error the fake returns from a method until cleared.
#[derive(Debug, Clone)]
pub enum FakeError {
    /// `CloudError::InstanceNotFound`.
    NotFound,
    /// `CloudError::NotImplemented`.
    NotImplemented,
    /// `CloudError::ImplementedElsewhere`.
    ImplementedElsewhere,
    /// `CloudError::Retry` with this delay.
    Retry(Duration),
    /// `CloudError::Other` with this message.
    Other(String),
}

impl FakeError {
    fn to_error(&self) -> CloudError {
        match self {
            Self::NotFound => CloudError::InstanceNotFound,
            Self::NotImplemented => CloudError::NotImplemented,
            Self::ImplementedElsewhere => CloudError::ImplementedElsewhere,
            Self::Retry(d) => CloudError::retry_after("fake retry", *d),
            Self::Other(m) => CloudError::msg(m.clone()),
        }
    }
}

/// A fake load balancer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeLoadBalancer {
    /// `namespace/name` of the Service.
    pub service: String,
    /// Backend node names, sorted.
    pub nodes: Vec<String>,
    /// Hostname given in the status.
    pub hostname: String,
}

#[derive(Default)]
struct State {
    instances: BTreeMap<String, FakeInstance>,
    failures: BTreeMap<String, FakeError>,
    calls: Vec<String>,
    load_balancers: BTreeMap<String, FakeLoadBalancer>,
    routes: BTreeMap<String, Route>,
    /// `(prefix, remaining)`: calls starting with `prefix` panic while `remaining` > 0.
    panics: Vec<(String, u32)>,
    /// When set, load balancers answer with this address instead of their hostname.
    ingress_ip: Option<String>,
}

/// The fake provider. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct FakeCloud {
    state: Arc<Mutex<State>>,
    name: String,
    latency: Arc<Mutex<Duration>>,
    /// Calls (`"<method> <detail>"` prefixes) that never return.
    hangs: Arc<Mutex<Vec<String>>>,
    /// Offer `InstancesV2` (default true).
    pub enable_instances_v2: bool,
    /// Offer legacy `Instances` + `Zones` (default true; used when V2 is off).
    pub enable_instances: bool,
    /// Offer `LoadBalancer` (default true).
    pub enable_load_balancer: bool,
    /// Offer `Routes` (default true).
    pub enable_routes: bool,
}

impl std::fmt::Debug for FakeCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeCloud")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Default for FakeCloud {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeCloud {
    /// A fake named `fake` with every capability.
    pub fn new() -> Self {
        Self {
            state: Arc::default(),
            name: "fake".into(),
            latency: Arc::default(),
            hangs: Arc::default(),
            enable_instances_v2: true,
            enable_instances: true,
            enable_load_balancer: true,
            enable_routes: true,
        }
    }

    /// Adds (or replaces) the instance of node `node_name`.
    pub fn add_instance(&self, node_name: &str, instance: FakeInstance) {
        self.state.lock().instances.insert(node_name.into(), instance);
    }

    /// Removes the instance of node `node_name` ("terminated").
    pub fn remove_instance(&self, node_name: &str) {
        self.state.lock().instances.remove(node_name);
    }

    /// Marks an instance shut down or running.
    pub fn set_shutdown(&self, node_name: &str, shutdown: bool) {
        if let Some(i) = self.state.lock().instances.get_mut(node_name) {
            i.shutdown = shutdown;
        }
    }

    /// Makes `method` (e.g. `InstanceMetadata`, `EnsureLoadBalancer`, `ListRoutes`) fail.
    pub fn fail(&self, method: &str, error: FakeError) {
        self.state.lock().failures.insert(method.into(), error);
    }

    /// Makes `method` succeed again.
    pub fn clear_failure(&self, method: &str) {
        self.state.lock().failures.remove(method);
    }

    /// Makes load balancers answer with `ip` in their status (`ingress[].ip`, no `ipMode`, as
    /// providers written before 1.29 do) instead of a hostname; `None` goes back to hostnames.
    pub fn set_ingress_ip(&self, ip: Option<&str>) {
        self.state.lock().ingress_ip = ip.map(str::to_string);
    }

    /// Makes every call take this long.
    pub fn set_latency(&self, latency: Duration) {
        *self.latency.lock() = latency;
    }

    /// Makes the calls whose `"<method> <detail>"` starts with `prefix` never return (a hung
    /// cloud API), e.g. `"EnsureLoadBalancer default/slow"`.
    pub fn hang(&self, prefix: &str) {
        self.hangs.lock().push(prefix.to_string());
    }

    /// Makes the next `times` calls whose `"<method> <detail>"` starts with `prefix` panic (a
    /// provider bug), e.g. `"EnsureLoadBalancer default/boom"`.
    pub fn panic_on(&self, prefix: &str, times: u32) {
        self.state.lock().panics.push((prefix.to_string(), times));
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<String> {
        self.state.lock().calls.clone()
    }

    /// Calls whose text starts with `prefix`.
    pub fn calls_starting_with(&self, prefix: &str) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| c.starts_with(prefix))
            .collect()
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        self.state.lock().calls.clear();
    }

    /// The load balancers, by name.
    pub fn load_balancers(&self) -> BTreeMap<String, FakeLoadBalancer> {
        self.state.lock().load_balancers.clone()
    }

    /// The routes, by destination CIDR.
    pub fn routes(&self) -> BTreeMap<String, Route> {
        self.state.lock().routes.clone()
    }

    /// Adds a route directly (e.g. a route the controller does not own).
    pub fn add_route(&self, route: Route) {
        self.state
            .lock()
            .routes
            .insert(route.destination_cidr.clone(), route);
    }

    async fn call(&self, method: &str, detail: String) -> CloudResult<()> {
        let latency = *self.latency.lock();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let call = format!("{method} {detail}");
        if self.hangs.lock().iter().any(|h| call.starts_with(h.as_str())) {
            std::future::pending::<()>().await;
        }
        let mut s = self.state.lock();
        s.calls.push(if detail.is_empty() {
            method.to_string()
        } else {
            format!("{method} {detail}")
        });
        if let Some((_, remaining)) = s
            .panics
            .iter_mut()
            .find(|(prefix, remaining)| *remaining > 0 && call.starts_with(prefix.as_str()))
        {
            *remaining -= 1;
            drop(s);
            panic!("fake cloud: injected panic in {call:?}");
        }
        match s.failures.get(method) {
            Some(e) => Err(e.to_error()),
            None => Ok(()),
        }
    }

    fn find(&self, node_name: &str, pid: &str) -> Option<FakeInstance> {
        let s = self.state.lock();
        if !pid.is_empty()
            && let Some(i) = s.instances.values().find(|i| i.provider_id == pid)
        {
            return Some(i.clone());
        }
        s.instances.get(node_name).cloned()
    }

    fn find_node(&self, node: &Node) -> Option<FakeInstance> {
        self.find(
            node.metadata.name.as_deref().unwrap_or_default(),
            provider_id(node),
        )
    }
}

#[async_trait]
impl crate::controllers::nodeipam::CloudCidrAllocator for FakeCloud {
    async fn node_pod_cidrs(&self, node: &Node) -> CloudResult<Vec<ipnet::IpNet>> {
        self.call("NodePodCIDRs", node.metadata.name.clone().unwrap_or_default())
            .await?;
        Ok(self
            .find_node(node)
            .map(|i| i.pod_cidrs.iter().filter_map(|c| c.parse().ok()).collect())
            .unwrap_or_default())
    }
}

#[async_trait]
impl CloudProvider for FakeCloud {
    fn provider_name(&self) -> &str {
        &self.name
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.enable_load_balancer.then_some(self as &dyn LoadBalancer)
    }
    fn instances(&self) -> Option<&dyn Instances> {
        self.enable_instances.then_some(self as &dyn Instances)
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.enable_instances_v2.then_some(self as &dyn InstancesV2)
    }
    fn zones(&self) -> Option<&dyn Zones> {
        self.enable_instances.then_some(self as &dyn Zones)
    }
    fn cidr_allocator(&self) -> Option<&dyn crate::controllers::nodeipam::CloudCidrAllocator> {
        Some(self)
    }
    fn routes(&self) -> Option<&dyn Routes> {
        self.enable_routes.then_some(self as &dyn Routes)
    }
}

#[async_trait]
impl InstancesV2 for FakeCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.call("InstanceExists", node.metadata.name.clone().unwrap_or_default())
            .await?;
        Ok(self.find_node(node).is_some())
    }
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.call("InstanceShutdown", node.metadata.name.clone().unwrap_or_default())
            .await?;
        Ok(self.find_node(node).is_some_and(|i| i.shutdown))
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.call("InstanceMetadata", node.metadata.name.clone().unwrap_or_default())
            .await?;
        let i = self.find_node(node).ok_or(CloudError::InstanceNotFound)?;
        Ok(Some(InstanceMetadata {
            provider_id: i.provider_id,
            instance_type: i.instance_type,
            node_addresses: i.addresses,
            zone: i.zone,
            region: i.region,
            additional_labels: i.additional_labels,
        }))
    }
}

#[async_trait]
impl Instances for FakeCloud {
    async fn node_addresses(&self, name: &str) -> CloudResult<Vec<NodeAddress>> {
        self.call("NodeAddresses", name.into()).await?;
        self.find(name, "")
            .map(|i| i.addresses)
            .ok_or(CloudError::InstanceNotFound)
    }
    async fn node_addresses_by_provider_id(&self, pid: &str) -> CloudResult<Vec<NodeAddress>> {
        self.call("NodeAddressesByProviderID", pid.into()).await?;
        self.find("", pid)
            .map(|i| i.addresses)
            .ok_or(CloudError::InstanceNotFound)
    }
    async fn instance_id(&self, name: &str) -> CloudResult<String> {
        self.call("InstanceID", name.into()).await?;
        let i = self.find(name, "").ok_or(CloudError::InstanceNotFound)?;
        Ok(i.provider_id
            .split_once("://")
            .map(|(_, id)| id.to_string())
            .unwrap_or(i.provider_id))
    }
    async fn instance_type(&self, name: &str) -> CloudResult<String> {
        self.call("InstanceType", name.into()).await?;
        self.find(name, "")
            .map(|i| i.instance_type)
            .ok_or(CloudError::InstanceNotFound)
    }
    async fn instance_type_by_provider_id(&self, pid: &str) -> CloudResult<String> {
        self.call("InstanceTypeByProviderID", pid.into()).await?;
        self.find("", pid)
            .map(|i| i.instance_type)
            .ok_or(CloudError::InstanceNotFound)
    }
    async fn instance_exists_by_provider_id(&self, pid: &str) -> CloudResult<bool> {
        self.call("InstanceExistsByProviderID", pid.into()).await?;
        Ok(self.find("", pid).is_some())
    }
    async fn instance_shutdown_by_provider_id(&self, pid: &str) -> CloudResult<bool> {
        self.call("InstanceShutdownByProviderID", pid.into()).await?;
        Ok(self.find("", pid).is_some_and(|i| i.shutdown))
    }
}

#[async_trait]
impl Zones for FakeCloud {
    async fn get_zone(&self) -> CloudResult<Zone> {
        self.call("GetZone", String::new()).await?;
        Ok(Zone::default())
    }
    async fn get_zone_by_provider_id(&self, pid: &str) -> CloudResult<Zone> {
        self.call("GetZoneByProviderID", pid.into()).await?;
        let i = self.find("", pid).ok_or(CloudError::InstanceNotFound)?;
        Ok(Zone {
            failure_domain: i.zone,
            region: i.region,
        })
    }
    async fn get_zone_by_node_name(&self, name: &str) -> CloudResult<Zone> {
        self.call("GetZoneByNodeName", name.into()).await?;
        let i = self.find(name, "").ok_or(CloudError::InstanceNotFound)?;
        Ok(Zone {
            failure_domain: i.zone,
            region: i.region,
        })
    }
}

fn node_names(nodes: &[Arc<Node>]) -> Vec<String> {
    let mut v: Vec<String> = nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
    v.sort();
    v
}

fn status_for(lb: &FakeLoadBalancer, ip: Option<&String>) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![match ip {
            Some(ip) => LoadBalancerIngress {
                ip: Some(ip.clone()),
                ..Default::default()
            },
            None => LoadBalancerIngress {
                hostname: Some(lb.hostname.clone()),
                ..Default::default()
            },
        }]),
    }
}

#[async_trait]
impl LoadBalancer for FakeCloud {
    async fn get_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.call("GetLoadBalancer", service_key(service)).await?;
        let name = default_load_balancer_name(service);
        let state = self.state.lock();
        Ok(state
            .load_balancers
            .get(&name)
            .map(|lb| status_for(lb, state.ingress_ip.as_ref())))
    }
    async fn ensure_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        let names = node_names(nodes);
        self.call(
            "EnsureLoadBalancer",
            format!("{} [{}]", service_key(service), names.join(" ")),
        )
        .await?;
        let name = default_load_balancer_name(service);
        let lb = FakeLoadBalancer {
            service: service_key(service),
            nodes: names,
            hostname: format!("{name}.lb.fake"),
        };
        let mut state = self.state.lock();
        let status = status_for(&lb, state.ingress_ip.as_ref());
        state.load_balancers.insert(name, lb);
        Ok(status)
    }
    async fn update_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        let names = node_names(nodes);
        self.call(
            "UpdateLoadBalancer",
            format!("{} [{}]", service_key(service), names.join(" ")),
        )
        .await?;
        let name = default_load_balancer_name(service);
        match self.state.lock().load_balancers.get_mut(&name) {
            Some(lb) => {
                lb.nodes = names;
                Ok(())
            }
            None => Err(CloudError::msg(format!("load balancer {name} does not exist"))),
        }
    }
    async fn ensure_load_balancer_deleted(&self, _cluster: &str, service: &Service) -> CloudResult<()> {
        self.call("EnsureLoadBalancerDeleted", service_key(service))
            .await?;
        self.state
            .lock()
            .load_balancers
            .remove(&default_load_balancer_name(service));
        Ok(())
    }
}

#[async_trait]
impl Routes for FakeCloud {
    async fn list_routes(&self, _cluster: &str) -> CloudResult<Vec<Route>> {
        self.call("ListRoutes", String::new()).await?;
        Ok(self.state.lock().routes.values().cloned().collect())
    }
    async fn create_route(&self, _cluster: &str, name_hint: &str, route: &Route) -> CloudResult<()> {
        self.call(
            "CreateRoute",
            format!("{} {}", route.target_node, route.destination_cidr),
        )
        .await?;
        let stored = Route {
            name: format!("{name_hint}-{}", route.destination_cidr),
            ..route.clone()
        };
        self.state
            .lock()
            .routes
            .insert(route.destination_cidr.clone(), stored);
        Ok(())
    }
    async fn delete_route(&self, _cluster: &str, route: &Route) -> CloudResult<()> {
        self.call(
            "DeleteRoute",
            format!("{} {}", route.target_node, route.destination_cidr),
        )
        .await?;
        self.state.lock().routes.remove(&route.destination_cidr);
        Ok(())
    }
}

/// The fake's cloud-config (JSON): instances by node name.
///
/// ```json
/// {"instances": {"node-1": {"providerID": "fake://i-1", "instanceType": "m5.large",
///   "zone": "z1", "region": "r1", "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}}
/// ```
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeConfig {
    /// Instances by node name.
    #[serde(default)]
    pub instances: BTreeMap<String, FakeConfigInstance>,
    /// Injected panics (see [`FakeCloud::panic_on`]).
    #[serde(default)]
    pub panics: Vec<FakeConfigPanic>,
}

/// One injected panic of [`FakeConfig`]: `{"call": "EnsureLoadBalancer default/boom", "times": 2}`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeConfigPanic {
    /// Prefix of `"<method> <detail>"`.
    pub call: String,
    /// How many matching calls panic.
    pub times: u32,
}

/// One instance of [`FakeConfig`].
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FakeConfigInstance {
    /// Provider ID.
    #[serde(rename = "providerID")]
    pub provider_id: String,
    /// Instance type.
    #[serde(default)]
    pub instance_type: String,
    /// Zone.
    #[serde(default)]
    pub zone: String,
    /// Region.
    #[serde(default)]
    pub region: String,
    /// Addresses.
    #[serde(default)]
    pub addresses: Vec<NodeAddress>,
    /// The Pod CIDRs the cloud assigned (`podCIDRs`).
    #[serde(default, rename = "podCIDRs")]
    pub pod_cidrs: Vec<String>,
}

/// A registry factory building a [`FakeCloud`] from a [`FakeConfig`] JSON file (no file ⇒ no
/// instances). An invalid file is an error naming the problem.
pub fn factory() -> crate::registry::Factory {
    Arc::new(|config: Option<Vec<u8>>| {
        Box::pin(async move {
            let parsed: FakeConfig = match config {
                None => FakeConfig::default(),
                Some(bytes) => {
                    serde_json::from_slice(&bytes).map_err(|e| format!("fake cloud config: {e}"))?
                }
            };
            let cloud = FakeCloud::new();
            for (node, i) in parsed.instances {
                cloud.add_instance(
                    &node,
                    FakeInstance {
                        provider_id: i.provider_id,
                        instance_type: i.instance_type,
                        zone: i.zone,
                        region: i.region,
                        addresses: i.addresses,
                        pod_cidrs: i.pod_cidrs,
                        ..Default::default()
                    },
                );
            }
            for p in parsed.panics {
                cloud.panic_on(&p.call, p.times);
            }
            Ok(Arc::new(cloud) as Arc<dyn CloudProvider>)
        })
    })
}
