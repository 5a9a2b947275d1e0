//! The service-lb controller (`service-lb-controller`, spec §4): a cloud load balancer for
//! every `type: LoadBalancer` Service without `spec.loadBalancerClass`.
//!
//! - The finalizer `service.kubernetes.io/load-balancer-cleanup` is added **before** the cloud
//!   is asked to create anything and removed only **after** the load balancer is deleted, so a
//!   Service can never disappear while its load balancer lives on.
//! - `.status.loadBalancer` is written through the status subresource, only when the ingress
//!   list changes.
//! - Backends follow the newest node predicates (not being deleted, exclusion label, no
//!   cluster-autoscaler deletion taint; readiness ignored). A node-set change updates every
//!   load balancer whose (name, providerID, labels) set changed, in parallel. (Upstream
//!   ignores label changes, so provider label filters such as AWS `target-node-labels` did not
//!   follow them; deliberate difference.)
//! - Per-service back-off 5 s → 300 s; a provider's `CloudError::Retry` re-queues after
//!   exactly its delay.
//! - Events use upstream's reasons and messages exactly.

use std::{collections::HashMap, sync::Arc, time::Instant};

use futures::StreamExt;
use k8s_controller_manager::{
    events::{EventRecorder, EventType},
    informer::{InformerEvent, next_event, object_key},
    workqueue::{ExponentialBackoff, WorkQueue},
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, ObjectReference, Service};
use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
};
use parking_lot::Mutex;
use tracing::{info, info_span, warn};

use super::{ControllerContext, is_not_found};
use crate::{
    error::CloudError,
    node::helpers::provider_id,
    service::helpers::{
        is_load_balancer_backend, load_balancer_backends, load_balancer_status_equal, needs_cleanup,
        needs_update, node_set_fingerprint, wants_load_balancer,
    },
    well_known::{FINALIZER_LOAD_BALANCER_CLEANUP, events},
};

/// Canonical controller name.
pub const NAME: &str = "service-lb-controller";
/// Client name (credentials).
pub const CLIENT_NAME: &str = "service-controller";
/// Event source component.
pub const COMPONENT: &str = "service-controller";
/// Per-service back-off (minRetryDelay / maxRetryDelay).
pub const BACKOFF: ExponentialBackoff = ExponentialBackoff {
    base: std::time::Duration::from_secs(5),
    max: std::time::Duration::from_secs(300),
};

/// A service sync failure.
#[derive(Debug, thiserror::Error)]
pub enum ServiceSyncError {
    /// A cloud call failed (the message says which).
    #[error("{context}: {source}")]
    Cloud {
        /// What was being done.
        context: &'static str,
        /// The cloud's error (a `Retry` keeps its delay).
        #[source]
        source: CloudError,
    },
    /// An API call failed.
    #[error("{context}: {source}")]
    Api {
        /// What was being done.
        context: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

impl ServiceSyncError {
    fn retry_delay(&self) -> Option<std::time::Duration> {
        match self {
            Self::Cloud { source, .. } => source.retry_delay(),
            Self::Api { .. } => None,
        }
    }
}

/// How soon a Service is synced again when the provider asks for it after a status update
/// ([`crate::LoadBalancer::sync_again_after_status`]): time for the informer to see the new status.
const SYNC_AGAIN_AFTER_STATUS: std::time::Duration = std::time::Duration::from_secs(1);

struct CachedService {
    state: Arc<Service>,
    last_synced_nodes: Vec<Arc<Node>>,
}

/// The service-lb controller.
pub struct ServiceController {
    ctx: ControllerContext,
    client: kube::Client,
    service_queue: WorkQueue<String>,
    node_queue: WorkQueue<String>,
    cache: Mutex<HashMap<String, CachedService>>,
    /// One lock per Service key, held by its sync and by the node sync's update of it: the
    /// cloud never sees an update of a load balancer interleaved with its deletion (found by
    /// the crash trials: a restarted CCM's node sync re-granted an NLB's node rules while the
    /// Service's deletion had just revoked them, and they outlived the NLB).
    key_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    recorder: EventRecorder,
}

/// Holds one Service's key lock; drops the lock's map entry when no one else waits for it.
struct KeyGuard<'a> {
    locks: &'a Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    key: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        let mut locks = self.locks.lock();
        self.guard.take();
        if locks.get(&self.key).is_some_and(|l| Arc::strong_count(l) == 1) {
            locks.remove(&self.key);
        }
    }
}

impl ServiceController {
    /// Builds the controller; fails (skipped) when the provider has no load balancers.
    pub fn new(ctx: ControllerContext) -> Result<Self, String> {
        if ctx.cloud.load_balancer().is_none() {
            return Err("the cloud provider does not support external load balancers".into());
        }
        if ctx.config.concurrent_service_syncs == 0 {
            return Err("concurrent-service-syncs must be a positive number".into());
        }
        let wq = Some(ctx.metrics.workqueue.clone());
        let (service_queue, node_queue) = (
            WorkQueue::new("service", BACKOFF, wq.clone()),
            WorkQueue::new("node", BACKOFF, wq),
        );
        ctx.register_queue(NAME, &service_queue);
        ctx.register_queue(NAME, &node_queue);
        Ok(Self {
            client: ctx.client_for(CLIENT_NAME),
            service_queue,
            node_queue,
            cache: Mutex::new(HashMap::new()),
            key_locks: Mutex::new(HashMap::new()),
            recorder: ctx.events.recorder(COMPONENT),
            ctx,
        })
    }

    /// Runs until shutdown.
    pub async fn run(self) {
        let this = Arc::new(self);
        this.service_queue.start_time_metrics();
        this.node_queue.start_time_metrics();
        let mut service_events = this.ctx.services.subscribe();
        let mut node_events = this.ctx.nodes.subscribe();
        let (services, nodes) = (this.ctx.services.store(), this.ctx.nodes.store());
        tokio::select! {
            _ = async { services.wait_synced().await; nodes.wait_synced().await } => {}
            _ = this.ctx.shutdown.cancelled() => return,
        }
        this.enqueue_all();
        let service_pump = {
            let this = this.clone();
            tokio::spawn(async move {
                while let Some(ev) = next_event(&mut service_events).await {
                    match ev {
                        InformerEvent::Added(s) => {
                            if wants_load_balancer(&s) || needs_cleanup(&s) {
                                this.service_queue.add(object_key(s.as_ref()));
                            }
                        }
                        InformerEvent::Updated { old, new } => {
                            let reason = needs_update(&old, &new);
                            if let Some(r) = reason {
                                info!(service = %object_key(new.as_ref()), reason = r, "service needs a load-balancer update");
                            }
                            if reason.is_some() || needs_cleanup(&new) {
                                this.service_queue.add(object_key(new.as_ref()));
                            }
                        }
                        // Deletion is driven by the finalizer (deletionTimestamp is an update).
                        InformerEvent::Deleted(_) => {}
                        InformerEvent::Resync => this.enqueue_all(),
                    }
                }
            })
        };
        let node_pump = {
            let this = this.clone();
            tokio::spawn(async move {
                while let Some(ev) = next_event(&mut node_events).await {
                    match ev {
                        InformerEvent::Added(n) | InformerEvent::Deleted(n) => {
                            this.node_queue.add(n.metadata.name.clone().unwrap_or_default())
                        }
                        InformerEvent::Updated { old, new } => {
                            if is_load_balancer_backend(&old) != is_load_balancer_backend(&new)
                                || provider_id(&old) != provider_id(&new)
                                || old.metadata.labels != new.metadata.labels
                            {
                                this.node_queue.add(new.metadata.name.clone().unwrap_or_default());
                            }
                        }
                        InformerEvent::Resync => this.node_queue.add(String::new()),
                    }
                }
            })
        };
        let node_worker = {
            let this = this.clone();
            tokio::spawn(async move {
                while let Some(key) = this.node_queue.get().await {
                    // A panic fails this pass only (counted); the next node change or resync
                    // retries.
                    let _ = super::catch_panic(&this.ctx, NAME, "node sync", this.sync_nodes()).await;
                    this.node_queue.forget(&key);
                    this.node_queue.done(&key);
                }
            })
        };
        let workers: Vec<_> = (0..this.ctx.config.concurrent_service_syncs)
            .map(|_| {
                let this = this.clone();
                tokio::spawn(async move { this.service_worker().await })
            })
            .collect();
        let workers_len = workers.len();
        let mut tasks = workers;
        tasks.extend([service_pump, node_pump, node_worker]);
        // Dropped with this future (the controller's task aborted): its tasks are aborted too.
        let _tasks_guard = super::AbortOnDrop::of(&tasks);
        super::supervise_tasks(NAME, &this.ctx.shutdown, &mut tasks).await;
        this.service_queue.shut_down();
        this.node_queue.shut_down();
        // Workers finish the reconcile in hand (the queue is shut down); pumps and loops stop.
        let worker_count = workers_len;
        for (i, t) in tasks.into_iter().enumerate() {
            if i >= worker_count {
                t.abort();
            }
            let _ = t.await;
        }
    }

    fn enqueue_all(&self) {
        for s in self.ctx.services.store().list() {
            if wants_load_balancer(&s) || needs_cleanup(&s) {
                self.service_queue.add(object_key(s.as_ref()));
            }
        }
    }

    async fn lock_key(&self, key: &str) -> KeyGuard<'_> {
        let lock = self.key_locks.lock().entry(key.to_string()).or_default().clone();
        KeyGuard {
            locks: &self.key_locks,
            key: key.to_string(),
            guard: Some(lock.lock_owned().await),
        }
    }

    async fn service_worker(&self) {
        super::work(
            &self.ctx,
            NAME,
            &self.service_queue,
            |key| info_span!("reconcile", controller = NAME, service = %key),
            |key| async move {
                let _locked = self.lock_key(&key).await;
                self.sync_service(&key).await
            },
            ServiceSyncError::retry_delay,
        )
        .await;
    }

    fn service_api(&self, service: &Service) -> Api<Service> {
        Api::namespaced(
            self.client.clone(),
            service.metadata.namespace.as_deref().unwrap_or("default"),
        )
    }

    fn event(&self, service: &Service, type_: EventType, reason: &str, message: impl Into<String>) {
        let reference: ObjectReference = service.object_ref(&());
        self.recorder.event(&reference, type_, reason, message);
    }

    /// Syncs one Service by key (`namespace/name`).
    pub async fn sync_service(&self, key: &str) -> Result<(), ServiceSyncError> {
        let Some(service) = self.ctx.services.store().get(key) else {
            return self.process_service_deletion(key).await;
        };
        // A Service deleted and re-created (without finalizer) under the same name: delete the
        // old load balancer first.
        let stale = {
            let cache = self.cache.lock();
            cache
                .get(key)
                .filter(|c| c.state.metadata.uid != service.metadata.uid)
                .map(|c| c.state.clone())
        };
        if let Some(old) = stale
            && wants_load_balancer(&old)
        {
            self.delete_cached_load_balancer(&old).await?;
        }
        {
            let mut cache = self.cache.lock();
            let entry = cache.entry(key.to_string()).or_insert_with(|| CachedService {
                state: service.clone(),
                last_synced_nodes: Vec::new(),
            });
            entry.state = service.clone();
        }
        match self.sync_load_balancer_if_needed(&service, key).await {
            Ok(deleted) => {
                if deleted {
                    self.cache.lock().remove(key);
                }
                Ok(())
            }
            Err(e) => {
                self.event(
                    &service,
                    EventType::Warning,
                    events::SYNC_LOAD_BALANCER_FAILED,
                    format!("Error syncing load balancer: {e}"),
                );
                Err(e)
            }
        }
    }

    async fn process_service_deletion(&self, key: &str) -> Result<(), ServiceSyncError> {
        let cached = self.cache.lock().get(key).map(|c| c.state.clone());
        let Some(cached) = cached else { return Ok(()) };
        if wants_load_balancer(&cached) {
            self.delete_cached_load_balancer(&cached).await?;
        }
        self.cache.lock().remove(key);
        Ok(())
    }

    async fn delete_cached_load_balancer(&self, service: &Service) -> Result<(), ServiceSyncError> {
        let lb = self.ctx.cloud.load_balancer().ok_or(ServiceSyncError::Cloud {
            context: "failed to delete load balancer",
            source: CloudError::NotImplemented,
        })?;
        self.event(
            service,
            EventType::Normal,
            events::DELETING_LOAD_BALANCER,
            "Deleting load balancer",
        );
        let r = self
            .ctx
            .cloud_metrics
            .observe(
                NAME,
                "EnsureLoadBalancerDeleted",
                lb.ensure_load_balancer_deleted(&self.ctx.config.cluster_name, service),
            )
            .await;
        match r {
            Ok(()) | Err(CloudError::ImplementedElsewhere) => {}
            Err(e) => {
                self.event(
                    service,
                    EventType::Warning,
                    events::DELETE_LOAD_BALANCER_FAILED,
                    format!("Error deleting load balancer: {e}"),
                );
                return Err(ServiceSyncError::Cloud {
                    context: "failed to delete load balancer",
                    source: e,
                });
            }
        }
        self.event(
            service,
            EventType::Normal,
            events::DELETED_LOAD_BALANCER,
            "Deleted load balancer",
        );
        Ok(())
    }

    /// Returns `Ok(true)` when the delete branch ran.
    async fn sync_load_balancer_if_needed(
        &self,
        service: &Service,
        key: &str,
    ) -> Result<bool, ServiceSyncError> {
        let lb = self.ctx.cloud.load_balancer().ok_or(ServiceSyncError::Cloud {
            context: "failed to ensure load balancer",
            source: CloudError::NotImplemented,
        })?;
        let cluster = self.ctx.config.cluster_name.as_str();
        let previous = service.status.as_ref().and_then(|s| s.load_balancer.clone());
        let m = &self.ctx.cloud_metrics;
        if !wants_load_balancer(service) || needs_cleanup(service) {
            let exists = m
                .observe(NAME, "GetLoadBalancer", lb.get_load_balancer(cluster, service))
                .await
                .map_err(|source| ServiceSyncError::Cloud {
                    context: "failed to check if load balancer exists before cleanup",
                    source,
                })?
                .is_some();
            if exists {
                info!(service = key, "Deleting existing load balancer for service {key}");
                self.event(
                    service,
                    EventType::Normal,
                    events::DELETING_LOAD_BALANCER,
                    "Deleting load balancer",
                );
                match m
                    .observe(
                        NAME,
                        "EnsureLoadBalancerDeleted",
                        lb.ensure_load_balancer_deleted(cluster, service),
                    )
                    .await
                {
                    Ok(()) | Err(CloudError::ImplementedElsewhere) => {}
                    Err(source) => {
                        return Err(ServiceSyncError::Cloud {
                            context: "failed to delete load balancer",
                            source,
                        });
                    }
                }
            }
            self.set_finalizer(service, false)
                .await
                .map_err(|source| ServiceSyncError::Api {
                    context: "failed to remove load balancer cleanup finalizer",
                    source,
                })?;
            self.event(
                service,
                EventType::Normal,
                events::DELETED_LOAD_BALANCER,
                "Deleted load balancer",
            );
            self.patch_status(service, previous.as_ref(), &LoadBalancerStatus::default())
                .await
                .map_err(|source| ServiceSyncError::Api {
                    context: "failed to update load balancer status",
                    source,
                })?;
            return Ok(true);
        }

        self.event(
            service,
            EventType::Normal,
            events::ENSURING_LOAD_BALANCER,
            "Ensuring load balancer",
        );
        self.set_finalizer(service, true)
            .await
            .map_err(|source| ServiceSyncError::Api {
                context: "failed to add load balancer cleanup finalizer",
                source,
            })?;
        let nodes = load_balancer_backends(&self.ctx.nodes.store().list());
        if nodes.is_empty() {
            self.event(
                service,
                EventType::Warning,
                events::UNAVAILABLE_LOAD_BALANCER,
                "There are no available nodes for LoadBalancer",
            );
        }
        if let Some(c) = self.cache.lock().get_mut(key) {
            c.last_synced_nodes = nodes.clone();
        }
        self.ctx.cloud_metrics.loadbalancer_sync_total.inc();
        let status = match m
            .observe(
                NAME,
                "EnsureLoadBalancer",
                lb.ensure_load_balancer(cluster, service, &nodes),
            )
            .await
        {
            Ok(status) => status,
            Err(CloudError::ImplementedElsewhere) => {
                info!(
                    service = key,
                    "LoadBalancer for service {key} implemented by a different controller, ignoring"
                );
                return Ok(false);
            }
            Err(source) => {
                return Err(ServiceSyncError::Cloud {
                    context: "failed to ensure load balancer",
                    source,
                });
            }
        };
        self.event(
            service,
            EventType::Normal,
            events::ENSURED_LOAD_BALANCER,
            "Ensured load balancer",
        );
        self.patch_status(service, previous.as_ref(), &status)
            .await
            .map_err(|source| ServiceSyncError::Api {
                context: "failed to update load balancer status",
                source,
            })?;
        if lb.sync_again_after_status(service) {
            // Once the informer has the new status (the next sync reads the Service from it).
            info!(
                service = key,
                "the provider asked for one more sync once the status shows the new load balancer"
            );
            self.service_queue
                .add_after(key.to_string(), SYNC_AGAIN_AFTER_STATUS);
        }
        Ok(false)
    }

    /// Adds or removes the cleanup finalizer through the status subresource with a strategic
    /// merge patch that names only this finalizer, as upstream's `PatchService` does: no
    /// `resourceVersion` precondition (a stale one made every concurrent change of the Service
    /// fail the sync), and no other finalizer is touched.
    async fn set_finalizer(&self, service: &Service, present: bool) -> Result<(), kube::Error> {
        let has = service
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP);
        if has == present {
            return Ok(());
        }
        let patch = if present {
            serde_json::json!({ "metadata": { "finalizers": [FINALIZER_LOAD_BALANCER_CLEANUP] } })
        } else {
            serde_json::json!({
                "metadata": { "$deleteFromPrimitiveList/finalizers": [FINALIZER_LOAD_BALANCER_CLEANUP] }
            })
        };
        let name = service.metadata.name.as_deref().unwrap_or_default();
        match self
            .service_api(service)
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => Ok(()),
            // Removing the finalizer of a Service that is already gone is done.
            Err(e) if !present && is_not_found(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn patch_status(
        &self,
        service: &Service,
        previous: Option<&LoadBalancerStatus>,
        new: &LoadBalancerStatus,
    ) -> Result<(), kube::Error> {
        if load_balancer_status_equal(previous, Some(new)) {
            return Ok(());
        }
        let mut lb = serde_json::to_value(new).unwrap_or_default();
        if new.ingress.is_none() {
            lb["ingress"] = serde_json::Value::Null;
        }
        let patch = serde_json::json!({ "status": { "loadBalancer": lb } });
        let name = service.metadata.name.as_deref().unwrap_or_default();
        match self
            .service_api(service)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(e) if is_not_found(&e) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Updates the host set of every load balancer whose backends changed (§4.4).
    pub async fn sync_nodes(&self) {
        let start = Instant::now();
        let all_nodes = self.ctx.nodes.store().list();
        let new_nodes = load_balancer_backends(&all_nodes);
        let keys: Vec<String> = self.cache.lock().keys().cloned().collect();
        let failed: Vec<String> = futures::stream::iter(keys)
            .map(|key| {
                let new_nodes = new_nodes.clone();
                async move {
                    let _locked = self.lock_key(&key).await;
                    // Only a Service that still wants its load balancer: one being deleted
                    // (or gone) is left to its own sync.
                    let current = self.ctx.services.store().get(&key)?;
                    if current.metadata.deletion_timestamp.is_some() || !wants_load_balancer(&current) {
                        return None;
                    }
                    let (service, old_nodes) = {
                        let mut cache = self.cache.lock();
                        let entry = cache.get_mut(&key)?;
                        if !wants_load_balancer(&entry.state)
                            || entry.state.metadata.uid != current.metadata.uid
                        {
                            return None;
                        }
                        let old = load_balancer_backends(&entry.last_synced_nodes);
                        entry.last_synced_nodes = new_nodes.clone();
                        (entry.state.clone(), old)
                    };
                    if node_set_fingerprint(&old_nodes) == node_set_fingerprint(&new_nodes) {
                        return None;
                    }
                    match self.update_load_balancer_hosts(&service, &new_nodes).await {
                        Ok(()) => None,
                        Err(e) => {
                            warn!(service = %key, error = %e, "failed to update load balancer hosts");
                            Some(key)
                        }
                    }
                }
            })
            .buffer_unordered(self.ctx.config.concurrent_service_syncs.max(1))
            .filter_map(|x| async move { x })
            .collect()
            .await;
        for key in failed {
            self.ctx.cloud_metrics.nodesync_error_total.inc();
            self.service_queue.add(key);
        }
        self.ctx
            .cloud_metrics
            .nodesync_latency
            .observe(start.elapsed().as_secs_f64());
    }

    async fn update_load_balancer_hosts(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), CloudError> {
        let lb = self.ctx.cloud.load_balancer().ok_or(CloudError::NotImplemented)?;
        let cluster = self.ctx.config.cluster_name.as_str();
        let start = Instant::now();
        self.ctx.cloud_metrics.loadbalancer_sync_total.inc();
        let m = &self.ctx.cloud_metrics;
        let result = m
            .observe(
                NAME,
                "UpdateLoadBalancer",
                lb.update_load_balancer(cluster, service, nodes),
            )
            .await;
        self.ctx
            .cloud_metrics
            .update_loadbalancer_host_latency
            .observe(start.elapsed().as_secs_f64());
        match result {
            Ok(()) | Err(CloudError::ImplementedElsewhere) => {
                if nodes.is_empty() {
                    self.event(
                        service,
                        EventType::Warning,
                        events::UNAVAILABLE_LOAD_BALANCER,
                        "There are no available nodes for LoadBalancer",
                    );
                } else {
                    self.event(
                        service,
                        EventType::Normal,
                        events::UPDATED_LOAD_BALANCER,
                        "Updated load balancer with new hosts",
                    );
                }
                Ok(())
            }
            Err(e) => {
                match m
                    .observe(NAME, "GetLoadBalancer", lb.get_load_balancer(cluster, service))
                    .await
                {
                    Ok(None) => return Ok(()),
                    Ok(Some(_)) => {}
                    Err(ge) => warn!(error = %ge, "failed to check whether the load balancer still exists"),
                }
                self.event(
                    service,
                    EventType::Warning,
                    events::UPDATE_LOAD_BALANCER_FAILED,
                    update_failed_message(nodes, &e),
                );
                Err(e)
            }
        }
    }
}

/// `Error updating load balancer with new hosts [a b …] [node names limited, total number of
/// nodes: N], error: E` (at most 20 names, sorted).
pub fn update_failed_message(nodes: &[Arc<Node>], e: &CloudError) -> String {
    let mut names: Vec<String> = nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
    names.sort();
    let total = names.len();
    if names.len() > 20 {
        let more = names.len() - 20;
        names.truncate(20);
        names.push(format!("<{more} more>"));
    }
    format!(
        "Error updating load balancer with new hosts [{}] [node names limited, total number of nodes: {total}], error: {e}",
        names.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    #[test]
    fn update_failure_message_limits_names() {
        let nodes: Vec<Arc<Node>> = (0..23)
            .map(|i| {
                Arc::new(Node {
                    metadata: ObjectMeta {
                        name: Some(format!("n{i:02}")),
                        ..Default::default()
                    },
                    ..Default::default()
                })
            })
            .collect();
        let m = update_failed_message(&nodes, &CloudError::msg("boom"));
        assert!(
            m.starts_with("Error updating load balancer with new hosts [n00 n01"),
            "{m}"
        );
        assert!(
            m.contains("n19 <3 more>] [node names limited, total number of nodes: 23], error: boom"),
            "{m}"
        );
    }
}
