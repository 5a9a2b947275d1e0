//! The four cloud controllers and what they share.
//!
//! | controller | module | upstream name (alias) |
//! |---|---|---|
//! | cloud-node | [`node`] | `cloud-node-controller` (`cloud-node`) |
//! | cloud-node-lifecycle | [`nodelifecycle`] | `cloud-node-lifecycle-controller` (`cloud-node-lifecycle`) |
//! | service-lb | [`service`] | `service-lb-controller` (`service`) |
//! | node-route | [`route`] | `node-route-controller` (`route`) |
//!
//! and one a provider may add ([`nodeipam`], `node-ipam-controller` (`nodeipam`): Pod CIDRs
//! for Nodes with `--allocate-node-cidrs`).
//!
//! Every controller reads Nodes and Services from the shared informers of
//! [`ControllerContext`], writes through its own client, records events under its upstream
//! component name, and stops when the context's shutdown token is cancelled.

pub mod node;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod route;
pub mod service;

use std::{collections::HashMap, future::Future, sync::Arc, time::Duration};

use ipnet::IpNet;
use k8s_controller_manager::{
    events::EventBroadcaster,
    informer::{Informer, strip_managed_fields},
    metrics::Metrics,
};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{Api, Client};
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts};
use tokio_util::sync::CancellationToken;

use crate::{cloud::CloudProvider, error::CloudError};

/// Settings of the controllers (the flags of `--help`'s controller sections).
#[derive(Debug, Clone)]
pub struct ControllersConfig {
    /// `--cluster-name`, passed to load-balancer and route calls.
    pub cluster_name: String,
    /// `--cluster-cidr`, parsed (≤ 2, one per family).
    pub cluster_cidrs: Vec<IpNet>,
    /// `--node-status-update-frequency`.
    pub node_status_update_frequency: Duration,
    /// `--node-monitor-period`.
    pub node_monitor_period: Duration,
    /// `--route-reconciliation-period`.
    pub route_reconciliation_period: Duration,
    /// `--concurrent-node-syncs` (≥ 1).
    pub concurrent_node_syncs: usize,
    /// `--concurrent-node-status-updates` (0 = same as `concurrent_node_syncs`).
    pub concurrent_node_status_updates: usize,
    /// `--concurrent-service-syncs` (≥ 1).
    pub concurrent_service_syncs: usize,
    /// `--cloud-call-timeout`: the longest a controller waits for one cloud call before it
    /// abandons it (the key is retried with back-off; others keep being served).
    pub cloud_call_timeout: Duration,
}

impl Default for ControllersConfig {
    fn default() -> Self {
        Self {
            cluster_name: "kubernetes".into(),
            cluster_cidrs: Vec::new(),
            node_status_update_frequency: Duration::from_secs(300),
            node_monitor_period: Duration::from_secs(5),
            route_reconciliation_period: Duration::from_secs(10),
            concurrent_node_syncs: 1,
            concurrent_node_status_updates: 0,
            concurrent_service_syncs: 1,
            cloud_call_timeout: DEFAULT_CLOUD_CALL_TIMEOUT,
        }
    }
}

/// Default of `--cloud-call-timeout`.
pub const DEFAULT_CLOUD_CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// The cloud controllers' own metrics (names exact as upstream).
#[derive(Debug, Clone)]
pub struct CloudControllerMetrics {
    /// `node_controller_cloud_provider_taint_removal_delay_seconds`
    pub taint_removal_delay: Histogram,
    /// `node_controller_initial_node_sync_delay_seconds`
    pub initial_node_sync_delay: Histogram,
    /// `service_controller_loadbalancer_sync_total`
    pub loadbalancer_sync_total: IntCounter,
    /// `service_controller_nodesync_error_total`
    pub nodesync_error_total: IntCounter,
    /// `service_controller_nodesync_latency_seconds`
    pub nodesync_latency: Histogram,
    /// `service_controller_update_loadbalancer_host_latency_seconds`
    pub update_loadbalancer_host_latency: Histogram,
    /// `route_controller_route_sync_total`
    pub route_sync_total: IntCounter,
    /// `cloudprovider_api_calls_total{controller, operation, result}`: cloud calls made by the
    /// controllers (not part of upstream; shows calls per node at a glance).
    pub cloud_calls: IntCounterVec,
    /// `cloudprovider_api_call_duration_seconds{operation}`.
    pub cloud_call_duration: HistogramVec,
    /// `cloudprovider_api_call_timeouts_total{controller, operation}`: cloud calls abandoned
    /// after `--cloud-call-timeout` (not part of upstream).
    pub cloud_call_timeouts: IntCounterVec,
    /// The `--cloud-call-timeout` applied by [`CloudControllerMetrics::observe`].
    pub call_timeout: Duration,
    /// `node_lifecycle_instance_existence_unknown_total`: times the node-lifecycle controller
    /// kept a Node because the cloud could not tell whether its instance exists (not part of
    /// upstream, which only logs).
    pub existence_unknown_total: IntCounter,
}

impl CloudControllerMetrics {
    /// Creates the metrics and registers them in `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        let node_buckets = vec![1.0, 4.0, 16.0, 64.0, 256.0, 1024.0];
        let service_buckets = prometheus::exponential_buckets(1.0, 2.0, 15).expect("static buckets");
        let h = |name: &str, help: &str, buckets: Vec<f64>| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid metric")
        };
        let c = |name: &str, help: &str| IntCounter::with_opts(Opts::new(name, help)).expect("valid metric");
        let m = Self {
            taint_removal_delay: h(
                "node_controller_cloud_provider_taint_removal_delay_seconds",
                "Number of seconds after node creation when NodeController removed the cloud-provider taint of a single node.",
                node_buckets.clone(),
            ),
            initial_node_sync_delay: h(
                "node_controller_initial_node_sync_delay_seconds",
                "Number of seconds after node creation when NodeController finished the initial synchronization of a single node.",
                node_buckets,
            ),
            loadbalancer_sync_total: c(
                "service_controller_loadbalancer_sync_total",
                "A metric counting the amount of times any load balancer has been configured, as an effect of service/node changes on the cluster",
            ),
            nodesync_error_total: c(
                "service_controller_nodesync_error_total",
                "A metric counting the amount of times any load balancer has been configured and errored, as an effect of node changes on the cluster",
            ),
            nodesync_latency: h(
                "service_controller_nodesync_latency_seconds",
                "A metric measuring the latency for nodesync which updates loadbalancer hosts on cluster node updates.",
                service_buckets.clone(),
            ),
            update_loadbalancer_host_latency: h(
                "service_controller_update_loadbalancer_host_latency_seconds",
                "A metric measuring the latency for updating each load balancer hosts.",
                service_buckets,
            ),
            route_sync_total: c(
                "route_controller_route_sync_total",
                "A metric counting the amount of times routes have been synced with the cloud provider.",
            ),
            cloud_calls: IntCounterVec::new(
                Opts::new(
                    "cloudprovider_api_calls_total",
                    "Cloud provider interface calls made by the cloud controllers.",
                ),
                &["controller", "operation", "result"],
            )
            .expect("valid metric"),
            cloud_call_duration: HistogramVec::new(
                HistogramOpts::new(
                    "cloudprovider_api_call_duration_seconds",
                    "Duration of cloud provider interface calls.",
                )
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 16).expect("static buckets")),
                &["operation"],
            )
            .expect("valid metric"),
            cloud_call_timeouts: IntCounterVec::new(
                Opts::new(
                    "cloudprovider_api_call_timeouts_total",
                    "Cloud provider interface calls abandoned after --cloud-call-timeout.",
                ),
                &["controller", "operation"],
            )
            .expect("valid metric"),
            call_timeout: DEFAULT_CLOUD_CALL_TIMEOUT,
            existence_unknown_total: c(
                "node_lifecycle_instance_existence_unknown_total",
                "Times a Node that is not Ready was kept because the cloud provider could not tell whether its instance exists.",
            ),
        };
        metrics.register(Box::new(m.existence_unknown_total.clone()));
        metrics.register(Box::new(m.cloud_call_timeouts.clone()));
        metrics.register(Box::new(m.taint_removal_delay.clone()));
        metrics.register(Box::new(m.initial_node_sync_delay.clone()));
        metrics.register(Box::new(m.loadbalancer_sync_total.clone()));
        metrics.register(Box::new(m.nodesync_error_total.clone()));
        metrics.register(Box::new(m.nodesync_latency.clone()));
        metrics.register(Box::new(m.update_loadbalancer_host_latency.clone()));
        metrics.register(Box::new(m.route_sync_total.clone()));
        metrics.register(Box::new(m.cloud_calls.clone()));
        metrics.register(Box::new(m.cloud_call_duration.clone()));
        m
    }

    /// Bounds a cloud call that does not go through the [`CloudProvider`] interface (a
    /// provider's own controller calling its cloud): abandoned after
    /// [`CloudControllerMetrics::call_timeout`] (`--cloud-call-timeout`), counted in
    /// `cloudprovider_api_call_timeouts_total{controller, operation}`; `Err` names the call.
    pub async fn bounded<T>(
        &self,
        controller: &str,
        operation: &str,
        call: impl Future<Output = T>,
    ) -> Result<T, CloudError> {
        tokio::time::timeout(self.call_timeout, call).await.map_err(|_| {
            self.cloud_call_timeouts
                .with_label_values(&[controller, operation])
                .inc();
            tracing::warn!(controller, operation, timeout = ?self.call_timeout, "cloud call timed out");
            CloudError::msg(format!(
                "cloud call {operation} did not return within {:?} (--cloud-call-timeout); abandoned",
                self.call_timeout
            ))
        })
    }

    /// Times a cloud call and counts it by controller, operation and result; a call that does
    /// not return within [`CloudControllerMetrics::call_timeout`] is abandoned, counted in
    /// `cloudprovider_api_call_timeouts_total` and turned into an error naming it.
    pub async fn observe<T>(
        &self,
        controller: &str,
        operation: &str,
        call: impl Future<Output = Result<T, CloudError>>,
    ) -> Result<T, CloudError> {
        let start = std::time::Instant::now();
        let r = match tokio::time::timeout(self.call_timeout, call).await {
            Ok(r) => r,
            Err(_) => {
                self.cloud_call_timeouts
                    .with_label_values(&[controller, operation])
                    .inc();
                tracing::warn!(controller, operation, timeout = ?self.call_timeout, "cloud call timed out");
                Err(CloudError::msg(format!(
                    "cloud provider call {operation} did not return within {:?} (--cloud-call-timeout); abandoned",
                    self.call_timeout
                )))
            }
        };
        self.cloud_call_duration
            .with_label_values(&[operation])
            .observe(start.elapsed().as_secs_f64());
        self.cloud_calls
            .with_label_values(&[controller, operation, if r.is_ok() { "success" } else { "error" }])
            .inc();
        r
    }
}

/// Everything a cloud controller needs. Cheap to clone.
#[derive(Clone)]
pub struct ControllerContext {
    /// The root client (the controller manager's identity).
    pub client: Client,
    /// Per-controller clients by client name (`node-controller`, `service-controller`,
    /// `route-controller`), with `--use-service-account-credentials`. Missing ⇒ `client`.
    pub clients: Arc<HashMap<String, Client>>,
    /// The cloud provider.
    pub cloud: Arc<dyn CloudProvider>,
    /// Shared Node informer (stored without `status.images` and `managedFields`).
    pub nodes: Informer<Node>,
    /// Shared Service informer (stored without `managedFields`).
    pub services: Informer<Service>,
    /// Event writer.
    pub events: EventBroadcaster,
    /// The process's metrics registry.
    pub metrics: Arc<Metrics>,
    /// The cloud controllers' metrics.
    pub cloud_metrics: Arc<CloudControllerMetrics>,
    /// Controller settings.
    pub config: Arc<ControllersConfig>,
    /// Cancelled to stop every controller.
    pub shutdown: CancellationToken,
    /// Per controller, probes of how long its longest-running worker has been on one key
    /// (registered by the controllers; read by the per-controller health checks).
    pub worker_probes: Arc<parking_lot::Mutex<HashMap<String, Vec<WorkerProbe>>>>,
}

/// How long a controller's longest-running worker has been processing one key.
pub type WorkerProbe = Arc<dyn Fn() -> Duration + Send + Sync>;

impl std::fmt::Debug for ControllerContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerContext")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ControllerContext {
    /// Registers a work queue of `controller` for its stuck-worker health check.
    pub fn register_queue<T: Eq + std::hash::Hash + Clone + Send + Sync + 'static>(
        &self,
        controller: &str,
        queue: &k8s_controller_manager::workqueue::WorkQueue<T>,
    ) {
        let q = queue.clone();
        self.worker_probes
            .lock()
            .entry(controller.to_string())
            .or_default()
            .push(Arc::new(move || q.longest_running()));
    }

    /// A worker of `controller` busy with one key for longer than twice
    /// `--cloud-call-timeout` (a reconcile makes a few cloud calls, each bounded by it): the
    /// error its health check reports.
    pub fn stuck_worker(&self, controller: &str) -> Result<(), String> {
        let limit = self.config.cloud_call_timeout * 2;
        let longest = self
            .worker_probes
            .lock()
            .get(controller)
            .into_iter()
            .flatten()
            .map(|p| p())
            .max()
            .unwrap_or_default();
        if longest > limit {
            Err(format!(
                "a worker has been processing one key for {longest:?}, more than {limit:?} (2 × --cloud-call-timeout)"
            ))
        } else {
            Ok(())
        }
    }

    /// The provider as its concrete type `T`, for a controller a provider adds: looks through
    /// the [`crate::dry_run::AuditedCloud`] the controller manager wraps the provider in.
    pub fn provider<T: CloudProvider>(&self) -> Option<&T> {
        let cloud: &dyn std::any::Any = self.cloud.as_ref();
        if let Some(audited) = cloud.downcast_ref::<crate::dry_run::AuditedCloud>() {
            let inner: &dyn std::any::Any = audited.inner().as_ref();
            return inner.downcast_ref::<T>();
        }
        cloud.downcast_ref::<T>()
    }

    /// The client for a controller's client name.
    pub fn client_for(&self, client_name: &str) -> Client {
        self.clients
            .get(client_name)
            .cloned()
            .unwrap_or_else(|| self.client.clone())
    }
}

/// The shared informers the controllers read from.
pub fn node_informer(client: Client) -> Informer<Node> {
    Informer::new(
        Api::all(client),
        Some(Arc::new(|n: &mut Node| {
            strip_managed_fields(n);
            if let Some(status) = n.status.as_mut() {
                status.images = None;
            }
        })),
    )
}

/// The shared Service informer (all namespaces).
pub fn service_informer(client: Client) -> Informer<Service> {
    Informer::new(
        Api::all(client),
        Some(Arc::new(|s: &mut Service| strip_managed_fields(s))),
    )
}

/// Retries `f` while it fails with HTTP 409 Conflict, up to `steps` attempts, sleeping
/// `base`..`2×base` (jitter 1.0) between attempts — client-go's `RetryOnConflict`.
pub async fn retry_on_conflict<T, F, Fut>(steps: usize, base: Duration, mut f: F) -> Result<T, kube::Error>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        match f(attempt).await {
            Err(kube::Error::Api(s)) if s.code == 409 && attempt + 1 < steps => {
                attempt += 1;
                let jitter = rand::random::<f64>();
                tokio::time::sleep(base.mul_f64(1.0 + jitter)).await;
            }
            other => return other,
        }
    }
}

/// Whether a kube error is HTTP 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// An `ObjectReference` to a Node, as upstream builds for node events (`v1`, `Node`, name, uid).
pub fn node_reference(node: &Node) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: node.metadata.name.clone(),
        uid: node.metadata.uid.clone(),
        ..Default::default()
    }
}

impl ControllerContext {
    /// A context with fresh shared informers (not yet running: see
    /// [`ControllerContext::start_informers`]) and the cloud controllers' metrics registered in
    /// `metrics`.
    pub fn new(
        client: Client,
        cloud: Arc<dyn CloudProvider>,
        config: ControllersConfig,
        metrics: Arc<Metrics>,
        events: EventBroadcaster,
        shutdown: CancellationToken,
    ) -> Self {
        let mut cloud_metrics = CloudControllerMetrics::new(&metrics);
        cloud_metrics.call_timeout = config.cloud_call_timeout;
        let cloud_metrics = Arc::new(cloud_metrics);
        Self {
            nodes: node_informer(client.clone()),
            services: service_informer(client.clone()),
            client,
            clients: Arc::new(HashMap::new()),
            cloud,
            events,
            metrics,
            cloud_metrics,
            config: Arc::new(config),
            shutdown,
            worker_probes: Arc::default(),
        }
    }

    /// Starts the shared Node and Service informers (they stop with the shutdown token).
    pub fn start_informers(&self) -> Vec<tokio::task::JoinHandle<()>> {
        vec![
            tokio::spawn(self.nodes.clone().run(self.shutdown.clone())),
            tokio::spawn(self.services.clone().run(self.shutdown.clone())),
        ]
    }
}

/// One cloud controller, as the controller manager knows it: every place that needs to know
/// the controllers (flags, aliases, credentials, metrics labels, start) reads this table.
#[derive(Debug, Clone, Copy)]
pub struct ControllerSpec {
    /// Canonical name (`--controllers`, health check, leader migration).
    pub name: &'static str,
    /// The 1.20 name: an alias and the `running_managed_controllers` label.
    pub legacy_name: &'static str,
    /// Other accepted names in `--controllers` and leader-migration configs.
    pub extra_aliases: &'static [&'static str],
    /// Client name (per-controller credentials, user agent).
    pub client_name: &'static str,
    /// Builds and spawns it; `Err` says why it is skipped (e.g. a missing capability).
    pub start: fn(ControllerContext) -> Result<tokio::task::JoinHandle<()>, String>,
}

/// The cloud controllers, in start order (spec §6.3; `service-controller` and
/// `route-controller` are accepted as aliases too, see §7.2).
pub const CONTROLLERS: [ControllerSpec; 4] = [
    ControllerSpec {
        name: node::NAME,
        legacy_name: "cloud-node",
        extra_aliases: &[],
        client_name: node::CLIENT_NAME,
        start: |ctx| Ok(tokio::spawn(node::CloudNodeController::new(ctx)?.run())),
    },
    ControllerSpec {
        name: nodelifecycle::NAME,
        legacy_name: "cloud-node-lifecycle",
        extra_aliases: &[],
        client_name: nodelifecycle::CLIENT_NAME,
        start: |ctx| {
            Ok(tokio::spawn(
                nodelifecycle::CloudNodeLifecycleController::new(ctx)?.run(),
            ))
        },
    },
    ControllerSpec {
        name: service::NAME,
        legacy_name: "service",
        extra_aliases: &["service-controller"],
        client_name: service::CLIENT_NAME,
        start: |ctx| Ok(tokio::spawn(service::ServiceController::new(ctx)?.run())),
    },
    ControllerSpec {
        name: route::NAME,
        legacy_name: "route",
        extra_aliases: &["route-controller"],
        client_name: route::CLIENT_NAME,
        start: |ctx| Ok(tokio::spawn(route::RouteController::new(ctx)?.run())),
    },
];

/// Canonical names of the cloud controllers, in start order.
pub const CONTROLLER_NAMES: [&str; 4] = [
    CONTROLLERS[0].name,
    CONTROLLERS[1].name,
    CONTROLLERS[2].name,
    CONTROLLERS[3].name,
];

/// The table entry of a canonical name.
pub fn controller_spec(name: &str) -> Option<&'static ControllerSpec> {
    CONTROLLERS.iter().find(|c| c.name == name)
}

/// Builds and starts the controller with canonical name `name`. `Err` carries why it was not
/// started (e.g. the provider lacks the capability), which the controller manager logs as
/// "Skipping".
pub fn start_controller(name: &str, ctx: &ControllerContext) -> Result<tokio::task::JoinHandle<()>, String> {
    match controller_spec(name) {
        Some(spec) => (spec.start)(ctx.clone()),
        None => Err(format!("{name:?} is not in the list of known controllers")),
    }
}

/// The message of a panic payload (`panic!("…")` carries a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_string()
    }
}

/// Runs `fut` and catches a panic in it: `Ok(output)`, or `Err(message)` once the panic is
/// logged (with `what`, e.g. the key) and counted in `controller_panics_total{controller}`.
///
/// Upstream's controllers let a panic crash the whole process (`HandleCrash` re-panics), so a
/// single Service or Node whose data trips a bug keeps the whole cloud-controller-manager in a
/// crash loop. Here one reconcile or one periodic pass fails alone and is retried; the others
/// keep being served.
pub async fn catch_panic<T>(
    ctx: &ControllerContext,
    controller: &'static str,
    what: &str,
    fut: impl Future<Output = T>,
) -> Result<T, String> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(fut).catch_unwind().await {
        Ok(output) => Ok(output),
        Err(payload) => {
            let message = panic_message(payload.as_ref());
            ctx.metrics.panics_total.with_label_values(&[controller]).inc();
            tracing::error!(controller, key = what, panic = %message, "{controller}: {what} panicked (retried): {message}");
            Err(message)
        }
    }
}

/// Aborts tasks when dropped: held by the future that spawned them, it ties the tasks' lives
/// to that future's. A controller's `run` keeps one for its workers, pumps and loops, so that
/// when the controller's own task is aborted (the controller manager's drain cap, a lost
/// lease) its workers stop too instead of running on, detached, with nobody to wait for them.
#[derive(Debug, Default)]
pub struct AbortOnDrop(Vec<tokio::task::AbortHandle>);

impl AbortOnDrop {
    /// Guards the tasks of `handles`.
    pub fn of<'a>(handles: impl IntoIterator<Item = &'a tokio::task::JoinHandle<()>>) -> Self {
        Self(handles.into_iter().map(|h| h.abort_handle()).collect())
    }

    /// Guards one more task.
    pub fn push(&mut self, handle: &tokio::task::JoinHandle<()>) {
        self.0.push(handle.abort_handle());
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Waits until `shutdown` is cancelled while the controller's own tasks (informer pumps,
/// workers, periodic loops) run. If one of them ends before that, it is a bug (panics inside
/// reconciles are caught by [`work`] and [`catch_panic`]): the controller then stops its
/// other tasks and panics with the task's message, so that its own task ends by a panic, which
/// the controller manager treats as fatal (it releases its leases and exits non-zero; the
/// kubelet restarts it, as after upstream's crash).
pub async fn supervise_tasks(
    controller: &'static str,
    shutdown: &CancellationToken,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) {
    if tasks.is_empty() {
        shutdown.cancelled().await;
        return;
    }
    let ended = tokio::select! {
        _ = shutdown.cancelled() => return,
        (result, index, _) = futures::future::select_all(tasks.iter_mut()) => (result, index),
    };
    if shutdown.is_cancelled() {
        return;
    }
    let (result, index) = ended;
    tasks.remove(index);
    for t in tasks.iter() {
        t.abort();
    }
    let why = match result {
        Err(e) if e.is_panic() => panic_message(e.into_panic().as_ref()),
        Err(e) => e.to_string(),
        Ok(()) => "returned before shutdown".to_string(),
    };
    panic!("{controller}: one of its tasks stopped: {why}");
}

/// The worker loop shared by the queue-driven controllers (client-go's `processNextWorkItem`):
/// takes keys from `queue` until it shuts down; reconciles each inside `span`; records
/// `controller_reconcile_duration_seconds` and `controller_reconcile_total{result}`; on
/// success forgets the key's failures; on error re-adds it after the provider's fixed delay
/// (`retry_after`, result `requeue`) or with the queue's back-off (result `error`); a panic
/// in the reconcile is caught, logged with the key, counted (`controller_panics_total`,
/// result `panic`) and the key retried with the queue's back-off; always marks the key done.
pub async fn work<K, E, Fut>(
    ctx: &ControllerContext,
    controller: &'static str,
    queue: &k8s_controller_manager::workqueue::WorkQueue<K>,
    span: impl Fn(&K) -> tracing::Span,
    reconcile: impl Fn(K) -> Fut,
    retry_after: impl Fn(&E) -> Option<Duration>,
) where
    K: Eq + std::hash::Hash + Clone + std::fmt::Display + Send + Sync + 'static,
    E: std::fmt::Display,
    Fut: Future<Output = Result<(), E>>,
{
    use tracing::Instrument;
    while let Some(key) = queue.get().await {
        let start = std::time::Instant::now();
        let span = span(&key);
        let result = catch_panic(
            ctx,
            controller,
            &key.to_string(),
            reconcile(key.clone()).instrument(span.clone()),
        )
        .instrument(span)
        .await;
        ctx.metrics
            .reconcile_duration
            .with_label_values(&[controller])
            .observe(start.elapsed().as_secs_f64());
        let outcome = match &result {
            Ok(Ok(())) => {
                queue.forget(&key);
                "success"
            }
            Ok(Err(e)) => match retry_after(e) {
                Some(delay) => {
                    tracing::warn!(controller, key = %key, error = %e, "error syncing {key} (retrying in {delay:?}): {e}");
                    queue.add_after(key.clone(), delay);
                    "requeue"
                }
                None => {
                    tracing::warn!(controller, key = %key, error = %e, "error syncing {key}, requeuing with back-off: {e}");
                    queue.add_rate_limited(key.clone());
                    "error"
                }
            },
            Err(_) => {
                queue.add_rate_limited(key.clone());
                "panic"
            }
        };
        ctx.metrics
            .reconcile_total
            .with_label_values(&[controller, outcome])
            .inc();
        queue.done(&key);
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    #[tokio::test]
    async fn a_task_that_panics_outside_a_reconcile_makes_its_controller_panic() {
        let shutdown = CancellationToken::new();
        let mut tasks = vec![
            tokio::spawn(std::future::pending::<()>()),
            tokio::spawn(async { panic!("pump bug") }),
        ];
        let pending = tasks[0].abort_handle();
        let controller =
            tokio::spawn(async move { super::supervise_tasks("c", &shutdown, &mut tasks).await }).await;
        let err = controller.expect_err("the controller's task panics");
        let message = super::panic_message(err.into_panic().as_ref());
        assert_eq!(message, "c: one of its tasks stopped: pump bug");
        tokio::task::yield_now().await;
        assert!(pending.is_finished(), "the other tasks are stopped");
    }

    #[tokio::test]
    async fn shutdown_ends_supervision_quietly() {
        let shutdown = CancellationToken::new();
        let mut tasks = vec![tokio::spawn(std::future::pending::<()>())];
        shutdown.cancel();
        super::supervise_tasks("c", &shutdown, &mut tasks).await;
        assert_eq!(tasks.len(), 1);
    }
}
