//! `[LoadBalancer] manage-security-groups` (OCCM's `loadbalancer_sg.go`): each Service gets a
//! neutron security group `lb-sg-<uid>-<namespace>-<name>` that lets the members' subnet
//! reach its NodePorts (and its `healthCheckNodePort`), added to the port of each member Node
//! that carries the member address; it goes with the Service.
//!
//! Ownership: a group is the Service's only under that exact name, which holds the Service's
//! UID (OCCM's naming, so a cluster moving from OCCM adopts its groups: with the same rules
//! and ports nothing is written). Two groups of that name are an error, never a guess.
//!
//! **Deliberate difference from OCCM**: OCCM deletes the group on every sync while the option
//! is off (so that switching it off cleans up). Taking a group off the Nodes' ports while the
//! load balancer serves can cut the load balancer off from its members (the Nodes' own groups
//! may not open the NodePorts), and a take-over must write nothing: here a group found while
//! the option is off is kept, with a warning, and deleted with the Service (as OCCM also
//! does).

use std::{collections::BTreeSet, sync::Arc};

use k8s_cloud_provider::{CloudError, CloudResult};
use k8s_openapi::api::core::v1::{Node, Service as KubeService};
use serde::Deserialize;
use serde_json::json;

use super::{autodetect::Port, ensure::Members, options::*};
use crate::{
    OpenStackCloud,
    client::{ClientError, Service, query_escape},
    cloud_error,
};

/// OCCM's group name for a Service (neutron allows 255 bytes).
pub fn security_group_name(service: &KubeService) -> String {
    let mut name = format!(
        "lb-sg-{}-{}-{}",
        service.metadata.uid.as_deref().unwrap_or_default(),
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    );
    if name.len() > 255 {
        let mut end = 255;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    name
}

/// OCCM's description of the group (it names the cluster; `orphans` reads it back).
pub fn security_group_description(cluster: &str, service: &KubeService) -> String {
    format!(
        "Security Group for {}/{} Service LoadBalancer in cluster {cluster}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A neutron security group.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SecurityGroup {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) description: String,
}

/// A rule, as compared (OCCM's fields).
#[derive(Debug, Deserialize)]
struct Rule {
    id: String,
    #[serde(default)]
    direction: String,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default)]
    ethertype: String,
    #[serde(default)]
    remote_ip_prefix: Option<String>,
    #[serde(default)]
    port_range_min: Option<i64>,
    #[serde(default)]
    port_range_max: Option<i64>,
}

/// `(direction, protocol, ethertype, remote prefix, port)`: what OCCM compares (its rules
/// open one port each).
type RuleKey = (String, String, String, String, Option<i64>, Option<i64>);

impl Rule {
    fn key(&self) -> RuleKey {
        (
            self.direction.clone(),
            self.protocol.clone().unwrap_or_default().to_ascii_lowercase(),
            self.ethertype.clone(),
            self.remote_ip_prefix.clone().unwrap_or_default(),
            self.port_range_min,
            self.port_range_max,
        )
    }
}

/// The rules the Service's group should have: TCP from the members' subnet to the
/// `healthCheckNodePort`, and each port's protocol from each source to its NodePort (from the
/// members' subnet; with the `ovn` provider, which keeps the client's address, from the
/// Service's source ranges, every address without them).
fn wanted_rules(
    ports: &[PortSpec],
    health_check_node_port: Option<i32>,
    subnet_cidr: &str,
    ipv6: bool,
    sources: &[String],
) -> BTreeSet<RuleKey> {
    let ethertype = if ipv6 { "IPv6" } else { "IPv4" };
    let rule = |protocol: &str, remote: &str, port: i32| {
        (
            "ingress".to_string(),
            protocol.to_ascii_lowercase(),
            ethertype.to_string(),
            remote.to_string(),
            Some(i64::from(port)),
            Some(i64::from(port)),
        )
    };
    let mut want = BTreeSet::new();
    if let Some(hc) = health_check_node_port.filter(|p| *p > 0) {
        want.insert(rule("tcp", subnet_cidr, hc));
    }
    for p in ports.iter().filter(|p| p.node_port > 0) {
        for source in sources {
            want.insert(rule(&p.protocol, source, p.node_port));
        }
    }
    want
}

impl OpenStackCloud {
    /// The group of that name; two are an error.
    pub(super) async fn security_group_named(&self, name: &str) -> CloudResult<Option<SecurityGroup>> {
        let found: Vec<SecurityGroup> = self
            .client
            .list(
                Service::Network,
                &format!("/security-groups?name={}", query_escape(name)),
                "security_groups",
            )
            .await
            .map_err(|e| cloud_error(format!("listing security groups named {name}"), e))?;
        match found.len() {
            0 | 1 => Ok(found.into_iter().next()),
            n => Err(CloudError::msg(format!(
                "neutron has {n} security groups named {name} ({}): not choosing one; delete the extra ones",
                found.iter().map(|g| g.id.as_str()).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// With `manage-security-groups`: the Service's group made or adopted, its rules made
    /// right, and added to each member Node's port. Without: a group found (made with the
    /// option on, here or by OCCM) is kept, with a warning (see the module's documentation).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn reconcile_security_group(
        &self,
        cluster: &str,
        service: &KubeService,
        ports: &[PortSpec],
        opts: &ServiceOptions,
        allowed_cidrs: &[String],
        nodes: &[Arc<Node>],
        members: &Members,
    ) -> CloudResult<()> {
        let name = security_group_name(service);
        if !self.config.load_balancer.manage_security_groups {
            if let Some(g) = self.security_group_named(&name).await? {
                tracing::warn!(
                    group = %g.id,
                    name = %g.name,
                    "the Service has a security group made with [LoadBalancer] manage-security-groups = true, which is off: it is kept while the Service has its load balancer (taking it off the Nodes' ports could cut the load balancer off) and deleted with the Service; set the option to manage it"
                );
            }
            return Ok(());
        }
        let group = match self.security_group_named(&name).await? {
            Some(g) => g,
            None => {
                let v = self
                    .client
                    .post(
                        Service::Network,
                        "/security-groups",
                        &json!({"security_group": {"name": name, "description": security_group_description(cluster, service)}}),
                    )
                    .await
                    .map_err(|e| cloud_error(format!("creating security group {name}"), e))?;
                let g: SecurityGroup = crate::client::decode(&v, "security_group", "security-groups")
                    .map_err(|e| cloud_error("creating security group", e))?;
                tracing::info!(group = %g.id, name = %g.name, "created the Service's security group");
                g
            }
        };

        // The members' subnet: its CIDR is the source, its family the rules'.
        let subnet_id = opts.members_subnet();
        let subnet: serde_json::Value = self
            .client
            .get_as(Service::Network, &format!("/subnets/{subnet_id}"), "subnet")
            .await
            .map_err(|e| cloud_error(format!("reading the members' subnet {subnet_id}"), e))?;
        let cidr = subnet["cidr"].as_str().unwrap_or_default().to_string();
        let ipv6 = cidr.contains(':');
        let sources = if self.config.load_balancer.lb_provider == "ovn" {
            if allowed_cidrs.is_empty() {
                vec![if ipv6 { "::/0" } else { "0.0.0.0/0" }.to_string()]
            } else {
                allowed_cidrs.to_vec()
            }
        } else {
            vec![cidr.clone()]
        };
        let want = wanted_rules(ports, health_check_node_port(service), &cidr, ipv6, &sources);
        let rules: Vec<Rule> = self
            .client
            .list(
                Service::Network,
                &format!("/security-group-rules?security_group_id={}", group.id),
                "security_group_rules",
            )
            .await
            .map_err(|e| cloud_error(format!("listing the rules of security group {}", group.id), e))?;
        let have: BTreeSet<RuleKey> = rules.iter().map(Rule::key).collect();
        for (direction, protocol, ethertype, remote, min, max) in want.difference(&have) {
            let body = json!({"security_group_rule": {
                "security_group_id": group.id, "direction": direction, "protocol": protocol,
                "ethertype": ethertype, "remote_ip_prefix": remote,
                "port_range_min": min, "port_range_max": max,
            }});
            match self
                .client
                .post(Service::Network, "/security-group-rules", &body)
                .await
            {
                Ok(_) => {}
                // Already there (a concurrent sync): as OCCM, fine.
                Err(ClientError::Http { status, .. }) if status.as_u16() == 409 => {}
                Err(e) => {
                    return Err(cloud_error(
                        format!(
                            "adding rule {protocol} {remote} → {min:?} to security group {}",
                            group.id
                        ),
                        e,
                    ));
                }
            }
        }
        // Rules the group should not have (OCCM's: including neutron's default egress rules of
        // a new group; the Nodes' own groups decide what leaves them).
        for r in rules.iter().filter(|r| !want.contains(&r.key())) {
            self.client
                .delete(Service::Network, &format!("/security-group-rules/{}", r.id))
                .await
                .map_err(|e| {
                    cloud_error(
                        format!("deleting rule {} of security group {}", r.id, group.id),
                        e,
                    )
                })?;
        }

        // The group on each member's port: the port of the member Node's server with the
        // member address (on the members' subnet), as OCCM; ports without port security skipped.
        for (node_name, address) in &members.by_node {
            let Some(node) = nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(node_name))
            else {
                continue;
            };
            let (_, node_ports) = self.ports_of_node(node).await?;
            for port in node_ports {
                let member_port = port.fixed_ips.iter().any(|ip| {
                    ip.ip_address == *address
                        && (opts.member_subnet_id.is_empty() || ip.subnet_id == opts.member_subnet_id)
                });
                if port.port_security_enabled == Some(false)
                    || !member_port
                    || port.security_groups.contains(&group.id)
                {
                    continue;
                }
                let mut groups = port.security_groups.clone();
                groups.push(group.id.clone());
                self.client
                    .put(
                        Service::Network,
                        &format!("/ports/{}", port.id),
                        &json!({"port": {"security_groups": groups}}),
                    )
                    .await
                    .map_err(|e| {
                        cloud_error(
                            format!(
                                "adding security group {} to port {} of Node {node_name}",
                                group.id, port.id
                            ),
                            e,
                        )
                    })?;
                tracing::info!(group = %group.id, port = %port.id, node = %node_name, "added the Service's security group to a member's port");
            }
        }
        Ok(())
    }

    /// The Service's group taken off every port and deleted (whatever the option says: OCCM's
    /// or this CCM's, made for this Service by its UID).
    pub(super) async fn delete_security_group(&self, service: &KubeService) -> CloudResult<()> {
        let name = security_group_name(service);
        let Some(group) = self.security_group_named(&name).await? else {
            return Ok(());
        };
        self.delete_security_group_by_id(&group).await
    }

    /// Takes `group` off every port that has it (and OCCM's old tag of its ID), then deletes it.
    pub(crate) async fn delete_security_group_by_id(&self, group: &SecurityGroup) -> CloudResult<()> {
        let ports: Vec<Port> = self
            .client
            .list(
                Service::Network,
                &format!("/ports?security_groups={}", group.id),
                "ports",
            )
            .await
            .map_err(|e| cloud_error(format!("listing the ports of security group {}", group.id), e))?;
        for port in ports {
            let rest: Vec<&String> = port.security_groups.iter().filter(|g| **g != group.id).collect();
            self.client
                .put(
                    Service::Network,
                    &format!("/ports/{}", port.id),
                    &json!({"port": {"security_groups": rest}}),
                )
                .await
                .map_err(|e| {
                    cloud_error(
                        format!("taking security group {} off port {}", group.id, port.id),
                        e,
                    )
                })?;
            if port.tags.contains(&group.id) {
                self.client
                    .delete(Service::Network, &format!("/ports/{}/tags/{}", port.id, group.id))
                    .await
                    .map_err(|e| cloud_error(format!("removing tag {} of port {}", group.id, port.id), e))?;
            }
        }
        self.client
            .delete(Service::Network, &format!("/security-groups/{}", group.id))
            .await
            .map_err(|e| {
                cloud_error(
                    format!("deleting security group {} ({})", group.id, group.name),
                    e,
                )
            })?;
        tracing::info!(group = %group.id, name = %group.name, "deleted the Service's security group");
        Ok(())
    }
}

/// The Service's `healthCheckNodePort` (set by the API server for `externalTrafficPolicy:
/// Local`), whatever the monitors say: OCCM opens it whenever it is set.
fn health_check_node_port(service: &KubeService) -> Option<i32> {
    service.spec.as_ref()?.health_check_node_port.filter(|p| *p > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_rules_and_sources_as_occm() {
        let mut svc = KubeService::default();
        svc.metadata.uid = Some("4a0e-uid".into());
        svc.metadata.namespace = Some("shop".into());
        svc.metadata.name = Some("web".into());
        assert_eq!(security_group_name(&svc), "lb-sg-4a0e-uid-shop-web");
        svc.metadata.name = Some("é".repeat(200));
        let long = security_group_name(&svc);
        assert!(long.len() <= 255 && long.starts_with("lb-sg-4a0e-uid-shop-é"));
        assert_eq!(
            security_group_description("prod", &svc)
                .split(" in cluster ")
                .nth(1),
            Some("prod")
        );

        let ports = [
            PortSpec {
                protocol: "TCP".into(),
                port: 80,
                node_port: 30080,
            },
            PortSpec {
                protocol: "UDP".into(),
                port: 53,
                node_port: 30053,
            },
            PortSpec {
                protocol: "TCP".into(),
                port: 81,
                node_port: 0,
            },
        ];
        let want = wanted_rules(&ports, Some(32000), "10.0.0.0/24", false, &["10.0.0.0/24".into()]);
        let got: Vec<(String, Option<i64>)> = want.iter().map(|r| (r.1.clone(), r.4)).collect();
        assert_eq!(
            got,
            [
                ("tcp".into(), Some(30080)),
                ("tcp".into(), Some(32000)),
                ("udp".into(), Some(30053))
            ],
            "no rule for a port without NodePort"
        );
        assert!(
            want.iter()
                .all(|r| r.0 == "ingress" && r.2 == "IPv4" && r.3 == "10.0.0.0/24")
        );
    }
}
