//! What OCCM detects when `[LoadBalancer]` and the annotations leave it unset: the VIP and
//! member subnet (the subnet of a backend Node's address of the Service's IP family, from the
//! Node's neutron ports) and the floating network (an external network with an IPv4 subnet).
//!
//! One deliberate difference from OCCM: when the project sees several external networks, OCCM
//! takes the first neutron lists, which may not be routed to the VIP subnet (neutron then
//! refuses the floating IP); here the external network that a router attached to the VIP
//! subnet has as its gateway comes first, and OCCM's choice only when no router says.

use std::sync::Arc;

use k8s_cloud_provider::{CloudError, CloudResult, service::helpers::load_balancer_backends};
use k8s_openapi::api::core::v1::{Node, Service as KubeService};
use serde::Deserialize;

use super::{octavia::OctaviaLoadBalancer, options::*};
use crate::{
    OpenStackCloud,
    client::{Service, query_escape},
    cloud_error, server_id_from_provider_id,
};

/// A neutron port's fixed IP.
#[derive(Debug, Deserialize)]
pub(super) struct FixedIp {
    #[serde(default)]
    pub(super) subnet_id: String,
    #[serde(default)]
    pub(super) ip_address: String,
}

/// A neutron port, as detection and security groups read it.
#[derive(Debug, Deserialize)]
pub(super) struct Port {
    #[serde(default)]
    pub(super) id: String,
    #[serde(default)]
    pub(super) device_id: String,
    #[serde(default)]
    pub(super) fixed_ips: Vec<FixedIp>,
    #[serde(default)]
    pub(super) security_groups: Vec<String>,
    #[serde(default)]
    pub(super) port_security_enabled: Option<bool>,
    #[serde(default)]
    pub(super) tags: Vec<String>,
}

/// The address OCCM takes a Node's subnet from: its first InternalIP of the family, else its
/// first ExternalIP of the family.
pub fn node_address_for_subnet(node: &Node, ipv6: bool) -> Option<String> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    ["InternalIP", "ExternalIP"].iter().find_map(|kind| {
        addresses
            .iter()
            .filter(|a| a.type_ == *kind)
            .find(|a| {
                a.address
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_ipv6() == ipv6)
            })
            .map(|a| a.address.clone())
    })
}

impl OpenStackCloud {
    /// Fills in the VIP and member subnets OCCM detects: with no `subnet-id`, `network-id` or
    /// `port-id` anywhere, the VIP (and members') subnet is the subnet of the first backend
    /// Node's address of the Service's IP family; with a VIP network or port but no subnet and
    /// no member subnet, the members' subnet likewise. A Service that needs one and cannot get
    /// it is an error naming what is unset and why detection failed.
    pub(super) async fn detect_subnets(
        &self,
        service: &KubeService,
        nodes: &[Arc<Node>],
        opts: &mut ServiceOptions,
    ) -> CloudResult<()> {
        let no_vip = opts.subnet_id.is_empty() && opts.network_id.is_empty() && opts.port_id.is_empty();
        let no_members = opts.subnet_id.is_empty() && opts.member_subnet_id.is_empty();
        if !no_vip && !no_members {
            return Ok(());
        }
        let subnet = self.node_subnet(service, nodes).await.map_err(|why| {
            CloudError::msg(format!(
                "{}, and it cannot be detected as OCCM does: {why}",
                if no_vip {
                    format!(
                        "no VIP subnet: [LoadBalancer] subnet-id, network-id and the {ANNOTATION_SUBNET_ID}, {ANNOTATION_NETWORK_ID} and {ANNOTATION_PORT_ID} annotations are unset"
                    )
                } else {
                    format!(
                        "no member subnet: [LoadBalancer] subnet-id and member-subnet-id and the {ANNOTATION_SUBNET_ID} and {ANNOTATION_MEMBER_SUBNET_ID} annotations are unset"
                    )
                }
            ))
        })?;
        tracing::info!(subnet = %subnet, vip = no_vip, "detected the load balancer's subnet from a Node's port");
        if no_vip {
            opts.subnet_id = subnet;
        } else {
            opts.member_subnet_id = subnet;
        }
        Ok(())
    }

    /// The subnet of the first backend Node's address of the Service's family, read from the
    /// neutron ports of the Node's server; why not, as a sentence.
    async fn node_subnet(&self, service: &KubeService, nodes: &[Arc<Node>]) -> Result<String, String> {
        let ipv6 = service_wants_ipv6(service);
        let family = if ipv6 { "IPv6" } else { "IPv4" };
        let backends = load_balancer_backends(nodes);
        let node = backends
            .first()
            .ok_or_else(|| "there is no backend Node to take it from".to_string())?;
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let address = node_address_for_subnet(node, ipv6).ok_or_else(|| {
            format!("Node {name} has no InternalIP or ExternalIP of the Service's family ({family})")
        })?;
        let (server, ports) = self.ports_of_node(node).await.map_err(|e| e.to_string())?;
        ports
            .iter()
            .flat_map(|p| &p.fixed_ips)
            .find(|ip| ip.ip_address == address && !ip.subnet_id.is_empty())
            .map(|ip| ip.subnet_id.clone())
            .ok_or_else(|| format!("no port of server {server} (Node {name}) has its address {address}"))
    }

    /// The neutron ports of the Node's server (named by its provider ID): `(server ID, ports)`.
    pub(super) async fn ports_of_node(&self, node: &Node) -> CloudResult<(String, Vec<Port>)> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .unwrap_or_default();
        let server = server_id_from_provider_id(provider_id, &self.config.global.region)
            .map_err(|e| CloudError::msg(format!("Node {name}: {e}")))?;
        let ports = self
            .client
            .list(
                Service::Network,
                &format!("/ports?device_id={}", query_escape(&server)),
                "ports",
            )
            .await
            .map_err(|e| cloud_error(format!("listing the ports of server {server} (Node {name})"), e))?;
        Ok((server, ports))
    }

    /// The floating network OCCM detects for an external Service when none is configured: an
    /// external network with an IPv4 subnet (or whose subnets cannot be read), preferring the
    /// gateway network of a router attached to the load balancer's VIP subnet. `None` when
    /// the project sees no such network (the Service then shows its VIP, as in OCCM).
    pub(super) async fn detect_floating_network(
        &self,
        lb: &OctaviaLoadBalancer,
    ) -> CloudResult<Option<String>> {
        #[derive(Deserialize)]
        struct Network {
            id: String,
            #[serde(default)]
            subnets: Vec<String>,
        }
        #[derive(Deserialize)]
        struct Subnet {
            id: String,
            #[serde(default)]
            ip_version: u8,
        }
        let externals: Vec<Network> = self
            .client
            .list(Service::Network, "/networks?router:external=true", "networks")
            .await
            .map_err(|e| cloud_error("listing the external networks (floating-network-id is unset)", e))?;
        let mut candidates = Vec::new();
        for network in externals.iter().filter(|n| !n.subnets.is_empty()) {
            let subnets: Vec<Subnet> = self
                .client
                .list(
                    Service::Network,
                    &format!("/subnets?network_id={}", query_escape(&network.id)),
                    "subnets",
                )
                .await
                .map_err(|e| {
                    cloud_error(
                        format!("listing the subnets of external network {}", network.id),
                        e,
                    )
                })?;
            // As OCCM: a subnet it cannot read counts as IPv4.
            let ipv4 = network.subnets.iter().any(|id| {
                subnets
                    .iter()
                    .find(|s| &s.id == id)
                    .is_none_or(|s| s.ip_version == 4)
            });
            if ipv4 {
                candidates.push(network.id.clone());
            }
        }
        if candidates.len() > 1
            && let Some(routed) = self.routed_external_network(lb, &candidates).await?
        {
            tracing::info!(network = %routed, lb = %lb.id, "detected the floating network: the gateway of the VIP subnet's router");
            return Ok(Some(routed));
        }
        match candidates.first() {
            Some(first) => {
                tracing::info!(network = %first, candidates = candidates.len(), "detected the floating network (floating-network-id is unset)");
                Ok(Some(first.clone()))
            }
            None => {
                tracing::warn!(
                    lb = %lb.id,
                    "floating-network-id is unset and the project sees no external network with an IPv4 subnet: the Service gets no floating IP"
                );
                Ok(None)
            }
        }
    }

    /// Among `candidates`, the gateway network of a router with an interface on the load
    /// balancer's VIP subnet, if exactly one such network.
    async fn routed_external_network(
        &self,
        lb: &OctaviaLoadBalancer,
        candidates: &[String],
    ) -> CloudResult<Option<String>> {
        #[derive(Deserialize)]
        struct Gateway {
            #[serde(default)]
            network_id: String,
        }
        #[derive(Deserialize)]
        struct Router {
            #[serde(default)]
            external_gateway_info: Option<Gateway>,
        }
        if lb.vip_subnet_id.is_empty() {
            return Ok(None);
        }
        let interfaces: Vec<Port> = self
            .client
            .list(
                Service::Network,
                &format!(
                    "/ports?device_owner=network:router_interface&fixed_ips=subnet_id%3D{}",
                    query_escape(&lb.vip_subnet_id)
                ),
                "ports",
            )
            .await
            .map_err(|e| {
                cloud_error(
                    format!("listing the router interfaces on subnet {}", lb.vip_subnet_id),
                    e,
                )
            })?;
        let mut routers: Vec<&str> = interfaces.iter().map(|p| p.device_id.as_str()).collect();
        routers.sort_unstable();
        routers.dedup();
        let mut found = Vec::new();
        for router in routers.into_iter().filter(|r| !r.is_empty()) {
            let r: Router = self
                .client
                .get_as(Service::Network, &format!("/routers/{router}"), "router")
                .await
                .map_err(|e| cloud_error(format!("reading router {router}"), e))?;
            if let Some(g) = r.external_gateway_info
                && candidates.contains(&g.network_id)
                && !found.contains(&g.network_id)
            {
                found.push(g.network_id);
            }
        }
        Ok((found.len() == 1).then(|| found.remove(0)))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};

    use super::*;

    fn node(addresses: &[(&str, &str)]) -> Node {
        Node {
            status: Some(NodeStatus {
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(t, a)| NodeAddress {
                            type_: t.to_string(),
                            address: a.to_string(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_subnet_comes_from_the_internal_ip_of_the_family_else_the_external_ip() {
        let n = node(&[
            ("Hostname", "node-0"),
            ("ExternalIP", "172.24.4.9"),
            ("InternalIP", "fd00::5"),
            ("InternalIP", "10.0.0.5"),
        ]);
        assert_eq!(node_address_for_subnet(&n, false).as_deref(), Some("10.0.0.5"));
        assert_eq!(node_address_for_subnet(&n, true).as_deref(), Some("fd00::5"));
        let external_only = node(&[("ExternalIP", "172.24.4.9"), ("Hostname", "n")]);
        assert_eq!(
            node_address_for_subnet(&external_only, false).as_deref(),
            Some("172.24.4.9")
        );
        assert_eq!(node_address_for_subnet(&external_only, true), None);
        assert_eq!(node_address_for_subnet(&Node::default(), false), None);
    }
}
