//! Floating IPs of load balancers' VIP ports, owned the way OCCM owns them: a floating IP made
//! for a Service carries the description [`floating_ip_description`]
//! (`Floating IP for Kubernetes external service <ns>/<name> from cluster <cluster>`, OCCM's
//! words), and only a floating IP with exactly that description — this Service's, this
//! cluster's — is ever deleted. (OCCM deletes any floating IP whose description starts with
//! those words, another cluster's included; this provider is stricter.) A user's own floating
//! IP, chosen through `spec.loadBalancerIP` or put on the VIP port by hand, is attached but
//! never deleted (when its load balancer goes it is detached, free for another use).

use k8s_cloud_provider::{CloudError, CloudResult};
use k8s_openapi::api::core::v1::Service as KubeService;
use serde::Deserialize;
use serde_json::json;

use super::{octavia::OctaviaLoadBalancer, options::ServiceOptions};
use crate::{
    OpenStackCloud,
    client::{Service, decode, query_escape},
    cloud_error,
};

/// A neutron floating IP (what this crate reads of one).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct FloatingIp {
    pub(crate) id: String,
    pub(crate) floating_ip_address: String,
    #[serde(default)]
    pub(crate) description: String,
    #[serde(default)]
    pub(crate) port_id: Option<String>,
}

/// The description of the floating IP made for `service` in `cluster` (OCCM's).
pub fn floating_ip_description(cluster: &str, service: &KubeService) -> String {
    format!(
        "Floating IP for Kubernetes external service {}/{} from cluster {cluster}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `spec.loadBalancerIP`, when set.
fn requested_address(service: &KubeService) -> Option<&str> {
    service
        .spec
        .as_ref()?
        .load_balancer_ip
        .as_deref()
        .map(str::trim)
        .filter(|a| !a.is_empty())
}

impl OpenStackCloud {
    /// The floating IP on `port_id`, if any.
    pub(super) async fn floating_ip_on_port(&self, port_id: &str) -> CloudResult<Option<FloatingIp>> {
        if port_id.is_empty() {
            return Ok(None);
        }
        let path = format!("/floatingips?port_id={}", query_escape(port_id));
        let mut fips: Vec<FloatingIp> = self
            .client
            .list(Service::Network, &path, "floatingips")
            .await
            .map_err(|e| cloud_error(format!("listing floating IPs of port {port_id}"), e))?;
        Ok(fips.pop())
    }

    /// The floating IP with the address `address`, if the project has it.
    async fn floating_ip_by_address(&self, address: &str) -> CloudResult<Option<FloatingIp>> {
        let path = format!("/floatingips?floating_ip_address={}", query_escape(address));
        let mut fips: Vec<FloatingIp> = self
            .client
            .list(Service::Network, &path, "floatingips")
            .await
            .map_err(|e| cloud_error(format!("looking up floating IP {address}"), e))?;
        fips.retain(|f| f.floating_ip_address == address);
        Ok(fips.pop())
    }

    /// The public address of an external Service's load balancer, as OCCM chooses it: the
    /// floating IP already on the VIP port; else the one `spec.loadBalancerIP` names (attached
    /// when free, made with that address when the project has none); else a new one from the
    /// floating network (and `floating-subnet-id`, when set). A `spec.loadBalancerIP` that
    /// cannot be had is an error saying why (a Warning event on the Service).
    pub(super) async fn ensure_floating_ip(
        &self,
        cluster: &str,
        service: &KubeService,
        lb: &OctaviaLoadBalancer,
        opts: &ServiceOptions,
    ) -> CloudResult<String> {
        let requested = requested_address(service);
        if let Some(f) = self.floating_ip_on_port(&lb.vip_port_id).await? {
            if let Some(r) = requested
                && r != f.floating_ip_address
            {
                return Err(CloudError::msg(format!(
                    "spec.loadBalancerIP {r}: the load balancer already has the floating IP {}; a floating IP is not moved (delete and re-create the Service to change it)",
                    f.floating_ip_address
                )));
            }
            return Ok(f.floating_ip_address);
        }
        if let Some(r) = requested
            && let Some(f) = self.floating_ip_by_address(r).await?
        {
            if let Some(port) = f.port_id.as_deref().filter(|p| !p.is_empty()) {
                return Err(CloudError::msg(format!(
                    "spec.loadBalancerIP {r}: that floating IP is attached to port {port}, not free"
                )));
            }
            self.client
                .put(
                    Service::Network,
                    &format!("/floatingips/{}", f.id),
                    &json!({"floatingip": {"port_id": lb.vip_port_id}}),
                )
                .await
                .map_err(|e| {
                    cloud_error(
                        format!("attaching floating IP {r} to VIP port {}", lb.vip_port_id),
                        e,
                    )
                })?;
            tracing::info!(fip = r, port = %lb.vip_port_id, "attached the requested floating IP");
            return Ok(f.floating_ip_address);
        }
        let mut body = json!({
            "floating_network_id": opts.floating_network_id,
            "port_id": lb.vip_port_id,
            "description": floating_ip_description(cluster, service),
        });
        if let Some(r) = requested {
            body["floating_ip_address"] = json!(r);
        }
        let matcher = opts
            .floating_subnet
            .matcher()
            .map_err(|m| CloudError::msg(format!("floating subnet: {m}")))?;
        let v = match matcher {
            // As OCCM: the subnets chosen by name and tags, tried in neutron's order until one
            // has a free address (not for a requested address: neutron finds its subnet).
            Some(m) if requested.is_none() => self.create_in_matching_subnet(&body, &m, opts, lb).await?,
            _ => {
                if !opts.floating_subnet.id.is_empty() {
                    body["subnet_id"] = json!(opts.floating_subnet.id);
                }
                self.client
                    .post(Service::Network, "/floatingips", &json!({"floatingip": body}))
                    .await
                    .map_err(|e| {
                        let what = match requested {
                            Some(r) => format!(
                                "creating the floating IP {r} (spec.loadBalancerIP) for VIP port {}",
                                lb.vip_port_id
                            ),
                            None => format!("creating a floating IP for VIP port {}", lb.vip_port_id),
                        };
                        cloud_error(what, e)
                    })?
            }
        };
        let f: FloatingIp =
            decode(&v, "floatingip", "floatingips").map_err(|e| cloud_error("creating floating IP", e))?;
        tracing::info!(fip = %f.floating_ip_address, port = %lb.vip_port_id, "created floating IP");
        Ok(f.floating_ip_address)
    }

    /// Creates the floating IP `body` in the first floating subnet `m` chooses that has a free
    /// address.
    async fn create_in_matching_subnet(
        &self,
        body: &serde_json::Value,
        m: &super::SubnetMatcher,
        opts: &ServiceOptions,
        lb: &OctaviaLoadBalancer,
    ) -> CloudResult<serde_json::Value> {
        #[derive(Deserialize)]
        struct Subnet {
            id: String,
            #[serde(default)]
            name: String,
            #[serde(default)]
            tags: Vec<String>,
        }
        let network = &opts.floating_network_id;
        let path = format!(
            "/subnets?network_id={}{}",
            query_escape(network),
            m.neutron_query()
        );
        let subnets: Vec<Subnet> = self
            .client
            .list(Service::Network, &path, "subnets")
            .await
            .map_err(|e| cloud_error(format!("listing the subnets of floating network {network}"), e))?;
        let mut last = None;
        for subnet in subnets.iter().filter(|s| m.matches(&s.name, &s.tags)) {
            let mut b = body.clone();
            b["subnet_id"] = json!(subnet.id);
            match self
                .client
                .post(Service::Network, "/floatingips", &json!({"floatingip": b}))
                .await
            {
                Ok(v) => {
                    tracing::info!(subnet = %subnet.name, subnet_id = %subnet.id, port = %lb.vip_port_id, "floating IP from a chosen subnet");
                    return Ok(v);
                }
                // Full, or refused: the next one (as OCCM); the last refusal is reported.
                Err(e) => {
                    tracing::info!(subnet = %subnet.name, error = %e, "floating subnet not used");
                    last = Some((subnet.name.clone(), e));
                }
            }
        }
        Err(match last {
            Some((name, e)) => cloud_error(
                format!(
                    "no subnet of floating network {network} matching {} has a free address (the last tried, {name:?})",
                    opts.floating_subnet
                ),
                e,
            ),
            None => CloudError::msg(format!(
                "no subnet of floating network {network} matches {}",
                opts.floating_subnet
            )),
        })
    }

    /// Takes the floating IP off `lb`'s VIP port: deleted when it was made for the Service (its
    /// description is one of `ours`: [`floating_ip_description`] of the Service, and of the
    /// Service the load balancer is named for when another Service deletes a shared one) and
    /// is not to be `keep`; detached when it is to be kept. A user's own floating IP is never
    /// deleted: with `deleting` (the load balancer is about to go) it is detached so that it is
    /// free at once, whenever Octavia deletes the VIP port; otherwise (an internal Service) it
    /// is left as it is.
    pub(super) async fn release_floating_ip(
        &self,
        lb: &OctaviaLoadBalancer,
        ours: &[String],
        keep: bool,
        deleting: bool,
    ) -> CloudResult<()> {
        let Some(f) = self.floating_ip_on_port(&lb.vip_port_id).await? else {
            return Ok(());
        };
        let ours = ours.contains(&f.description);
        if ours && !keep {
            match self
                .client
                .delete(Service::Network, &format!("/floatingips/{}", f.id))
                .await
            {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    return Err(cloud_error(
                        format!("deleting floating IP {}", f.floating_ip_address),
                        e,
                    ));
                }
            }
            tracing::info!(fip = %f.floating_ip_address, "deleted floating IP");
            return Ok(());
        }
        if !ours && !deleting {
            tracing::info!(fip = %f.floating_ip_address, description = %f.description, "floating IP not made for this Service: left as it is");
            return Ok(());
        }
        self.client
            .put(
                Service::Network,
                &format!("/floatingips/{}", f.id),
                &json!({"floatingip": {"port_id": null}}),
            )
            .await
            .map_err(|e| cloud_error(format!("detaching floating IP {}", f.floating_ip_address), e))?;
        tracing::info!(fip = %f.floating_ip_address, made_for_the_service = ours, "detached the floating IP (kept)");
        Ok(())
    }
}
