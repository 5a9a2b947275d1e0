//! The cloud-node-lifecycle controller (`cloud-node-lifecycle-controller`, spec §3): every
//! `--node-monitor-period`, for each Node that is not Ready, asks the cloud whether its
//! instance still exists — deleting the Node only when the cloud positively says it is gone —
//! and whether it is shut down (then it adds the `node.cloudprovider.kubernetes.io/shutdown`
//! taint). Ready Nodes lose that taint and are never checked against the cloud.
//!
//! A cloud error never deletes a Node: it is logged, counted
//! (`node_lifecycle_instance_existence_unknown_total`), recorded as a Warning event
//! `InstanceExistenceUnknown` on the Node (both additions to upstream, which only logs), and
//! the Node is skipped until the next period.

use std::time::Instant;

use k8s_controller_manager::events::{EventRecorder, EventType};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
};
use tracing::{Instrument, debug, info_span, warn};

use super::{ControllerContext, is_not_found, node_reference, retry_on_conflict};
use crate::{
    error::CloudError,
    node::helpers::{condition_status, has_taint_with_effect, provider_id},
    well_known::{TAINT_SHUTDOWN, events},
};

/// Canonical controller name.
pub const NAME: &str = "cloud-node-lifecycle-controller";
/// Client name (credentials).
pub const CLIENT_NAME: &str = "node-controller";

/// The cloud-node-lifecycle controller.
pub struct CloudNodeLifecycleController {
    ctx: ControllerContext,
    api: Api<Node>,
    recorder: EventRecorder,
}

impl CloudNodeLifecycleController {
    /// Builds the controller; fails when the provider supports no instances capability.
    pub fn new(ctx: ControllerContext) -> Result<Self, String> {
        if ctx.cloud.instances().is_none() && ctx.cloud.instances_v2().is_none() {
            return Err("cloud provider does not support instances".into());
        }
        let api = Api::all(ctx.client_for(CLIENT_NAME));
        let recorder = ctx.events.recorder(NAME);
        Ok(Self { ctx, api, recorder })
    }

    /// Runs `monitor_nodes` every `--node-monitor-period` (sliding, first run at once) until
    /// shutdown.
    pub async fn run(self) {
        let store = self.ctx.nodes.store();
        tokio::select! {
            _ = store.wait_synced() => {}
            _ = self.ctx.shutdown.cancelled() => return,
        }
        loop {
            let start = Instant::now();
            self.monitor_nodes()
                .instrument(info_span!("reconcile", controller = NAME))
                .await;
            self.ctx
                .metrics
                .reconcile_duration
                .with_label_values(&[NAME])
                .observe(start.elapsed().as_secs_f64());
            self.ctx
                .metrics
                .reconcile_total
                .with_label_values(&[NAME, "success"])
                .inc();
            tokio::select! {
                _ = tokio::time::sleep(self.ctx.config.node_monitor_period) => {}
                _ = self.ctx.shutdown.cancelled() => return,
            }
        }
    }

    /// One pass over every Node.
    ///
    /// The pass holds the Nodes' names, not the Nodes: each Node is read from the informer when
    /// its turn comes. A pass can take long (cloud answers for thousands of NotReady Nodes),
    /// and a snapshot of the objects would both judge a Node by its state at the start of the
    /// pass and keep every replaced version of it in memory until the pass ends (measured:
    /// ≈ 2500 stale Nodes held at 5000 NotReady Nodes).
    pub async fn monitor_nodes(&self) {
        let store = self.ctx.nodes.store();
        let mut names = store.keys();
        names.sort();
        for key in names {
            if self.ctx.shutdown.is_cancelled() {
                return;
            }
            // Deleted since the pass began: nothing to check.
            let Some(node) = store.get(&key) else {
                continue;
            };
            let name = node.metadata.name.as_deref().unwrap_or_default();
            // A panic on one Node fails that Node's check only (retried next period).
            let _ = super::catch_panic(&self.ctx, NAME, name, self.monitor_node(&node)).await;
        }
    }

    async fn monitor_node(&self, node: &Node) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if condition_status(node, "Ready") == "True" {
            if has_taint_with_effect(node, TAINT_SHUTDOWN, "NoSchedule")
                && let Err(e) = self.set_shutdown_taint(name, false).await
            {
                warn!(node = name, error = %e, "error patching node taints: {e}");
            }
            return;
        }
        let exists = match self.instance_exists(node).await {
            Ok(exists) => exists,
            Err(e) => {
                warn!(node = name, error = %e, "error checking if node {name} exists: {e}");
                self.ctx.cloud_metrics.existence_unknown_total.inc();
                self.recorder.event(
                    &node_reference(node),
                    EventType::Warning,
                    events::INSTANCE_EXISTENCE_UNKNOWN,
                    format!("Keeping node {name}: the cloud provider could not tell whether its instance exists: {e}"),
                );
                return;
            }
        };
        if !exists {
            debug!(
                node = name,
                "deleting node since it is no longer present in cloud provider: {name}"
            );
            let reference = node_reference(node);
            self.recorder.event(
                &reference,
                EventType::Normal,
                events::DELETING_NODE,
                format!("Deleting node {name} because it does not exist in the cloud provider"),
            );
            // The UID precondition: a Node re-created under the same name meanwhile is another
            // Node, never deleted for the old one's instance.
            let params = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: node.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match self.api.delete(name, &params).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    debug!(
                        node = name,
                        "node {name} was replaced meanwhile (UID changed); not deleting it"
                    );
                }
                Err(e) => {
                    warn!(node = name, error = %e, "unable to delete node {name:?}: {e}");
                    self.recorder.event(
                        &reference,
                        EventType::Warning,
                        events::DELETING_NODE_FAILED,
                        format!("Failed deleting node {name}: {e}"),
                    );
                }
            }
            return;
        }
        match self.instance_shutdown(node).await {
            Ok(true) => {
                if !has_taint_with_effect(node, TAINT_SHUTDOWN, "NoSchedule")
                    && let Err(e) = self.set_shutdown_taint(name, true).await
                {
                    warn!(node = name, error = %e, "failed to apply shutdown taint to node {name}, it may have been deleted.");
                }
            }
            Ok(false) => {}
            Err(e) => warn!(node = name, error = %e, "error checking if node {name} is shutdown: {e}"),
        }
    }

    async fn instance_exists(&self, node: &Node) -> Result<bool, CloudError> {
        let m = &self.ctx.cloud_metrics;
        if let Some(v2) = self.ctx.cloud.instances_v2() {
            return m.observe(NAME, "InstanceExists", v2.instance_exists(node)).await;
        }
        let instances = self.ctx.cloud.instances().ok_or(CloudError::NotImplemented)?;
        let Some(pid) = self.provider_id_for(node).await? else {
            return Ok(false);
        };
        m.observe(
            NAME,
            "InstanceExistsByProviderID",
            instances.instance_exists_by_provider_id(&pid),
        )
        .await
    }

    async fn instance_shutdown(&self, node: &Node) -> Result<bool, CloudError> {
        let m = &self.ctx.cloud_metrics;
        if let Some(v2) = self.ctx.cloud.instances_v2() {
            return m
                .observe(NAME, "InstanceShutdown", v2.instance_shutdown(node))
                .await;
        }
        let instances = self.ctx.cloud.instances().ok_or(CloudError::NotImplemented)?;
        let Some(pid) = self.provider_id_for(node).await? else {
            return Ok(false);
        };
        match m
            .observe(
                NAME,
                "InstanceShutdownByProviderID",
                instances.instance_shutdown_by_provider_id(&pid),
            )
            .await
        {
            Err(CloudError::NotImplemented) => Ok(false),
            other => other,
        }
    }

    /// `spec.providerID`, else `<provider>://<InstanceID(name)>`; `None` when the instance is
    /// not found.
    async fn provider_id_for(&self, node: &Node) -> Result<Option<String>, CloudError> {
        let pid = provider_id(node);
        if !pid.is_empty() {
            return Ok(Some(pid.to_string()));
        }
        let instances = self.ctx.cloud.instances().ok_or(CloudError::NotImplemented)?;
        let name = node.metadata.name.as_deref().unwrap_or_default();
        match self
            .ctx
            .cloud_metrics
            .observe(NAME, "InstanceID", instances.instance_id(name))
            .await
        {
            Ok(id) => Ok(Some(format!("{}://{id}", self.ctx.cloud.provider_name()))),
            Err(CloudError::InstanceNotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Adds or removes the shutdown taint with an optimistic-concurrency patch (the observed
    /// `resourceVersion` plus the whole new taint list), retried on conflict.
    async fn set_shutdown_taint(&self, name: &str, present: bool) -> Result<(), kube::Error> {
        retry_on_conflict(5, std::time::Duration::from_millis(100), |_| async move {
            let current = self.api.get(name).await?;
            let mut taints: Vec<Taint> = current
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            let has = taints
                .iter()
                .any(|t| t.key == TAINT_SHUTDOWN && t.effect == "NoSchedule");
            if has == present {
                return Ok(());
            }
            if present {
                taints.push(Taint {
                    key: TAINT_SHUTDOWN.into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                });
            } else {
                taints.retain(|t| !(t.key == TAINT_SHUTDOWN && t.effect == "NoSchedule"));
            }
            let patch = serde_json::json!({
                "metadata": { "resourceVersion": current.metadata.resource_version },
                "spec": { "taints": taints },
            });
            self.api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        })
        .await
    }
}
