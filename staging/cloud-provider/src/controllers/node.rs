//! The cloud-node controller (`cloud-node-controller`, spec §2): initialises Nodes that carry
//! the `node.cloudprovider.kubernetes.io/uninitialized` taint with what the cloud knows
//! (provider ID, instance type, zone, region, extra labels, addresses) and removes the taint
//! in the same update; keeps addresses up to date every `--node-status-update-frequency`;
//! mirrors beta labels to their GA names on initialised Nodes.
//!
//! Deliberate differences from upstream (documented in the spec's "Rust" notes):
//! - `--concurrent-node-syncs` ≤ 0 is rejected at start (upstream silently runs no workers);
//! - after a conflict, the Node is re-read with a GET (upstream re-reads its lister, which may
//!   still be stale), so a conflict costs one retry, not several;
//! - the periodic address sync asks [`crate::InstancesV2::instance_metadata`] for all Nodes
//!   concurrently, so a provider can coalesce the calls (AWS: one `DescribeInstances` per
//!   chunk of nodes).

use std::{collections::BTreeMap, sync::Arc, time::Instant};

use futures::StreamExt;
use k8s_controller_manager::{
    events::{EventRecorder, EventType},
    informer::{InformerEvent, next_event},
    workqueue::{ExponentialBackoff, WorkQueue},
};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use tracing::{debug, info, info_span, warn};

use super::{ControllerContext, node_reference, retry_on_conflict};
use crate::{
    cloud::InstanceMetadata,
    error::CloudError,
    node::helpers::{
        addresses, apply_additional_labels, beta_to_ga_label_changes, desired_node_addresses, has_taint,
        is_valid_label_value, node_addresses_changed, provided_node_ips, provider_id,
    },
    well_known::{self, TAINT_UNINITIALIZED, events},
};

/// How many times a Node's addresses are written at most when the API server fails (`5xx`,
/// `429`, no answer).
const ADDRESS_PATCH_ATTEMPTS: u32 = 5;

/// Canonical controller name.
pub const NAME: &str = "cloud-node-controller";
/// Client name (credentials).
pub const CLIENT_NAME: &str = "node-controller";

/// Errors of one node sync.
#[derive(Debug, thiserror::Error)]
pub enum NodeSyncError {
    /// The cloud could not say what the instance is.
    #[error("failed to get instance metadata for node {node}: {source}")]
    Metadata {
        /// Node name.
        node: String,
        /// Cloud error.
        #[source]
        source: CloudError,
    },
    /// The provider gave no provider ID and the Node has none.
    #[error("cloud provider does not set node provider ID for node {0}")]
    NoProviderId(String),
    /// The `--node-ip` annotation is invalid or matches no cloud address.
    #[error("provided node ip for node {node:?} is not valid: {reason}")]
    ProvidedNodeIp {
        /// Node name.
        node: String,
        /// Why.
        reason: String,
    },
    /// The API server refused the update.
    #[error("failed to update node {node}: {source}")]
    Update {
        /// Node name.
        node: String,
        /// API error.
        #[source]
        source: kube::Error,
    },
    /// The Node is initialised but the API server did not take its addresses (no answer or a
    /// server error on every attempt); the Node is synced again (with back-off) until it does.
    #[error("failed to update node addresses for node {node}: {source}")]
    Addresses {
        /// Node name.
        node: String,
        /// API error of the last attempt.
        #[source]
        source: kube::Error,
    },
}

/// The cloud-node controller.
pub struct CloudNodeController {
    ctx: ControllerContext,
    api: Api<Node>,
    queue: WorkQueue<String>,
    recorder: EventRecorder,
}

impl CloudNodeController {
    /// Builds the controller; fails (and is skipped by the controller manager) when the
    /// provider supports neither `Instances` nor `InstancesV2`.
    pub fn new(ctx: ControllerContext) -> Result<Self, String> {
        if ctx.cloud.instances().is_none() && ctx.cloud.instances_v2().is_none() {
            return Err("cloud provider does not support instances".into());
        }
        if ctx.config.concurrent_node_syncs == 0 {
            return Err("concurrent-node-syncs must be a positive number".into());
        }
        let api = Api::all(ctx.client_for(CLIENT_NAME));
        // client-go's default controller rate limiter: per-key 5 ms → 1000 s, and 10 qps /
        // burst 100 overall.
        let queue = WorkQueue::new(
            "Nodes",
            ExponentialBackoff::CONTROLLER_DEFAULT,
            Some(ctx.metrics.workqueue.clone()),
        )
        .with_bucket(10.0, 100);
        ctx.register_queue(NAME, &queue);
        let recorder = ctx.events.recorder(NAME);
        Ok(Self {
            ctx,
            api,
            queue,
            recorder,
        })
    }

    /// Runs until the context's shutdown token is cancelled.
    pub async fn run(self) {
        let this = Arc::new(self);
        this.queue.start_time_metrics();
        let mut events = this.ctx.nodes.subscribe();
        let store = this.ctx.nodes.store();
        tokio::select! {
            _ = store.wait_synced() => {}
            _ = this.ctx.shutdown.cancelled() => return,
        }
        for key in store.keys() {
            this.queue.add(key);
        }
        // Informer handlers: Add and Update enqueue the node; no Delete handler.
        let pump = {
            let this = this.clone();
            tokio::spawn(async move {
                while let Some(ev) = next_event(&mut events).await {
                    match ev {
                        InformerEvent::Added(n) | InformerEvent::Updated { new: n, .. } => {
                            this.queue.add(n.metadata.name.clone().unwrap_or_default())
                        }
                        InformerEvent::Resync => this
                            .ctx
                            .nodes
                            .store()
                            .keys()
                            .into_iter()
                            .for_each(|k| this.queue.add(k)),
                        InformerEvent::Deleted(_) => {}
                    }
                }
            })
        };
        let status_loop = {
            let this = this.clone();
            tokio::spawn(async move {
                loop {
                    let start = tokio::time::Instant::now();
                    // A panic fails this pass only (counted; the next period retries).
                    let _ =
                        super::catch_panic(&this.ctx, NAME, "node status update", this.update_node_status())
                            .await;
                    // Sliding period: the next run starts a full period after this one ended.
                    tokio::select! {
                        _ = tokio::time::sleep(this.ctx.config.node_status_update_frequency) => {}
                        _ = this.ctx.shutdown.cancelled() => return,
                    }
                    let _ = start;
                }
            })
        };
        let workers: Vec<_> = (0..this.ctx.config.concurrent_node_syncs)
            .map(|_| {
                let this = this.clone();
                tokio::spawn(async move { this.worker().await })
            })
            .collect();
        let workers_len = workers.len();
        let mut tasks = workers;
        tasks.push(pump);
        tasks.push(status_loop);
        // Dropped with this future (the controller's task aborted): its tasks are aborted too.
        let _tasks_guard = super::AbortOnDrop::of(&tasks);
        super::supervise_tasks(NAME, &this.ctx.shutdown, &mut tasks).await;
        this.queue.shut_down();
        // Workers finish the reconcile in hand (the queue is shut down); pumps and loops stop.
        let worker_count = workers_len;
        for (i, t) in tasks.into_iter().enumerate() {
            if i >= worker_count {
                t.abort();
            }
            let _ = t.await;
        }
    }

    async fn worker(&self) {
        super::work(
            &self.ctx,
            NAME,
            &self.queue,
            |key| info_span!("reconcile", controller = NAME, node = %key),
            |key| async move { self.sync_node(&key).await },
            |_: &NodeSyncError| None,
        )
        .await;
    }

    /// Initialises one Node (or, if it is initialised, reconciles its beta/GA labels).
    pub async fn sync_node(&self, name: &str) -> Result<(), NodeSyncError> {
        let Some(node) = self.ctx.nodes.store().get(name) else {
            return Ok(());
        };
        if !has_taint(&node, TAINT_UNINITIALIZED) {
            self.reconcile_node_labels(&node).await;
            // A retry of a failed sync that finds the Node initialised without addresses: the
            // initialising write was applied but its answer lost. The addresses are written
            // now rather than at the next periodic sync (5 min; upstream waits for it). (Not on
            // every sync: right after a successful initialisation the informer may not show
            // the addresses yet, and that would double the cloud calls.)
            if self.queue.num_requeues(&name.to_string()) > 0
                && addresses(&node).is_empty()
                && !provider_id(&node).is_empty()
            {
                let metadata =
                    self.instance_metadata(&node)
                        .await
                        .map_err(|source| NodeSyncError::Metadata {
                            node: name.to_string(),
                            source,
                        })?;
                if let Some(m) = metadata {
                    self.update_node_address(&node, &m.node_addresses)
                        .await
                        .map_err(|source| NodeSyncError::Addresses {
                            node: name.to_string(),
                            source,
                        })?;
                }
            }
            return Ok(());
        }
        info!(node = name, "Initializing node {name} with cloud provider");
        let Some(metadata) =
            self.instance_metadata(&node)
                .await
                .map_err(|source| NodeSyncError::Metadata {
                    node: name.to_string(),
                    source,
                })?
        else {
            info!(
                node = name,
                "Skip sync node {name} because cloud provided nil metadata"
            );
            return Ok(());
        };
        let mut metadata = metadata;
        if metadata.provider_id.is_empty() {
            if provider_id(&node).is_empty() {
                return Err(NodeSyncError::NoProviderId(name.to_string()));
            }
            metadata.provider_id = provider_id(&node).to_string();
        }
        // Validate the provided node IP against the cloud's addresses before changing anything.
        if let Some(ips) = provided_node_ips(&node) {
            let invalid = |reason: String| NodeSyncError::ProvidedNodeIp {
                node: name.to_string(),
                reason,
            };
            let checked = ips.and_then(|ips| {
                crate::node::helpers::addresses_by_provided_ips(&metadata.node_addresses, &ips)
            });
            if let Err(e) = checked {
                // Told on the Node too: `kubectl describe node` then says why it stays tainted.
                self.recorder.event(
                    &node_reference(&node),
                    EventType::Warning,
                    events::PROVIDED_NODE_IP_INVALID,
                    format!(
                        "the kubelet's --node-ip ({} {:?}) is not usable with this instance's addresses: {e}; the Node stays uninitialised until it is",
                        well_known::ANNOTATION_PROVIDED_NODE_IP,
                        node.metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(well_known::ANNOTATION_PROVIDED_NODE_IP))
                            .map(String::as_str)
                            .unwrap_or_default(),
                    ),
                );
                return Err(invalid(e.to_string()));
            }
        }

        let updated = retry_on_conflict(20, std::time::Duration::from_millis(50), |attempt| {
            let api = self.api.clone();
            let cached = node.clone();
            let metadata = &metadata;
            async move {
                let mut current = if attempt == 0 {
                    (*cached).clone()
                } else {
                    api.get(name).await?
                };
                let before = current.clone();
                apply_initialization(&mut current, metadata);
                let patch = initialization_patch(&before, &current);
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            }
        })
        .await
        .map_err(|source| NodeSyncError::Update {
            node: name.to_string(),
            source,
        })?;

        if let Some(created) = updated.metadata.creation_timestamp.as_ref() {
            let delay = k8s_openapi::jiff::Timestamp::now()
                .duration_since(created.0)
                .as_secs_f64()
                .max(0.0);
            self.ctx.cloud_metrics.taint_removal_delay.observe(delay);
        }
        let addresses_written = self.update_node_address(&updated, &metadata.node_addresses).await;
        info!(
            node = name,
            "Successfully initialized node {name} with cloud provider"
        );
        self.recorder.event(
            &node_reference(&updated),
            EventType::Normal,
            events::SYNCED,
            events::SYNCED_MESSAGE,
        );
        if let Some(created) = updated.metadata.creation_timestamp.as_ref() {
            let delay = k8s_openapi::jiff::Timestamp::now()
                .duration_since(created.0)
                .as_secs_f64()
                .max(0.0);
            self.ctx.cloud_metrics.initial_node_sync_delay.observe(delay);
        }
        // The API server went away between the initialising write and the addresses: the Node
        // is synced again with back-off, and that retry (which finds it initialised without
        // addresses) writes them, instead of the next periodic sync minutes later.
        addresses_written.map_err(|source| NodeSyncError::Addresses {
            node: name.to_string(),
            source,
        })
    }

    async fn instance_metadata(&self, node: &Node) -> Result<Option<InstanceMetadata>, CloudError> {
        let m = &self.ctx.cloud_metrics;
        if let Some(v2) = self.ctx.cloud.instances_v2() {
            return m
                .observe(NAME, "InstanceMetadata", v2.instance_metadata(node))
                .await;
        }
        let Some(instances) = self.ctx.cloud.instances() else {
            return Err(CloudError::msg("cloud provider does not support instances"));
        };
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let mut pid = provider_id(node).to_string();
        if pid.is_empty() {
            match m.observe(NAME, "InstanceID", instances.instance_id(name)).await {
                Ok(id) => pid = format!("{}://{id}", self.ctx.cloud.provider_name()),
                Err(CloudError::NotImplemented) => {
                    warn!(
                        node = name,
                        "cloud provider does not set node provider ID, using node name to discover node {name}"
                    )
                }
                Err(CloudError::InstanceNotFound) => return Err(CloudError::InstanceNotFound),
                Err(e) => {
                    return Err(CloudError::wrap(
                        "failed to get instance ID from cloud provider",
                        e,
                    ));
                }
            }
        }
        let node_addresses = match m
            .observe(
                NAME,
                "NodeAddressesByProviderID",
                instances.node_addresses_by_provider_id(&pid),
            )
            .await
        {
            Ok(a) => a,
            Err(e1) => match m
                .observe(NAME, "NodeAddresses", instances.node_addresses(name))
                .await
            {
                Ok(a) => a,
                Err(e2) => {
                    return Err(CloudError::msg(format!(
                        "error fetching node by provider ID: {e1}, and error by node name: {e2}"
                    )));
                }
            },
        };
        let instance_type = match m
            .observe(
                NAME,
                "InstanceTypeByProviderID",
                instances.instance_type_by_provider_id(&pid),
            )
            .await
        {
            Ok(t) => t,
            Err(e1) => match m
                .observe(NAME, "InstanceType", instances.instance_type(name))
                .await
            {
                Ok(t) => t,
                Err(e2) => {
                    return Err(CloudError::msg(format!(
                        "InstanceType: Error fetching by providerID: {e1} Error fetching by NodeName: {e2}"
                    )));
                }
            },
        };
        let (mut zone, mut region) = (String::new(), String::new());
        if let Some(zones) = self.ctx.cloud.zones() {
            let z = match m
                .observe(NAME, "GetZoneByProviderID", zones.get_zone_by_provider_id(&pid))
                .await
            {
                Ok(z) => z,
                Err(e1) => match m
                    .observe(NAME, "GetZoneByNodeName", zones.get_zone_by_node_name(name))
                    .await
                {
                    Ok(z) => z,
                    Err(e2) => {
                        return Err(CloudError::msg(format!(
                            "failed to get zone from cloud provider: Zone: Error fetching by providerID: {e1} Error fetching by NodeName: {e2}"
                        )));
                    }
                },
            };
            zone = z.failure_domain;
            region = z.region;
        }
        Ok(Some(InstanceMetadata {
            provider_id: pid,
            instance_type,
            node_addresses,
            zone,
            region,
            additional_labels: BTreeMap::new(),
        }))
    }

    /// Writes the cloud's addresses to `status.addresses` when they differ (spec §2.5). A
    /// refusal (`4xx`) or bad cloud addresses are logged and not returned (trying again would
    /// not help; the periodic address sync comes back to them); an API server that did not take
    /// the write after [`ADDRESS_PATCH_ATTEMPTS`] is returned so that the caller can retry.
    async fn update_node_address(&self, node: &Node, cloud: &[NodeAddress]) -> Result<(), kube::Error> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let wanted = match desired_node_addresses(node, cloud) {
            Ok(Some(w)) => w,
            Ok(None) => return Ok(()),
            Err(e) => {
                warn!(node = name, error = %e, "Failed to update node addresses for node {name:?}: {e}");
                return Ok(());
            }
        };
        if !node_addresses_changed(addresses(node), &wanted) {
            return Ok(());
        }
        // A merge patch replaces the list wholesale (the strategic merge key `type` would
        // otherwise merge the old and new lists incorrectly).
        let patch = serde_json::json!({ "status": { "addresses": wanted } });
        // A server error or a lost connection is tried again (up to ADDRESS_PATCH_ATTEMPTS,
        // 0.2 s apart and more): otherwise a Node initialised while the API server failed once
        // would wait for the next periodic address sync (--node-status-update-frequency,
        // 5 min) for its addresses, as upstream's does.
        let mut attempt = 1;
        loop {
            match self
                .api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code < 500 && s.code != 429 => {
                    warn!(node = name, error = %s, "failed to update node addresses for node {name:?}");
                    return Ok(());
                }
                Err(e) if attempt >= ADDRESS_PATCH_ATTEMPTS => {
                    warn!(node = name, error = %e, "failed to update node addresses for node {name:?}");
                    return Err(e);
                }
                Err(e) => {
                    debug!(node = name, error = %e, attempt, "updating node addresses; trying again");
                    tokio::time::sleep(std::time::Duration::from_millis(200 * u64::from(attempt))).await;
                    attempt += 1;
                }
            }
        }
    }

    /// One run of the periodic address sync over every initialised Node.
    pub async fn update_node_status(&self) {
        let start = Instant::now();
        // Names, not Nodes: each Node is read from the informer when its turn comes, so that a
        // long pass neither works on stale objects nor keeps the replaced ones in memory.
        let store = self.ctx.nodes.store();
        let names = store.keys();
        let count = names.len();
        let workers = match self.ctx.config.concurrent_node_status_updates {
            0 => self.ctx.config.concurrent_node_syncs.max(1),
            n => n,
        };
        let store = &store;
        futures::stream::iter(names)
            .for_each_concurrent(workers, |key| async move {
                let Some(node) = store.get(&key).filter(|n| !has_taint(n, TAINT_UNINITIALIZED)) else {
                    return;
                };
                let cloud = match self.instance_metadata(&node).await {
                    Ok(Some(m)) => m.node_addresses,
                    Ok(None) => return,
                    Err(e) => {
                        warn!(node = node.metadata.name.as_deref().unwrap_or_default(), error = %e,
                            "Error getting instance metadata for node addresses: {e}");
                        return;
                    }
                };
                // A failure is logged inside; the next period tries again.
                let _ = self.update_node_address(&node, &cloud).await;
            })
            .await;
        debug!(nodes = count, took = ?start.elapsed(), "Update {count} nodes status took {:?}.", start.elapsed());
    }

    /// Mirrors beta labels to GA labels with one merge patch (§2.6).
    async fn reconcile_node_labels(&self, node: &Node) {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let changes = beta_to_ga_label_changes(&labels);
        if changes.is_empty() {
            return;
        }
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let patch = serde_json::json!({ "metadata": { "labels": changes } });
        if let Err(e) = self
            .api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            warn!(node = name, error = %e, "failed update labels for node {name}");
        }
    }
}

/// Applies the initialisation modifiers of §2.4 to a Node (pure; unit-tested).
pub fn apply_initialization(node: &mut Node, metadata: &InstanceMetadata) {
    let spec = node.spec.get_or_insert_with(Default::default);
    if spec.provider_id.as_deref().unwrap_or_default().is_empty() && !metadata.provider_id.is_empty() {
        spec.provider_id = Some(metadata.provider_id.clone());
    }
    if let Some(taints) = spec.taints.as_mut() {
        taints.retain(|t| t.key != TAINT_UNINITIALIZED);
    }
    let labels = node.metadata.labels.get_or_insert_with(Default::default);
    // Unlike upstream, whose Node update the API server then refuses (the Node is never
    // initialised: OCCM #1379, an availability zone with a blank), a value that is no valid
    // label value is left out, with a log line naming it.
    let mut set = |k: &str, v: &str| {
        if is_valid_label_value(v) {
            labels.insert(k.to_string(), v.to_string());
        } else {
            warn!(
                label = k,
                value = v,
                "the cloud's value is not a valid label value: label not set"
            );
        }
    };
    if !metadata.instance_type.is_empty() {
        set(well_known::LABEL_INSTANCE_TYPE_BETA, &metadata.instance_type);
        set(well_known::LABEL_INSTANCE_TYPE, &metadata.instance_type);
    }
    if !metadata.zone.is_empty() {
        set(well_known::LABEL_FAILURE_DOMAIN_ZONE_BETA, &metadata.zone);
        set(well_known::LABEL_TOPOLOGY_ZONE, &metadata.zone);
    }
    if !metadata.region.is_empty() {
        set(well_known::LABEL_FAILURE_DOMAIN_REGION_BETA, &metadata.region);
        set(well_known::LABEL_TOPOLOGY_REGION, &metadata.region);
    }
    apply_additional_labels(labels, &metadata.additional_labels);
}

/// The JSON merge patch that turns `before` into `after` for the fields initialisation owns:
/// the labels it adds or changes, `spec.providerID`, and `spec.taints` (a list a merge patch
/// replaces whole, so it is sent only when it changed). `metadata.resourceVersion` makes it
/// conditional: a Node changed since it was read answers `409 Conflict` and is read again, as an
/// update would. Fields the CCM does not own, including those of API versions newer than this
/// build knows, are never sent and so never dropped (a whole-object update would drop them).
pub fn initialization_patch(before: &Node, after: &Node) -> serde_json::Value {
    let mut metadata = serde_json::Map::new();
    if let Some(rv) = &before.metadata.resource_version {
        metadata.insert("resourceVersion".into(), rv.clone().into());
    }
    let old_labels = before.metadata.labels.clone().unwrap_or_default();
    let labels: serde_json::Map<String, serde_json::Value> = after
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, v)| old_labels.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone().into()))
        .collect();
    if !labels.is_empty() {
        metadata.insert("labels".into(), labels.into());
    }
    let mut spec = serde_json::Map::new();
    let (old_spec, new_spec) = (
        before.spec.clone().unwrap_or_default(),
        after.spec.clone().unwrap_or_default(),
    );
    if new_spec.provider_id != old_spec.provider_id
        && let Some(id) = new_spec.provider_id
    {
        spec.insert("providerID".into(), id.into());
    }
    if new_spec.taints != old_spec.taints {
        spec.insert(
            "taints".into(),
            serde_json::to_value(new_spec.taints.unwrap_or_default()).unwrap_or_default(),
        );
    }
    let mut patch = serde_json::Map::new();
    patch.insert("metadata".into(), metadata.into());
    if !spec.is_empty() {
        patch.insert("spec".into(), spec.into());
    }
    patch.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};
    use kube::api::ObjectMeta;

    #[test]
    fn initialization_sets_labels_provider_id_and_removes_every_uninitialized_taint() {
        let mut node = Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![
                    Taint {
                        key: TAINT_UNINITIALIZED.into(),
                        value: Some("true".into()),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    },
                    Taint {
                        key: TAINT_UNINITIALIZED.into(),
                        effect: "NoExecute".into(),
                        ..Default::default()
                    },
                    Taint {
                        key: "other".into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            status: None,
        };
        let md = InstanceMetadata {
            provider_id: "fake://i-1".into(),
            instance_type: "m5.large".into(),
            zone: "z1".into(),
            region: "r1".into(),
            additional_labels: [("example.com/x".to_string(), "y".to_string())].into(),
            ..Default::default()
        };
        apply_initialization(&mut node, &md);
        let spec = node.spec.as_ref().unwrap();
        assert_eq!(spec.provider_id.as_deref(), Some("fake://i-1"));
        assert_eq!(
            spec.taints
                .as_ref()
                .unwrap()
                .iter()
                .map(|t| t.key.as_str())
                .collect::<Vec<_>>(),
            vec!["other"]
        );
        let labels = node.metadata.labels.as_ref().unwrap();
        for (k, v) in [
            ("node.kubernetes.io/instance-type", "m5.large"),
            ("beta.kubernetes.io/instance-type", "m5.large"),
            ("topology.kubernetes.io/zone", "z1"),
            ("failure-domain.beta.kubernetes.io/zone", "z1"),
            ("topology.kubernetes.io/region", "r1"),
            ("failure-domain.beta.kubernetes.io/region", "r1"),
            ("example.com/x", "y"),
        ] {
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
        }
    }

    #[test]
    fn values_that_are_no_label_values_are_left_out_and_the_node_initialised() {
        let mut node = Node::default();
        let md = InstanceMetadata {
            provider_id: "fake://i-2".into(),
            instance_type: "m1 small".into(),
            zone: "zone one".into(),
            region: "r1".into(),
            additional_labels: [
                ("example.com/ok".to_string(), "yes".to_string()),
                ("example.com/bad".to_string(), "-starts-with-a-dash".to_string()),
                ("example.com/long".to_string(), "x".repeat(64)),
            ]
            .into(),
            ..Default::default()
        };
        apply_initialization(&mut node, &md);
        let labels = node.metadata.labels.as_ref().unwrap();
        let keys: Vec<&str> = labels.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "example.com/ok",
                "failure-domain.beta.kubernetes.io/region",
                "topology.kubernetes.io/region"
            ]
        );
        assert_eq!(
            node.spec.as_ref().unwrap().provider_id.as_deref(),
            Some("fake://i-2")
        );
        assert!(is_valid_label_value(""));
        assert!(is_valid_label_value("eu-de-1a"));
        assert!(is_valid_label_value(&"x".repeat(63)));
        assert!(!is_valid_label_value("a."));
    }

    #[test]
    fn the_initialization_patch_holds_only_what_initialization_changed() {
        let before = Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                resource_version: Some("42".into()),
                labels: Some([("kept".to_string(), "1".to_string())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: Some("10.244.0.0/24".into()),
                taints: Some(vec![Taint {
                    key: TAINT_UNINITIALIZED.into(),
                    value: Some("true".into()),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut after = before.clone();
        let md = InstanceMetadata {
            provider_id: "fake://i-1".into(),
            zone: "z1".into(),
            ..Default::default()
        };
        apply_initialization(&mut after, &md);
        assert_eq!(
            initialization_patch(&before, &after),
            serde_json::json!({
                "metadata": {
                    "resourceVersion": "42",
                    "labels": {
                        "topology.kubernetes.io/zone": "z1",
                        "failure-domain.beta.kubernetes.io/zone": "z1"
                    }
                },
                "spec": {"providerID": "fake://i-1", "taints": []}
            })
        );
        // A Node that needs nothing gets a patch of its resource version alone.
        assert_eq!(
            initialization_patch(&after, &after),
            serde_json::json!({"metadata": {"resourceVersion": "42"}})
        );
    }

    #[test]
    fn an_existing_provider_id_is_never_changed() {
        let mut node = Node {
            spec: Some(NodeSpec {
                provider_id: Some("fake://old".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        apply_initialization(
            &mut node,
            &InstanceMetadata {
                provider_id: "fake://new".into(),
                ..Default::default()
            },
        );
        assert_eq!(node.spec.unwrap().provider_id.as_deref(), Some("fake://old"));
    }
}
