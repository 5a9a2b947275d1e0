//! Orphan routes: routes of the cluster's route table, within the cluster CIDR, to an instance
//! that no Node runs on.
//!
//! A route is an orphan when it is a blackhole or points at an instance, and no Node runs on
//! that instance. Liveness is decided by instance IDs only, never by names: a Node runs on the instance its
//! provider ID names (`aws:///<zone>/<instance id>`); a Node without a provider ID runs on the
//! instance the CCM would give it (the instance whose private DNS name is the Node's name).
//! Node names are never compared with instance names, so kubeadm short host names and
//! `--hostname-override` Nodes are matched like the CCM matches them. When a Node cannot be
//! placed on an instance (a provider ID that is not an AWS instance's, or no provider ID and no
//! instance of that name), no route is listed at all: any of them could be that Node's.

use std::collections::BTreeSet;

use aws_sdk_ec2::types::RouteState;
use k8s_cloud_provider::{CloudError, CloudResult, node::helpers::provider_id};
use k8s_openapi::api::core::v1::Node;

use super::{Orphan, OrphanKind};
use crate::{AwsCloud, cloud_error, instances::instance_id_from_provider_id};

/// The owner of a route orphan: `instance/<id>` (`instance/` when EC2 names none).
fn route_owner(instance: Option<&str>) -> String {
    format!("instance/{}", instance.unwrap_or_default())
}

impl AwsCloud {
    /// The instance IDs the given Nodes run on (see the module docs). A Node that cannot be
    /// placed is an error naming it: no route may be called an orphan then.
    pub async fn node_instance_ids(&self, nodes: &[Node]) -> CloudResult<BTreeSet<String>> {
        let mut live = BTreeSet::new();
        for node in nodes {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            let pid = provider_id(node);
            if !pid.is_empty() {
                let id = instance_id_from_provider_id(pid).map_err(|e| {
                    CloudError::msg(format!(
                        "Node {name} has spec.providerID {pid:?}, which names no AWS instance ({e}); routes are not checked, since any of them could be this Node's"
                    ))
                })?;
                live.insert(id);
                continue;
            }
            match self.instance_for(node, std::time::Duration::ZERO).await? {
                Some(instance) => {
                    live.insert(instance.id.clone());
                }
                None => {
                    return Err(CloudError::msg(format!(
                        "Node {name} has no spec.providerID and no instance has the private DNS name {name:?}; routes are not checked, since any of them could be this Node's"
                    )));
                }
            }
        }
        Ok(live)
    }

    /// The routes of the cluster's route table whose destination lies within one of
    /// `cluster_cidrs` (the Nodes' pod CIDRs come from there) and that are blackholes (their
    /// instance is gone) or point at an instance none of `nodes` (every Node of the cluster)
    /// runs on. Routes outside the cluster CIDRs (a NAT instance's default route, VPN routes,
    /// …) and routes to anything but an instance (gateways, NAT gateways, network interfaces,
    /// peering connections) are never looked at.
    pub async fn find_orphan_routes(
        &self,
        nodes: &[Node],
        cluster_cidrs: &[ipnet::IpNet],
    ) -> CloudResult<Vec<Orphan>> {
        let live = self.node_instance_ids(nodes).await?;
        let table_id = self.route_table_id().await?;
        let mut found = Vec::new();
        for table in self.describe_table(&table_id).await? {
            for r in table.routes() {
                let Some(cidr) = r.destination_cidr_block() else {
                    continue;
                };
                let Ok(destination) = cidr.parse::<ipnet::IpNet>() else {
                    continue;
                };
                if !cluster_cidrs.iter().any(|c| c.contains(&destination)) {
                    continue;
                }
                let instance = r.instance_id();
                let blackhole = r.state() == Some(&RouteState::Blackhole);
                // A blackhole to an instance a Node runs on (a stopped instance) is kept: the
                // instance may be started again.
                let reason = match instance {
                    Some(id) if live.contains(id) => continue,
                    Some(id) if blackhole => {
                        format!("blackhole: instance {id} is gone or stopped, and no Node runs on it")
                    }
                    Some(id) => format!("no Node runs on instance {id} (no Node's provider ID names it)"),
                    None if blackhole => "blackhole: its target no longer exists".to_string(),
                    None => continue,
                };
                found.push(Orphan {
                    kind: OrphanKind::Route,
                    name: cidr.to_string(),
                    id: cidr.to_string(),
                    owner: route_owner(instance),
                    reason,
                });
            }
        }
        found.sort();
        Ok(found)
    }

    /// Deletes a route orphan after reading it again: the route must still point at the
    /// instance it was listed with (or still be a blackhole), and no Node of `nodes_now` (the
    /// cluster's Nodes, listed again just before) may run on that instance.
    pub async fn delete_orphan_route(&self, orphan: &Orphan, nodes_now: &[Node]) -> CloudResult<()> {
        if orphan.kind != OrphanKind::Route {
            return Err(CloudError::msg(format!(
                "{} {} is not a route",
                orphan.kind, orphan.name
            )));
        }
        let listed = orphan.owner.strip_prefix("instance/").unwrap_or_default();
        let table_id = self.route_table_id().await?;
        let tables = self.describe_table(&table_id).await?;
        let Some(route) = tables
            .iter()
            .flat_map(|t| t.routes())
            .find(|r| r.destination_cidr_block() == Some(orphan.id.as_str()))
        else {
            return Ok(()); // gone since
        };
        let blackhole = route.state() == Some(&RouteState::Blackhole);
        let now = route.instance_id().unwrap_or_default();
        if now != listed {
            return Err(CloudError::msg(format!(
                "route {} now points at {:?} (listed: {listed:?}); not deleted",
                orphan.id,
                route.instance_id()
            )));
        }
        let runs_a_node = !now.is_empty() && self.node_instance_ids(nodes_now).await?.contains(now);
        if runs_a_node || (now.is_empty() && !blackhole) {
            return Err(CloudError::msg(format!(
                "route {}: a Node runs on instance {now} now; not deleted",
                orphan.id
            )));
        }
        tracing::info!(route = %orphan.id, instance = now, table = %table_id, "deleting an orphan route");
        self.delete_cidr_route(&table_id, &orphan.id)
            .await
            .map_err(|e| cloud_error(format!("deleting route {} from {table_id}", orphan.id), e))
    }
}
