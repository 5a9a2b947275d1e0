//! The sample provider: a cloud whose machines are listed in a JSON inventory file, with
//! load balancers from an address pool and credentials from a Secret.
//!
//! The `--cloud-config` file (gcfg, see [`crate::config`]) names the inventory, which lists
//! the machines and is read again on every call, so that a machine removed from it is gone for
//! the cloud-node-lifecycle controller:
//!
//! ```json
//! { "token": "s3cret",
//!   "machines": [ { "id": "m-1", "name": "node-a", "type": "small", "zone": "zone-a",
//!                   "region": "region-1", "state": "running",
//!                   "addresses": [ { "type": "InternalIP", "address": "10.0.0.1" } ] } ] }
//! ```
//!
//! `token`, when present, is what a real cloud's API checks: the provider must present it,
//! from the Secret named by `[Global] credentials-secret` (see [`crate::credentials`]).

use std::{path::PathBuf, time::Duration};

use k8s_cloud_provider::{
    CloudError, CloudProvider, CloudResult, InitContext, InstanceMetadata, InstancesV2,
    LoadBalancer,
    app::{FactoryContext, ProviderSpec},
    async_trait,
    error::BoxError,
    k8s_controller_manager::metrics::{
        Metrics,
        prometheus::{IntCounter, IntGauge},
    },
};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use serde::Deserialize;

use crate::{config::CloudConfig, credentials::Credentials, loadbalancer::AddressPool};

/// The provider's name: `--cloud-provider=sample`, provider IDs `sample://<machine id>`.
pub const PROVIDER_NAME: &str = "sample";

/// The sample's own flags: added to the command's (`--help` lists them under their heading),
/// read by the factory from its [`FactoryContext`].
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Sample provider flags")]
pub struct SampleFlags {
    /// How long one call to the cloud (a read of the inventory) may take (a Go duration, e.g.
    /// 10s); a call that takes longer fails and is retried by the controller that made it.
    #[arg(long = "sample-api-timeout", default_value = "10s", value_parser = parse_duration)]
    pub api_timeout: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    k8s_cloud_provider::k8s_controller_manager::duration::parse_go_duration(s)
}

/// What `cloud-controller-manager-sample` runs: the provider's name, its factory (a closure
/// given the cloud config and the sample's own flags), its flags, and a controller of its own
/// ([`crate::pool_usage`]). Every built-in controller is on by default; the node route
/// controller has nothing to do (no `Routes`) and says so at start.
pub fn provider_spec() -> ProviderSpec {
    ProviderSpec::new(PROVIDER_NAME, |ctx: FactoryContext| async move {
        // Checked before the command connects anywhere: a bad file or flag stops it with the
        // line, flag and value at fault.
        let flags: SampleFlags = ctx.flags()?;
        let bytes = ctx
            .config
            .ok_or("the sample provider needs --cloud-config (a gcfg file naming the inventory)")?;
        let text = String::from_utf8(bytes).map_err(|_| "--cloud-config: not UTF-8 text")?;
        let config = CloudConfig::parse(&text)?;
        Ok::<_, BoxError>(SampleCloud::new(config, flags.api_timeout))
    })
    // `--version` names the sample's version (then the framework's).
    .with_version(env!("CARGO_PKG_VERSION"))
    .with_flags(<SampleFlags as clap::Args>::augment_args)
    .with_controller(crate::pool_usage::provider_controller())
}

#[derive(Deserialize)]
struct Inventory {
    /// The token the cloud's "API" accepts (none: no credentials needed).
    #[serde(default)]
    token: Option<String>,
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

/// The sample cloud: [`InstancesV2`] (zone and region included, so no `Zones`: the node
/// controllers use only `InstancesV2` when a provider has it) and, with an address pool,
/// [`LoadBalancer`].
pub(crate) struct SampleCloud {
    inventory: PathBuf,
    api_timeout: Duration,
    credentials: Credentials,
    pub(crate) load_balancers: Option<AddressPool>,
    /// `sample_inventory_reads_total`: a provider's own metric, served on `/metrics`.
    reads: IntCounter,
    /// `sample_address_pool_held`: set by the sample's own controller ([`crate::pool_usage`]).
    pub(crate) pool_held: IntGauge,
}

impl SampleCloud {
    fn new(config: CloudConfig, api_timeout: Duration) -> Self {
        let reads = IntCounter::new(
            "sample_inventory_reads_total",
            "Reads of the machine inventory file.",
        )
        .expect("a valid metric name");
        let pool_held = IntGauge::new(
            "sample_address_pool_held",
            "Addresses of the load-balancer address pool held by Services.",
        )
        .expect("a valid metric name");
        Self {
            inventory: config.inventory,
            api_timeout,
            credentials: Credentials::new(config.credentials_secret),
            load_balancers: config
                .address_pool
                .map(|(first, last)| AddressPool::new(first, last)),
            reads,
            pool_held,
        }
    }

    /// Reads the inventory as a cloud API call is made: without blocking the runtime's
    /// threads (`tokio::fs`), presenting the credentials, which are read from their Secret
    /// again once when the cloud refuses them (a rotation).
    async fn inventory(&self) -> CloudResult<Inventory> {
        self.reads.inc();
        let at = || format!("inventory {}", self.inventory.display());
        let bytes = tokio::time::timeout(self.api_timeout, tokio::fs::read(&self.inventory))
            .await
            .map_err(|_| {
                CloudError::msg(format!("{}: no answer within --sample-api-timeout", at()))
            })?
            .map_err(|e| CloudError::wrap(at(), e))?;
        let inventory: Inventory =
            serde_json::from_slice(&bytes).map_err(|e| CloudError::wrap(at(), e))?;
        if let Some(wanted) = &inventory.token {
            let accepted = |t: Option<String>| t.as_deref() == Some(wanted.as_str());
            if !accepted(self.credentials.token(false).await?)
                && !accepted(self.credentials.token(true).await?)
            {
                return Err(CloudError::msg(format!(
                    "{}: the credentials of {} are refused",
                    at(),
                    self.credentials.source()
                )));
            }
        }
        Ok(inventory)
    }

    /// The machine a Node runs on: by the ID in its provider ID when it has one, else by name.
    /// `Ok(None)` only when the inventory was read and no machine matches.
    async fn machine_of(&self, node: &Node) -> CloudResult<Option<Machine>> {
        let inventory = self.inventory().await?;
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

    /// Keeps the framework's client, to read the credentials' Secret with.
    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        self.credentials.set_client(ctx.client.clone());
        Ok(())
    }

    fn register_metrics(&self, metrics: &Metrics) {
        metrics.register(Box::new(self.reads.clone()));
        metrics.register(Box::new(self.pool_held.clone()));
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.load_balancers.as_ref().map(|p| p as &dyn LoadBalancer)
    }
}

#[async_trait]
impl InstancesV2 for SampleCloud {
    /// `false` (the Node is deleted) only when the inventory was read and lists no such machine.
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.machine_of(node).await?.is_some())
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        Ok(self
            .machine_of(node)
            .await?
            .is_some_and(|m| m.state == State::Stopped))
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let machine = self
            .machine_of(node)
            .await?
            .ok_or(CloudError::InstanceNotFound)?;
        Ok(Some(
            InstanceMetadata::new(format!("sample://{}", machine.id))
                .with_instance_type(machine.instance_type)
                .with_node_addresses(machine.addresses)
                .with_zone(machine.zone, machine.region),
        ))
    }
}
