//! Well-known labels, taints, annotations, finalizers, event reasons and messages, in one place
//! so that tests can assert the exact strings upstream uses.

/// Taint kubelet (`--cloud-provider=external`) puts on a new Node until the cloud-node
/// controller initialises it (value `true`, effect `NoSchedule`).
pub const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Taint the lifecycle controller puts on Nodes whose instance is shut down (effect `NoSchedule`).
pub const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// Taint cluster-autoscaler puts on Nodes it is about to delete.
pub const TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER: &str = "ToBeDeletedByClusterAutoscaler";

/// Annotation kubelet writes when started with `--cloud-provider=external --node-ip=…`.
pub const ANNOTATION_PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";

/// Finalizer the service controller puts on LoadBalancer Services before creating the LB.
pub const FINALIZER_LOAD_BALANCER_CLEANUP: &str = "service.kubernetes.io/load-balancer-cleanup";
/// Node label that excludes a Node from load-balancer backends (bool-parsed; unparsable,
/// including the empty value, excludes).
pub const LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";
/// Service annotation listing allowed client CIDRs (comma-separated).
pub const ANNOTATION_LOAD_BALANCER_SOURCE_RANGES: &str =
    "service.beta.kubernetes.io/load-balancer-source-ranges";

/// GA instance-type label.
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Beta instance-type label.
pub const LABEL_INSTANCE_TYPE_BETA: &str = "beta.kubernetes.io/instance-type";
/// GA zone label.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// Beta zone label.
pub const LABEL_FAILURE_DOMAIN_ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
/// GA region label.
pub const LABEL_TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";
/// Beta region label.
pub const LABEL_FAILURE_DOMAIN_REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";
/// Legacy control-plane role label (only 1.20's service controller excluded it).
pub const LABEL_NODE_ROLE_MASTER: &str = "node-role.kubernetes.io/master";

/// Beta → GA label pairs reconciled on initialised Nodes (primary → secondary).
pub const BETA_TO_GA_LABELS: [(&str, &str); 3] = [
    (LABEL_FAILURE_DOMAIN_ZONE_BETA, LABEL_TOPOLOGY_ZONE),
    (LABEL_FAILURE_DOMAIN_REGION_BETA, LABEL_TOPOLOGY_REGION),
    (LABEL_INSTANCE_TYPE_BETA, LABEL_INSTANCE_TYPE),
];

/// Secure serving port of the cloud-controller-manager.
pub const CLOUD_CONTROLLER_MANAGER_PORT: u16 = 10258;

/// Event reasons and messages, exactly as upstream.
pub mod events {
    /// Node initialised (Normal).
    pub const SYNCED: &str = "Synced";
    /// Message of [`SYNCED`].
    pub const SYNCED_MESSAGE: &str = "Node synced successfully";
    /// Node deleted because its instance is gone (Normal).
    pub const DELETING_NODE: &str = "DeletingNode";
    /// Node deletion failed (Warning).
    pub const DELETING_NODE_FAILED: &str = "DeletingNodeFailed";
    /// A Node that is not Ready is kept because the cloud could not tell whether its instance
    /// exists (Warning; not part of upstream, which only logs).
    pub const INSTANCE_EXISTENCE_UNKNOWN: &str = "InstanceExistenceUnknown";
    /// The kubelet's `--node-ip` (the `alpha.kubernetes.io/provided-node-ip` annotation) is
    /// unparsable or none of the instance's addresses, so the Node stays uninitialised (Warning;
    /// not part of upstream, which only logs and retries).
    pub const PROVIDED_NODE_IP_INVALID: &str = "ProvidedNodeIPInvalid";
    /// Route creation failed (Warning, on the Node).
    pub const FAILED_TO_CREATE_ROUTE: &str = "FailedToCreateRoute";
    /// Service controller: about to ensure the LB (Normal).
    pub const ENSURING_LOAD_BALANCER: &str = "EnsuringLoadBalancer";
    /// Service controller: LB ensured (Normal).
    pub const ENSURED_LOAD_BALANCER: &str = "EnsuredLoadBalancer";
    /// Service controller: about to delete the LB (Normal).
    pub const DELETING_LOAD_BALANCER: &str = "DeletingLoadBalancer";
    /// Service controller: LB deleted (Normal).
    pub const DELETED_LOAD_BALANCER: &str = "DeletedLoadBalancer";
    /// Service controller: deletion failed (Warning).
    pub const DELETE_LOAD_BALANCER_FAILED: &str = "DeleteLoadBalancerFailed";
    /// Service controller: sync failed (Warning).
    pub const SYNC_LOAD_BALANCER_FAILED: &str = "SyncLoadBalancerFailed";
    /// Service controller: no backend nodes (Warning).
    pub const UNAVAILABLE_LOAD_BALANCER: &str = "UnAvailableLoadBalancer";
    /// Service controller: hosts updated (Normal).
    pub const UPDATED_LOAD_BALANCER: &str = "UpdatedLoadBalancer";
    /// Service controller: host update failed (Warning).
    pub const UPDATE_LOAD_BALANCER_FAILED: &str = "UpdateLoadBalancerFailed";
}

/// The `NetworkUnavailable` condition written by the route controller.
pub mod conditions {
    /// Condition type.
    pub const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";
    /// Reason when the node's routes exist (status `False`).
    pub const ROUTE_CREATED: &str = "RouteCreated";
    /// Message for [`ROUTE_CREATED`].
    pub const ROUTE_CREATED_MESSAGE: &str = "RouteController created a route";
    /// Reason when a route is missing (status `True`).
    pub const NO_ROUTE_CREATED: &str = "NoRouteCreated";
    /// Message for [`NO_ROUTE_CREATED`].
    pub const NO_ROUTE_CREATED_MESSAGE: &str = "RouteController failed to create a route";
}
