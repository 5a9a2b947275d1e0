//! The sample's load balancers: an address from the `[LoadBalancer] address-pool` of the cloud
//! config for each Service of type `LoadBalancer`, the way a provider's `LoadBalancer` reports
//! what it made. It shows the answers the service controller acts on:
//!
//! - a Service annotated `sample.example.com/load-balancer: external` is another
//!   controller's: `CloudError::ImplementedElsewhere` (no status written, no event, and no
//!   finalizer work later);
//! - an exhausted pool: `CloudError::retry_after` (a `SyncLoadBalancerFailed` event, then a
//!   retry after exactly that delay instead of the growing back-off);
//! - after a restart, an address a Service's status already shows is kept (adopted), never
//!   handed to another Service.
//!
//! A real cloud's API calls go where the map is read and written.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_cloud_provider::{
    CloudError, CloudResult, LoadBalancer, async_trait,
    k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service},
};

/// The annotation that hands a Service to another load-balancer controller.
pub const CONTROLLER_ANNOTATION: &str = "sample.example.com/load-balancer";

/// How long the service controller waits before trying an exhausted pool again.
pub const EXHAUSTED_RETRY: Duration = Duration::from_secs(5);

/// The address pool and which Service (`namespace/name`) holds which address.
pub struct AddressPool {
    first: Ipv4Addr,
    last: Ipv4Addr,
    held: Mutex<BTreeMap<String, Ipv4Addr>>,
}

fn key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

fn status(address: Ipv4Addr) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            ip: Some(address.to_string()),
            ip_mode: Some("VIP".into()),
            ..Default::default()
        }]),
    }
}

/// The first IPv4 address the Service's status shows.
fn shown(service: &Service) -> Option<Ipv4Addr> {
    service
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .iter()
        .find_map(|i| i.ip.as_deref()?.parse().ok())
}

impl AddressPool {
    /// The addresses `first` to `last`, all free.
    pub fn new(first: Ipv4Addr, last: Ipv4Addr) -> Self {
        Self {
            first,
            last,
            held: Mutex::new(BTreeMap::new()),
        }
    }

    /// How many addresses Services hold.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn contains(&self, a: Ipv4Addr) -> bool {
        self.first <= a && a <= self.last
    }

    /// The Service's address: the one it holds, else the one its status shows (adopted after a
    /// restart) when free, else the lowest free one if `allocate`.
    fn address_of(&self, service: &Service, allocate: bool) -> CloudResult<Option<Ipv4Addr>> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let key = key(service);
        if let Some(a) = held.get(&key) {
            return Ok(Some(*a));
        }
        let taken = |a: &Ipv4Addr| held.values().any(|h| h == a);
        if let Some(a) = shown(service).filter(|a| self.contains(*a) && !taken(a)) {
            held.insert(key, a);
            return Ok(Some(a));
        }
        if !allocate {
            return Ok(None);
        }
        let free = (u32::from(self.first)..=u32::from(self.last))
            .map(Ipv4Addr::from)
            .find(|a| !taken(a));
        match free {
            Some(a) => {
                held.insert(key, a);
                Ok(Some(a))
            }
            None => Err(CloudError::retry_after(
                format!(
                    "address pool {}-{} is exhausted ({} load balancers); {key} waits for one to be deleted",
                    self.first,
                    self.last,
                    held.len()
                ),
                EXHAUSTED_RETRY,
            )),
        }
    }
}

#[async_trait]
impl LoadBalancer for AddressPool {
    async fn get_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        Ok(self.address_of(service, false)?.map(status))
    }

    async fn ensure_load_balancer(
        &self,
        _cluster: &str,
        service: &Service,
        _nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        let annotations = service.metadata.annotations.as_ref();
        if annotations
            .and_then(|a| a.get(CONTROLLER_ANNOTATION))
            .map(String::as_str)
            == Some("external")
        {
            return Err(CloudError::ImplementedElsewhere);
        }
        let address = self
            .address_of(service, true)?
            .ok_or_else(|| CloudError::msg("no address allocated"))?;
        Ok(status(address))
    }

    async fn update_load_balancer(
        &self,
        _cluster: &str,
        _service: &Service,
        _nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        // The sample's load balancers have no backends to program.
        Ok(())
    }

    async fn ensure_load_balancer_deleted(
        &self,
        _cluster: &str,
        service: &Service,
    ) -> CloudResult<()> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key(service));
        Ok(())
    }
}
