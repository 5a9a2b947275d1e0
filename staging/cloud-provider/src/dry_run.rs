//! The provider as the controllers see it: every cloud write passes [`AuditedCloud`].
//!
//! The framework's controllers write to the cloud only through [`LoadBalancer`]
//! (`EnsureLoadBalancer`, `UpdateLoadBalancer`, `EnsureLoadBalancerDeleted`) and [`Routes`]
//! (`CreateRoute`, `DeleteRoute`). [`AuditedCloud`] wraps the provider the controller manager
//! runs and is that one place:
//!
//! - normally it forwards every call and logs each write at `debug` level (`write`, with the
//!   controller, the action and the object: the Service's `namespace/name`, or the route's
//!   `node destination-CIDR`);
//! - with `--dry-run` (shadow mode) it does not make the write: it records it
//!   ([`DryRun::record`]: one `info` line, one count in
//!   `cloud_controller_manager_dry_run_actions_total{controller, action}`) and answers as the
//!   write would have: `EnsureLoadBalancer` returns the load balancer's current status when it
//!   exists, and otherwise a placeholder ingress `<load balancer name>.dry-run.invalid`
//!   (`.invalid` can never resolve; the Service status write it leads to is itself a dry run),
//!   so that the controller goes on to the writes that would follow; the others return `Ok`.
//!   Reads (instances, zones, `GetLoadBalancer`, `ListRoutes`) go to the cloud as usual.
//!
//! Writes a provider makes outside this interface (a provider's own controller, such as the
//! AWS tagging controller) are the provider's to guard: it gets the [`DryRun`] in
//! [`InitContext::dry_run`]. A provider's own controller reaches the provider's concrete type
//! through [`crate::controllers::ControllerContext::provider`], which looks through this wrapper.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_controller_manager::{metrics::Metrics, writes::DryRun};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use tracing::debug;

use crate::{
    cloud::{
        CloudProvider, Clusters, InitContext, Instances, InstancesV2, LoadBalancer, Route, Routes, Zones,
    },
    controllers::{route, service},
    error::{CloudError, CloudResult},
};

/// The suffix of the placeholder hostname a dry-run `EnsureLoadBalancer` answers for a load
/// balancer that does not exist yet.
pub const PLACEHOLDER_SUFFIX: &str = ".dry-run.invalid";

/// A provider whose cloud writes are logged, or (with a [`DryRun`]) recorded and not made.
pub struct AuditedCloud {
    inner: Arc<dyn CloudProvider>,
    dry_run: Option<DryRun>,
    fence: Option<tokio_util::sync::CancellationToken>,
}

impl AuditedCloud {
    /// Wraps `inner`; `dry_run` switches shadow mode on.
    pub fn new(inner: Arc<dyn CloudProvider>, dry_run: Option<DryRun>) -> Self {
        Self {
            inner,
            dry_run,
            fence: None,
        }
    }

    /// Refuses every write from the moment `fence` is cancelled (the controller manager
    /// cancels it when its lease is lost, from the thread that renews the lease): a write the
    /// controllers attempt after that is an error, whatever state their tasks are in.
    pub fn with_fence(mut self, fence: tokio_util::sync::CancellationToken) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The provider itself.
    pub fn inner(&self) -> &Arc<dyn CloudProvider> {
        &self.inner
    }

    /// Whether writes are recorded instead of made.
    pub fn is_dry_run(&self) -> bool {
        self.dry_run.is_some()
    }

    /// Records (dry run: `true`, the caller must not write) or logs (`false`) one write; an
    /// error once the fence is down.
    fn write(&self, controller: &str, action: &str, object: &str) -> CloudResult<bool> {
        if self.fence.as_ref().is_some_and(|f| f.is_cancelled()) {
            return Err(CloudError::msg(format!(
                "{action} {object}: not written: this controller manager lost its leadership"
            )));
        }
        Ok(match &self.dry_run {
            Some(dry_run) => {
                dry_run.record(controller, action, object);
                true
            }
            None => {
                debug!(dry_run = false, controller, action, object, "write");
                false
            }
        })
    }
}

fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

fn route_key(route: &Route) -> String {
    format!("{} {}", route.target_node, route.destination_cidr)
}

#[async_trait]
impl CloudProvider for AuditedCloud {
    fn provider_name(&self) -> &str {
        self.inner.provider_name()
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        self.inner.initialize(ctx).await
    }

    async fn shutdown(&self) {
        self.inner.shutdown().await
    }

    fn register_metrics(&self, metrics: &Metrics) {
        self.inner.register_metrics(metrics)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.inner.load_balancer().map(|_| self as &dyn LoadBalancer)
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

    fn clusters(&self) -> Option<&dyn Clusters> {
        self.inner.clusters()
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.inner.routes().map(|_| self as &dyn Routes)
    }

    fn has_cluster_id(&self) -> bool {
        self.inner.has_cluster_id()
    }

    fn cidr_allocator(&self) -> Option<&dyn crate::controllers::nodeipam::CloudCidrAllocator> {
        // Read-only: the controller writes the Nodes, never the cloud.
        self.inner.cidr_allocator()
    }
}

impl AuditedCloud {
    /// The provider's load balancers (`NotImplemented` if the provider stopped offering them).
    fn lb(&self) -> CloudResult<&dyn LoadBalancer> {
        self.inner.load_balancer().ok_or(CloudError::NotImplemented)
    }

    /// The provider's routes (`NotImplemented` if the provider stopped offering them).
    fn rt(&self) -> CloudResult<&dyn Routes> {
        self.inner.routes().ok_or(CloudError::NotImplemented)
    }
}

#[async_trait]
impl LoadBalancer for AuditedCloud {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.lb()?.get_load_balancer(cluster_name, service).await
    }

    fn get_load_balancer_name(&self, cluster_name: &str, service: &Service) -> String {
        match self.lb() {
            Ok(lb) => lb.get_load_balancer_name(cluster_name, service),
            Err(_) => crate::service::helpers::default_load_balancer_name(service),
        }
    }

    fn sync_again_after_status(&self, service: &Service) -> bool {
        self.lb().is_ok_and(|lb| lb.sync_again_after_status(service))
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        if !self.write(service::CLIENT_NAME, "EnsureLoadBalancer", &service_key(service))? {
            return self
                .lb()?
                .ensure_load_balancer(cluster_name, service, nodes)
                .await;
        }
        if let Some(status) = self.lb()?.get_load_balancer(cluster_name, service).await? {
            return Ok(status);
        }
        let name = self.get_load_balancer_name(cluster_name, service);
        Ok(LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                hostname: Some(format!("{name}{PLACEHOLDER_SUFFIX}")),
                ..Default::default()
            }]),
        })
    }

    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        if !self.write(service::CLIENT_NAME, "UpdateLoadBalancer", &service_key(service))? {
            return self
                .lb()?
                .update_load_balancer(cluster_name, service, nodes)
                .await;
        }
        Ok(())
    }

    async fn ensure_load_balancer_deleted(&self, cluster_name: &str, service: &Service) -> CloudResult<()> {
        if !self.write(
            service::CLIENT_NAME,
            "EnsureLoadBalancerDeleted",
            &service_key(service),
        )? {
            return self
                .lb()?
                .ensure_load_balancer_deleted(cluster_name, service)
                .await;
        }
        Ok(())
    }
}

#[async_trait]
impl Routes for AuditedCloud {
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        self.rt()?.list_routes(cluster_name).await
    }

    async fn create_route(&self, cluster_name: &str, name_hint: &str, route: &Route) -> CloudResult<()> {
        if !self.write(route::CLIENT_NAME, "CreateRoute", &route_key(route))? {
            return self.rt()?.create_route(cluster_name, name_hint, route).await;
        }
        Ok(())
    }

    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()> {
        if !self.write(route::CLIENT_NAME, "DeleteRoute", &route_key(route))? {
            return self.rt()?.delete_route(cluster_name, route).await;
        }
        Ok(())
    }
}
