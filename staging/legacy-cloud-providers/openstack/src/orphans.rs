//! Finding (and deleting) the Octavia load balancers and floating IPs this cluster made that no
//! Service wants any more — what a cloud-controller-manager leaves behind when a Service's
//! cleanup finalizer was removed by hand, when it was stopped for good, or when a bug skipped a
//! deletion. Not part of OCCM; the `orphans` command of `cloud-controller-manager-openstack`
//! runs it.
//!
//! The rules, all of which must hold:
//!
//! - **Load balancers.** Named `kube_service_<cluster>_<namespace>_<name>` (the name this
//!   provider and OCCM give; a name cut at Octavia's 255 characters is never matched: doubt
//!   keeps), not `PENDING_*`, and no Service wants it: a Service wants the load balancer of its
//!   name, the one its `loadbalancer.openstack.org/load-balancer-id` names, and one tagged with
//!   its load balancer name (a shared one), when it is `type: LoadBalancer` or still carries
//!   the cleanup finalizer. Its listeners, pools, members and monitors go with it.
//! - **Floating IPs.** Described as made for a Service of this cluster
//!   ([`crate::loadbalancer::floating_ip_description`]), no Service of that namespace and name
//!   wants a load balancer, and attached to no port or to the VIP port of an orphan load
//!   balancer (any other port: it serves something). A floating IP with any other
//!   description — a user's own — never is an orphan.
//! - **Security groups** (`manage-security-groups`). Named `lb-sg-<uid>-<namespace>-<name>`
//!   with OCCM's description naming this cluster
//!   ([`crate::loadbalancer::security_group_description`]; another cluster's, or one without
//!   that description, never is an orphan), the name not cut at 255 bytes, and no Service with
//!   that UID, namespace and name wants a load balancer. Deleting one takes it off the ports
//!   that have it first.
//!
//! Deletion ([`OpenStackCloud::delete_orphan`]) reads the candidate again right before deleting
//! it, with the Services as they are then, and refuses when it is no longer an orphan.

use std::collections::BTreeSet;

use k8s_cloud_provider::{CloudError, CloudResult};
use k8s_openapi::api::core::v1::Service as KubeService;

use crate::{
    OpenStackCloud,
    client::Service,
    cloud_error,
    loadbalancer::{
        ANNOTATION_LOAD_BALANCER_ID, FloatingIp, OctaviaLoadBalancer, SecurityGroup, floating_ip_description,
        load_balancer_name, security_group_name,
    },
};

/// Octavia's longest name: a name this long may have been cut.
const MAX_NAME: usize = 255;

/// What kind of resource an [`Orphan`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OrphanKind {
    /// A neutron floating IP made for a Service (deleted first: one on an orphan load
    /// balancer's VIP port goes before the load balancer, as in a Service's deletion).
    FloatingIp,
    /// An Octavia load balancer (with its listeners, pools, members and monitors).
    LoadBalancer,
    /// A neutron security group made for a Service (`manage-security-groups`), deleted after
    /// the load balancers (taken off the Nodes' ports first).
    SecurityGroup,
}

impl std::fmt::Display for OrphanKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::LoadBalancer => "load-balancer",
            Self::FloatingIp => "floating-ip",
            Self::SecurityGroup => "security-group",
        })
    }
}

/// One resource no Service wants.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Orphan {
    /// Its kind.
    pub kind: OrphanKind,
    /// Its name (a floating IP's address).
    pub name: String,
    /// Its ID.
    pub id: String,
    /// The Service it was made for (`namespace/name`).
    pub owner: String,
    /// Why it is an orphan.
    pub reason: String,
}

/// Whether `service` wants its load balancer (`type: LoadBalancer`, or the cleanup finalizer
/// still on it).
pub(crate) fn wants_load_balancer(service: &KubeService) -> bool {
    // Any `type: LoadBalancer`, a load-balancer class included: doubt keeps.
    service.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
        || k8s_cloud_provider::service::helpers::has_lb_finalizer(service)
}

/// The load-balancer names the Services want.
fn wanted_names(cluster: &str, services: &[KubeService]) -> BTreeSet<String> {
    services
        .iter()
        .filter(|s| wants_load_balancer(s))
        .map(|s| load_balancer_name(cluster, s))
        .collect()
}

/// The load balancers the Services name with `loadbalancer.openstack.org/load-balancer-id`.
fn wanted_ids(services: &[KubeService]) -> BTreeSet<String> {
    services
        .iter()
        .filter(|s| wants_load_balancer(s))
        .filter_map(|s| s.metadata.annotations.as_ref()?.get(ANNOTATION_LOAD_BALANCER_ID))
        .map(|id| id.trim().to_string())
        .collect()
}

/// Whether a Service uses the load balancer: by its name, by a Service tag (a shared one
/// carries the name of every Service using it), or through `load-balancer-id`.
fn in_use(lb: &OctaviaLoadBalancer, wanted: &BTreeSet<String>, ids: &BTreeSet<String>) -> bool {
    wanted.contains(&lb.name) || lb.tags.iter().any(|t| wanted.contains(t)) || ids.contains(&lb.id)
}

/// `namespace/name` of the Service a load balancer named `name` is for, when the name is one
/// of this cluster's and was not cut.
fn owner_of(cluster: &str, name: &str) -> Option<String> {
    if name.len() >= MAX_NAME {
        return None;
    }
    let rest = name.strip_prefix(&format!("kube_service_{cluster}_"))?;
    // Namespaces cannot hold `_`: the first one ends the namespace.
    let (ns, svc) = rest.split_once('_')?;
    (!ns.is_empty() && !svc.is_empty()).then(|| format!("{ns}/{svc}"))
}

/// The Service a floating IP was made for, from its description, when made in `cluster`.
fn fip_owner(cluster: &str, description: &str) -> Option<String> {
    let rest = description.strip_prefix("Floating IP for Kubernetes external service ")?;
    let owner = rest.strip_suffix(&format!(" from cluster {cluster}"))?;
    (owner
        .split_once('/')
        .is_some_and(|(ns, n)| !ns.is_empty() && !n.is_empty())
        && !owner.contains(' '))
    .then(|| owner.to_string())
}

/// The Service a security group was made for (`namespace/name`), when its name is OCCM's
/// (not cut) and its description names `cluster`.
fn security_group_owner(cluster: &str, group: &SecurityGroup) -> Option<String> {
    if !group.name.starts_with("lb-sg-") || group.name.len() >= MAX_NAME {
        return None;
    }
    let owner = group
        .description
        .strip_prefix("Security Group for ")?
        .strip_suffix(&format!(" Service LoadBalancer in cluster {cluster}"))?;
    let (ns, name) = owner.split_once('/')?;
    // The name ends with the owner's `-<namespace>-<name>`.
    (!ns.is_empty()
        && !name.is_empty()
        && !owner.contains(' ')
        && group.name.ends_with(&format!("-{ns}-{name}")))
    .then(|| owner.to_string())
}

/// The group names the Services that want a load balancer have.
fn wanted_security_groups(services: &[KubeService]) -> BTreeSet<String> {
    services
        .iter()
        .filter(|s| wants_load_balancer(s))
        .map(security_group_name)
        .collect()
}

/// The Service `namespace/name` of `services`, if it wants a load balancer.
fn wants(services: &[KubeService], owner: &str) -> bool {
    services.iter().any(|s| {
        wants_load_balancer(s)
            && format!(
                "{}/{}",
                s.metadata.namespace.as_deref().unwrap_or("default"),
                s.metadata.name.as_deref().unwrap_or_default()
            ) == owner
    })
}

/// A server as nova's short list (`GET /servers`) gives it.
#[derive(serde::Deserialize)]
struct ListedServer {
    id: String,
}

impl OpenStackCloud {
    /// Checks that the cluster whose Nodes are `nodes` (every Node, from the kubeconfig) is a
    /// cluster of this cloud config's project and region, before anything is deleted: every
    /// Node with an OpenStack provider ID must name a server nova lists for this project (and
    /// no other region), and there must be at least one. A kubeconfig of one cluster paired
    /// with the cloud config of another project would otherwise make that project's load
    /// balancers of the same cluster name orphans. Returns a one-line summary of what was
    /// checked.
    pub async fn verify_cluster(&self, nodes: &[k8s_openapi::api::core::v1::Node]) -> CloudResult<String> {
        let region = &self.config.global.region;
        let mut by_server = std::collections::BTreeMap::new();
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let Some(pid) = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) else {
                continue;
            };
            if !pid.starts_with("openstack://") {
                continue;
            }
            let id = crate::server_id_from_provider_id(pid, region)
                .map_err(|e| CloudError::msg(format!("Node {name}: {e}; nothing is deleted")))?;
            by_server.insert(id, name);
        }
        if by_server.is_empty() {
            return Err(CloudError::msg(
                "no Node of the kubeconfig's cluster has an OpenStack provider ID, so it cannot be checked to be a cluster of the cloud config's project; nothing is deleted",
            ));
        }
        // The project's own list: an admin's `GET /servers/<id>` would find other projects'.
        let listed: BTreeSet<String> = self
            .client
            .list::<ListedServer>(Service::Compute, "/servers", "servers")
            .await
            .map_err(|e| cloud_error("listing the project's servers to check the cluster", e))?
            .into_iter()
            .map(|s| s.id)
            .collect();
        let problems: Vec<String> = by_server
            .iter()
            .filter(|(id, _)| !listed.contains(*id))
            .map(|(id, node)| format!("Node {node}'s server {id} is not in this project"))
            .collect();
        if !problems.is_empty() {
            let shown: Vec<&str> = problems.iter().take(3).map(String::as_str).collect();
            let more = if problems.len() > 3 {
                format!(" (and {} more)", problems.len() - 3)
            } else {
                String::new()
            };
            return Err(CloudError::msg(format!(
                "the kubeconfig's cluster does not look like a cluster of the cloud config's project: {}{more}; nothing is deleted",
                shown.join("; ")
            )));
        }
        Ok(format!(
            "the servers of the cluster's {} Node(s) are in the cloud config's project",
            by_server.len()
        ))
    }

    /// The orphans of `cluster` given every Service of the cluster.
    pub async fn orphans(&self, cluster: &str, services: &[KubeService]) -> CloudResult<Vec<Orphan>> {
        let wanted = wanted_names(cluster, services);
        let ids = wanted_ids(services);
        let mut out = Vec::new();
        // VIP port → orphan load balancer's name.
        let mut orphan_ports: std::collections::BTreeMap<String, String> = Default::default();
        if self.config.load_balancer.enabled {
            let lbs: Vec<OctaviaLoadBalancer> = self
                .client
                .list(Service::LoadBalancer, "/v2/lbaas/loadbalancers", "loadbalancers")
                .await
                .map_err(|e| cloud_error("listing load balancers", e))?;
            for lb in lbs {
                let Some(owner) = owner_of(cluster, &lb.name) else {
                    continue;
                };
                if in_use(&lb, &wanted, &ids)
                    || lb.provisioning_status.starts_with("PENDING_")
                    || lb.provisioning_status == "DELETED"
                {
                    continue;
                }
                if !lb.vip_port_id.is_empty() {
                    orphan_ports.insert(lb.vip_port_id.clone(), lb.name.clone());
                }
                out.push(Orphan {
                    kind: OrphanKind::LoadBalancer,
                    name: lb.name.clone(),
                    id: lb.id.clone(),
                    reason: format!(
                        "no Service {owner} wants a load balancer ({})",
                        lb.provisioning_status
                    ),
                    owner,
                });
            }
        }
        let fips: Vec<FloatingIp> = self
            .client
            .list(Service::Network, "/floatingips", "floatingips")
            .await
            .map_err(|e| cloud_error("listing floating IPs", e))?;
        for f in fips {
            let Some(owner) = fip_owner(cluster, &f.description) else {
                continue;
            };
            if wants(services, &owner) {
                continue;
            }
            let reason = match f.port_id.as_deref().filter(|p| !p.is_empty()) {
                None => {
                    format!("made for Service {owner}, which wants no load balancer; attached to no port")
                }
                Some(port) => match orphan_ports.get(port) {
                    Some(lb) => format!(
                        "made for Service {owner}, which wants no load balancer; on the VIP port of orphan load balancer {lb}"
                    ),
                    None => continue,
                },
            };
            out.push(Orphan {
                kind: OrphanKind::FloatingIp,
                name: f.floating_ip_address.clone(),
                id: f.id.clone(),
                reason,
                owner,
            });
        }
        let groups: Vec<SecurityGroup> = self
            .client
            .list(Service::Network, "/security-groups", "security_groups")
            .await
            .map_err(|e| cloud_error("listing security groups", e))?;
        let wanted_groups = wanted_security_groups(services);
        for g in groups {
            let Some(owner) = security_group_owner(cluster, &g) else {
                continue;
            };
            if wanted_groups.contains(&g.name) {
                continue;
            }
            out.push(Orphan {
                kind: OrphanKind::SecurityGroup,
                name: g.name.clone(),
                id: g.id.clone(),
                reason: format!(
                    "made for Service {owner} (its UID in the name), which wants no load balancer"
                ),
                owner,
            });
        }
        out.sort();
        Ok(out)
    }

    /// Deletes `orphan` after reading it again, with `services` (every Service of the cluster,
    /// read right before): refused when it is no longer an orphan (renamed, attached, wanted, or
    /// changing).
    pub async fn delete_orphan(
        &self,
        cluster: &str,
        services: &[KubeService],
        orphan: &Orphan,
    ) -> CloudResult<()> {
        let refuse = |why: String| {
            CloudError::msg(format!(
                "{} {} ({}): not deleted: {why}",
                orphan.kind, orphan.name, orphan.id
            ))
        };
        match orphan.kind {
            OrphanKind::LoadBalancer => {
                let path = format!("/v2/lbaas/loadbalancers/{}", orphan.id);
                let lb: OctaviaLoadBalancer = match self
                    .client
                    .get_as(Service::LoadBalancer, &path, "loadbalancer")
                    .await
                {
                    Ok(lb) => lb,
                    Err(e) if e.is_not_found() => return Ok(()),
                    Err(e) => return Err(cloud_error(format!("reading load balancer {}", orphan.id), e)),
                };
                if lb.name != orphan.name || owner_of(cluster, &lb.name).is_none() {
                    return Err(refuse(format!("it is now named {:?}", lb.name)));
                }
                if in_use(&lb, &wanted_names(cluster, services), &wanted_ids(services)) {
                    return Err(refuse(format!(
                        "a Service uses it now (Service {}, a Service tag, or a load-balancer-id annotation)",
                        orphan.owner
                    )));
                }
                self.delete_load_balancer(&lb, true).await
            }
            OrphanKind::SecurityGroup => {
                let path = format!("/security-groups/{}", orphan.id);
                let g: SecurityGroup = match self
                    .client
                    .get_as(Service::Network, &path, "security_group")
                    .await
                {
                    Ok(g) => g,
                    Err(e) if e.is_not_found() => return Ok(()),
                    Err(e) => return Err(cloud_error(format!("reading security group {}", orphan.id), e)),
                };
                if g.name != orphan.name
                    || security_group_owner(cluster, &g).as_deref() != Some(&orphan.owner)
                {
                    return Err(refuse(format!(
                        "it is now named {:?}, described {:?}",
                        g.name, g.description
                    )));
                }
                if wanted_security_groups(services).contains(&g.name) {
                    return Err(refuse(format!(
                        "Service {} wants a load balancer now",
                        orphan.owner
                    )));
                }
                self.delete_security_group_by_id(&g).await
            }
            OrphanKind::FloatingIp => {
                let path = format!("/floatingips/{}", orphan.id);
                let f: FloatingIp = match self.client.get_as(Service::Network, &path, "floatingip").await {
                    Ok(f) => f,
                    Err(e) if e.is_not_found() => return Ok(()),
                    Err(e) => return Err(cloud_error(format!("reading floating IP {}", orphan.name), e)),
                };
                if f.description != floating_ip_description_of(cluster, &orphan.owner) {
                    return Err(refuse(format!("its description is now {:?}", f.description)));
                }
                if let Some(port) = f.port_id.as_deref().filter(|p| !p.is_empty()) {
                    // Only on the VIP port of a load balancer that is still an orphan.
                    let lbs: Vec<OctaviaLoadBalancer> = self
                        .client
                        .list(
                            Service::LoadBalancer,
                            &format!(
                                "/v2/lbaas/loadbalancers?vip_port_id={}",
                                crate::client::query_escape(port)
                            ),
                            "loadbalancers",
                        )
                        .await
                        .map_err(|e| cloud_error(format!("finding the load balancer of port {port}"), e))?;
                    let wanted = wanted_names(cluster, services);
                    let ids = wanted_ids(services);
                    let orphan_lb = lbs.iter().any(|lb| {
                        lb.vip_port_id == port
                            && owner_of(cluster, &lb.name).is_some()
                            && !in_use(lb, &wanted, &ids)
                    });
                    if !orphan_lb {
                        return Err(refuse(format!(
                            "it is attached to port {port}, which is no orphan load balancer's"
                        )));
                    }
                }
                if wants(services, &orphan.owner) {
                    return Err(refuse(format!(
                        "Service {} wants a load balancer now",
                        orphan.owner
                    )));
                }
                self.client
                    .delete(Service::Network, &path)
                    .await
                    .map_err(|e| cloud_error(format!("deleting floating IP {}", orphan.name), e))
            }
        }
    }
}

/// [`floating_ip_description`] for the Service `namespace/name`.
fn floating_ip_description_of(cluster: &str, owner: &str) -> String {
    let (ns, name) = owner.split_once('/').unwrap_or(("", owner));
    let service = KubeService {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            namespace: Some(ns.to_string()),
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    floating_ip_description(cluster, &service)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_from_names_and_descriptions() {
        assert_eq!(
            owner_of("kubernetes", "kube_service_kubernetes_shop_web").as_deref(),
            Some("shop/web")
        );
        assert_eq!(
            owner_of("prod", "kube_service_kubernetes_shop_web"),
            None,
            "another cluster's"
        );
        assert_eq!(
            owner_of("a_b", "kube_service_a_b_ns_name").as_deref(),
            Some("ns/name")
        );
        let long = format!("kube_service_kubernetes_ns_{}", "x".repeat(300));
        assert_eq!(owner_of("kubernetes", &long[..255]), None, "a cut name is doubt");
        assert_eq!(
            fip_owner(
                "kubernetes",
                "Floating IP for Kubernetes external service shop/web from cluster kubernetes"
            )
            .as_deref(),
            Some("shop/web")
        );
        assert_eq!(
            fip_owner(
                "prod",
                "Floating IP for Kubernetes external service shop/web from cluster kubernetes"
            ),
            None
        );
        assert_eq!(fip_owner("kubernetes", "the user's own"), None);
        assert_eq!(
            floating_ip_description_of("kubernetes", "shop/web"),
            "Floating IP for Kubernetes external service shop/web from cluster kubernetes"
        );
    }

    #[test]
    fn security_groups_of_this_cluster_by_occms_name_and_description() {
        let group = |name: &str, description: &str| SecurityGroup {
            id: "g".into(),
            name: name.into(),
            description: description.into(),
        };
        let occm = "Security Group for shop/web Service LoadBalancer in cluster kubernetes";
        let name = "lb-sg-0b7f0a52-5c2e-4f3c-9d35-9a7c7a1e0b11-shop-web";
        assert_eq!(
            security_group_owner("kubernetes", &group(name, occm)).as_deref(),
            Some("shop/web")
        );
        assert_eq!(
            security_group_owner("prod", &group(name, occm)),
            None,
            "another cluster's"
        );
        assert_eq!(
            security_group_owner("kubernetes", &group(name, "mine")),
            None,
            "a user's"
        );
        assert_eq!(
            security_group_owner("kubernetes", &group("default", occm)),
            None,
            "not OCCM's name"
        );
        assert_eq!(
            security_group_owner("kubernetes", &group("lb-sg-x-other-app", occm)),
            None,
            "the name and the description disagree"
        );
    }

    #[test]
    fn a_shared_load_balancer_is_in_use_while_any_of_its_services_wants_it() {
        let svc = |name: &str, lb_id: Option<&str>| KubeService {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                namespace: Some("default".into()),
                name: Some(name.into()),
                annotations: lb_id
                    .map(|id| [(ANNOTATION_LOAD_BALANCER_ID.to_string(), id.to_string())].into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let lb: OctaviaLoadBalancer = serde_json::from_value(serde_json::json!({
            "id": "lb-1",
            "name": "kube_service_k_default_owner",
            "tags": ["kube_service_k_default_owner", "kube_service_k_default_guest"],
        }))
        .unwrap();
        let check =
            |services: &[KubeService]| in_use(&lb, &wanted_names("k", services), &wanted_ids(services));
        assert!(check(&[svc("owner", None)]), "its owner");
        assert!(check(&[svc("guest", None)]), "a Service in its tags");
        assert!(check(&[svc("other", Some("lb-1"))]), "a Service naming it");
        assert!(
            !check(&[svc("other", Some("lb-2")), svc("third", None)]),
            "nobody"
        );
        assert!(!check(&[]));
    }
}
