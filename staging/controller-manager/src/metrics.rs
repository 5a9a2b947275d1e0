//! The Prometheus registry shared by every component of a controller manager, and the generic
//! metrics it always carries (names as in Kubernetes): work queues, leader election, running
//! controllers, process metrics.
//!
//! Controllers and providers register their own metrics into [`Metrics::registry`]. The text
//! exposition format is served on `/metrics` by the controller manager's HTTP server.

/// The `prometheus` crate this registry is built with: a provider registers collectors of this
/// version (`k8s_controller_manager::metrics::prometheus::IntCounter`, …), so that its metrics
/// land in the same registry without a second, incompatible copy of the crate.
pub use prometheus;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Exponential buckets 10^-8 … 10^1 s, as client-go's workqueue metrics.
fn workqueue_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(1e-8, 10.0, 10).expect("static buckets")
}

/// The work-queue metric families (label `name`).
#[derive(Clone, Debug)]
pub struct WorkQueueMetrics {
    /// `workqueue_depth`
    pub depth: IntGaugeVec,
    /// `workqueue_adds_total`
    pub adds: IntCounterVec,
    /// `workqueue_retries_total`
    pub retries: IntCounterVec,
    /// `workqueue_queue_duration_seconds`
    pub queue_duration: HistogramVec,
    /// `workqueue_work_duration_seconds`
    pub work_duration: HistogramVec,
    /// `workqueue_unfinished_work_seconds`
    pub unfinished_work: GaugeVec,
    /// `workqueue_longest_running_processor_seconds`
    pub longest_running: GaugeVec,
}

/// A process-wide metrics registry with the controller manager's generic metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Work-queue metrics, for [`crate::workqueue::WorkQueue`].
    pub workqueue: WorkQueueMetrics,
    /// `leader_election_master_status{name}`: 1 while this process holds the lease `name`.
    pub leader_election_master_status: IntGaugeVec,
    /// `running_managed_controllers{name, manager}`: 1 while a controller runs.
    pub running_managed_controllers: IntGaugeVec,
    /// `controller_reconcile_total{controller, result}`: reconciles per controller and outcome
    /// (`success`, `error`, `requeue`, `panic`).
    pub reconcile_total: IntCounterVec,
    /// `controller_reconcile_duration_seconds{controller}`.
    pub reconcile_duration: HistogramVec,
    /// `controller_panics_total{controller}`: panics caught in a controller (one reconcile or
    /// one periodic pass; the key or pass is retried), and controllers whose task ended by a
    /// panic (the process then exits).
    pub panics_total: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates the registry with the generic metrics and the process collector.
    pub fn new() -> Self {
        let registry = Registry::new();
        let name = &["name"];
        let workqueue = WorkQueueMetrics {
            depth: IntGaugeVec::new(Opts::new("workqueue_depth", "Current depth of workqueue"), name)
                .expect("valid metric"),
            adds: IntCounterVec::new(Opts::new("workqueue_adds_total", "Total number of adds handled by workqueue"), name)
                .expect("valid metric"),
            retries: IntCounterVec::new(
                Opts::new("workqueue_retries_total", "Total number of retries handled by workqueue"),
                name,
            )
            .expect("valid metric"),
            queue_duration: HistogramVec::new(
                HistogramOpts::new(
                    "workqueue_queue_duration_seconds",
                    "How long in seconds an item stays in workqueue before being requested.",
                )
                .buckets(workqueue_buckets()),
                name,
            )
            .expect("valid metric"),
            work_duration: HistogramVec::new(
                HistogramOpts::new(
                    "workqueue_work_duration_seconds",
                    "How long in seconds processing an item from workqueue takes.",
                )
                .buckets(workqueue_buckets()),
                name,
            )
            .expect("valid metric"),
            unfinished_work: GaugeVec::new(
                Opts::new(
                    "workqueue_unfinished_work_seconds",
                    "How many seconds of work has done that is in progress and hasn't been observed by work_duration.",
                ),
                name,
            )
            .expect("valid metric"),
            longest_running: GaugeVec::new(
                Opts::new(
                    "workqueue_longest_running_processor_seconds",
                    "How many seconds has the longest running processor for workqueue been running.",
                ),
                name,
            )
            .expect("valid metric"),
        };
        let leader_election_master_status = IntGaugeVec::new(
            Opts::new(
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            ),
            name,
        )
        .expect("valid metric");
        let running_managed_controllers = IntGaugeVec::new(
            Opts::new(
                "running_managed_controllers",
                "Indicates where instances of a controller are currently running",
            ),
            &["name", "manager"],
        )
        .expect("valid metric");
        let reconcile_total = IntCounterVec::new(
            Opts::new(
                "controller_reconcile_total",
                "Reconciles per controller and result (success, error, requeue, panic).",
            ),
            &["controller", "result"],
        )
        .expect("valid metric");
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "controller_reconcile_duration_seconds",
                "Duration of one reconcile per controller.",
            )
            .buckets(prometheus::exponential_buckets(0.001, 2.0, 16).expect("static buckets")),
            &["controller"],
        )
        .expect("valid metric");

        let panics_total = IntCounterVec::new(
            Opts::new(
                "controller_panics_total",
                "Panics caught per controller (the reconcile is retried with back-off).",
            ),
            &["controller"],
        )
        .expect("valid metric");

        let metrics = Self {
            registry,
            workqueue,
            leader_election_master_status,
            running_managed_controllers,
            reconcile_total,
            reconcile_duration,
            panics_total,
        };
        let r = &metrics.registry;
        let w = &metrics.workqueue;
        for c in [
            Box::new(w.depth.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(w.adds.clone()),
            Box::new(w.retries.clone()),
            Box::new(w.queue_duration.clone()),
            Box::new(w.work_duration.clone()),
            Box::new(w.unfinished_work.clone()),
            Box::new(w.longest_running.clone()),
            Box::new(metrics.leader_election_master_status.clone()),
            Box::new(metrics.running_managed_controllers.clone()),
            Box::new(metrics.reconcile_total.clone()),
            Box::new(metrics.reconcile_duration.clone()),
            Box::new(metrics.panics_total.clone()),
            Box::new(prometheus::process_collector::ProcessCollector::for_self()),
        ] {
            r.register(c).expect("generic metrics are registered once");
        }
        metrics
    }

    /// The registry controllers and providers register their metrics into.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Registers a collector, ignoring "already registered" (a provider initialised twice).
    pub fn register(&self, collector: Box<dyn prometheus::core::Collector>) {
        if let Err(e) = self.registry.register(collector)
            && !matches!(e, prometheus::Error::AlreadyReg)
        {
            tracing::warn!(error = %e, "could not register a metric");
        }
    }

    /// The Prometheus text exposition of everything registered.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
