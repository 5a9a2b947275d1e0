//! Deleting a Service's load balancer, as OCCM decides it: the load balancer goes only when no
//! other Service uses it (no other Service's tag) and it was made by a cloud controller manager
//! — stricter than OCCM, named for a Service of *this* cluster. Otherwise (shared, a user's own
//! load balancer named through `load-balancer-id`, or a legacy `a<uid>` one, which OCCM never
//! deletes either) only the Service's own listeners go and its tag is taken off.

use k8s_cloud_provider::{CloudResult, service::AnnotationChanges};
use k8s_openapi::api::core::v1::Service as KubeService;
use serde_json::json;

use super::{
    ensure::{ServiceLoadBalancer, service_of_load_balancer_name, service_tags},
    floating_ip::floating_ip_description,
    listeners::is_services_listener,
    octavia::*,
    options::*,
};
use crate::OpenStackCloud;

impl OpenStackCloud {
    /// Whether the Service `ns/name` exists and wants a load balancer (`type: LoadBalancer`,
    /// or the cleanup finalizer still on it). Without an API-server client (a provider not
    /// initialised by the framework): `true`, on doubt.
    async fn service_wants_load_balancer(&self, ns: &str, name: &str) -> CloudResult<bool> {
        let Some(client) = self.kube.get() else {
            return Ok(true);
        };
        let api: kube::Api<KubeService> = kube::Api::namespaced(client.clone(), ns);
        match api.get_opt(name).await {
            Ok(None) => Ok(false),
            Ok(Some(s)) => Ok(crate::orphans::wants_load_balancer(&s)),
            Err(e) => Err(k8s_cloud_provider::CloudError::msg(format!(
                "reading Service {ns}/{name}, the Service the load balancer is named for (it is deleted only when that Service is gone): {e}"
            ))),
        }
    }

    /// Deletes what the Service has: see the module's documentation, then its security group
    /// (`manage-security-groups`: made for it by its UID, here or by OCCM; whatever the option
    /// says, as OCCM). Bad annotations never block a deletion (on doubt the floating IP is
    /// kept).
    pub(super) async fn delete_service_load_balancer(
        &self,
        cluster: &str,
        service: &KubeService,
    ) -> CloudResult<()> {
        self.delete_service_load_balancer_only(cluster, service).await?;
        self.delete_security_group(service).await
    }

    async fn delete_service_load_balancer_only(
        &self,
        cluster: &str,
        service: &KubeService,
    ) -> CloudResult<()> {
        let name = load_balancer_name(cluster, service);
        let lb_id = annotation(service, ANNOTATION_LOAD_BALANCER_ID)
            .map(str::trim)
            .filter(|v| !v.is_empty());
        let Some(ServiceLoadBalancer { lb, owner }) =
            self.service_load_balancer(cluster, service, lb_id).await?
        else {
            return Ok(());
        };
        // Out of PENDING_* first (ACTIVE or ERROR).
        let Some(lb) = self.wait_settled(&lb.id).await? else {
            return Ok(());
        };
        let others: Vec<&str> = service_tags(&lb).filter(|t| *t != name).collect();
        let named_for = service_of_load_balancer_name(cluster, &lb.name);
        let this = (
            service
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            service.metadata.name.clone().unwrap_or_default(),
        );
        let delete = match &named_for {
            None => false,
            _ if !others.is_empty() => false,
            Some(for_service) if *for_service == this => true,
            // Named for another Service, which shared it with this one: deleted when that
            // Service is read gone (an untagged load balancer of before tags may still serve
            // it), never on doubt.
            Some((ns, svc)) => !self.service_wants_load_balancer(ns, svc).await?,
        };
        if delete {
            let keep = annotation_bool(service, ANNOTATION_KEEP_FLOATING_IP, false).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "keeping the floating IP");
                true
            });
            // The floating IP made for this Service, or for the Service the load balancer is
            // named for (it shared its load balancer with this one and was deleted first).
            let mut ours = vec![floating_ip_description(cluster, service)];
            if let Some((ns, svc)) = &named_for {
                ours.push(format!(
                    "Floating IP for Kubernetes external service {ns}/{svc} from cluster {cluster}"
                ));
            }
            self.release_floating_ip(&lb, &ours, keep, true).await?;
            self.delete_load_balancer(&lb, self.config.load_balancer.cascade_delete)
                .await?;
            tracing::info!(lb = %lb.id, name = %lb.name, "deleted Octavia load balancer");
            // A Service that stays (it left `type: LoadBalancer`) keeps no ID of a load
            // balancer that is gone (OCCM keeps it, and the Service fails when it comes back).
            self.annotate(
                service,
                AnnotationChanges::new()
                    .remove(ANNOTATION_LOAD_BALANCER_ID)
                    .remove(ANNOTATION_LOAD_BALANCER_ADDRESS),
            )
            .await?;
            return Ok(());
        }

        // Kept: only the Service's listeners go (tagged with its name; as OCCM, untagged ones
        // of a load balancer made before tags are left).
        let listeners = self.listeners_of(&lb.id).await?;
        for l in listeners.iter().filter(|l| is_services_listener(l, &name, false)) {
            self.delete_listener(&lb.id, l).await?;
            tracing::info!(lb = %lb.id, listener = %l.id, port = l.protocol_port, "deleted the Service's listener of a load balancer that stays");
        }
        if lb.tags.contains(&name) {
            let rest: Vec<&String> = lb.tags.iter().filter(|t| **t != name).collect();
            self.lb_put(
                &lb.id,
                &format!("{LBAAS}/loadbalancers/{}", lb.id),
                json!({"loadbalancer": {"tags": rest}}),
                "load balancer tags",
            )
            .await?;
        }
        // The address is no longer the Service's; the ID stays (the load balancer does, and
        // the Service uses it again when it comes back).
        self.annotate(
            service,
            AnnotationChanges::new().remove(ANNOTATION_LOAD_BALANCER_ADDRESS),
        )
        .await?;
        tracing::info!(
            lb = %lb.id,
            name = %lb.name,
            owner,
            other_services = %others.join(","),
            "load balancer kept: {}",
            if others.is_empty() {
                "not named for a Service of this cluster"
            } else {
                "other Services use it"
            }
        );
        Ok(())
    }
}
