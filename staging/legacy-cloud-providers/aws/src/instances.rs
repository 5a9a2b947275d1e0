//! Finding EC2 instances for Nodes (AWS-07…24) with few `DescribeInstances` calls.
//!
//! **Coalescing with read-ahead.** A look-up that misses the cache takes the fetch lock (so
//! concurrent misses wait for one fetch instead of each calling EC2), then fetches its own key
//! **plus every other Node of the shared informer whose instance is not cached**: by instance
//! ID in chunks of [`IDS_PER_CALL`], and by private DNS name (filter `private-dns-name`, chunks
//! of [`NAMES_PER_CALL`], with `instance-state-name` and client-side cluster-tag filtering). So
//! initialising 1000 Nodes, or the periodic address sync of 1000 Nodes, costs a handful of calls
//! instead of one (upstream: five) per Node. Each look-up says how old a cached answer may be: existence and shutdown
//! checks accept [`CACHE_TTL`] (10 s: a stopped or terminated instance is noticed at most 10 s
//! late), instance metadata for initialisation and the address sync [`METADATA_MAX_AGE`]
//! (60 s: a new address or type shows at most a minute late). The existence and shutdown
//! checks (the node-lifecycle controller's, which asks about NotReady Nodes only) read ahead
//! only NotReady Nodes ([`ReadAhead::NotReadyNodes`]): otherwise one NotReady Node among 5000
//! would re-read all 5000 instances every 10 s.
//!
//! A batch by ID fails as a whole when one ID is unknown (`InvalidInstanceID.NotFound`); the
//! key that was asked for is then fetched alone, and recorded as "not found" only if EC2 says
//! so for it alone.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use aws_sdk_ec2::types::{Filter, Instance};
use k8s_cloud_provider::node::helpers::{condition_status, node_name, provider_id};
use k8s_controller_manager::informer::Store;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use parking_lot::{Mutex, RwLock};

use crate::{
    api::{AwsApi, AwsError},
    config::IpFamily,
};

/// How old a cached instance may be for existence and shutdown checks.
pub const CACHE_TTL: Duration = Duration::from_secs(10);
/// How old a cached instance may be for metadata (type, zone, addresses).
pub const METADATA_MAX_AGE: Duration = Duration::from_secs(60);
/// Which other Nodes a cache miss reads ahead with the key asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadAhead {
    /// Every Node of the informer whose entry is too old (initialisation, address sync,
    /// routes, load-balancer targets: passes that ask for most Nodes).
    AllNodes,
    /// Only Nodes whose `Ready` condition is not `True`: the node-lifecycle controller asks
    /// about those and no others, so with one NotReady Node among thousands a miss reads one
    /// instance, not every instance of the cluster.
    NotReadyNodes,
}

/// IDs per `DescribeInstances` call by ID.
///
/// The answer is held whole while it is parsed (the body, then the SDK's `Instance`s, ≈ 2.8 KB
/// and ≈ 8 KB per instance), and that transient is the CCM's largest allocation: 500 IDs per
/// call made a 5.3 MB peak on top of the caches (heaptrack, 1000 Nodes), and each of the
/// runtime's threads' malloc arenas kept room for it. 200 keeps the peak at ≈ 2 MB for a
/// handful more calls (1000 Nodes: 5 per full read-ahead instead of 2).
pub const IDS_PER_CALL: usize = 200;
/// Private DNS names per `DescribeInstances` call (AWS allows 200 filter values).
pub const NAMES_PER_CALL: usize = 150;
/// Instance states a node-name look-up considers (terminated ones are ignored).
pub const ALIVE_STATES: [&str; 5] = ["pending", "running", "shutting-down", "stopping", "stopped"];

/// A malformed `spec.providerID`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "spec.providerID {value:?} is not a valid AWS provider ID ({reason}); expected aws:///<zone>/<instance-id>, aws://<zone>/<instance-id> or <instance-id>"
)]
pub struct ProviderIdError {
    /// The value.
    pub value: String,
    /// Why.
    pub reason: &'static str,
}

/// The instance ID of an AWS provider ID (AWS-07): `aws:///az/i-x`, `aws://az/i-x` or a bare
/// `i-x`; the last path segment must be `i-…` or a `fargate-…` variant ID. Never panics.
pub fn instance_id_from_provider_id(value: &str) -> Result<String, ProviderIdError> {
    let err = |reason| ProviderIdError {
        value: value.to_string(),
        reason,
    };
    let rest = match value.split_once("://") {
        Some(("aws", rest)) => rest,
        Some(_) => return Err(err("the provider is not aws")),
        None => value,
    };
    let last = rest.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
    if last.is_empty() {
        return Err(err("no instance ID"));
    }
    if (last.starts_with("i-") || last.starts_with("fargate-")) && !last.contains(char::is_whitespace) {
        Ok(last.to_string())
    } else {
        Err(err("the last segment is not an instance ID"))
    }
}

/// `aws:///<az>/<id>`.
pub fn provider_id_for(az: &str, id: &str) -> String {
    format!("aws:///{az}/{id}")
}

/// One network interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Eni {
    /// Attachment device index (None: not attached).
    pub device_index: Option<i32>,
    /// `in-use`, `available`, …
    pub status: String,
    /// Private IPv4 addresses (primary first).
    pub private_ips: Vec<String>,
    /// IPv6 addresses.
    pub ipv6: Vec<String>,
}

/// What the provider needs to know about an instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceInfo {
    /// `i-…`
    pub id: String,
    /// Availability zone.
    pub zone: String,
    /// Instance type.
    pub instance_type: String,
    /// State name (`running`, `stopped`, …); `None` when EC2 gave none.
    pub state: Option<String>,
    /// Primary private IPv4.
    pub private_ip: String,
    /// Private DNS name.
    pub private_dns_name: String,
    /// Public IPv4.
    pub public_ip: String,
    /// Public DNS name.
    pub public_dns_name: String,
    /// Network interfaces.
    pub enis: Vec<Eni>,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Source/destination check.
    pub source_dest_check: Option<bool>,
    /// VPC.
    pub vpc_id: String,
    /// Subnet.
    pub subnet_id: String,
    /// Security group IDs.
    pub security_groups: Vec<String>,
    /// A Fargate "instance" (AWS-13): answered from its network interface, never a
    /// load-balancer target.
    pub fargate: bool,
}

impl InstanceInfo {
    /// Converts an SDK instance.
    pub fn from_sdk(i: &Instance) -> Self {
        let s = |o: Option<&str>| o.unwrap_or_default().to_string();
        Self {
            id: s(i.instance_id()),
            zone: s(i.placement().and_then(|p| p.availability_zone())),
            instance_type: i
                .instance_type()
                .map(|t| t.as_str().to_string())
                .unwrap_or_default(),
            state: i.state().and_then(|st| st.name()).map(|n| n.as_str().to_string()),
            private_ip: s(i.private_ip_address()),
            private_dns_name: s(i.private_dns_name()),
            public_ip: s(i.public_ip_address()),
            public_dns_name: s(i.public_dns_name()),
            enis: i
                .network_interfaces()
                .iter()
                .map(|n| Eni {
                    device_index: n.attachment().and_then(|a| a.device_index()),
                    status: n.status().map(|x| x.as_str().to_string()).unwrap_or_default(),
                    private_ips: n
                        .private_ip_addresses()
                        .iter()
                        .filter_map(|p| p.private_ip_address().map(str::to_string))
                        .collect(),
                    ipv6: n
                        .ipv6_addresses()
                        .iter()
                        .filter_map(|p| p.ipv6_address().map(str::to_string))
                        .collect(),
                })
                .collect(),
            tags: i
                .tags()
                .iter()
                .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
                .collect(),
            source_dest_check: i.source_dest_check(),
            vpc_id: s(i.vpc_id()),
            subnet_id: s(i.subnet_id()),
            security_groups: i
                .security_groups()
                .iter()
                .filter_map(|g| g.group_id().map(str::to_string))
                .collect(),
            fargate: false,
        }
    }

    /// Whether the instance carries the cluster tag (`kubernetes.io/cluster/<id>` with any
    /// value, or legacy `KubernetesCluster=<id>`; AWS-55).
    pub fn belongs_to(&self, cluster_id: &str) -> bool {
        self.tags
            .contains_key(&format!("kubernetes.io/cluster/{cluster_id}"))
            || self.tags.get("KubernetesCluster").map(String::as_str) == Some(cluster_id)
    }

    /// Node addresses by AWS-14…16 (a Fargate node: InternalIP and InternalDNS of its network
    /// interface per family, as upstream's Fargate variant).
    pub fn node_addresses(&self, families: &[IpFamily]) -> Result<Vec<NodeAddress>, String> {
        if self.fargate {
            let mut out = Vec::new();
            for family in families {
                let ip = match family {
                    IpFamily::Ipv4 => Some(self.private_ip.as_str()).filter(|ip| !ip.is_empty()),
                    IpFamily::Ipv6 => self.enis.first().and_then(|e| e.ipv6.first()).map(String::as_str),
                };
                let Some(ip) = ip else { continue };
                check_ip(ip, &self.id)?;
                out.push(NodeAddress {
                    type_: "InternalIP".into(),
                    address: ip.into(),
                });
                if !self.private_dns_name.is_empty() {
                    out.push(NodeAddress {
                        type_: "InternalDNS".into(),
                        address: self.private_dns_name.clone(),
                    });
                }
            }
            return Ok(out);
        }
        let mut enis: Vec<&Eni> = self.enis.iter().collect();
        enis.sort_by_key(|e| e.device_index.unwrap_or(i32::MAX));
        let mut out = Vec::new();
        let mut push = |t: &str, a: &str| {
            out.push(NodeAddress {
                type_: t.into(),
                address: a.into(),
            })
        };
        for family in families {
            match family {
                IpFamily::Ipv4 => {
                    if enis.is_empty() && !self.private_ip.is_empty() {
                        check_ip(&self.private_ip, &self.id)?;
                        push("InternalIP", &self.private_ip);
                    }
                    for eni in enis.iter().filter(|e| e.status == "in-use") {
                        for ip in &eni.private_ips {
                            check_ip(ip, &self.id)?;
                            push("InternalIP", ip);
                        }
                    }
                    if !self.public_ip.is_empty() {
                        check_ip(&self.public_ip, &self.id)?;
                        push("ExternalIP", &self.public_ip);
                    }
                    if !self.private_dns_name.is_empty() {
                        push("InternalDNS", &self.private_dns_name);
                        push("Hostname", &self.private_dns_name);
                    }
                    if !self.public_dns_name.is_empty() {
                        push("ExternalDNS", &self.public_dns_name);
                    }
                }
                IpFamily::Ipv6 => {
                    for eni in enis.iter().filter(|e| e.status == "in-use") {
                        if let Some(ip) = eni.ipv6.first() {
                            check_ip(ip, &self.id)?;
                            push("InternalIP", ip);
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

fn check_ip(ip: &str, id: &str) -> Result<(), String> {
    ip.parse::<IpAddr>()
        .map(|_| ())
        .map_err(|_| format!("EC2 returned an invalid IP address {ip:?} for instance {id}"))
}

/// How a Node is identified in EC2.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NodeKey {
    /// By instance ID (from `spec.providerID` or an `i-` node name).
    Id(String),
    /// By private DNS name (the node name).
    Name(String),
}

/// The key of a Node: its providerID's instance ID, else an `i-…` name (text before the
/// first `.`), else its name as private DNS name (AWS-08).
pub fn node_key(node: &Node) -> Result<NodeKey, ProviderIdError> {
    let pid = provider_id(node);
    if !pid.is_empty() {
        return instance_id_from_provider_id(pid).map(NodeKey::Id);
    }
    Ok(name_key(node_name(node)))
}

/// The key of a node name (AWS-08 steps 1 and 3).
pub fn name_key(name: &str) -> NodeKey {
    if name.starts_with("i-") {
        NodeKey::Id(name.split('.').next().unwrap_or(name).to_string())
    } else {
        NodeKey::Name(name.to_string())
    }
}

#[derive(Clone)]
enum Cached {
    Found(Arc<InstanceInfo>),
    NotFound,
    /// More than one cluster instance has this private DNS name.
    Ambiguous(Vec<String>),
}

/// Errors of a look-up.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    /// EC2 failed.
    #[error(transparent)]
    Aws(#[from] AwsError),
    /// Several instances match a node name.
    #[error("node name {name:?} matches more than one instance of the cluster: {ids:?}")]
    Ambiguous {
        /// The name.
        name: String,
        /// The instances.
        ids: Vec<String>,
    },
}

/// The instance cache with coalesced, read-ahead fetching.
pub struct InstanceCache {
    ec2: aws_sdk_ec2::Client,
    api: AwsApi,
    cluster_id: String,
    entries: Mutex<HashMap<NodeKey, (Instant, Cached)>>,
    fetch_lock: tokio::sync::Mutex<()>,
    nodes: RwLock<Option<Store<Node>>>,
}

impl std::fmt::Debug for InstanceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceCache")
            .field("cluster_id", &self.cluster_id)
            .finish_non_exhaustive()
    }
}

impl InstanceCache {
    /// A cache over `ec2`; name look-ups only accept instances of `cluster_id`.
    pub fn new(ec2: aws_sdk_ec2::Client, api: AwsApi, cluster_id: String) -> Self {
        Self {
            ec2,
            api,
            cluster_id,
            entries: Mutex::new(HashMap::new()),
            fetch_lock: tokio::sync::Mutex::new(()),
            nodes: RwLock::new(None),
        }
    }

    /// Gives the cache the shared Node informer for read-ahead and node-name resolution.
    pub fn set_nodes(&self, nodes: Store<Node>) {
        *self.nodes.write() = Some(nodes);
    }

    /// The cached Node informer, if set.
    pub fn nodes(&self) -> Option<Store<Node>> {
        self.nodes.read().clone()
    }

    fn fresh(&self, key: &NodeKey, max_age: Duration) -> Option<Cached> {
        let entries = self.entries.lock();
        let (at, c) = entries.get(key)?;
        (at.elapsed() < max_age).then(|| c.clone())
    }

    /// Drops a cached entry (after a change the provider made itself).
    pub fn invalidate(&self, key: &NodeKey) {
        self.entries.lock().remove(key);
    }

    /// The instance for a key, from a cached answer at most `max_age` old or a fetch;
    /// `Ok(None)` when EC2 says there is none.
    pub async fn get(
        &self,
        key: &NodeKey,
        max_age: Duration,
    ) -> Result<Option<Arc<InstanceInfo>>, LookupError> {
        self.get_reading_ahead(key, max_age, ReadAhead::AllNodes).await
    }

    /// [`InstanceCache::get`], saying which other Nodes a miss reads ahead.
    pub async fn get_reading_ahead(
        &self,
        key: &NodeKey,
        max_age: Duration,
        read_ahead: ReadAhead,
    ) -> Result<Option<Arc<InstanceInfo>>, LookupError> {
        if let Some(c) = self.fresh(key, max_age) {
            return resolve(key, c);
        }
        let _guard = self.fetch_lock.lock().await;
        if let Some(c) = self.fresh(key, max_age) {
            return resolve(key, c);
        }
        self.fetch(key, max_age, read_ahead).await?;
        match self.fresh(key, Duration::MAX) {
            Some(c) => resolve(key, c),
            None => Ok(None),
        }
    }

    fn read_ahead(
        &self,
        wanted: &NodeKey,
        max_age: Duration,
        scope: ReadAhead,
    ) -> (Vec<String>, Vec<String>) {
        let (mut ids, mut names) = (Vec::new(), Vec::new());
        let mut seen = HashSet::new();
        let mut add = |k: NodeKey| {
            if !seen.insert(k.clone()) {
                return;
            }
            match k {
                NodeKey::Id(id) => ids.push(id),
                NodeKey::Name(n) => names.push(n),
            }
        };
        add(wanted.clone());
        if let Some(store) = self.nodes() {
            for node in store.list() {
                if scope == ReadAhead::NotReadyNodes && condition_status(&node, "Ready") == "True" {
                    continue;
                }
                if let Ok(k) = node_key(&node)
                    && self.fresh(&k, max_age).is_none()
                {
                    add(k);
                }
            }
        }
        (ids, names)
    }

    async fn fetch(&self, wanted: &NodeKey, max_age: Duration, scope: ReadAhead) -> Result<(), LookupError> {
        let (ids, names) = self.read_ahead(wanted, max_age, scope);
        // By ID, in chunks; the chunk holding the wanted key goes first.
        for chunk in ids.chunks(IDS_PER_CALL) {
            let has_wanted = matches!(wanted, NodeKey::Id(w) if chunk.contains(w));
            match self.describe_ids(chunk).await {
                Ok(found) => self.store_ids(chunk, found),
                Err(e) if e.code_starts_with("InvalidInstanceID.") => {
                    if let NodeKey::Id(w) = wanted
                        && has_wanted
                    {
                        match self.describe_ids(std::slice::from_ref(w)).await {
                            Ok(found) => self.store_ids(std::slice::from_ref(w), found),
                            Err(e) if e.code_starts_with("InvalidInstanceID.") => {
                                self.entries
                                    .lock()
                                    .insert(wanted.clone(), (Instant::now(), Cached::NotFound));
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                Err(e) if has_wanted => return Err(e.into()),
                Err(e) => tracing::debug!(error = %e, "read-ahead DescribeInstances failed"),
            }
        }
        for chunk in names.chunks(NAMES_PER_CALL) {
            let has_wanted = matches!(wanted, NodeKey::Name(w) if chunk.contains(w));
            match self.describe_names(chunk).await {
                Ok(found) => self.store_names(chunk, found),
                Err(e) if has_wanted => return Err(e.into()),
                Err(e) => tracing::debug!(error = %e, "read-ahead DescribeInstances by name failed"),
            }
        }
        Ok(())
    }

    fn store_ids(&self, asked: &[String], found: Vec<InstanceInfo>) {
        let now = Instant::now();
        let mut entries = self.entries.lock();
        let by_id: HashMap<String, Arc<InstanceInfo>> =
            found.into_iter().map(|i| (i.id.clone(), Arc::new(i))).collect();
        for id in asked {
            let c = match by_id.get(id) {
                Some(i) => Cached::Found(i.clone()),
                None => Cached::NotFound,
            };
            entries.insert(NodeKey::Id(id.clone()), (now, c));
        }
    }

    fn store_names(&self, asked: &[String], found: Vec<InstanceInfo>) {
        let now = Instant::now();
        let mut by_name: HashMap<String, Vec<Arc<InstanceInfo>>> = HashMap::new();
        for i in found.into_iter().filter(|i| i.belongs_to(&self.cluster_id)) {
            by_name
                .entry(i.private_dns_name.clone())
                .or_default()
                .push(Arc::new(i));
        }
        let mut entries = self.entries.lock();
        for name in asked {
            let c = match by_name.get(name).map(Vec::as_slice) {
                None | Some([]) => Cached::NotFound,
                Some([one]) => {
                    entries.insert(NodeKey::Id(one.id.clone()), (now, Cached::Found(one.clone())));
                    Cached::Found(one.clone())
                }
                Some(many) => Cached::Ambiguous(many.iter().map(|i| i.id.clone()).collect()),
            };
            entries.insert(NodeKey::Name(name.clone()), (now, c));
        }
    }

    /// `DescribeInstances` by IDs (all pages).
    pub async fn describe_ids(&self, ids: &[String]) -> Result<Vec<InstanceInfo>, AwsError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let req = self
                .ec2
                .describe_instances()
                .set_instance_ids(Some(ids.to_vec()))
                .set_next_token(token.clone());
            let page = self.api.call("describe_instances", req.send()).await?;
            out.extend(
                page.reservations()
                    .iter()
                    .flat_map(|r| r.instances())
                    .map(InstanceInfo::from_sdk),
            );
            token = page.next_token().filter(|t| !t.is_empty()).map(str::to_string);
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    /// `DescribeInstances` by private DNS names of live instances (all pages).
    pub async fn describe_names(&self, names: &[String]) -> Result<Vec<InstanceInfo>, AwsError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let req = self
                .ec2
                .describe_instances()
                .filters(
                    Filter::builder()
                        .name("private-dns-name")
                        .set_values(Some(names.to_vec()))
                        .build(),
                )
                .filters(
                    Filter::builder()
                        .name("instance-state-name")
                        .set_values(Some(ALIVE_STATES.iter().map(|s| s.to_string()).collect()))
                        .build(),
                )
                .max_results(1000)
                .set_next_token(token.clone());
            let page = self.api.call("describe_instances", req.send()).await?;
            out.extend(
                page.reservations()
                    .iter()
                    .flat_map(|r| r.instances())
                    .map(InstanceInfo::from_sdk),
            );
            token = page.next_token().filter(|t| !t.is_empty()).map(str::to_string);
            if token.is_none() {
                return Ok(out);
            }
        }
    }
}

fn resolve(key: &NodeKey, c: Cached) -> Result<Option<Arc<InstanceInfo>>, LookupError> {
    match c {
        Cached::Found(i) => Ok(Some(i)),
        Cached::NotFound => Ok(None),
        Cached::Ambiguous(ids) => Err(LookupError::Ambiguous {
            name: match key {
                NodeKey::Name(n) | NodeKey::Id(n) => n.clone(),
            },
            ids,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids() {
        assert_eq!(
            instance_id_from_provider_id("aws:///us-east-1a/i-0abc").unwrap(),
            "i-0abc"
        );
        assert_eq!(
            instance_id_from_provider_id("aws://us-east-1a/i-0abc").unwrap(),
            "i-0abc"
        );
        assert_eq!(instance_id_from_provider_id("i-0abc").unwrap(), "i-0abc");
        assert_eq!(
            instance_id_from_provider_id("aws:///us-east-1a/fargate-ip-1-2-3-4").unwrap(),
            "fargate-ip-1-2-3-4"
        );
        for bad in [
            "",
            "aws:///",
            "aws:///us-east-1a/",
            "gce://p/z/i-1",
            "aws:///us-east-1a/vm-12",
            "aws:///zone/i-1 2",
            "///",
        ] {
            let e = instance_id_from_provider_id(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        assert_eq!(provider_id_for("us-east-1a", "i-1"), "aws:///us-east-1a/i-1");
    }

    #[test]
    fn node_names_map_to_keys() {
        assert_eq!(name_key("i-0abc.ec2.internal"), NodeKey::Id("i-0abc".into()));
        assert_eq!(name_key("i-0abc"), NodeKey::Id("i-0abc".into()));
        assert_eq!(
            name_key("ip-10-0-1-5.ec2.internal"),
            NodeKey::Name("ip-10-0-1-5.ec2.internal".into())
        );
    }

    fn instance() -> InstanceInfo {
        InstanceInfo {
            id: "i-1".into(),
            private_ip: "10.0.1.5".into(),
            private_dns_name: "ip-10-0-1-5.ec2.internal".into(),
            public_ip: "54.1.2.3".into(),
            public_dns_name: "ec2-54-1-2-3.compute-1.amazonaws.com".into(),
            enis: vec![
                Eni {
                    device_index: Some(1),
                    status: "in-use".into(),
                    private_ips: vec!["10.0.2.7".into()],
                    ipv6: vec!["fd00::2".into()],
                },
                Eni {
                    device_index: None,
                    status: "in-use".into(),
                    private_ips: vec!["10.0.3.9".into()],
                    ipv6: vec![],
                },
                Eni {
                    device_index: Some(0),
                    status: "in-use".into(),
                    private_ips: vec!["10.0.1.5".into(), "10.0.1.6".into()],
                    ipv6: vec!["fd00::1".into(), "fd00::9".into()],
                },
                Eni {
                    device_index: Some(2),
                    status: "detaching".into(),
                    private_ips: vec!["10.0.4.4".into()],
                    ipv6: vec![],
                },
            ],
            ..Default::default()
        }
    }

    fn a(t: &str, v: &str) -> NodeAddress {
        NodeAddress {
            type_: t.into(),
            address: v.into(),
        }
    }

    #[test]
    fn ipv4_addresses_in_aws_15_order() {
        assert_eq!(
            instance().node_addresses(&[IpFamily::Ipv4]).unwrap(),
            vec![
                a("InternalIP", "10.0.1.5"),
                a("InternalIP", "10.0.1.6"),
                a("InternalIP", "10.0.2.7"),
                a("InternalIP", "10.0.3.9"),
                a("ExternalIP", "54.1.2.3"),
                a("InternalDNS", "ip-10-0-1-5.ec2.internal"),
                a("Hostname", "ip-10-0-1-5.ec2.internal"),
                a("ExternalDNS", "ec2-54-1-2-3.compute-1.amazonaws.com"),
            ]
        );
    }

    #[test]
    fn ipv6_first_address_per_eni_and_family_order() {
        let v = instance()
            .node_addresses(&[IpFamily::Ipv6, IpFamily::Ipv4])
            .unwrap();
        assert_eq!(&v[..2], &[a("InternalIP", "fd00::1"), a("InternalIP", "fd00::2")]);
        assert_eq!(v[2], a("InternalIP", "10.0.1.5"));
    }

    #[test]
    fn invalid_ips_are_errors() {
        let mut i = instance();
        i.public_ip = "not-an-ip".into();
        assert!(
            i.node_addresses(&[IpFamily::Ipv4])
                .unwrap_err()
                .contains("invalid IP address \"not-an-ip\" for instance i-1")
        );
    }

    #[test]
    fn cluster_membership() {
        let mut i = instance();
        assert!(!i.belongs_to("c1"));
        i.tags.insert("kubernetes.io/cluster/c1".into(), "shared".into());
        assert!(i.belongs_to("c1"));
        let mut j = instance();
        j.tags.insert("KubernetesCluster".into(), "c1".into());
        assert!(j.belongs_to("c1") && !j.belongs_to("c2"));
    }
}
