//! The staged OpenStack cloud provider (the Rust counterpart of `legacy-cloud-providers/openstack`
//! and of cloud-provider-openstack's `openstack-cloud-controller-manager`):
//!
//! - [`InstancesV2`]: Nodes from nova servers — provider ID `openstack:///<server-id>` (with
//!   `OS_CCM_REGIONAL=true` `openstack://<region>/<server-id>`, as OCCM), addresses
//!   by the `[Networking]` rules, instance type = flavor name, zone = availability zone, region =
//!   `[Global] region`; exists (404 → gone) and shutdown (`SHUTOFF`).
//! - [`LoadBalancer`]: Octavia load balancers, listeners, pools, members and health monitors, with
//!   a neutron floating IP for external Services ([`loadbalancer`]).
//! - [`Routes`]: Pod routes as extra routes of the neutron router `[Route] router-id`
//!   ([`routes`]).
//!
//! Safety: every doubt is an error, never "gone": only nova's 404 for the server's own ID (or
//! an empty answer to the exact-name query for a Node without a provider ID) makes a Node
//! disappear; a provider ID of another region is an error.

pub mod client;
pub mod config;
pub mod doctor;
pub mod loadbalancer;
pub mod orphans;
pub mod routes;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use k8s_cloud_provider::{
    CloudError, CloudProvider, CloudResult, InitContext, InstanceMetadata, InstancesV2, LoadBalancer, Routes,
    node::helpers::{is_valid_label_value, node_name, provider_id},
    registry::Factory,
};
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::{
    client::{ClientError, OpenStackClient, Service, query_escape},
    config::{NetworkingOptions, OpenStackConfig},
};

/// The provider name (`--cloud-provider openstack`, the provider ID scheme).
pub const PROVIDER_NAME: &str = "openstack";

/// How long one OpenStack API request may take unless `[Metadata] request-timeout` says
/// otherwise (OCCM's default, which OCCM also applies to every API request).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A nova server, as far as the provider reads it.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct Server {
    /// UUID.
    pub id: String,
    /// Name (the Node's name).
    pub name: String,
    /// `ACTIVE`, `SHUTOFF`, `ERROR`, …
    #[serde(default)]
    pub status: String,
    /// Addresses by network name.
    #[serde(default)]
    pub addresses: BTreeMap<String, Vec<ServerAddress>>,
    /// `accessIPv4`.
    #[serde(rename = "accessIPv4", default)]
    pub access_ipv4: String,
    /// `accessIPv6`.
    #[serde(rename = "accessIPv6", default)]
    pub access_ipv6: String,
    /// The flavor (microversion ≥ 2.47: embedded, with `original_name`).
    #[serde(default)]
    pub flavor: ServerFlavor,
    /// `OS-EXT-AZ:availability_zone`.
    #[serde(rename = "OS-EXT-AZ:availability_zone", default)]
    pub availability_zone: String,
}

/// One address of a server.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct ServerAddress {
    /// 4 or 6.
    #[serde(default)]
    pub version: u8,
    /// The address.
    pub addr: String,
    /// `fixed` or `floating`.
    #[serde(rename = "OS-EXT-IPS:type", default)]
    pub kind: String,
}

/// A server's flavor.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct ServerFlavor {
    /// The flavor's name when the server was created (2.47+).
    #[serde(default)]
    pub original_name: Option<String>,
    /// The flavor's ID (before 2.47).
    #[serde(default)]
    pub id: Option<String>,
}

/// The provider.
pub struct OpenStackCloud {
    config: OpenStackConfig,
    client: Arc<OpenStackClient>,
    /// Octavia's API version `(2, minor)`, read once (features are checked against it).
    octavia_version: tokio::sync::OnceCell<(u32, u32)>,
    /// How long to wait for Octavia to finish one change (`OCCM_WAIT_LB_ACTIVE_STEPS`).
    lb_wait: Duration,
    /// `OS_CCM_REGIONAL=true`: provider IDs name the region (`openstack://<region>/<id>`).
    regional_provider_ids: bool,
    /// The API server, from [`CloudProvider::initialize`]: a load balancer named for another
    /// Service is deleted only after that Service is read gone.
    kube: std::sync::OnceLock<kube::Client>,
    /// The provider's Event recorder, from [`CloudProvider::initialize`] (OCCM's Warnings).
    events: std::sync::OnceLock<k8s_controller_manager::events::EventRecorder>,
}

impl std::fmt::Debug for OpenStackCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStackCloud")
            .field("region", &self.config.global.region)
            .finish_non_exhaustive()
    }
}

/// An OpenStack API error as a [`CloudError`].
pub fn cloud_error(context: impl std::fmt::Display, e: ClientError) -> CloudError {
    CloudError::wrap(context, e)
}

/// OCCM's environment variable for regional provider IDs.
pub const REGIONAL_PROVIDER_ID_ENV: &str = "OS_CCM_REGIONAL";

/// Whether `OS_CCM_REGIONAL` asks for regional provider IDs: exactly `true`, as OCCM reads it.
pub fn regional_provider_ids(value: Option<&str>) -> bool {
    value == Some("true")
}

/// The server ID of `openstack:///<id>` or `openstack://<region>/<id>`; a region other than
/// `region` (when both are set) is an error, not "gone".
pub fn server_id_from_provider_id(value: &str, region: &str) -> CloudResult<String> {
    let rest = value.strip_prefix("openstack://").ok_or_else(|| {
        CloudError::msg(format!(
            "spec.providerID {value:?} is not of the form openstack:///<server-id>"
        ))
    })?;
    let (id_region, id) = rest.rsplit_once('/').unwrap_or(("", rest));
    if id.is_empty() {
        return Err(CloudError::msg(format!(
            "spec.providerID {value:?} has no server ID"
        )));
    }
    if !id_region.is_empty() && !region.is_empty() && id_region != region {
        return Err(CloudError::msg(format!(
            "spec.providerID {value:?} names region {id_region:?}, but this controller manages {region:?}"
        )));
    }
    Ok(id.to_string())
}

/// The Node addresses of a server by cloud-provider-openstack's rules: `accessIPv4`/`accessIPv6`
/// as ExternalIP; per network (by name): `floating` addresses and those of a
/// `public-network-name` are ExternalIP, those of an `internal-network-name` (or any network
/// when none is named) InternalIP, others left out; IPv6 left out when disabled; then the
/// `address-sort-order` CIDRs first (stable), duplicates removed.
pub fn node_addresses(server: &Server, opts: &NetworkingOptions) -> Vec<NodeAddress> {
    let mut out: Vec<NodeAddress> = Vec::new();
    let mut push = |kind: &str, addr: &str| {
        if !out.iter().any(|a| a.type_ == kind && a.address == addr) {
            out.push(NodeAddress {
                type_: kind.into(),
                address: addr.into(),
            });
        }
    };
    if !server.access_ipv4.is_empty() {
        push("ExternalIP", &server.access_ipv4);
    }
    if !server.access_ipv6.is_empty() && !opts.ipv6_support_disabled {
        push("ExternalIP", &server.access_ipv6);
    }
    for (network, addrs) in &server.addresses {
        for a in addrs {
            if a.version == 6 && opts.ipv6_support_disabled {
                continue;
            }
            let kind = if a.kind == "floating" || opts.public_network_names.iter().any(|n| n == network) {
                "ExternalIP"
            } else if opts.internal_network_names.is_empty()
                || opts.internal_network_names.iter().any(|n| n == network)
            {
                "InternalIP"
            } else {
                continue;
            };
            push(kind, &a.addr);
        }
    }
    if !opts.address_sort_order.is_empty() {
        let rank = |a: &NodeAddress| {
            a.address
                .parse::<std::net::IpAddr>()
                .ok()
                .and_then(|ip| opts.address_sort_order.iter().position(|n| n.contains(&ip)))
                .unwrap_or(usize::MAX)
        };
        out.sort_by_key(rank);
    }
    out
}

impl OpenStackCloud {
    /// Builds the provider (no request yet).
    pub fn new(config: OpenStackConfig) -> Result<Self, CloudError> {
        config.validate().map_err(|e| CloudError::msg(e.to_string()))?;
        let timeout = config
            .metadata
            .request_timeout
            .filter(|t| !t.is_zero())
            .unwrap_or(REQUEST_TIMEOUT);
        // OCCM's environment variable, read as OCCM reads it: once, at start.
        let lb_wait = loadbalancer::provisioning_timeout(
            std::env::var(loadbalancer::WAIT_LB_ACTIVE_STEPS_ENV)
                .ok()
                .as_deref(),
        )
        .map_err(CloudError::msg)?;
        let regional_provider_ids =
            regional_provider_ids(std::env::var(REGIONAL_PROVIDER_ID_ENV).ok().as_deref());
        if regional_provider_ids && config.global.region.is_empty() {
            return Err(CloudError::msg(format!(
                "{REGIONAL_PROVIDER_ID_ENV}=true needs [Global] region: a regional provider ID names it"
            )));
        }
        let client = OpenStackClient::new(&config.global, timeout)
            .map_err(|e| CloudError::msg(format!("cloud config: {e}")))?;
        Ok(Self {
            config,
            client: Arc::new(client),
            octavia_version: tokio::sync::OnceCell::new(),
            lb_wait,
            regional_provider_ids,
            kube: std::sync::OnceLock::new(),
            events: std::sync::OnceLock::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &OpenStackConfig {
        &self.config
    }

    /// The API client.
    pub fn client(&self) -> &Arc<OpenStackClient> {
        &self.client
    }

    /// The server by ID; `None` on nova's 404.
    pub async fn server_by_id(&self, id: &str) -> CloudResult<Option<Server>> {
        match self
            .client
            .get_as::<Server>(
                Service::Compute,
                &format!("/servers/{}", query_escape(id)),
                "server",
            )
            .await
        {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(cloud_error(format!("reading server {id}"), e)),
        }
    }

    /// The server named exactly `name`; `None` when there is none, an error when there are
    /// several (which one would be the Node is a doubt).
    pub async fn server_by_name(&self, name: &str) -> CloudResult<Option<Server>> {
        let pattern = format!("^{}$", regex_escape(name));
        let path = format!("/servers/detail?name={}", query_escape(&pattern));
        let servers: Vec<Server> = self
            .client
            .list(Service::Compute, &path, "servers")
            .await
            .map_err(|e| cloud_error(format!("listing servers named {name:?}"), e))?;
        let mut exact: Vec<Server> = servers.into_iter().filter(|s| s.name == name).collect();
        match exact.len() {
            0 => Ok(None),
            1 => Ok(exact.pop()),
            n => Err(CloudError::msg(format!(
                "{n} servers are named {name:?}; set the Node's spec.providerID to pick one"
            ))),
        }
    }

    /// The Node's server: by provider ID when it has one, else by name.
    pub async fn server_for_node(&self, node: &Node) -> CloudResult<Option<Server>> {
        let pid = provider_id(node);
        if pid.is_empty() {
            return self.server_by_name(node_name(node)).await;
        }
        let id = server_id_from_provider_id(pid, &self.config.global.region)?;
        self.server_by_id(&id).await
    }

    /// The server's instance type: its flavor's name when that is a valid label value, else
    /// (as OCCM) the flavor's ID — read from nova's flavor list when the server shows only the
    /// name (microversion 2.47+). A name no flavor has any more is returned as it is (the
    /// framework then leaves the label out, with a log line).
    pub async fn instance_type(&self, server: &Server) -> CloudResult<String> {
        #[derive(serde::Deserialize)]
        struct Flavor {
            id: String,
            #[serde(default)]
            name: String,
        }
        let name = match (&server.flavor.original_name, &server.flavor.id) {
            (Some(name), _) if is_valid_label_value(name) => return Ok(name.clone()),
            (_, Some(id)) => return Ok(id.clone()),
            (Some(name), None) => name,
            (None, None) => return Ok(String::new()),
        };
        let flavors: Vec<Flavor> = self
            .client
            .list(Service::Compute, "/flavors", "flavors")
            .await
            .map_err(|e| {
                cloud_error(
                    format!(
                        "listing flavors (to find the ID of flavor {name:?}, which is no valid label value)"
                    ),
                    e,
                )
            })?;
        Ok(flavors
            .into_iter()
            .find(|f| f.name == *name)
            .map_or_else(|| name.clone(), |f| f.id))
    }

    /// The provider ID of a server (`openstack:///<id>`).
    pub fn provider_id(server: &Server) -> String {
        format!("{PROVIDER_NAME}:///{}", server.id)
    }

    /// The provider ID a Node of this server gets: `openstack:///<id>`, or with
    /// `OS_CCM_REGIONAL=true` `openstack://<region>/<id>` (OCCM). Either form is read back.
    pub fn node_provider_id(&self, server: &Server) -> String {
        if self.regional_provider_ids {
            format!("{PROVIDER_NAME}://{}/{}", self.config.global.region, server.id)
        } else {
            Self::provider_id(server)
        }
    }
}

/// Escapes a name for nova's regular-expression `name` filter.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[async_trait]
impl CloudProvider for OpenStackCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        let _ = self.kube.set(ctx.client.clone());
        let _ = self.events.set(ctx.events.clone());
        if let Some(dry_run) = ctx.dry_run {
            // Shadow mode: from now on no OpenStack write is sent (see `set_dry_run`).
            self.client.set_dry_run(dry_run);
        }
        // Fail fast on bad credentials or a catalog without nova, as upstream does at start.
        self.client
            .check()
            .await
            .map_err(|e| CloudError::wrap("OpenStack authentication", e))
    }

    fn register_metrics(&self, metrics: &k8s_controller_manager::metrics::Metrics) {
        metrics.register(Box::new(ClientCollector::new(self.client.clone())));
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.config
            .load_balancer
            .enabled
            .then_some(self as &dyn LoadBalancer)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        (!self.config.route.router_id.is_empty()).then_some(self as &dyn Routes)
    }

    fn has_cluster_id(&self) -> bool {
        true
    }
}

#[async_trait]
impl InstancesV2 for OpenStackCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.server_for_node(node).await?.is_some())
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        match self.server_for_node(node).await? {
            Some(s) => Ok(s.status == "SHUTOFF"),
            None => Err(CloudError::InstanceNotFound),
        }
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let Some(server) = self.server_for_node(node).await? else {
            return Err(CloudError::InstanceNotFound);
        };
        let instance_type = self.instance_type(&server).await?;
        Ok(Some(
            InstanceMetadata::new(self.node_provider_id(&server))
                .with_instance_type(instance_type)
                .with_node_addresses(node_addresses(&server, &self.config.networking))
                .with_zone(
                    server.availability_zone.clone(),
                    self.config.global.region.clone(),
                ),
        ))
    }
}

/// `cloudprovider_openstack_keystone_authentications_total` (token requests: one per token
/// lifetime when tokens are reused, one more after a token is revoked) and
/// `cloudprovider_openstack_api_requests_total` (nova, neutron and octavia requests), read from
/// the client at scrape time.
struct ClientCollector {
    client: Arc<OpenStackClient>,
    descs: [prometheus::core::Desc; 2],
}

impl ClientCollector {
    const AUTHS: (&'static str, &'static str) = (
        "cloudprovider_openstack_keystone_authentications_total",
        "keystone token requests (authentications)",
    );
    const REQUESTS: (&'static str, &'static str) = (
        "cloudprovider_openstack_api_requests_total",
        "OpenStack API requests (authentications excluded)",
    );

    fn new(client: Arc<OpenStackClient>) -> Self {
        let desc = |(name, help): (&str, &str)| {
            prometheus::core::Desc::new(name.into(), help.into(), vec![], Default::default())
                .expect("valid metric description")
        };
        Self {
            client,
            descs: [desc(Self::AUTHS), desc(Self::REQUESTS)],
        }
    }
}

impl prometheus::core::Collector for ClientCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut out = Vec::new();
        for ((name, help), value) in [
            (Self::AUTHS, self.client.auth_count()),
            (Self::REQUESTS, self.client.request_count()),
        ] {
            let c = prometheus::IntCounter::new(name, help).expect("valid metric");
            c.inc_by(value);
            out.extend(prometheus::core::Collector::collect(&c));
        }
        out
    }
}

/// The factory the cloud-controller-manager calls with the `--cloud-config` contents.
pub fn factory() -> Factory {
    Arc::new(|bytes: Option<Vec<u8>>| {
        Box::pin(async move {
            let config = OpenStackConfig::parse(bytes.as_deref())?;
            for w in &config.warnings {
                tracing::warn!("cloud config: {w}");
            }
            Ok(Arc::new(OpenStackCloud::new(config)?) as Arc<dyn CloudProvider>)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(addresses: serde_json::Value) -> Server {
        serde_json::from_value(serde_json::json!({
            "id": "s1", "name": "n1", "status": "ACTIVE", "addresses": addresses,
            "accessIPv4": "", "accessIPv6": "",
            "flavor": {"original_name": "m1.small"}, "OS-EXT-AZ:availability_zone": "nova"
        }))
        .unwrap()
    }

    fn kinds(a: &[NodeAddress]) -> Vec<(String, String)> {
        a.iter().map(|a| (a.type_.clone(), a.address.clone())).collect()
    }

    #[test]
    fn provider_ids() {
        assert_eq!(
            server_id_from_provider_id("openstack:///abc", "R").unwrap(),
            "abc"
        );
        assert_eq!(
            server_id_from_provider_id("openstack://R/abc", "R").unwrap(),
            "abc"
        );
        assert!(server_id_from_provider_id("openstack://Other/abc", "R").is_err());
        assert!(server_id_from_provider_id("aws:///i-1", "R").is_err());
        assert!(server_id_from_provider_id("openstack:///", "R").is_err());
        // OS_CCM_REGIONAL as OCCM reads it: exactly "true".
        assert!(regional_provider_ids(Some("true")));
        for other in [None, Some("1"), Some("TRUE"), Some("")] {
            assert!(!regional_provider_ids(other), "{other:?}");
        }
    }

    #[test]
    fn addresses_follow_the_networking_rules() {
        let s = server(serde_json::json!({
            "private": [{"version": 4, "addr": "10.0.0.5", "OS-EXT-IPS:type": "fixed"},
                        {"version": 4, "addr": "172.24.4.9", "OS-EXT-IPS:type": "floating"},
                        {"version": 6, "addr": "fd00::5", "OS-EXT-IPS:type": "fixed"}],
            "public": [{"version": 4, "addr": "203.0.113.7", "OS-EXT-IPS:type": "fixed"}],
            "storage": [{"version": 4, "addr": "192.168.9.9", "OS-EXT-IPS:type": "fixed"}]
        }));
        let mut opts = NetworkingOptions::default();
        assert_eq!(
            kinds(&node_addresses(&s, &opts)),
            [
                ("InternalIP".into(), "10.0.0.5".into()),
                ("ExternalIP".into(), "172.24.4.9".into()),
                ("InternalIP".into(), "fd00::5".into()),
                ("InternalIP".into(), "203.0.113.7".into()),
                ("InternalIP".into(), "192.168.9.9".into()),
            ]
        );
        opts.public_network_names = vec!["public".into()];
        opts.internal_network_names = vec!["private".into()];
        opts.ipv6_support_disabled = true;
        opts.address_sort_order = vec!["203.0.113.0/24".parse().unwrap()];
        assert_eq!(
            kinds(&node_addresses(&s, &opts)),
            [
                ("ExternalIP".into(), "203.0.113.7".into()),
                ("InternalIP".into(), "10.0.0.5".into()),
                ("ExternalIP".into(), "172.24.4.9".into()),
            ]
        );
    }

    #[test]
    fn names_are_escaped_for_the_regex_filter() {
        assert_eq!(regex_escape("node-1.example"), "node-1\\.example");
    }
}
