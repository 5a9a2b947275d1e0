//! A cloud-controller-manager with the fake provider (cloud-config: the fake's JSON), for the
//! application's end-to-end tests (leader election, health, metrics, flags). Not a product.
//!
//! With `RCP_FAKE_CLOUD_WRITE_LOG=<file>`, every write that reaches the fake cloud (load
//! balancers, routes) is also appended to that file as `<unix time in µs> <writer> <call>`
//! (`<writer>` from `RCP_FAKE_CLOUD_WRITER`): the request log of a cloud that several processes
//! share, which tests read to see who wrote when.

use std::{io::Write, sync::Arc};

use async_trait::async_trait;
use k8s_cloud_provider::{
    CloudProvider, CloudResult, Instances, InstancesV2, LoadBalancer, Route, Routes, Zones,
    app::ProviderSpec, registry::Factory,
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

fn main() -> std::process::ExitCode {
    let fake = k8s_cloud_provider::fake::factory();
    let factory: Factory = match std::env::var_os("RCP_FAKE_CLOUD_WRITE_LOG") {
        None => fake,
        Some(path) => {
            let writer = std::env::var("RCP_FAKE_CLOUD_WRITER").unwrap_or_else(|_| "ccm".into());
            Arc::new(move |config| {
                let (fake, path, writer) = (fake.clone(), path.clone(), writer.clone());
                Box::pin(async move {
                    let inner = fake(config).await?;
                    let log = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)?;
                    Ok(Arc::new(Logged {
                        inner,
                        log: std::sync::Mutex::new(log),
                        writer,
                    }) as Arc<dyn CloudProvider>)
                })
            })
        }
    };
    // The node IPAM controller, as a provider offers it (off unless named in --controllers).
    k8s_cloud_provider::app::main(
        ProviderSpec::new("fake", factory)
            .with_controller(k8s_cloud_provider::controllers::nodeipam::provider_controller()),
    )
}

/// The fake cloud, its writes logged to the shared file.
struct Logged {
    inner: Arc<dyn CloudProvider>,
    log: std::sync::Mutex<std::fs::File>,
    writer: String,
}

impl Logged {
    fn record(&self, call: String) {
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or_default();
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        // One write(2) per line: O_APPEND keeps the lines of several processes whole.
        let _ = log.write_all(format!("{micros} {} {call}\n", self.writer).as_bytes());
    }

    fn service(service: &Service) -> String {
        format!(
            "{}/{}",
            service.metadata.namespace.as_deref().unwrap_or_default(),
            service.metadata.name.as_deref().unwrap_or_default()
        )
    }
}

#[async_trait]
impl CloudProvider for Logged {
    fn provider_name(&self) -> &str {
        self.inner.provider_name()
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.inner.load_balancer().map(|_| self as &dyn LoadBalancer)
    }
    fn routes(&self) -> Option<&dyn Routes> {
        self.inner.routes().map(|_| self as &dyn Routes)
    }
    fn instances(&self) -> Option<&dyn Instances> {
        self.inner.instances()
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.inner.instances_v2()
    }
    fn zones(&self) -> Option<&dyn Zones> {
        self.inner.zones()
    }
}

#[async_trait]
impl LoadBalancer for Logged {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.inner
            .load_balancer()
            .expect("checked")
            .get_load_balancer(cluster, service)
            .await
    }
    fn get_load_balancer_name(&self, cluster: &str, service: &Service) -> String {
        self.inner
            .load_balancer()
            .expect("checked")
            .get_load_balancer_name(cluster, service)
    }
    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        self.record(format!("EnsureLoadBalancer {}", Self::service(service)));
        self.inner
            .load_balancer()
            .expect("checked")
            .ensure_load_balancer(cluster, service, nodes)
            .await
    }
    async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        self.record(format!("UpdateLoadBalancer {}", Self::service(service)));
        self.inner
            .load_balancer()
            .expect("checked")
            .update_load_balancer(cluster, service, nodes)
            .await
    }
    async fn ensure_load_balancer_deleted(&self, cluster: &str, service: &Service) -> CloudResult<()> {
        self.record(format!("EnsureLoadBalancerDeleted {}", Self::service(service)));
        self.inner
            .load_balancer()
            .expect("checked")
            .ensure_load_balancer_deleted(cluster, service)
            .await
    }
}

#[async_trait]
impl Routes for Logged {
    async fn list_routes(&self, cluster: &str) -> CloudResult<Vec<Route>> {
        self.inner.routes().expect("checked").list_routes(cluster).await
    }
    async fn create_route(&self, cluster: &str, hint: &str, route: &Route) -> CloudResult<()> {
        self.record(format!("CreateRoute {}", route.destination_cidr));
        self.inner
            .routes()
            .expect("checked")
            .create_route(cluster, hint, route)
            .await
    }
    async fn delete_route(&self, cluster: &str, route: &Route) -> CloudResult<()> {
        self.record(format!("DeleteRoute {}", route.destination_cidr));
        self.inner
            .routes()
            .expect("checked")
            .delete_route(cluster, route)
            .await
    }
}
