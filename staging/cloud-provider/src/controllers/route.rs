//! The node-route controller (`node-route-controller`, spec §5): every
//! `--route-reconciliation-period`, makes the cloud's routes match the Nodes' pod CIDRs and
//! records the outcome in each Node's `NetworkUnavailable` condition.
//!
//! Only routes whose destination lies inside `--cluster-cidr` are ever deleted; routes outside
//! are left alone. At most 200 cloud route operations are in flight at once.
//!
//! Deliberate difference (spec §5 step 6): a Node's `NetworkUnavailable` condition is written as
//! soon as that Node's own routes are made, not after every route of the pass; the condition
//! says the same, but in a burst of 1000 routes the conditions no longer wait for the last
//! route (the writes overlap the cloud calls instead of following them).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use ipnet::IpNet;
use k8s_controller_manager::events::{EventRecorder, EventType};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use tokio::sync::Semaphore;
use tracing::{Instrument, debug, info_span, warn};

use super::{ControllerContext, node_reference, retry_on_conflict};
use crate::{
    cloud::Route,
    node::helpers::addresses,
    well_known::{conditions, events},
};

/// Canonical controller name.
pub const NAME: &str = "node-route-controller";
/// Client name (credentials).
pub const CLIENT_NAME: &str = "route-controller";
/// Event source component (with an underscore, as upstream).
pub const COMPONENT: &str = "route_controller";
/// Maximum cloud route operations in flight.
pub const MAX_CONCURRENT_ROUTE_OPERATIONS: usize = 200;

/// What to do for one node's pod CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteAction {
    /// A matching route exists.
    Keep,
    /// A route for the CIDR exists but its node addresses differ.
    Update,
    /// No route for the CIDR exists.
    Add,
}

/// Validates `--cluster-cidr` for the route controller: 1 or 2 CIDRs, dual-stack if 2.
pub fn validate_cluster_cidrs(cidrs: &[IpNet]) -> Result<(), String> {
    match cidrs {
        [] => Err("RouteController: Must specify clusterCIDR.".into()),
        [_] => Ok(()),
        [a, b] => {
            if matches!(a, IpNet::V4(_)) == matches!(b, IpNet::V4(_)) {
                Err("len of ClusterCIDRs==2 and they are not configured as dual stack (at least one from each IPFamily".into())
            } else {
                Ok(())
            }
        }
        more => Err(format!(
            "length of clusterCIDRs is:{} more than max allowed of 2",
            more.len()
        )),
    }
}

/// Parses `--cluster-cidr` (comma-separated, trimmed).
pub fn parse_cluster_cidrs(value: &str) -> Result<Vec<IpNet>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNet>()
                .map_err(|e| format!("--cluster-cidr: {s:?} is not a valid CIDR: {e}"))
        })
        .collect()
}

/// The node's pod CIDRs (`spec.podCIDRs`, else `spec.podCIDR`).
pub fn pod_cidrs(node: &Node) -> Vec<String> {
    let spec = node.spec.as_ref();
    match spec.and_then(|s| s.pod_cidrs.clone()).filter(|v| !v.is_empty()) {
        Some(v) => v,
        None => spec
            .and_then(|s| s.pod_cidr.clone())
            .into_iter()
            .filter(|c| !c.is_empty())
            .collect(),
    }
}

/// Whether the controller is responsible for a route: its destination parses and its first or
/// last address lies in a cluster CIDR.
pub fn is_responsible_for(route: &Route, cluster_cidrs: &[IpNet]) -> bool {
    let Ok(dest) = route.destination_cidr.parse::<IpNet>() else {
        warn!(route = %route.name, cidr = %route.destination_cidr, "route has an unparsable destination CIDR, ignoring it");
        return false;
    };
    let (first, last) = (dest.network(), dest.broadcast());
    cluster_cidrs
        .iter()
        .any(|c| c.contains(&first) || c.contains(&last))
}

fn same_addresses(a: &[NodeAddress], b: &[NodeAddress]) -> bool {
    let mut x: Vec<(&str, &str)> = a.iter().map(|n| (n.type_.as_str(), n.address.as_str())).collect();
    let mut y: Vec<(&str, &str)> = b.iter().map(|n| (n.type_.as_str(), n.address.as_str())).collect();
    x.sort();
    x.dedup();
    y.sort();
    y.dedup();
    x == y
}

/// The plan of one reconcile (pure; unit-tested): per node and CIDR the action, and the routes
/// to delete.
pub fn plan(
    nodes: &[Arc<Node>],
    routes: &[Route],
    cluster_cidrs: &[IpNet],
) -> (BTreeMap<String, BTreeMap<String, RouteAction>>, Vec<Route>) {
    let mut by_node: HashMap<&str, Vec<&Route>> = HashMap::new();
    for r in routes {
        if !r.target_node.is_empty() {
            by_node.entry(r.target_node.as_str()).or_default().push(r);
        }
    }
    let mut actions: BTreeMap<String, BTreeMap<String, RouteAction>> = BTreeMap::new();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let cidrs = pod_cidrs(node);
        if cidrs.is_empty() {
            continue;
        }
        let existing = by_node.get(name.as_str()).cloned().unwrap_or_default();
        let entry = actions.entry(name.clone()).or_default();
        for cidr in cidrs {
            let action = match existing.iter().find(|r| r.destination_cidr == cidr) {
                Some(r)
                    if !r.enable_node_addresses
                        || same_addresses(&r.target_node_addresses, addresses(node)) =>
                {
                    RouteAction::Keep
                }
                Some(_) => RouteAction::Update,
                None => RouteAction::Add,
            };
            debug!(node = %name, cidr = %cidr, ?action, "action for Node {name:?} with CIDR {cidr:?}: {action:?}");
            entry.insert(cidr, action);
        }
    }
    // Nodes known only through existing routes (no pod CIDR) get an empty action map.
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        if by_node.contains_key(name.as_str()) {
            actions.entry(name).or_default();
        }
    }
    let to_delete = routes
        .iter()
        .filter(|r| is_responsible_for(r, cluster_cidrs))
        .filter(|r| {
            r.blackhole
                || match actions
                    .get(&r.target_node)
                    .and_then(|a| a.get(&r.destination_cidr))
                {
                    None => true,
                    Some(RouteAction::Update) => true,
                    Some(_) => false,
                }
        })
        .cloned()
        .collect();
    (actions, to_delete)
}

/// The node-route controller.
pub struct RouteController {
    ctx: ControllerContext,
    api: Api<Node>,
    recorder: EventRecorder,
    limiter: Arc<Semaphore>,
}

impl RouteController {
    /// Builds the controller; fails when the provider has no routes or `--cluster-cidr` is
    /// invalid.
    pub fn new(ctx: ControllerContext) -> Result<Self, String> {
        if ctx.cloud.routes().is_none() {
            return Err(
                "--configure-cloud-routes is set, but cloud provider does not support routes. Will not configure cloud provider routes.".into(),
            );
        }
        validate_cluster_cidrs(&ctx.config.cluster_cidrs)?;
        Ok(Self {
            api: Api::all(ctx.client_for(CLIENT_NAME)),
            recorder: ctx.events.recorder(COMPONENT),
            limiter: Arc::new(Semaphore::new(MAX_CONCURRENT_ROUTE_OPERATIONS)),
            ctx,
        })
    }

    /// Reconciles every `--route-reconciliation-period` (measured from the start of each run)
    /// until shutdown.
    pub async fn run(self) {
        let store = self.ctx.nodes.store();
        tokio::select! {
            _ = store.wait_synced() => {}
            _ = self.ctx.shutdown.cancelled() => return,
        }
        let mut ticker = tokio::time::interval(self.ctx.config.route_reconciliation_period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = self.ctx.shutdown.cancelled() => return,
            }
            let start = Instant::now();
            // A panic fails this pass only (counted; the next tick retries).
            let ok = super::catch_panic(
                &self.ctx,
                NAME,
                "routes",
                self.reconcile()
                    .instrument(info_span!("reconcile", controller = NAME)),
            )
            .await;
            let outcome = match ok {
                Ok(true) => "success",
                Ok(false) => "error",
                Err(_) => "panic",
            };
            self.ctx.cloud_metrics.route_sync_total.inc();
            self.ctx
                .metrics
                .reconcile_duration
                .with_label_values(&[NAME])
                .observe(start.elapsed().as_secs_f64());
            self.ctx
                .metrics
                .reconcile_total
                .with_label_values(&[NAME, outcome])
                .inc();
        }
    }

    /// One reconcile. Returns whether the routes could be listed.
    pub async fn reconcile(&self) -> bool {
        let Some(routes_api) = self.ctx.cloud.routes() else {
            return false;
        };
        let cluster = self.ctx.config.cluster_name.as_str();
        let m = &self.ctx.cloud_metrics;
        let routes = match m
            .observe(NAME, "ListRoutes", routes_api.list_routes(cluster))
            .await
        {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "error listing routes: {e}");
                return false;
            }
        };
        let nodes = self.ctx.nodes.store().list();
        let (actions, to_delete) = plan(&nodes, &routes, &self.ctx.config.cluster_cidrs);

        let deletions = futures::future::join_all(to_delete.into_iter().map(|r| self.delete_route(r)));
        let wait_for_deletions = routes.first().is_some_and(|r| r.enable_node_addresses);
        let by_name: HashMap<String, Arc<Node>> = nodes
            .iter()
            .map(|n| (n.metadata.name.clone().unwrap_or_default(), n.clone()))
            .collect();
        // Per Node: its missing routes, then its condition (see the module docs).
        let per_node = actions.into_iter().filter_map(|(name, cidrs)| {
            let node = by_name.get(&name)?.clone();
            Some(self.make_routes_of_node(node, cidrs))
        });
        let per_node = futures::future::join_all(per_node);
        if wait_for_deletions {
            deletions.await;
            per_node.await;
        } else {
            tokio::join!(deletions, per_node);
        }
        true
    }

    /// Creates the routes of `cidrs` that are missing or outdated for `node`, then records in
    /// its `NetworkUnavailable` condition whether all of its routes exist.
    async fn make_routes_of_node(&self, node: Arc<Node>, cidrs: BTreeMap<String, RouteAction>) {
        let missing = cidrs
            .iter()
            .filter(|(_, action)| matches!(action, RouteAction::Add | RouteAction::Update))
            .map(|(cidr, _)| self.create_route(node.clone(), cidr.clone()));
        let all_created = futures::future::join_all(missing)
            .await
            .into_iter()
            .all(|created| created);
        let routes_created = !cidrs.is_empty() && all_created;
        self.update_network_condition_logged(node, routes_created).await;
    }

    async fn delete_route(&self, route: Route) {
        let Some(routes_api) = self.ctx.cloud.routes() else {
            return;
        };
        let _permit = self.limiter.acquire().await;
        let start = Instant::now();
        let cluster = self.ctx.config.cluster_name.as_str();
        match self
            .ctx
            .cloud_metrics
            .observe(NAME, "DeleteRoute", routes_api.delete_route(cluster, &route))
            .await
        {
            Ok(()) => debug!(route = %route.name, cidr = %route.destination_cidr, "deleted route"),
            Err(e) => warn!(route = %route.name, cidr = %route.destination_cidr, error = %e,
                "Could not delete route {} {} after {:?}: {e}", route.name, route.destination_cidr, start.elapsed()),
        }
    }

    /// Creates the route of `cidr` to `node`; whether it was made (a failure is logged and
    /// recorded as a `FailedToCreateRoute` event).
    async fn create_route(&self, node: Arc<Node>, cidr: String) -> bool {
        let name = node.metadata.name.clone().unwrap_or_default();
        let Some(routes_api) = self.ctx.cloud.routes() else {
            return false;
        };
        let _permit = self.limiter.acquire().await;
        let name_hint = node.metadata.uid.clone().unwrap_or_default();
        let route = Route {
            target_node: name.clone(),
            target_node_addresses: addresses(&node).to_vec(),
            destination_cidr: cidr.clone(),
            ..Default::default()
        };
        let start = Instant::now();
        let cluster = self.ctx.config.cluster_name.as_str();
        match self
            .ctx
            .cloud_metrics
            .observe(
                NAME,
                "CreateRoute",
                routes_api.create_route(cluster, &name_hint, &route),
            )
            .await
        {
            Ok(()) => true,
            Err(e) => {
                let msg = format!(
                    "Could not create route {name_hint} {cidr} for node {name} after {:?}: {e}",
                    start.elapsed()
                );
                warn!(node = %name, "{msg}");
                self.recorder.event(
                    &node_reference(&node),
                    EventType::Warning,
                    events::FAILED_TO_CREATE_ROUTE,
                    msg,
                );
                false
            }
        }
    }

    async fn update_network_condition_logged(&self, node: Arc<Node>, routes_created: bool) {
        let _permit = self.limiter.acquire().await;
        if let Err(e) = self.update_network_condition(&node, routes_created).await {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            warn!(node = %name, error = %e, "Error updating node {name}: {e}");
        }
    }

    async fn update_network_condition(&self, node: &Node, routes_created: bool) -> Result<(), kube::Error> {
        let (status, reason, message) = if routes_created {
            (
                "False",
                conditions::ROUTE_CREATED,
                conditions::ROUTE_CREATED_MESSAGE,
            )
        } else {
            (
                "True",
                conditions::NO_ROUTE_CREATED,
                conditions::NO_ROUTE_CREATED_MESSAGE,
            )
        };
        let existing = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == conditions::NETWORK_UNAVAILABLE));
        if let Some(c) = existing
            && c.status == status
            && c.reason.as_deref() == Some(reason)
        {
            return Ok(());
        }
        let now = k8s_openapi::jiff::Timestamp::now();
        let patch = serde_json::json!({
            "status": { "conditions": [{
                "type": conditions::NETWORK_UNAVAILABLE,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }]}
        });
        let name = node.metadata.name.clone().unwrap_or_default();
        retry_on_conflict(5, Duration::from_millis(100), |_| {
            let (api, name, patch) = (self.api.clone(), name.clone(), patch.clone());
            async move {
                api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await
                    .map(|_| ())
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use kube::api::ObjectMeta;

    fn node(name: &str, cidrs: &[&str]) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidrs: Some(cidrs.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            }),
            status: None,
        })
    }

    fn route(node: &str, cidr: &str) -> Route {
        Route {
            name: format!("r-{cidr}"),
            target_node: node.into(),
            destination_cidr: cidr.into(),
            ..Default::default()
        }
    }

    #[test]
    fn cluster_cidr_validation() {
        let v4: IpNet = "10.244.0.0/16".parse().unwrap();
        let v6: IpNet = "fd00:10::/56".parse().unwrap();
        assert!(validate_cluster_cidrs(&[v4]).is_ok());
        assert!(validate_cluster_cidrs(&[v4, v6]).is_ok());
        assert_eq!(
            validate_cluster_cidrs(&[]).unwrap_err(),
            "RouteController: Must specify clusterCIDR."
        );
        assert!(
            validate_cluster_cidrs(&[v4, v4])
                .unwrap_err()
                .contains("not configured as dual stack")
        );
        assert_eq!(
            validate_cluster_cidrs(&[v4, v6, v4]).unwrap_err(),
            "length of clusterCIDRs is:3 more than max allowed of 2"
        );
        assert_eq!(
            parse_cluster_cidrs(" 10.244.0.0/16 , fd00:10::/56").unwrap(),
            vec![v4, v6]
        );
        assert!(
            parse_cluster_cidrs("10.244.0.0/33")
                .unwrap_err()
                .contains("--cluster-cidr")
        );
    }

    #[test]
    fn plan_adds_keeps_and_deletes_only_inside_the_cluster_cidr() {
        let cluster: Vec<IpNet> = vec!["10.244.0.0/16".parse().unwrap()];
        let nodes = vec![node("a", &["10.244.1.0/24"]), node("b", &["10.244.2.0/24"])];
        let routes = vec![
            route("a", "10.244.1.0/24"),     // keep
            route("gone", "10.244.9.0/24"),  // node deleted: delete
            route("gone", "192.168.0.0/24"), // outside the cluster CIDR: untouched
            Route {
                blackhole: true,
                ..route("a", "10.244.7.0/24")
            },
            route("x", "not-a-cidr"),
        ];
        let (actions, delete) = plan(&nodes, &routes, &cluster);
        assert_eq!(actions["a"]["10.244.1.0/24"], RouteAction::Keep);
        assert_eq!(actions["b"]["10.244.2.0/24"], RouteAction::Add);
        let deleted: Vec<&str> = delete.iter().map(|r| r.destination_cidr.as_str()).collect();
        assert_eq!(deleted, vec!["10.244.9.0/24", "10.244.7.0/24"]);
    }

    #[test]
    fn routes_straddling_the_cluster_cidr_are_owned() {
        let cluster: Vec<IpNet> = vec!["10.244.0.0/16".parse().unwrap()];
        assert!(is_responsible_for(&route("n", "10.244.255.0/24"), &cluster));
        assert!(!is_responsible_for(&route("n", "10.0.0.0/8"), &cluster));
        assert!(is_responsible_for(&route("n", "10.244.0.0/15"), &cluster));
    }

    #[test]
    fn address_changes_make_an_update_when_the_provider_compares_addresses() {
        let cluster: Vec<IpNet> = vec!["10.244.0.0/16".parse().unwrap()];
        let mut n = (*node("a", &["10.244.1.0/24"])).clone();
        n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: "10.0.0.2".into(),
            }]),
            ..Default::default()
        });
        let r = Route {
            enable_node_addresses: true,
            target_node_addresses: vec![NodeAddress {
                type_: "InternalIP".into(),
                address: "10.0.0.1".into(),
            }],
            ..route("a", "10.244.1.0/24")
        };
        let (actions, delete) = plan(&[Arc::new(n)], &[r], &cluster);
        assert_eq!(actions["a"]["10.244.1.0/24"], RouteAction::Update);
        assert_eq!(delete.len(), 1);
    }
}
