//! LoadBalancer Services as Octavia load balancers (cloud-provider-openstack's
//! `openstack_loadbalancer.go`): one load balancer named
//! `kube_service_<cluster>_<namespace>_<name>` (found also under the legacy `a<uid>` name, or
//! the one `loadbalancer.openstack.org/load-balancer-id` names, possibly another Service's,
//! shared), one listener per Service port (matched by protocol and port, named
//! `listener_<i>_<lb>`, tagged with the Service's load balancer name), its default pool
//! (`pool_<i>_<lb>`) with one member per backend Node (its InternalIP, else ExternalIP, of the Service's IP
//! family, the port's NodePort, named after the Node), an optional health monitor
//! (`monitor_<i>_<lb>`), and for external Services a neutron floating IP on the VIP port.
//! Octavia is asynchronous: every change waits for the load balancer to be `ACTIVE` again.
//!
//! Annotations read (upstream names) are the `ANNOTATION_*` constants; a bad value is an error
//! naming the annotation and the value; nothing is created or changed then. The README's
//! OpenStack section lists them against OCCM's.
//!
//! Only load balancers with this cluster's name for the Service, or that a Service names, are
//! touched; on a shared one only the Service's own listeners (`listeners.rs`), and it is
//! deleted only by the last Service using it (`delete.rs`). Octavia's states: `PENDING_*` is
//! waited out (at most [`PROVISIONING_TIMEOUT`]); a load balancer that went into `ERROR` when
//! it was made is deleted and made again (OCCM); one in `ERROR` that served is left as it is,
//! an error on the Service, until the Service is deleted (then it is deleted, as an `ACTIVE`
//! one). Floating IPs: only the one made for the Service is ever deleted (`floating_ip.rs`);
//! `spec.loadBalancerIP` chooses the address.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use k8s_cloud_provider::{CloudError, CloudResult, LoadBalancer};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service as KubeService};

use crate::OpenStackCloud;

mod autodetect;
mod delete;
mod ensure;
mod floating_ip;
mod floating_subnet;
mod listeners;
mod octavia;
mod options;
mod security_group;
pub mod tls;

pub use autodetect::node_address_for_subnet;
pub(crate) use floating_ip::FloatingIp;
pub use floating_ip::floating_ip_description;
pub use floating_subnet::{FloatingSubnetSpec, SubnetMatcher};
pub use octavia::{OctaviaFeature, OctaviaLoadBalancer, octavia_api_version};
pub use options::*;
pub(crate) use security_group::SecurityGroup;
pub use security_group::{security_group_description, security_group_name};

/// The Service status OCCM writes: the hostname when one is asked for, else the address with
/// `ipMode: Proxy` when the pools speak PROXY protocol (kube-proxy must then send in-cluster
/// traffic through the load balancer, which adds the header) and `VIP` otherwise.
fn status_for(address: &str, hostname: Option<&str>, proxy_protocol: bool) -> LoadBalancerStatus {
    use k8s_cloud_provider::service::helpers::{LOAD_BALANCER_IP_MODE_PROXY, LOAD_BALANCER_IP_MODE_VIP};
    LoadBalancerStatus {
        ingress: Some(vec![match hostname {
            // `loadbalancer.openstack.org/hostname`: the hostname instead of the address.
            Some(h) => LoadBalancerIngress {
                hostname: Some(h.to_string()),
                ..Default::default()
            },
            None => LoadBalancerIngress {
                ip: Some(address.to_string()),
                ip_mode: Some(
                    if proxy_protocol {
                        LOAD_BALANCER_IP_MODE_PROXY
                    } else {
                        LOAD_BALANCER_IP_MODE_VIP
                    }
                    .to_string(),
                ),
                ..Default::default()
            },
        }]),
    }
}

impl OpenStackCloud {
    /// A Warning Event on the Service, as OCCM records them (component
    /// `cloud-provider-openstack`); nothing before [`k8s_cloud_provider::CloudProvider::initialize`].
    pub(super) fn warn(&self, service: &KubeService, reason: &str, message: &str) {
        use kube::Resource as _;
        if let Some(events) = self.events.get() {
            events.event(
                &service.object_ref(&()),
                k8s_controller_manager::events::EventType::Warning,
                reason,
                message,
            );
        }
    }
}

#[async_trait]
impl LoadBalancer for OpenStackCloud {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        service: &KubeService,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let lb_id = annotation(service, ANNOTATION_LOAD_BALANCER_ID)
            .map(str::trim)
            .filter(|v| !v.is_empty());
        let Some(ensure::ServiceLoadBalancer { lb, .. }) =
            self.service_load_balancer(cluster, service, lb_id).await?
        else {
            return Ok(None);
        };
        let address = match self.floating_ip_on_port(&lb.vip_port_id).await? {
            Some(f) => f.floating_ip_address,
            None => lb.vip_address,
        };
        // The annotations as `ensure` reads them; unreadable ones: the hostname annotation alone.
        let (hostname, proxy_protocol) = match ServiceOptions::from_service(self, service) {
            Ok(opts) => (opts.status_hostname(&address), opts.proxy_protocol.is_some()),
            Err(_) => (
                annotation(service, ANNOTATION_HOSTNAME)
                    .map(str::trim)
                    .filter(|h| !h.is_empty())
                    .map(str::to_string),
                false,
            ),
        };
        Ok(Some(status_for(&address, hostname.as_deref(), proxy_protocol)))
    }

    fn get_load_balancer_name(&self, cluster: &str, service: &KubeService) -> String {
        load_balancer_name(cluster, service)
    }

    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &KubeService,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        self.ensure(cluster, service, nodes)
            .await
            .map(|(status, _)| status)
    }

    async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &KubeService,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        // As upstream, a Node without an InternalIP or ExternalIP is no member; a node sync that met one (a
        // Node whose addresses arrive just after its provider ID) fails after applying the rest,
        // so the Service is synced again shortly, not at the next periodic node sync.
        let (_, skipped) = self.ensure(cluster, service, nodes).await?;
        if skipped.is_empty() {
            return Ok(());
        }
        Err(CloudError::retry_after(
            format!(
                "nodes without an InternalIP or ExternalIP of the Service's family are not members yet: {}",
                skipped.join(", ")
            ),
            Duration::from_secs(5),
        ))
    }

    /// Deletes the Service's load balancer (`delete.rs`), or, on a load balancer other
    /// Services share or that was not made for this cluster, only the Service's listeners.
    async fn ensure_load_balancer_deleted(&self, cluster: &str, service: &KubeService) -> CloudResult<()> {
        self.delete_service_load_balancer(cluster, service).await
    }
}
