//! The tagging controller (cloud-provider-aws `pkg/controllers/tagging`, AWS-64): tags the EC2
//! instance of every Node with `--tags`, and removes them when the Node is deleted.
//!
//! Off by default; enabled with `--controllers=*,tagging`. As upstream:
//! - Node added, or updated while its label `k8s.io/cloud-provider-aws` is not the MD5 of the
//!   sorted `key=value` list of `--tags` → an `ADD` work item: `CreateTags` on the instance of
//!   its provider ID, then the label is set (so that the Node is skipped from then on, and
//!   tagged again when `--tags` changes);
//! - Node with the label deleted → a `DELETE` work item: `DeleteTags` (with the values, so a tag someone has
//!   changed since stays); an instance that no longer exists counts as untagged;
//! - an instance "not found" while the Node is less than 5 minutes old is retried (`CreateTags`
//!   is eventually consistent), later it is given up; an `InvalidID` (KWOK's fake nodes) is
//!   skipped, as are Fargate nodes and provider IDs that name no instance;
//! - a failed item is retried with the queue's back-off up to 9 times, counted in
//!   `cloudprovider_aws_tagging_controller_work_item_errors_total{error_type="total_errors"}`,
//!   then dropped and counted with `error_type="errors_after_retries_exhausted"`;
//! - `tagging_controller_inital_node_tagging_delay_seconds` (sic) observes the time from a
//!   Node's creation to its first tagging.
//!
//! Deliberate differences: cluster-ownership tag keys are refused in `--tags`
//! ([`options::TaggingFlags::validate`]); a deleted Node without the label (its instance was
//! never tagged by this controller, e.g. tagging kept failing, or the tags come from a launch
//! template) is not untagged — upstream removes the tags from it all the same; a panic in one work item is caught and the item
//! retried like a failure (the framework's rule) instead of crashing the process; each
//! reconcile is also counted in `controller_reconcile_total{controller="tagging"}`.

pub mod batcher;
pub mod options;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_cloud_provider::{
    app::{ProviderController, ProviderControllerStart},
    controllers::{ControllerContext, catch_panic, is_not_found, supervise_tasks},
};
use k8s_controller_manager::{
    informer::{InformerEvent, next_event},
    workqueue::{ExponentialBackoff, WorkQueue},
};
use k8s_legacy_cloud_provider_aws::{
    AwsCloud, FARGATE_PREFIX,
    api::AwsError,
    instances::instance_id_from_provider_id,
    tags::{INSTANCE_NOT_FOUND, INVALID_ID, TagClient},
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use md5::{Digest, Md5};
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts};
use tracing::{Instrument, error, info, info_span, warn};

use self::{
    batcher::{TagBatcher, TagOperation},
    options::{RESOURCE_INSTANCE, TaggingFlags, TaggingOptions},
};

/// Canonical name (`--controllers=*,tagging`).
pub const NAME: &str = "tagging";
/// Client name (service account with `--use-service-account-credentials`).
pub const CLIENT_NAME: &str = "tagging-controller";
/// The label that records which tags a Node's instance has.
pub const LABEL_KEY: &str = "k8s.io/cloud-provider-aws";
/// Retries of a failed work item before it is dropped.
pub const MAX_REQUEUES: u32 = 9;
/// How long after a Node's creation an instance "not found" is retried.
pub const NEW_NODE_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);

/// The controller as the AWS cloud-controller-manager registers it: off by default, its flags
/// in their own `--help` section.
pub fn provider_controller() -> ProviderController {
    ProviderController::new(NAME, CLIENT_NAME, |matches| {
        let flags = <TaggingFlags as clap::FromArgMatches>::from_arg_matches(matches)
            .map_err(|e| format!("tagging controller flags: {e}"))?;
        let options = flags
            .validate()
            .map_err(|e| format!("tagging controller inputs are not properly set: {}", e.join("; ")))?;
        let start: ProviderControllerStart =
            Arc::new(move |ctx| Ok(tokio::spawn(TaggingController::new(ctx, options.clone())?.run())));
        Ok(start)
    })
    .enabled_by_default(false)
    .with_flags(<TaggingFlags as clap::Args>::augment_args)
}

/// What to do for a Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Tag its instance.
    Add,
    /// Remove the tags from its instance.
    Delete,
}

/// One queued piece of work: identical items are queued once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkItem {
    /// Node name.
    pub name: String,
    /// The Node's provider ID when the item was queued.
    pub provider_id: String,
    /// What to do.
    pub action: Action,
}

impl std::fmt::Display for WorkItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let action = match self.action {
            Action::Add => "ADD",
            Action::Delete => "DELETE",
        };
        write!(f, "[Node: {}, Action: {action}]", self.name)
    }
}

/// The controller's metrics (names exact as upstream).
#[derive(Debug, Clone)]
pub struct TaggingMetrics {
    /// `cloudprovider_aws_tagging_controller_work_item_errors_total{error_type, instance_id}`.
    pub work_item_errors: IntCounterVec,
    /// `tagging_controller_inital_node_tagging_delay_seconds` (upstream's spelling).
    pub initial_node_tagging_delay: Histogram,
}

impl TaggingMetrics {
    fn new(metrics: &k8s_controller_manager::metrics::Metrics) -> Self {
        let m = Self {
            work_item_errors: IntCounterVec::new(
                Opts::new(
                    "cloudprovider_aws_tagging_controller_work_item_errors_total",
                    "any error in dequeueing the work queue and processing workItem",
                ),
                &["error_type", "instance_id"],
            )
            .expect("valid metric"),
            initial_node_tagging_delay: Histogram::with_opts(
                HistogramOpts::new(
                    "tagging_controller_inital_node_tagging_delay_seconds",
                    "Latency (in seconds) between node creation and its first successful tagging by TaggingController.",
                )
                .buckets(prometheus::exponential_buckets(1.0, 4.0, 6).expect("static buckets")),
            )
            .expect("valid metric"),
        };
        metrics.register(Box::new(m.work_item_errors.clone()));
        metrics.register(Box::new(m.initial_node_tagging_delay.clone()));
        m
    }
}

/// Why a work item failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum TaggingError {
    /// The tag call failed.
    #[error("tagging EC2 instance {instance} of node {node}: {source}")]
    Tag {
        /// Node name.
        node: String,
        /// Instance ID.
        instance: String,
        /// The AWS error.
        #[source]
        source: AwsError,
    },
    /// The untag call failed.
    #[error("untagging EC2 instance {instance} of node {node}: {source}")]
    Untag {
        /// Node name.
        node: String,
        /// Instance ID.
        instance: String,
        /// The AWS error.
        #[source]
        source: AwsError,
    },
    /// The instance of a new Node is not found yet.
    #[error(
        "EC2 instance {instance} for node {node} does not exist, but node is within eventual consistency grace period"
    )]
    NotFoundYet {
        /// Node name.
        node: String,
        /// Instance ID.
        instance: String,
    },
    /// The label could not be written.
    #[error("couldn't apply label {LABEL_KEY}={checksum} to node {node}: {source}")]
    Label {
        /// Node name.
        node: String,
        /// The label value.
        checksum: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A panic while processing (caught).
    #[error("panicked: {0}")]
    Panic(String),
}

/// The MD5 (hex) of the sorted, comma-joined `key=value` list: the label value of a tagged Node.
pub fn checksum_of_tags(tags: &BTreeMap<String, String>) -> String {
    let mut list: Vec<String> = tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
    list.sort();
    let digest = Md5::digest(list.join(",").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The tagging controller.
pub struct TaggingController {
    ctx: ControllerContext,
    api: Api<Node>,
    queue: WorkQueue<WorkItem>,
    options: TaggingOptions,
    checksum: String,
    client: TagClient,
    batcher: Option<TagBatcher>,
    metrics: TaggingMetrics,
}

impl TaggingController {
    /// Builds the controller; fails (the controller is skipped) when the provider is not AWS.
    pub fn new(ctx: ControllerContext, options: TaggingOptions) -> Result<Self, String> {
        let Some(aws) = ctx.provider::<AwsCloud>() else {
            return Err(format!(
                "tagging controller does not support {} provider",
                ctx.cloud.provider_name()
            ));
        };
        let client = aws.tag_client();
        let batcher = options.batching.then(|| TagBatcher::new(client.clone()));
        let (qps, burst) = options.rate_limit.unwrap_or((10.0, 100));
        if options.rate_limit.is_some() {
            info!("Rate limit enabled on controller with rate {qps} and burst {burst}.");
        } else {
            info!("Rate limit disabled on controller.");
        }
        let queue = WorkQueue::new(
            CLIENT_NAME,
            ExponentialBackoff::CONTROLLER_DEFAULT,
            Some(ctx.metrics.workqueue.clone()),
        )
        .with_bucket(qps, burst);
        ctx.register_queue(NAME, &queue);
        Ok(Self {
            api: Api::all(ctx.client_for(CLIENT_NAME)),
            metrics: TaggingMetrics::new(&ctx.metrics),
            checksum: checksum_of_tags(&options.tags),
            ctx,
            queue,
            options,
            client,
            batcher,
        })
    }

    fn is_tagging_required(&self, node: &Node) -> bool {
        node.metadata.labels.as_ref().and_then(|l| l.get(LABEL_KEY)) != Some(&self.checksum)
    }

    fn enqueue(&self, node: &Node, action: Action) {
        let item = WorkItem {
            name: node.metadata.name.clone().unwrap_or_default(),
            provider_id: node
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.clone())
                .unwrap_or_default(),
            action,
        };
        if self.options.rate_limit.is_some() {
            info!(item = %item, "Added {item} to the workqueue (rate-limited)");
            self.queue.add_rate_limited(item);
        } else {
            info!(item = %item, "Added {item} to the workqueue (without any rate-limit)");
            self.queue.add(item);
        }
    }

    /// Runs until the context's shutdown token is cancelled.
    pub async fn run(self) {
        let this = Arc::new(self);
        this.queue.start_time_metrics();
        let mut events = this.ctx.nodes.subscribe();
        let store = this.ctx.nodes.store();
        info!("Waiting for informer caches to sync");
        tokio::select! {
            _ = store.wait_synced() => {}
            _ = this.ctx.shutdown.cancelled() => return,
        }
        info!("Starting the tagging controller");
        for node in store.list() {
            if this.is_tagging_required(&node) {
                this.enqueue(&node, Action::Add);
            }
        }
        let pump = {
            let this = this.clone();
            tokio::spawn(async move {
                while let Some(ev) = next_event(&mut events).await {
                    match ev {
                        InformerEvent::Added(n) => this.enqueue(&n, Action::Add),
                        InformerEvent::Updated { new, .. } => {
                            if this.is_tagging_required(&new) {
                                this.enqueue(&new, Action::Add);
                            }
                        }
                        InformerEvent::Deleted(n) => {
                            if has_label(&n) {
                                this.enqueue(&n, Action::Delete);
                            } else {
                                let name = n.metadata.name.as_deref().unwrap_or_default();
                                info!(
                                    node = name,
                                    "Skip untagging node {name}: its instance was never tagged by this controller (no {LABEL_KEY} label)"
                                );
                            }
                        }
                        InformerEvent::Resync => {
                            for n in this.ctx.nodes.store().list() {
                                if this.is_tagging_required(&n) {
                                    this.enqueue(&n, Action::Add);
                                }
                            }
                        }
                    }
                }
            })
        };
        let workers = this.options.workers;
        let mut tasks: Vec<_> = (0..workers)
            .map(|_| {
                let this = this.clone();
                tokio::spawn(async move { this.worker().await })
            })
            .collect();
        tasks.push(pump);
        supervise_tasks(NAME, &this.ctx.shutdown, &mut tasks).await;
        this.queue.shut_down();
        for (i, t) in tasks.into_iter().enumerate() {
            if i >= workers {
                t.abort();
            }
            let _ = t.await;
        }
    }

    async fn worker(&self) {
        while let Some(item) = self.queue.get().await {
            let start = std::time::Instant::now();
            let span = info_span!("reconcile", controller = NAME, node = %item.name, action = ?item.action);
            let result = catch_panic(&self.ctx, NAME, &item.to_string(), self.process(&item))
                .instrument(span)
                .await
                .unwrap_or_else(|panic| Err(TaggingError::Panic(panic)));
            self.ctx
                .metrics
                .reconcile_duration
                .with_label_values(&[NAME])
                .observe(start.elapsed().as_secs_f64());
            let instance = instance_id_from_provider_id(&item.provider_id).unwrap_or_default();
            let outcome = match result {
                Ok(()) => {
                    info!(item = %item, "Finished processing {item}");
                    self.queue.forget(&item);
                    "success"
                }
                Err(e) => {
                    let retries = self.queue.num_requeues(&item);
                    if retries < MAX_REQUEUES {
                        self.metrics
                            .work_item_errors
                            .with_label_values(&["total_errors", &instance])
                            .inc();
                        warn!(item = %item, error = %e, retries, "error processing work item {item}: {e}, requeuing count {retries}");
                        self.queue.add_rate_limited(item.clone());
                        "error"
                    } else {
                        self.metrics
                            .work_item_errors
                            .with_label_values(&["errors_after_retries_exhausted", &instance])
                            .inc();
                        error!(item = %item, error = %e, "error processing work item {item}: {e}, requeuing count exceeded");
                        self.queue.forget(&item);
                        "dropped"
                    }
                }
            };
            self.ctx
                .metrics
                .reconcile_total
                .with_label_values(&[NAME, outcome])
                .inc();
            self.queue.done(&item);
        }
    }

    /// Processes one work item: `Ok` when done or when it can never succeed (logged).
    pub async fn process(&self, item: &WorkItem) -> Result<(), TaggingError> {
        let instance = match instance_id_from_provider_id(&item.provider_id) {
            Ok(id) => id,
            Err(e) => {
                warn!(node = %item.name, provider_id = %item.provider_id, "error in getting instanceID for node {}: {e}; skipped", item.name);
                return Ok(());
            }
        };
        if instance.starts_with(FARGATE_PREFIX) {
            info!(node = %item.name, instance, "Skip processing the node {instance} since it is a fargate node");
            return Ok(());
        }
        if !self.options.resources.iter().any(|r| r == RESOURCE_INSTANCE) {
            return Ok(());
        }
        match item.action {
            Action::Add => {
                // The Node as it is now: gone → nothing to tag.
                let Some(node) = self.ctx.nodes.store().get(&item.name) else {
                    return Ok(());
                };
                self.tag_instance(&node).await
            }
            Action::Delete => self.untag_instance(&item.name, &instance).await,
        }
    }

    /// One tag or untag call (batched with others when batching is on), abandoned after
    /// `--cloud-call-timeout` like every other cloud call of the controllers.
    async fn call(&self, op: TagOperation, instance: &str) -> Result<(), AwsError> {
        let ids = [instance.to_string()];
        let (operation, name) = match op {
            TagOperation::Create => ("create_tags", "CreateTags"),
            TagOperation::Delete => ("delete_tags", "DeleteTags"),
        };
        let call = async {
            match (&self.batcher, op) {
                (Some(b), op) => b.submit(op, instance, &self.options.tags).await,
                (None, TagOperation::Create) => self.client.create_tags(&ids, &self.options.tags).await,
                (None, TagOperation::Delete) => self.client.delete_tags(&ids, &self.options.tags).await,
            }
        };
        self.ctx
            .cloud_metrics
            .bounded(NAME, name, call)
            .await
            .unwrap_or_else(|timed_out| {
                Err(AwsError {
                    operation,
                    code: None,
                    message: timed_out.to_string(),
                })
            })
    }

    async fn tag_instance(&self, node: &Node) -> Result<(), TaggingError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        if !self.is_tagging_required(node) {
            info!(node = %name, "Skip tagging node {name} since it was already tagged earlier.");
            return Ok(());
        }
        let provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .unwrap_or_default();
        let Ok(instance) = instance_id_from_provider_id(provider_id) else {
            return Ok(());
        };
        if let Err(e) = self.call(TagOperation::Create, &instance).await {
            if e.is(INSTANCE_NOT_FOUND) {
                if age(node).is_some_and(|a| a < NEW_NODE_GRACE_PERIOD) {
                    return Err(TaggingError::NotFoundYet { node: name, instance });
                }
                info!(node = %name, instance, "Skip tagging since EC2 instance {instance} for node {name} does not exist");
                return Ok(());
            }
            if e.is(INVALID_ID) {
                info!(node = %name, instance, "Skip tagging since EC2 instance {instance} for node {name} has an invalid instance ID");
                return Ok(());
            }
            return Err(TaggingError::Tag {
                node: name,
                instance,
                source: e,
            });
        }
        info!(node = %name, instance, tags = ?self.options.tags, "Successfully tagged {instance}. Labeling the node with the tagging controller label now.");
        let patch = serde_json::json!({ "metadata": { "labels": { LABEL_KEY: self.checksum } } });
        match self
            .api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(source) => {
                return Err(TaggingError::Label {
                    node: name,
                    checksum: self.checksum.clone(),
                    source,
                });
            }
        }
        info!(node = %name, "Successfully labeled node {name} with {LABEL_KEY}={}.", self.checksum);
        if !has_label(node)
            && let Some(a) = age(node)
        {
            self.metrics.initial_node_tagging_delay.observe(a.as_secs_f64());
        }
        Ok(())
    }

    async fn untag_instance(&self, node: &str, instance: &str) -> Result<(), TaggingError> {
        match self.call(TagOperation::Delete, instance).await {
            Ok(()) => {
                info!(node, instance, "Successfully untagged {instance}");
                Ok(())
            }
            // The target state: an instance that is gone has no tags.
            Err(e) if e.is(INSTANCE_NOT_FOUND) => {
                info!(
                    node,
                    instance, "Couldn't find instance {instance} when trying to untag it; skipped"
                );
                Ok(())
            }
            Err(e) if e.is(INVALID_ID) => {
                info!(
                    node,
                    instance,
                    "Skip untagging since EC2 instance {instance} for node {node} has an invalid instance ID"
                );
                Ok(())
            }
            Err(source) => Err(TaggingError::Untag {
                node: node.to_string(),
                instance: instance.to_string(),
                source,
            }),
        }
    }
}

/// Whether the Node carries the label of a tagging (with any tags).
fn has_label(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_KEY))
}

/// How long ago the Node was created (`None` without a creation time).
fn age(node: &Node) -> Option<Duration> {
    let created = node.metadata.creation_timestamp.as_ref()?;
    let secs = k8s_openapi::jiff::Timestamp::now()
        .duration_since(created.0)
        .as_secs_f64()
        .max(0.0);
    Some(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_label_value_is_upstreams_md5_of_the_sorted_pairs() {
        // Reference values: Python's hashlib.md5 of the joined strings.
        assert_eq!(
            checksum_of_tags(&tags(&[("b", "2"), ("a", "1")])),
            "9dc867b7f2bf1e40160f90e46628512e"
        );
        // Upstream sorts the "k=v" strings, not the keys: "a-b=2" < "a=1" ('-' < '=').
        assert_eq!(
            checksum_of_tags(&tags(&[("a", "1"), ("a-b", "2")])),
            "dc82128ad3a623f00d27a6a1d6c4a643"
        );
    }

    #[test]
    fn work_items_print_as_upstream() {
        let item = WorkItem {
            name: "ip-10-0-0-1".into(),
            provider_id: "aws:///us-east-1a/i-0123".into(),
            action: Action::Delete,
        };
        assert_eq!(item.to_string(), "[Node: ip-10-0-0-1, Action: DELETE]");
    }
}
