//! Pod routes as extra routes of one neutron router (`[Route] router-id`), as
//! cloud-provider-openstack's `routes.go`: a route is `{destination: <pod CIDR>, nexthop: <the
//! Node's InternalIP>}`, added and removed with the atomic `add_extraroutes` /
//! `remove_extraroutes` calls (never a read-modify-write of the whole list, so routes other
//! tools add survive), and the pod CIDR is added to (removed from) the allowed address pairs of
//! the Node's port on that address, so port security lets the Pods' traffic through.
//!
//! Listing maps each nexthop to the server that has the address; a nexthop no server has is a
//! blackhole route (the route controller removes it only when it lies in the cluster CIDR).

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_cloud_provider::{CloudError, CloudResult, Route, Routes};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    OpenStackCloud, Server,
    client::{Service, query_escape},
    cloud_error,
};

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
struct ExtraRoute {
    destination: String,
    nexthop: String,
}

#[derive(Debug, Clone, Deserialize)]
struct Router {
    #[serde(default)]
    routes: Vec<ExtraRoute>,
}

#[derive(Debug, Clone, Deserialize)]
struct Port {
    id: String,
    #[serde(default)]
    fixed_ips: Vec<FixedIp>,
    #[serde(default)]
    allowed_address_pairs: Vec<Value>,
    /// Absent without neutron's `port-security` extension: pairs are allowed then.
    #[serde(default = "port_security_default")]
    port_security_enabled: bool,
}

fn port_security_default() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct FixedIp {
    ip_address: String,
}

fn same_family(a: &str, cidr: &str) -> bool {
    a.contains(':') == cidr.contains(':')
}

impl OpenStackCloud {
    fn router_path(&self) -> String {
        format!("/routers/{}", query_escape(&self.config.route.router_id))
    }

    async fn router(&self) -> CloudResult<Router> {
        self.client
            .get_as(Service::Network, &self.router_path(), "router")
            .await
            .map_err(|e| cloud_error(format!("reading router {}", self.config.route.router_id), e))
    }

    async fn all_servers(&self) -> CloudResult<Vec<Server>> {
        self.client
            .list(Service::Compute, "/servers/detail", "servers")
            .await
            .map_err(|e| cloud_error("listing servers", e))
    }

    /// The nexthop for a route: the target's InternalIP of the destination's family.
    async fn nexthop(&self, route: &Route) -> CloudResult<(String, Option<Server>)> {
        let from_node = route
            .target_node_addresses
            .iter()
            .find(|a| a.type_ == "InternalIP" && same_family(&a.address, &route.destination_cidr))
            .map(|a| a.address.clone());
        let server = self.server_by_name(&route.target_node).await?;
        if let Some(ip) = from_node.filter(|_| route.enable_node_addresses) {
            return Ok((ip, server));
        }
        let s = server.ok_or_else(|| {
            CloudError::msg(format!(
                "route to node {}: no server of that name",
                route.target_node
            ))
        })?;
        let ip = crate::node_addresses(&s, &self.config.networking)
            .into_iter()
            .find(|a| a.type_ == "InternalIP" && same_family(&a.address, &route.destination_cidr))
            .map(|a| a.address)
            .ok_or_else(|| {
                CloudError::msg(format!(
                    "route {} to node {}: the server has no InternalIP of that address family",
                    route.destination_cidr, route.target_node
                ))
            })?;
        Ok((ip, Some(s)))
    }

    /// The server's port that holds `ip`.
    async fn port_with_ip(&self, server: &Server, ip: &str) -> CloudResult<Option<Port>> {
        let path = format!("/ports?device_id={}", query_escape(&server.id));
        let ports: Vec<Port> = self
            .client
            .list(Service::Network, &path, "ports")
            .await
            .map_err(|e| cloud_error(format!("listing ports of server {}", server.id), e))?;
        Ok(ports
            .into_iter()
            .find(|p| p.fixed_ips.iter().any(|f| f.ip_address == ip)))
    }

    async fn set_address_pairs(&self, port: &Port, pairs: Vec<Value>) -> CloudResult<()> {
        self.client
            .put(
                Service::Network,
                &format!("/ports/{}", port.id),
                &json!({"port": {"allowed_address_pairs": pairs}}),
            )
            .await
            .map_err(|e| cloud_error(format!("updating allowed address pairs of port {}", port.id), e))?;
        Ok(())
    }
}

#[async_trait]
impl Routes for OpenStackCloud {
    async fn list_routes(&self, _cluster: &str) -> CloudResult<Vec<Route>> {
        let router = self.router().await?;
        let mut by_ip: BTreeMap<String, String> = BTreeMap::new();
        for s in self.all_servers().await? {
            for addrs in s.addresses.values() {
                for a in addrs {
                    by_ip.insert(a.addr.clone(), s.name.clone());
                }
            }
        }
        Ok(router
            .routes
            .into_iter()
            .map(|r| {
                let node = by_ip.get(&r.nexthop).cloned();
                Route::new(node.clone().unwrap_or_default(), r.destination.clone())
                    .with_name(r.destination)
                    .with_blackhole(node.is_none())
            })
            .collect())
    }

    async fn create_route(&self, _cluster: &str, _name_hint: &str, route: &Route) -> CloudResult<()> {
        let (nexthop, server) = self.nexthop(route).await?;
        let router = self.router().await?;
        let wanted = ExtraRoute {
            destination: route.destination_cidr.clone(),
            nexthop: nexthop.clone(),
        };
        if !router.routes.contains(&wanted) {
            self.client
                .put(
                    Service::Network,
                    &format!("{}/add_extraroutes", self.router_path()),
                    &json!({"router": {"routes": [{"destination": wanted.destination, "nexthop": wanted.nexthop}]}}),
                )
                .await
                .map_err(|e| cloud_error(format!("adding route {} via {nexthop}", route.destination_cidr), e))?;
            tracing::info!(destination = %route.destination_cidr, %nexthop, node = %route.target_node, "added router route");
        }
        if let Some(server) = server
            && let Some(port) = self.port_with_ip(&server, &nexthop).await?
        {
            // As OCCM: neutron refuses address pairs on a port without port security (and such
            // a port drops nothing for want of them), so none is added, with a log line.
            if !port.port_security_enabled {
                tracing::info!(port = %port.id, node = %route.target_node, destination = %route.destination_cidr, "port security is off on the node's port: no allowed address pair is needed or possible");
                return Ok(());
            }
            let present = port
                .allowed_address_pairs
                .iter()
                .any(|p| p["ip_address"].as_str() == Some(route.destination_cidr.as_str()));
            if !present {
                let mut pairs = port.allowed_address_pairs.clone();
                pairs.push(json!({"ip_address": route.destination_cidr}));
                self.set_address_pairs(&port, pairs).await?;
            }
        }
        Ok(())
    }

    async fn delete_route(&self, _cluster: &str, route: &Route) -> CloudResult<()> {
        let router = self.router().await?;
        let found: Vec<ExtraRoute> = router
            .routes
            .into_iter()
            .filter(|r| r.destination == route.destination_cidr)
            .collect();
        for r in &found {
            self.client
                .put(
                    Service::Network,
                    &format!("{}/remove_extraroutes", self.router_path()),
                    &json!({"router": {"routes": [{"destination": r.destination, "nexthop": r.nexthop}]}}),
                )
                .await
                .map_err(|e| cloud_error(format!("removing route {} via {}", r.destination, r.nexthop), e))?;
            tracing::info!(destination = %r.destination, nexthop = %r.nexthop, "removed router route");
        }
        if route.target_node.is_empty() {
            return Ok(());
        }
        if let Some(server) = self.server_by_name(&route.target_node).await? {
            for r in &found {
                if let Some(port) = self.port_with_ip(&server, &r.nexthop).await?
                    && port.port_security_enabled
                {
                    let pairs: Vec<Value> = port
                        .allowed_address_pairs
                        .iter()
                        .filter(|p| p["ip_address"].as_str() != Some(route.destination_cidr.as_str()))
                        .cloned()
                        .collect();
                    if pairs.len() != port.allowed_address_pairs.len() {
                        self.set_address_pairs(&port, pairs).await?;
                    }
                }
            }
        }
        Ok(())
    }
}
