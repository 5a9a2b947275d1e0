//! The cloud interface (upstream `cloud.go`): what a provider implements.
//!
//! A provider is one object per process implementing [`CloudProvider`]. Each optional
//! capability is returned by an accessor; `None` means "not supported" and the controller that
//! needs it is not started (logged, not fatal), exactly like the Go `(T, bool)` pairs.
//!
//! | capability | used by |
//! |---|---|
//! | [`InstancesV2`] (preferred) or [`Instances`] (+ [`Zones`]) | cloud-node, cloud-node-lifecycle |
//! | [`LoadBalancer`] | service-lb |
//! | [`Routes`] | node-route |
//! | [`Clusters`] | nothing (kept for completeness) |
//!
//! When [`CloudProvider::instances_v2`] returns `Some`, the node controllers use only it and
//! never call [`Zones`].
//!
//! All methods take `&self` and may be called concurrently from several controllers and
//! workers; implementations must treat the Kubernetes objects they are given as read-only.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_controller_manager::{events::EventRecorder, informer::Store, metrics::Metrics, writes::DryRun};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, NodeAddress, Service};
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::error::CloudResult;

/// What a provider receives when the cloud-controller-manager starts its controllers (after
/// leadership is acquired), like upstream's `Initialize(clientBuilder, stop)` plus
/// `SetInformers`. The framework builds it (`#[non_exhaustive]`: fields may be added).
#[derive(Clone)]
#[non_exhaustive]
pub struct InitContext {
    /// A client with the controller manager's identity (user agent `cloud-controller-manager`);
    /// its writes are server-side dry runs under `--dry-run`. To keep annotations on Services
    /// (such as a load balancer's ID), write them with a
    /// [`crate::service::ServiceAnnotator`] made from it.
    pub client: Client,
    /// The shared Node cache (e.g. to map instance IDs to node names).
    pub nodes: Store<Node>,
    /// Cancelled when the controllers stop; background tasks of the provider must end then.
    pub shutdown: CancellationToken,
    /// Set with `--dry-run` (shadow mode): the provider must not write to its cloud outside
    /// the [`LoadBalancer`] and [`Routes`] calls (which the framework already keeps from the
    /// cloud), and records each write it does not make with [`DryRun::record`].
    pub dry_run: Option<DryRun>,
    /// Records Events for the provider (component `cloud-provider-<name>`, as OCCM's), e.g. a
    /// Warning on a Service whose load balancer lacks something the provider could not find.
    /// Written by the framework's event writer (deduplicated, bounded; a dry run under
    /// `--dry-run`).
    pub events: EventRecorder,
}

impl std::fmt::Debug for InitContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitContext").finish_non_exhaustive()
    }
}

/// A cloud provider: the one object a provider crate hands to the framework.
///
/// It is [`std::any::Any`], so that a controller a provider adds (see
/// [`crate::app::ProviderController`]) can reach its own provider's concrete type through
/// [`crate::controllers::ControllerContext::provider`]: `ctx.provider::<MyCloud>()`.
#[async_trait]
pub trait CloudProvider: std::any::Any + Send + Sync {
    /// The provider's name (e.g. `aws`); provider IDs are `<name>://<instance id>`.
    fn provider_name(&self) -> &str;

    /// Called once before the controllers start (after leadership is acquired). The default
    /// does nothing.
    async fn initialize(&self, _ctx: InitContext) -> CloudResult<()> {
        Ok(())
    }

    /// Called once on graceful shutdown, after the controllers stopped: close cloud sessions
    /// (the default does nothing). Bounded by the caller (5 s).
    async fn shutdown(&self) {}

    /// Registers the provider's own metrics (e.g. per-API-call counters). Called once at start
    /// so that `/metrics` shows them from the beginning. The default registers nothing.
    fn register_metrics(&self, _metrics: &Metrics) {}

    /// The load-balancer capability, if supported.
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        None
    }

    /// The legacy per-node instances capability, if supported.
    fn instances(&self) -> Option<&dyn Instances> {
        None
    }

    /// The preferred instances capability, if supported.
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        None
    }

    /// The deprecated zones capability (used only on the [`Instances`] path), if supported.
    fn zones(&self) -> Option<&dyn Zones> {
        None
    }

    /// The clusters capability, if supported (no controller uses it).
    fn clusters(&self) -> Option<&dyn Clusters> {
        None
    }

    /// The Pod CIDRs the cloud assigns to Nodes, for the node IPAM controller with
    /// `--cidr-allocator-type=CloudAllocator` ([`crate::controllers::nodeipam`]); `None` (the
    /// default): the cloud assigns none.
    fn cidr_allocator(&self) -> Option<&dyn crate::controllers::nodeipam::CloudCidrAllocator> {
        None
    }

    /// The routes capability, if supported.
    fn routes(&self) -> Option<&dyn Routes> {
        None
    }

    /// Whether a cluster ID is configured ("ClusterID is required and set"). When `false`, the
    /// controller manager refuses to start unless `--allow-untagged-cloud` is given.
    fn has_cluster_id(&self) -> bool {
        true
    }
}

/// Load balancers for `type: LoadBalancer` Services. `cluster_name` is `--cluster-name`.
#[async_trait]
pub trait LoadBalancer: Send + Sync {
    /// The status of the Service's load balancer, or `None` if no load balancer created by the
    /// service controller exists.
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>>;

    /// The name of the Service's load balancer. Default:
    /// [`crate::service::helpers::default_load_balancer_name`].
    fn get_load_balancer_name(&self, _cluster_name: &str, service: &Service) -> String {
        crate::service::helpers::default_load_balancer_name(service)
    }

    /// Creates or updates the load balancer so that it forwards to `nodes`; returns the status
    /// to write to `.status.loadBalancer`.
    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus>;

    /// Updates only the backend host set of an existing load balancer.
    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()>;

    /// Deletes the load balancer and everything the provider created for it. Idempotent:
    /// returns `Ok` when it does not exist. Must not return `ImplementedElsewhere`.
    async fn ensure_load_balancer_deleted(&self, cluster_name: &str, service: &Service) -> CloudResult<()>;

    /// Asked by the service controller after it wrote the status that a successful
    /// [`LoadBalancer::ensure_load_balancer`] returned: whether to sync the Service once more,
    /// for work that must wait until the Service shows its new load balancer (the AWS
    /// provider deletes the load balancer a type switch replaced then). That sync runs like any
    /// other: under the Service's lock, each call within `--cloud-call-timeout`, a failure
    /// retried with the queue's back-off and reported as an event. Not part of upstream's
    /// interface; the default never asks.
    fn sync_again_after_status(&self, _service: &Service) -> bool {
        false
    }
}

/// The legacy instances capability: one call per fact, by node name or by provider ID.
#[async_trait]
pub trait Instances: Send + Sync {
    /// Addresses of the instance named `name` (may use local metadata).
    async fn node_addresses(&self, name: &str) -> CloudResult<Vec<NodeAddress>>;
    /// Addresses of the instance with this provider ID (must not use local metadata).
    async fn node_addresses_by_provider_id(&self, provider_id: &str) -> CloudResult<Vec<NodeAddress>>;
    /// The cloud's instance ID for the node `name`; [`crate::CloudError::InstanceNotFound`] if absent.
    async fn instance_id(&self, name: &str) -> CloudResult<String>;
    /// The instance type of the node `name`.
    async fn instance_type(&self, name: &str) -> CloudResult<String>;
    /// The instance type of the instance with this provider ID.
    async fn instance_type_by_provider_id(&self, provider_id: &str) -> CloudResult<String>;
    /// Adds an SSH key to all instances (unused by the controllers).
    async fn add_ssh_key_to_all_instances(&self, _user: &str, _key: &[u8]) -> CloudResult<()> {
        Err(crate::CloudError::NotImplemented)
    }
    /// The node name for a host name (unused by the controllers).
    async fn current_node_name(&self, hostname: &str) -> CloudResult<String> {
        Ok(hostname.to_string())
    }
    /// Whether the instance exists; must be `true` for stopped instances. `Ok(false)` makes
    /// the node-lifecycle controller delete the Node.
    async fn instance_exists_by_provider_id(&self, provider_id: &str) -> CloudResult<bool>;
    /// Whether the instance is shut down.
    async fn instance_shutdown_by_provider_id(&self, provider_id: &str) -> CloudResult<bool>;
}

/// Everything the node controller writes onto a Node, from one call.
///
/// `#[non_exhaustive]`: fields may be added in a minor release. Build one with
/// [`InstanceMetadata::new`] and the `with_*` methods (or assign the public fields):
///
/// ```
/// use k8s_cloud_provider::InstanceMetadata;
///
/// let metadata = InstanceMetadata::new("sample://i-0123")
///     .with_instance_type("m5.large")
///     .with_zone("zone-a", "region-1");
/// assert_eq!((metadata.zone.as_str(), metadata.region.as_str()), ("zone-a", "region-1"));
/// assert!(metadata.node_addresses.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct InstanceMetadata {
    /// `<provider>://<id>`; written to `spec.providerID` if the Node has none. Must be stable.
    pub provider_id: String,
    /// Instance type label value; empty = no label.
    pub instance_type: String,
    /// Node addresses (merged by the rules of [`crate::node::helpers::desired_node_addresses`]).
    pub node_addresses: Vec<NodeAddress>,
    /// Zone label value; empty = no label.
    pub zone: String,
    /// Region label value; empty = no label.
    pub region: String,
    /// Extra labels (keys in the `kubernetes.io`/`k8s.io` namespaces are dropped).
    pub additional_labels: std::collections::BTreeMap<String, String>,
}

impl InstanceMetadata {
    /// Metadata with this provider ID and nothing else (no labels, no addresses).
    pub fn new(provider_id: impl Into<String>) -> Self {
        Self {
            provider_id: provider_id.into(),
            ..Self::default()
        }
    }

    /// With this instance type (the `node.kubernetes.io/instance-type` label).
    pub fn with_instance_type(mut self, instance_type: impl Into<String>) -> Self {
        self.instance_type = instance_type.into();
        self
    }

    /// With these Node addresses.
    pub fn with_node_addresses(mut self, node_addresses: Vec<NodeAddress>) -> Self {
        self.node_addresses = node_addresses;
        self
    }

    /// With this zone and region (the `topology.kubernetes.io/{zone,region}` labels).
    pub fn with_zone(mut self, zone: impl Into<String>, region: impl Into<String>) -> Self {
        self.zone = zone.into();
        self.region = region.into();
        self
    }

    /// With these extra labels.
    pub fn with_additional_labels(
        mut self,
        additional_labels: std::collections::BTreeMap<String, String>,
    ) -> Self {
        self.additional_labels = additional_labels;
        self
    }
}

/// The preferred instances capability: whole-Node calls, so a provider can use
/// `spec.providerID`, the name, labels or annotations as it sees fit.
#[async_trait]
pub trait InstancesV2: Send + Sync {
    /// Whether the Node's instance exists (`true` for stopped instances). `Ok(false)` makes
    /// the node-lifecycle controller delete the Node, so only answer `false` when the cloud
    /// positively says the instance is gone; errors (auth, network) must be errors.
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool>;
    /// Whether the Node's instance is shut down.
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool>;
    /// The Node's instance metadata; `Ok(None)` skips the node without error.
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>>;
}

/// A failure domain (`#[non_exhaustive]`: build it with [`Zone::new`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Zone {
    /// Zone (e.g. `us-east-1a`).
    pub failure_domain: String,
    /// Region (e.g. `us-east-1`).
    pub region: String,
}

impl Zone {
    /// A zone of a region.
    pub fn new(failure_domain: impl Into<String>, region: impl Into<String>) -> Self {
        Self {
            failure_domain: failure_domain.into(),
            region: region.into(),
        }
    }
}

/// The deprecated zones capability (only used with [`Instances`]).
#[async_trait]
pub trait Zones: Send + Sync {
    /// The zone of the machine the process runs on (unused by the controllers).
    async fn get_zone(&self) -> CloudResult<Zone>;
    /// The zone of the instance with this provider ID.
    async fn get_zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Zone>;
    /// The zone of the node `name`.
    async fn get_zone_by_node_name(&self, name: &str) -> CloudResult<Zone>;
}

/// The clusters capability (no controller uses it).
#[async_trait]
pub trait Clusters: Send + Sync {
    /// Names of all clusters.
    async fn list_clusters(&self) -> CloudResult<Vec<String>>;
    /// The address of the cluster's control plane.
    async fn master(&self, cluster_name: &str) -> CloudResult<String>;
}

/// A pod-network route to a node.
///
/// `#[non_exhaustive]`: build one with [`Route::new`] and the `with_*` methods (or assign the
/// public fields).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Route {
    /// The provider's name for the route (ignored on create).
    pub name: String,
    /// The node the route points at.
    pub target_node: String,
    /// Whether the provider compares node addresses (then `target_node_addresses` matter).
    pub enable_node_addresses: bool,
    /// The target node's addresses (set on create).
    pub target_node_addresses: Vec<NodeAddress>,
    /// The pod CIDR the route covers.
    pub destination_cidr: String,
    /// Whether the route's target is gone.
    pub blackhole: bool,
}

impl Route {
    /// A route of `destination_cidr` to `target_node`, without a name (set by the cloud).
    pub fn new(target_node: impl Into<String>, destination_cidr: impl Into<String>) -> Self {
        Self {
            target_node: target_node.into(),
            destination_cidr: destination_cidr.into(),
            ..Self::default()
        }
    }

    /// With the provider's name for it.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// With the target node's addresses, compared by the provider
    /// (`enable_node_addresses`).
    pub fn with_target_node_addresses(mut self, addresses: Vec<NodeAddress>) -> Self {
        self.enable_node_addresses = true;
        self.target_node_addresses = addresses;
        self
    }

    /// Marked as a blackhole (its target is gone) or not.
    pub fn with_blackhole(mut self, blackhole: bool) -> Self {
        self.blackhole = blackhole;
        self
    }
}

/// The routes capability.
#[async_trait]
pub trait Routes: Send + Sync {
    /// Every route this cluster manages.
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>>;
    /// Creates a route; `name_hint` is the target Node's UID.
    async fn create_route(&self, cluster_name: &str, name_hint: &str, route: &Route) -> CloudResult<()>;
    /// Deletes a route as returned by [`Routes::list_routes`].
    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()>;
}
