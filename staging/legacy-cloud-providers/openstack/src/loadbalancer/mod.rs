//! LoadBalancer Services as Octavia load balancers (cloud-provider-openstack's
//! `openstack_loadbalancer.go`): one load balancer named
//! `kube_service_<cluster>_<namespace>_<name>`, one listener per Service port (matched by
//! protocol and port, named `listener_<i>_<lb>`), its default pool (`pool_<i>_<lb>`) with one
//! member per backend Node (its first InternalIP, the port's NodePort, named after the Node),
//! an optional health monitor (`monitor_<i>_<lb>`), and for external Services a neutron
//! floating IP on the VIP port. Octavia is asynchronous: every change waits for the load
//! balancer to be `ACTIVE` again.
//!
//! Annotations read (upstream names): `loadbalancer.openstack.org/subnet-id`, `…/network-id`,
//! `…/port-id`, `…/floating-network-id`, `…/floating-subnet-id`, `…/lb-method`,
//! `…/enable-health-monitor`,
//! `…/keep-floatingip`, `…/flavor-id`, `…/availability-zone`, and
//! `service.beta.kubernetes.io/openstack-internal-load-balancer`. A bad value is an error naming
//! the annotation and the value; nothing is created or changed then.
//!
//! Only load balancers with this cluster's name for the Service are touched. Octavia's states:
//! `PENDING_*` is waited out (at most [`PROVISIONING_TIMEOUT`]); a load balancer that went into
//! `ERROR` when it was made is deleted and made again (OCCM); one in `ERROR` that served is
//! left as it is, an error on the Service, until the Service is deleted (then it is deleted,
//! as an `ACTIVE` one). Floating IPs: only the one made for the Service is ever deleted
//! (`floating_ip.rs`); `spec.loadBalancerIP` chooses the address.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use k8s_cloud_provider::{CloudError, CloudResult, LoadBalancer};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service as KubeService};

use crate::OpenStackCloud;

mod ensure;
mod floating_ip;
mod octavia;
mod options;

pub(crate) use floating_ip::FloatingIp;
pub use floating_ip::floating_ip_description;
pub use octavia::OctaviaLoadBalancer;
pub use options::*;

fn status_for(address: &str, hostname: Option<&str>) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![match hostname {
            // `loadbalancer.openstack.org/hostname`: the hostname instead of the address.
            Some(h) => LoadBalancerIngress {
                hostname: Some(h.to_string()),
                ..Default::default()
            },
            None => LoadBalancerIngress {
                ip: Some(address.to_string()),
                ..Default::default()
            },
        }]),
    }
}

#[async_trait]
impl LoadBalancer for OpenStackCloud {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        service: &KubeService,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let Some(lb) = self
            .find_load_balancer(&load_balancer_name(cluster, service))
            .await?
        else {
            return Ok(None);
        };
        let address = match self.floating_ip_on_port(&lb.vip_port_id).await? {
            Some(f) => f.floating_ip_address,
            None => lb.vip_address,
        };
        let hostname = annotation(service, ANNOTATION_HOSTNAME)
            .map(str::trim)
            .filter(|h| !h.is_empty());
        Ok(Some(status_for(&address, hostname)))
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
        // As upstream, a Node without an InternalIP is no member; a node sync that met one (a
        // Node whose addresses arrive just after its provider ID) fails after applying the rest,
        // so the Service is synced again shortly, not at the next periodic node sync.
        let (_, skipped) = self.ensure(cluster, service, nodes).await?;
        if skipped.is_empty() {
            return Ok(());
        }
        Err(CloudError::retry_after(
            format!(
                "nodes without an InternalIP are not members yet: {}",
                skipped.join(", ")
            ),
            Duration::from_secs(5),
        ))
    }

    /// Deletes the Service's load balancer in any settled state (`ACTIVE` or `ERROR`;
    /// `PENDING_*` waited out with a bound) and the floating IP made for the Service (unless
    /// `keep-floatingip`); a user's own floating IP is never deleted.
    async fn ensure_load_balancer_deleted(&self, cluster: &str, service: &KubeService) -> CloudResult<()> {
        let name = load_balancer_name(cluster, service);
        let Some(lb) = self.find_load_balancer(&name).await? else {
            return Ok(());
        };
        // A bad value must not block the deletion: on doubt the floating IP is kept.
        let keep = annotation_bool(service, ANNOTATION_KEEP_FLOATING_IP, false).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "keeping the floating IP");
            true
        });
        self.release_floating_ip(cluster, service, &lb, keep, true)
            .await?;
        self.delete_load_balancer(&lb, self.config.load_balancer.cascade_delete)
            .await?;
        tracing::info!(lb = %lb.id, %name, "deleted Octavia load balancer");
        Ok(())
    }
}
