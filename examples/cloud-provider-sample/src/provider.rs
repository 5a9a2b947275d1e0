//! The sample provider: a cloud whose machines are listed in a JSON inventory file.
//!
//! The `--cloud-config` file names the inventory:
//!
//! ```json
//! { "inventory": "/etc/sample/machines.json" }
//! ```
//!
//! and the inventory lists the machines (read again on every call, so that a machine removed
//! from it is gone for the cloud-node-lifecycle controller):
//!
//! ```json
//! { "machines": [ { "id": "m-1", "name": "node-a", "type": "small", "zone": "zone-a",
//!                   "region": "region-1", "state": "running",
//!                   "addresses": [ { "type": "InternalIP", "address": "10.0.0.1" } ] } ] }
//! ```

use std::{path::PathBuf, sync::Arc};

use k8s_cloud_provider::{
    CloudError, CloudProvider, CloudResult, InstanceMetadata, InstancesV2,
    app::ProviderSpec,
    async_trait,
    k8s_controller_manager::metrics::{Metrics, prometheus::IntCounter},
    registry::Factory,
};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use serde::Deserialize;

/// The provider's name: `--cloud-provider=sample`, provider IDs `sample://<machine id>`.
pub const PROVIDER_NAME: &str = "sample";

/// What `cloud-controller-manager-sample` runs: the provider's name and its factory. Every
/// controller is on by default; the cloud-node-lifecycle and cloud-node controllers are the ones
/// with work to do here (no load balancers, no routes).
pub fn provider_spec() -> ProviderSpec {
    ProviderSpec::new(PROVIDER_NAME, factory())
}

/// Builds the provider from the `--cloud-config` file's contents.
fn factory() -> Factory {
    Arc::new(|bytes: Option<Vec<u8>>| {
        Box::pin(async move {
            let bytes = bytes.ok_or(
                "the sample provider needs --cloud-config (a JSON file naming the inventory)",
            )?;
            let config: CloudConfig =
                serde_json::from_slice(&bytes).map_err(|e| format!("--cloud-config: {e}"))?;
            Ok(Arc::new(SampleCloud::new(config.inventory)) as Arc<dyn CloudProvider>)
        })
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CloudConfig {
    inventory: PathBuf,
}

#[derive(Deserialize)]
struct Inventory {
    machines: Vec<Machine>,
}

#[derive(Deserialize)]
struct Machine {
    id: String,
    name: String,
    #[serde(rename = "type", default)]
    instance_type: String,
    #[serde(default)]
    zone: String,
    #[serde(default)]
    region: String,
    #[serde(default)]
    state: State,
    #[serde(default)]
    addresses: Vec<NodeAddress>,
}

#[derive(Deserialize, Default, PartialEq)]
#[serde(rename_all = "lowercase")]
enum State {
    #[default]
    Running,
    Stopped,
}

/// The sample cloud. Its one capability is [`InstancesV2`], which gives the zone and region
/// too (so no `Zones`: the node controllers use only `InstancesV2` when a provider has it).
struct SampleCloud {
    inventory: PathBuf,
    /// `sample_inventory_reads_total`: a provider's own metric, served on `/metrics`.
    reads: IntCounter,
}

impl SampleCloud {
    fn new(inventory: PathBuf) -> Self {
        let reads = IntCounter::new(
            "sample_inventory_reads_total",
            "Reads of the machine inventory file.",
        )
        .expect("a valid metric name");
        Self { inventory, reads }
    }

    /// The machine a Node runs on: by the ID in its provider ID when it has one, else by name.
    /// `Ok(None)` only when the inventory was read and no machine matches.
    fn machine_of(&self, node: &Node) -> CloudResult<Option<Machine>> {
        self.reads.inc();
        // A small local file: a plain read (a real cloud's API call goes here).
        let bytes = std::fs::read(&self.inventory).map_err(|e| {
            CloudError::wrap(format_args!("inventory {}", self.inventory.display()), e)
        })?;
        let inventory: Inventory = serde_json::from_slice(&bytes).map_err(|e| {
            CloudError::wrap(format_args!("inventory {}", self.inventory.display()), e)
        })?;
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .unwrap_or_default();
        let wanted = if provider_id.is_empty() {
            None
        } else {
            let id = provider_id.strip_prefix("sample://").filter(|id| !id.is_empty()).ok_or_else(|| {
                CloudError::msg(format!(
                    "node {name}: spec.providerID {provider_id:?} is not a sample provider ID (sample://<machine id>)"
                ))
            })?;
            Some(id)
        };
        Ok(inventory.machines.into_iter().find(|m| match wanted {
            Some(id) => m.id == id,
            None => m.name == name,
        }))
    }
}

#[async_trait]
impl CloudProvider for SampleCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    fn register_metrics(&self, metrics: &Metrics) {
        metrics.register(Box::new(self.reads.clone()));
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
}

#[async_trait]
impl InstancesV2 for SampleCloud {
    /// `false` (the Node is deleted) only when the inventory was read and lists no such machine.
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.machine_of(node)?.is_some())
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        Ok(self
            .machine_of(node)?
            .is_some_and(|m| m.state == State::Stopped))
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let machine = self.machine_of(node)?.ok_or(CloudError::InstanceNotFound)?;
        Ok(Some(
            InstanceMetadata::new(format!("sample://{}", machine.id))
                .with_instance_type(machine.instance_type)
                .with_node_addresses(machine.addresses)
                .with_zone(machine.zone, machine.region),
        ))
    }
}
