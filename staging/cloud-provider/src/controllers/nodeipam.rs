//! The node IPAM controller (upstream `nodeipam`, `--allocate-node-cidrs`): gives every Node
//! without one a Pod CIDR per IP family from `--cluster-cidr`, as kube-controller-manager's
//! range allocator does — or, with `--cidr-allocator-type=CloudAllocator`, the CIDRs the
//! provider's cloud assigned to the Node's instance ([`CloudCidrAllocator`]).
//!
//! It is not one of the four controllers every provider runs: a provider offers it with
//! [`provider_controller`] (`ProviderSpec::with_controller(nodeipam::provider_controller())`),
//! as Go providers import `nodeipam` (cloud-provider-gcp does); it is then named
//! `node-ipam-controller` (alias `nodeipam`), off unless named in `--controllers`, and
//! skipped while `--allocate-node-cidrs` is false.
//!
//! Range allocation, as upstream's: one `--cluster-cidr` per family (dual-stack: both), each
//! cut into subnets of `--node-cidr-mask-size-ipv4` (default 24) / `--node-cidr-mask-size-ipv6`
//! (default 64) (`--node-cidr-mask-size` for a single-stack cluster); a Node gets the lowest
//! free subnet of each family; the CIDRs Nodes hold (set by anyone) are taken, whatever their
//! order of arrival; a deleted Node's subnet is free again. When a family has no free subnet
//! left, the Node gets none and a `CIDRNotAvailable` event says so; it is tried again when Nodes
//! change.
//!
//! What it never does: change or remove a Node's Pod CIDR (the API server refuses that too), or
//! give one to a Node that has any. The allocation is recomputed from the Nodes each time (no
//! state of its own survives a restart, so none can go stale); a CIDR it just gave is held
//! until the informer shows it on the Node, so that two Nodes never get the same one.

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use ipnet::IpNet;
use k8s_controller_manager::{
    events::{EventRecorder, EventType},
    informer::next_event,
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use tracing::{info, warn};

use super::{ControllerContext, node_reference};
use crate::{
    app::{ProviderController, ProviderControllerStart},
    error::CloudResult,
};

/// Canonical controller name.
pub const NAME: &str = "node-ipam-controller";
/// Its other name in `--controllers` (upstream's).
pub const ALIASES: &[&str] = &["nodeipam"];
/// Client name (credentials).
pub const CLIENT_NAME: &str = "node-ipam-controller";
/// Event source component, as upstream's.
pub const COMPONENT: &str = "cidrAllocator";
/// The event when a family has no free subnet left (upstream's reason).
pub const CIDR_NOT_AVAILABLE: &str = "CIDRNotAvailable";
/// The event when writing a Node's Pod CIDRs failed (upstream's reason).
pub const CIDR_ASSIGNMENT_FAILED: &str = "CIDRAssignmentFailed";
/// How often the Nodes are looked at when nothing changes.
pub const RESYNC: Duration = Duration::from_secs(30);
/// How long a CIDR just given is held for the Node while the informer does not show it.
pub const HOLD: Duration = Duration::from_secs(60);

/// The Pod CIDRs a provider's cloud assigns to Nodes (`--cidr-allocator-type=CloudAllocator`),
/// offered by [`crate::CloudProvider::cidr_allocator`].
#[crate::async_trait]
pub trait CloudCidrAllocator: Send + Sync {
    /// The Pod CIDRs the cloud assigned to the Node's instance, one per IP family; empty when
    /// it has none yet (asked again when Nodes change, and every [`RESYNC`]).
    async fn node_pod_cidrs(&self, node: &Node) -> CloudResult<Vec<IpNet>>;
}

/// The controller's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Node IPAM controller flags")]
pub struct NodeIpamFlags {
    /// Mask size of the Pod CIDR of each Node in a single-stack cluster (0: 24 for IPv4, 64 for
    /// IPv6).
    #[arg(long = "node-cidr-mask-size", default_value_t = 0)]
    pub node_cidr_mask_size: u8,
    /// Mask size of each Node's IPv4 Pod CIDR in a dual-stack cluster (0: 24).
    #[arg(long = "node-cidr-mask-size-ipv4", default_value_t = 0)]
    pub node_cidr_mask_size_ipv4: u8,
    /// Mask size of each Node's IPv6 Pod CIDR in a dual-stack cluster (0: 64).
    #[arg(long = "node-cidr-mask-size-ipv6", default_value_t = 0)]
    pub node_cidr_mask_size_ipv6: u8,
}

/// Where the CIDRs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorType {
    /// Subnets of `--cluster-cidr`.
    Range,
    /// The provider's cloud.
    Cloud,
}

/// The subnets of one cluster CIDR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetRange {
    cluster: IpNet,
    mask: u8,
}

impl SubnetRange {
    /// The subnets of `cluster` with prefix length `mask`; an error (upstream's limits) when
    /// `mask` is shorter than the cluster CIDR's, longer than the family allows, or gives more
    /// than 2^16 subnets of an IPv6 range.
    pub fn new(cluster: IpNet, mask: u8) -> Result<Self, String> {
        let prefix = cluster.prefix_len();
        if mask < prefix || mask > cluster.max_prefix_len() {
            return Err(format!(
                "node CIDR mask size {mask} does not fit cluster CIDR {cluster} (between {prefix} and {})",
                cluster.max_prefix_len()
            ));
        }
        if mask - prefix > 16 && matches!(cluster, IpNet::V6(_)) {
            return Err(format!(
                "cluster CIDR {cluster} with node CIDR mask size {mask} gives more than 2^16 subnets (upstream's limit)"
            ));
        }
        Ok(Self {
            cluster: cluster.trunc(),
            mask,
        })
    }

    /// How many subnets there are.
    pub fn len(&self) -> u128 {
        1u128 << u32::from(self.mask - self.cluster.prefix_len()).min(127)
    }

    /// Whether there are none (never: a range has at least one).
    pub fn is_empty(&self) -> bool {
        false
    }

    fn shift(&self) -> u32 {
        u32::from(self.cluster.max_prefix_len() - self.mask)
    }

    fn base(&self) -> u128 {
        match self.cluster.network() {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        }
    }

    /// The index of `cidr` when it is one of the subnets.
    pub fn index_of(&self, cidr: &IpNet) -> Option<u128> {
        if cidr.prefix_len() != self.mask || !self.cluster.contains(&cidr.network()) {
            return None;
        }
        let addr = match (cidr.network(), &self.cluster) {
            (IpAddr::V4(a), IpNet::V4(_)) => u128::from(u32::from(a)),
            (IpAddr::V6(a), IpNet::V6(_)) => u128::from(a),
            _ => return None,
        };
        Some((addr - self.base()) >> self.shift())
    }

    /// The subnet at `index`.
    pub fn subnet(&self, index: u128) -> Option<IpNet> {
        if index >= self.len() {
            return None;
        }
        let addr = self.base() + (index << self.shift());
        let net = match self.cluster {
            IpNet::V4(_) => IpNet::new(IpAddr::V4(u32::try_from(addr).ok()?.into()), self.mask),
            IpNet::V6(_) => IpNet::new(IpAddr::V6(addr.into()), self.mask),
        };
        net.ok()
    }

    /// The lowest subnet whose index is not in `used`.
    pub fn lowest_free(&self, used: &BTreeSet<u128>) -> Option<IpNet> {
        let mut next = 0u128;
        for u in used {
            if *u != next {
                break;
            }
            next += 1;
        }
        self.subnet(next)
    }
}

/// The subnet ranges of `cluster_cidrs` with the flags' mask sizes (upstream's defaults).
pub fn ranges(cluster_cidrs: &[IpNet], flags: &NodeIpamFlags) -> Result<Vec<SubnetRange>, String> {
    if cluster_cidrs.is_empty() {
        return Err("--allocate-node-cidrs with the RangeAllocator needs --cluster-cidr".into());
    }
    let dual = cluster_cidrs.len() == 2;
    if dual && flags.node_cidr_mask_size != 0 {
        return Err(
            "--node-cidr-mask-size is for a single-stack --cluster-cidr; use --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6"
                .into(),
        );
    }
    cluster_cidrs
        .iter()
        .map(|c| {
            let (family, default) = match c {
                IpNet::V4(_) => (flags.node_cidr_mask_size_ipv4, 24),
                IpNet::V6(_) => (flags.node_cidr_mask_size_ipv6, 64),
            };
            let mask = match (dual, flags.node_cidr_mask_size, family) {
                (false, single, _) if single != 0 => single,
                (_, _, f) if f != 0 => f,
                _ => default,
            };
            SubnetRange::new(*c, mask)
        })
        .collect()
}

/// The Pod CIDRs a Node has (`spec.podCIDRs`, else `spec.podCIDR`), parsed.
fn pod_cidrs(node: &Node) -> Vec<IpNet> {
    let spec = node.spec.as_ref();
    let listed: Vec<String> = spec
        .and_then(|s| s.pod_cidrs.clone())
        .filter(|c| !c.is_empty())
        .or_else(|| spec.and_then(|s| s.pod_cidr.clone()).map(|c| vec![c]))
        .unwrap_or_default();
    listed.iter().filter_map(|c| c.parse().ok()).collect()
}

fn has_pod_cidr(node: &Node) -> bool {
    node.spec.as_ref().is_some_and(|s| {
        s.pod_cidr.as_deref().is_some_and(|c| !c.is_empty())
            || s.pod_cidrs.as_ref().is_some_and(|c| !c.is_empty())
    })
}

/// The controller as a provider adds it (see the module docs).
pub fn provider_controller() -> ProviderController {
    ProviderController::new(NAME, CLIENT_NAME, |matches| {
        let flags = <NodeIpamFlags as clap::FromArgMatches>::from_arg_matches(matches)
            .map_err(|e| format!("node IPAM controller flags: {e}"))?;
        let allocate = matches
            .get_one::<bool>("allocate_node_cidrs")
            .copied()
            .unwrap_or(false);
        let kind = match matches
            .get_one::<String>("cidr_allocator_type")
            .map(String::as_str)
            .unwrap_or("RangeAllocator")
        {
            "RangeAllocator" => AllocatorType::Range,
            "CloudAllocator" => AllocatorType::Cloud,
            other => {
                return Err(format!(
                    "--cidr-allocator-type={other:?}: RangeAllocator and CloudAllocator are supported"
                )
                .into());
            }
        };
        let start: ProviderControllerStart = Arc::new(move |ctx: ControllerContext| {
            if !allocate {
                return Err("--allocate-node-cidrs is false".into());
            }
            let allocator = match kind {
                AllocatorType::Range => Allocator::Range(ranges(&ctx.config.cluster_cidrs, &flags)?),
                AllocatorType::Cloud => {
                    if ctx.cloud.cidr_allocator().is_none() {
                        return Err(format!(
                            "--cidr-allocator-type=CloudAllocator: the {} provider allocates no CIDRs",
                            ctx.cloud.provider_name()
                        )
                        .into());
                    }
                    Allocator::Cloud
                }
            };
            let controller = NodeIpam {
                recorder: ctx.events.recorder(COMPONENT),
                api: Api::all(ctx.client_for(CLIENT_NAME)),
                allocator,
                held: HashMap::new(),
                ctx,
            };
            Ok(tokio::spawn(controller.run()))
        });
        Ok(start)
    })
    .with_aliases(ALIASES)
    .enabled_by_default(false)
    .with_flags(<NodeIpamFlags as clap::Args>::augment_args)
}

enum Allocator {
    Range(Vec<SubnetRange>),
    Cloud,
}

struct NodeIpam {
    ctx: ControllerContext,
    recorder: EventRecorder,
    api: Api<Node>,
    allocator: Allocator,
    /// CIDRs just given, by Node name, until the informer shows them.
    held: HashMap<String, (Vec<IpNet>, Instant)>,
}

impl NodeIpam {
    async fn run(mut self) {
        let mut events = self.ctx.nodes.subscribe();
        self.ctx.nodes.store().wait_synced().await;
        info!(controller = NAME, "allocating Pod CIDRs to Nodes");
        loop {
            self.sync().await;
            tokio::select! {
                e = next_event(&mut events) => if e.is_none() { return },
                _ = tokio::time::sleep(RESYNC) => {}
                _ = self.ctx.shutdown.cancelled() => return,
            }
        }
    }

    /// One pass over the Nodes: every Node without a Pod CIDR gets its CIDRs.
    async fn sync(&mut self) {
        let nodes = self.ctx.nodes.store().list();
        // A held CIDR goes once its Node shows a Pod CIDR (or is gone), or after HOLD.
        self.held.retain(|name, (_, at)| {
            nodes
                .iter()
                .any(|n| n.metadata.name.as_deref() == Some(name.as_str()) && !has_pod_cidr(n))
                && at.elapsed() < HOLD
        });
        let waiting: Vec<Arc<Node>> = nodes
            .iter()
            .filter(|n| !has_pod_cidr(n))
            .filter(|n| {
                !self
                    .held
                    .contains_key(n.metadata.name.as_deref().unwrap_or_default())
            })
            .cloned()
            .collect();
        if waiting.is_empty() {
            return;
        }
        match &self.allocator {
            Allocator::Range(ranges) => {
                let ranges = ranges.clone();
                let mut used: Vec<BTreeSet<u128>> = vec![BTreeSet::new(); ranges.len()];
                let taken = nodes
                    .iter()
                    .flat_map(|n| pod_cidrs(n))
                    .chain(self.held.values().flat_map(|(c, _)| c.clone()));
                for cidr in taken {
                    for (r, u) in ranges.iter().zip(used.iter_mut()) {
                        if let Some(i) = r.index_of(&cidr) {
                            u.insert(i);
                        }
                    }
                }
                for node in waiting {
                    let mut cidrs = Vec::new();
                    for (r, u) in ranges.iter().zip(used.iter()) {
                        match r.lowest_free(u) {
                            Some(c) => cidrs.push(c),
                            None => {
                                let msg = format!(
                                    "Node {} has no CIDR: no free subnet of /{} left in {}",
                                    node.metadata.name.as_deref().unwrap_or_default(),
                                    r.mask,
                                    r.cluster
                                );
                                warn!(controller = NAME, "{msg}");
                                self.recorder.event(
                                    &node_reference(&node),
                                    EventType::Normal,
                                    CIDR_NOT_AVAILABLE,
                                    msg,
                                );
                                cidrs.clear();
                                break;
                            }
                        }
                    }
                    if cidrs.is_empty() {
                        continue;
                    }
                    if self.assign(&node, &cidrs).await {
                        for (c, (r, u)) in cidrs.iter().zip(ranges.iter().zip(used.iter_mut())) {
                            if let Some(i) = r.index_of(c) {
                                u.insert(i);
                            }
                        }
                    }
                }
            }
            Allocator::Cloud => {
                for node in waiting {
                    let Some(cloud) = self.ctx.cloud.cidr_allocator() else {
                        return;
                    };
                    let asked = self
                        .ctx
                        .cloud_metrics
                        .observe(NAME, "NodePodCIDRs", cloud.node_pod_cidrs(&node))
                        .await;
                    match asked {
                        Ok(cidrs) if !cidrs.is_empty() => {
                            self.assign(&node, &cidrs).await;
                        }
                        Ok(_) => {}
                        Err(e) => warn!(
                            controller = NAME,
                            node = node.metadata.name.as_deref().unwrap_or_default(),
                            error = %e,
                            "the cloud did not say which Pod CIDRs the Node has; asked again later"
                        ),
                    }
                }
            }
        }
    }

    /// Writes `cidrs` as the Node's Pod CIDRs (a merge patch: nothing else is touched); holds
    /// them on success.
    async fn assign(&mut self, node: &Node, cidrs: &[IpNet]) -> bool {
        let name = node.metadata.name.clone().unwrap_or_default();
        let list: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"podCIDR": list[0], "podCIDRs": list},
        });
        match self
            .api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(controller = NAME, node = %name, pod_cidrs = ?list, "Set node PodCIDR");
                self.held.insert(name, (cidrs.to_vec(), Instant::now()));
                true
            }
            Err(e) => {
                // A conflict (the Node changed since the informer saw it) is tried again at the
                // next pass; anything else is an event too.
                let conflict = matches!(&e, kube::Error::Api(s) if s.code == 409);
                warn!(controller = NAME, node = %name, error = %e, "could not set the Node's Pod CIDRs");
                if !conflict {
                    self.recorder.event(
                        &node_reference(node),
                        EventType::Warning,
                        CIDR_ASSIGNMENT_FAILED,
                        format!("Node {name}: setting Pod CIDRs {list:?} failed: {e}"),
                    );
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn subnets_are_indexed_and_the_lowest_free_one_is_given() {
        let r = SubnetRange::new(net("10.244.0.0/16"), 24).unwrap();
        assert_eq!(r.len(), 256);
        assert_eq!(r.subnet(0), Some(net("10.244.0.0/24")));
        assert_eq!(r.subnet(255), Some(net("10.244.255.0/24")));
        assert_eq!(r.subnet(256), None);
        assert_eq!(r.index_of(&net("10.244.7.0/24")), Some(7));
        assert_eq!(r.index_of(&net("10.245.7.0/24")), None, "outside");
        assert_eq!(r.index_of(&net("10.244.7.0/25")), None, "another size");
        let used: BTreeSet<u128> = [0, 1, 3].into();
        assert_eq!(r.lowest_free(&used), Some(net("10.244.2.0/24")));
        let full: BTreeSet<u128> = (0..256).collect();
        assert_eq!(r.lowest_free(&full), None);
        let v6 = SubnetRange::new(net("fd00:10::/56"), 64).unwrap();
        assert_eq!(v6.subnet(3), Some(net("fd00:10:0:3::/64")));
        assert_eq!(v6.index_of(&net("fd00:10:0:3::/64")), Some(3));
        assert!(SubnetRange::new(net("fd00::/32"), 64).is_err(), "more than 2^16");
        assert!(SubnetRange::new(net("10.0.0.0/16"), 8).is_err());
    }

    #[test]
    fn mask_sizes_follow_upstream() {
        let flags = |single: u8, v4: u8, v6: u8| NodeIpamFlags {
            node_cidr_mask_size: single,
            node_cidr_mask_size_ipv4: v4,
            node_cidr_mask_size_ipv6: v6,
        };
        let dual = [net("10.244.0.0/16"), net("fd00:10::/56")];
        let r = ranges(&dual, &flags(0, 0, 0)).unwrap();
        assert_eq!((r[0].mask, r[1].mask), (24, 64));
        let r = ranges(&dual, &flags(0, 26, 72)).unwrap();
        assert_eq!((r[0].mask, r[1].mask), (26, 72));
        assert!(ranges(&dual, &flags(0, 26, 80)).is_err(), "2^24 subnets of /56");
        assert!(ranges(&dual, &flags(24, 0, 0)).is_err());
        let r = ranges(&[net("10.244.0.0/16")], &flags(25, 0, 0)).unwrap();
        assert_eq!(r[0].mask, 25);
        assert!(ranges(&[], &flags(0, 0, 0)).is_err());
    }
}
