//! Creating and updating a Service's load balancer: which load balancer (its own, or a shared
//! one), the checks OCCM makes before using it, its listeners (`listeners.rs`), the floating IP
//! and the load balancer's Service tags.

use std::{collections::BTreeMap, sync::Arc};

use k8s_cloud_provider::{
    CloudError, CloudResult,
    service::{
        AnnotationChanges, ServiceAnnotator,
        helpers::{is_allow_all, load_balancer_backends, load_balancer_source_ranges},
    },
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service as KubeService};
use serde_json::json;

use super::{floating_ip::floating_ip_description, octavia::*, options::*, status_for};
use crate::{
    OpenStackCloud,
    client::{Service, decode},
    cloud_error,
};

/// The load balancer a Service uses.
pub(super) struct ServiceLoadBalancer {
    /// The load balancer.
    pub(super) lb: OctaviaLoadBalancer,
    /// Whether it is the Service's own (its name, or its legacy name), not another Service's
    /// shared through `load-balancer-id`: only the owner gives it a floating IP, and only a
    /// load balancer with the Service's current name is ever deleted for it.
    pub(super) owner: bool,
}

/// The `<namespace>/<name>` a `kube_service_<cluster>_<namespace>_<name>` load balancer name
/// is for (namespaces and names have no `_`), if it is named for a Service of `cluster`.
pub(super) fn service_of_load_balancer_name(cluster: &str, name: &str) -> Option<(String, String)> {
    let rest = name
        .strip_prefix(SERVICE_PREFIX)?
        .strip_prefix(cluster)?
        .strip_prefix('_')?;
    let (ns, svc) = rest.split_once('_')?;
    (!ns.is_empty() && !svc.is_empty() && !svc.contains('_')).then(|| (ns.to_string(), svc.to_string()))
}

/// The Service load balancer names among a load balancer's tags (OCCM tags a load balancer
/// with the name of every Service that uses it).
pub(super) fn service_tags(lb: &OctaviaLoadBalancer) -> impl Iterator<Item = &str> {
    lb.tags
        .iter()
        .map(String::as_str)
        .filter(|t| t.starts_with(SERVICE_PREFIX))
}

impl OpenStackCloud {
    /// Writes the annotations OCCM keeps on a Service (`load-balancer-id`,
    /// `load-balancer-address`) that it does not show yet; nothing for a Service being
    /// deleted, or without an API-server client (a provider the framework did not initialise).
    pub(super) async fn annotate(
        &self,
        service: &KubeService,
        changes: AnnotationChanges,
    ) -> CloudResult<()> {
        let Some(client) = self.kube.get() else {
            return Ok(());
        };
        if service.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        ServiceAnnotator::new(client.clone())
            .apply(service, &changes)
            .await
            .map(|_| ())
    }

    /// The Service's load balancer: the one `load-balancer-id` names (`lb_id`), else the one
    /// with its name, else the one with its legacy `a<uid>` name (as OCCM looks them up).
    pub(super) async fn service_load_balancer(
        &self,
        cluster: &str,
        service: &KubeService,
        lb_id: Option<&str>,
    ) -> CloudResult<Option<ServiceLoadBalancer>> {
        let name = load_balancer_name(cluster, service);
        let legacy = legacy_load_balancer_name(service);
        let is_own = |lb: &OctaviaLoadBalancer| lb.name == name || Some(&lb.name) == legacy.as_ref();
        if let Some(id) = lb_id {
            let Some(lb) = self.load_balancer_by_id(id).await? else {
                return Ok(None);
            };
            let owner = is_own(&lb);
            if !owner
                && lb.name.starts_with(SERVICE_PREFIX)
                && lb.name.ends_with(&format!(
                    "_{}_{}",
                    service.metadata.namespace.as_deref().unwrap_or("default"),
                    service.metadata.name.as_deref().unwrap_or_default()
                ))
            {
                // OCCM renames it (the cluster name changed); renaming a load balancer another
                // cluster may own is not done on doubt.
                return Err(CloudError::msg(format!(
                    "annotation {ANNOTATION_LOAD_BALANCER_ID}: load balancer {id} is named {:?}, for this Service under another cluster name than {cluster:?} (--cluster-name); it is not renamed: rename it in Octavia to {name:?} if this cluster owns it",
                    lb.name
                )));
            }
            return Ok(Some(ServiceLoadBalancer { lb, owner }));
        }
        if let Some(lb) = self.find_load_balancer(&name).await? {
            return Ok(Some(ServiceLoadBalancer { lb, owner: true }));
        }
        if let Some(legacy) = &legacy
            && let Some(lb) = self.find_load_balancer(legacy).await?
        {
            return Ok(Some(ServiceLoadBalancer { lb, owner: true }));
        }
        Ok(None)
    }

    /// Creates or updates everything; returns the status and the backends left out for want of
    /// an address of the Service's family.
    pub(super) async fn ensure(
        &self,
        cluster: &str,
        service: &KubeService,
        nodes: &[Arc<Node>],
    ) -> CloudResult<(LoadBalancerStatus, Vec<String>)> {
        let mut opts = ServiceOptions::from_service(self, service)?;
        let ports = service_ports(service)?;
        let name = load_balancer_name(cluster, service);
        let ranges = load_balancer_source_ranges(service).map_err(|e| CloudError::msg(e.to_string()))?;
        let allowed_cidrs: Vec<String> = if is_allow_all(&ranges) {
            Vec::new()
        } else {
            ranges.iter().map(ToString::to_string).collect()
        };
        // OCCM ignores the ranges (with a Warning) where Octavia has no VIP ACLs; a load
        // balancer open to all that its Service restricts is not made here.
        if !allowed_cidrs.is_empty() && !self.octavia_supports(OctaviaFeature::VipAcl).await? {
            return Err(CloudError::msg(format!(
                "loadBalancerSourceRanges {}: this Octavia (or lb-provider {:?}) has no listener ACLs (API 2.12); the load balancer is not made open to all",
                allowed_cidrs.join(","),
                self.config.load_balancer.lb_provider
            )));
        }
        // The certificate first (OCCM's order): a reference barbican lacks changes nothing.
        if let Some(tls) = &opts.tls {
            self.check_tls_reference(tls).await?;
        }
        let members = self.members(service, nodes, &opts)?;
        self.detect_subnets(service, nodes, &mut opts).await?;

        let tags = self.octavia_supports(OctaviaFeature::Tags).await?;
        let mut found = self
            .service_load_balancer(cluster, service, opts.load_balancer_id.as_deref())
            .await?;
        // A `load-balancer-id` a controller manager wrote (it wrote the address beside it) for
        // a load balancer that is gone — deleted when the Service left `type: LoadBalancer`
        // under OCCM, which keeps the annotation (OCCM #2751) — is stale: the Service gets its
        // own load balancer again (found by its name, or made), and the annotation is
        // rewritten. An ID a user set alone stays an error: the Service is meant to share.
        let stale_id = found.is_none()
            && opts.load_balancer_id.is_some()
            && annotation(service, ANNOTATION_LOAD_BALANCER_ADDRESS).is_some();
        if stale_id {
            tracing::warn!(
                id = opts.load_balancer_id.as_deref().unwrap_or_default(),
                "the load balancer the Service's {ANNOTATION_LOAD_BALANCER_ID} names is gone from Octavia (a stale annotation): the Service gets its own"
            );
            found = self.service_load_balancer(cluster, service, None).await?;
        }
        let (ServiceLoadBalancer { lb, owner }, created) = match found {
            Some(found) => (found, false),
            None => {
                if let Some(id) = opts.load_balancer_id.as_ref().filter(|_| !stale_id) {
                    return Err(CloudError::msg(format!(
                        "annotation {ANNOTATION_LOAD_BALANCER_ID}: Octavia has no load balancer {id}"
                    )));
                }
                let lb = self
                    .create_load_balancer(cluster, service, &name, &opts, tags)
                    .await?;
                (ServiceLoadBalancer { lb, owner: true }, true)
            }
        };
        let others: Vec<&str> = service_tags(&lb).filter(|t| *t != name).collect();
        if !owner {
            if !tags {
                return Err(CloudError::msg(format!(
                    "annotation {ANNOTATION_LOAD_BALANCER_ID}: sharing load balancer {} needs Octavia's tags (API 2.5), which this Octavia lacks",
                    lb.id
                )));
            }
            let max = self.config.load_balancer.max_shared_lb;
            if !lb.tags.contains(&name) && others.len() + 1 > max as usize {
                return Err(CloudError::msg(format!(
                    "annotation {ANNOTATION_LOAD_BALANCER_ID}: load balancer {} is already shared by {} Services ({}), the most [LoadBalancer] max-shared-lb = {max} allows",
                    lb.id,
                    others.len(),
                    others.join(", ")
                )));
            }
            // As OCCM: an internal Service never shares (its owner may be made external).
            if opts.internal {
                return Err(CloudError::msg(format!(
                    "annotation {ANNOTATION_LOAD_BALANCER_ID}: an internal Service cannot share a load balancer ({})",
                    lb.id
                )));
            }
        }
        let settled = self.wait_settled(&lb.id).await?;
        // Whether a load balancer in ERROR never served: made by this call, or the Service
        // shows no sign of it having served — no address in its status (the informer's copy
        // may lag), no `load-balancer-address` annotation (written once it serves) — and it
        // has no listener (its creating sync was cut short before them).
        let never_served = match &settled {
            Some(l) if l.is_error() && l.name == name && others.is_empty() => {
                created
                    || (!has_ingress(service)
                        && annotation(service, ANNOTATION_LOAD_BALANCER_ADDRESS).is_none()
                        && self.listeners_of(&l.id).await?.is_empty())
            }
            _ => false,
        };
        let lb = match settled {
            None => {
                return Err(CloudError::msg(format!(
                    "load balancer {} ({}) disappeared",
                    lb.name, lb.id
                )));
            }
            // As OCCM: a load balancer that went into ERROR when it was made is deleted, and
            // made again by the retried sync. Also one found in ERROR that never served (see
            // `never_served`). Only one with this Service's name that no other Service uses.
            Some(l) if never_served => {
                self.delete_load_balancer(&l, self.config.load_balancer.cascade_delete)
                    .await?;
                return Err(CloudError::msg(format!(
                    "load balancer {name} ({}) went into ERROR in Octavia when it was made (see Octavia's logs for why); it was deleted and is made again",
                    l.id
                )));
            }
            // One that served may still serve: never deleted on doubt, nor changed (Octavia
            // refuses changes to it anyway).
            Some(l) if l.is_error() => {
                return Err(CloudError::msg(format!(
                    "load balancer {} ({}) is in ERROR in Octavia: left as it is (it may still serve); repair it in Octavia (e.g. a failover), or delete the Service{}",
                    l.name,
                    l.id,
                    if owner && others.is_empty() {
                        " to delete it"
                    } else {
                        ""
                    }
                )));
            }
            Some(l) => l,
        };
        // Listeners, floating IP, tags. Whatever their outcome, the Service then gets the load
        // balancer's ID (as OCCM, which records it before anything can fail; once the load
        // balancer is known to stay: one in ERROR made again gets none), and the address once
        // it serves: one merge patch, none when the Service shows both already.
        let served: CloudResult<String> = async {
            self.ensure_listeners(&lb, &name, owner, &ports, &opts, &allowed_cidrs, &members, tags)
                .await?;

            // Floating IP.
            let ipv6_vip = lb
                .vip_address
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_ipv6());
            let address = if ipv6_vip {
                // As OCCM: neutron has no floating IPs for IPv6; the VIP is the address.
                if !opts.internal && !opts.floating_network_id.is_empty() {
                    tracing::info!(lb = %lb.id, vip = %lb.vip_address, "IPv6 load balancer: no floating IP, the VIP is the address");
                }
                lb.vip_address.clone()
            } else if opts.internal {
                // A floating IP made for the Service goes (detached when it is to be kept); a
                // user's own is left alone.
                self.release_floating_ip(
                    &lb,
                    &[floating_ip_description(cluster, service)],
                    opts.keep_floating_ip,
                    false,
                )
                .await?;
                lb.vip_address.clone()
            } else if !owner {
                // A Service sharing another's load balancer never adds a floating IP (it could
                // expose an internal owner): the owner's, else an error.
                match self.floating_ip_on_port(&lb.vip_port_id).await? {
                    Some(f) => f.floating_ip_address,
                    None if opts.floating_network_id.is_empty() => lb.vip_address.clone(),
                    None => {
                        return Err(CloudError::msg(format!(
                            "load balancer {} shared through {ANNOTATION_LOAD_BALANCER_ID} has no floating IP, and only the Service that owns it gives it one",
                            lb.id
                        )));
                    }
                }
            } else {
                // The floating network configured (by `[LoadBalancer]`, a class or an
                // annotation), else, as OCCM, an external network the project sees.
                if !opts.floating_network_id.is_empty() {
                    self.ensure_floating_ip(cluster, service, &lb, &opts).await?
                } else if let Some(f) = self.floating_ip_on_port(&lb.vip_port_id).await? {
                    // The one made before (every sync after the first) or someone's: the
                    // networks are not listed again.
                    f.floating_ip_address
                } else if let Some(detected) = self.detect_floating_network(&lb).await? {
                    opts.floating_network_id = detected;
                    self.ensure_floating_ip(cluster, service, &lb, &opts).await?
                } else {
                    // No external network: the VIP, and OCCM's Warning on the Service.
                    self.warn(
                        service,
                        "LoadBalancerExternalNetworkSearchFailed",
                        "no floating-network-id is configured and the project sees no external network with an IPv4 subnet: the Service's address is its load balancer's VIP (set [LoadBalancer] floating-network-id or the loadbalancer.openstack.org/floating-network-id annotation)",
                    );
                    lb.vip_address.clone()
                }
            };

            // The load balancer carries the name of every Service that uses it (OCCM's tags).
            if tags && !lb.tags.contains(&name) {
                let mut all = lb.tags.clone();
                all.push(name.clone());
                self.lb_put(
                    &lb.id,
                    &format!("{LBAAS}/loadbalancers/{}", lb.id),
                    json!({"loadbalancer": {"tags": all}}),
                    "load balancer tags",
                )
                .await?;
                tracing::info!(lb = %lb.id, service_tag = %name, "tagged the load balancer with the Service");
            }
            Ok(address)
        }
        .await;
        let mut notes = AnnotationChanges::new().set(ANNOTATION_LOAD_BALANCER_ID, lb.id.clone());
        if let Ok(address) = &served {
            notes = notes.set(ANNOTATION_LOAD_BALANCER_ADDRESS, address.clone());
        }
        let annotated = self.annotate(service, notes).await;
        let address = served?;
        annotated?;
        self.reconcile_security_group(cluster, service, &ports, &opts, &allowed_cidrs, nodes, &members)
            .await?;
        Ok((
            status_for(
                &address,
                opts.status_hostname(&address).as_deref(),
                opts.proxy_protocol.is_some(),
            ),
            members.skipped,
        ))
    }

    /// Creates the Service's own load balancer.
    async fn create_load_balancer(
        &self,
        cluster: &str,
        service: &KubeService,
        name: &str,
        opts: &ServiceOptions,
        tags: bool,
    ) -> CloudResult<OctaviaLoadBalancer> {
        let ns = service.metadata.namespace.as_deref().unwrap_or("default");
        let svc = service.metadata.name.as_deref().unwrap_or_default();
        let mut body = json!({
            "name": name,
            "description": format!("Kubernetes external service {ns}/{svc} from cluster {cluster}"),
        });
        if tags {
            body["tags"] = json!([name]);
        }
        // As OCCM: a port, else the network and the subnet as set (Octavia refuses a subnet
        // that is not on the network, rather than one of them being dropped silently).
        if !opts.port_id.is_empty() {
            body["vip_port_id"] = json!(opts.port_id);
        } else {
            if !opts.network_id.is_empty() {
                body["vip_network_id"] = json!(opts.network_id);
            }
            if !opts.subnet_id.is_empty() {
                body["vip_subnet_id"] = json!(opts.subnet_id);
            }
        }
        let provider = &self.config.load_balancer.lb_provider;
        if !provider.is_empty() {
            body["provider"] = json!(provider);
        }
        // As OCCM: sent only where Octavia (and the provider: not `ovn`) has them; otherwise
        // left out with a warning (Octavia would refuse the load balancer).
        for (field, value, feature) in [
            ("flavor_id", &opts.flavor_id, OctaviaFeature::Flavors),
            (
                "availability_zone",
                &opts.availability_zone,
                OctaviaFeature::AvailabilityZones,
            ),
        ] {
            if value.is_empty() {
                continue;
            }
            if self.octavia_supports(feature).await? {
                body[field] = json!(value);
            } else {
                let (major, minor) = feature.since();
                tracing::warn!(
                    field,
                    value = %value,
                    lb_provider = %self.config.load_balancer.lb_provider,
                    "left out of the new load balancer: this Octavia (API before {major}.{minor}) or its ovn provider does not have it (as OCCM)"
                );
            }
        }
        // As OCCM: `spec.loadBalancerIP` of an internal or IPv6 Service is its VIP (of an
        // external one, its floating IP).
        if let Some(ip) = service
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_ip.as_deref())
            .map(str::trim)
            .filter(|ip| !ip.is_empty())
            && (opts.internal || service_wants_ipv6(service))
        {
            body["vip_address"] = json!(ip);
        }
        let v = self
            .client
            .post(
                Service::LoadBalancer,
                &format!("{LBAAS}/loadbalancers"),
                &json!({"loadbalancer": body}),
            )
            .await
            .map_err(|e| cloud_error(format!("creating load balancer {name}"), e))?;
        let created: OctaviaLoadBalancer = decode(&v, "loadbalancer", "loadbalancers")
            .map_err(|e| cloud_error("creating load balancer", e))?;
        tracing::info!(lb = %created.id, %name, "created Octavia load balancer");
        Ok(created)
    }

    /// The members: each backend Node the node selector picks, at its first InternalIP (else ExternalIP, as OCCM) of the
    /// Service's primary family (a Node without one is left out, with a log). No member at all
    /// is an error, as in OCCM: the members are never wiped for it.
    fn members(
        &self,
        service: &KubeService,
        nodes: &[Arc<Node>],
        opts: &ServiceOptions,
    ) -> CloudResult<Members> {
        let ipv6 = service_wants_ipv6(service);
        let family = if ipv6 { "IPv6" } else { "IPv4" };
        let backends = load_balancer_backends(nodes);
        let selected: Vec<_> = backends
            .iter()
            .filter(|n| node_matches(n, &opts.node_selector))
            .collect();
        if selected.is_empty() {
            return Err(CloudError::msg(format!(
                "there are no available nodes for LoadBalancer service {}/{}{}: the load balancer's members are left as they are",
                service.metadata.namespace.as_deref().unwrap_or("default"),
                service.metadata.name.as_deref().unwrap_or_default(),
                if backends.is_empty() || opts.node_selector.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (none of the {} backend Nodes has the labels of the node selector {:?})",
                        backends.len(),
                        opts.node_selector
                    )
                }
            )));
        }
        let mut by_node = BTreeMap::new();
        let mut skipped = Vec::new();
        for n in selected {
            let node = n.metadata.name.clone().unwrap_or_default();
            match member_address(n, ipv6) {
                Some(ip) => {
                    by_node.insert(node, ip);
                }
                None => {
                    tracing::warn!(
                        node,
                        family,
                        "no InternalIP or ExternalIP of the Service's family: not a load balancer member"
                    );
                    skipped.push(node);
                }
            }
        }
        if by_node.is_empty() {
            return Err(CloudError::msg(format!(
                "no backend Node has an InternalIP or ExternalIP of the Service's IP family ({family}): the load balancer's members are left as they are"
            )));
        }
        Ok(Members { by_node, skipped })
    }
}

/// The wanted members of every pool.
pub(super) struct Members {
    /// Node name → address.
    pub(super) by_node: BTreeMap<String, String>,
    /// Backends left out for want of an address of the Service's family.
    pub(super) skipped: Vec<String>,
}

/// Whether the Service's status shows a load-balancer address.
fn has_ingress(service: &KubeService) -> bool {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_balancer_names_name_their_service() {
        assert_eq!(
            service_of_load_balancer_name("kubernetes", "kube_service_kubernetes_shop_web"),
            Some(("shop".into(), "web".into()))
        );
        // A cluster name with underscores.
        assert_eq!(
            service_of_load_balancer_name("my_cluster", "kube_service_my_cluster_shop_web"),
            Some(("shop".into(), "web".into()))
        );
        assert_eq!(
            service_of_load_balancer_name("other", "kube_service_kubernetes_shop_web"),
            None
        );
        assert_eq!(
            service_of_load_balancer_name("kubernetes", "a0123456789abcdef"),
            None
        );
        assert_eq!(
            service_of_load_balancer_name("kubernetes", "kube_service_kubernetes_shop"),
            None
        );
    }
}
