//! `type: LoadBalancer` Services on AWS (spec A6): Classic ELBs ([`classic`]) and NLBs with
//! instance targets ([`nlb`]), their security groups and subnets ([`network`]).
//!
//! - Annotations are validated before anything is created or changed
//!   ([`crate::annotations`]); so are the pre-flight rules of AWS-27.
//! - A change of load-balancer type (annotation added, removed or changed) makes the new load
//!   balancer first and deletes the old one (with its security groups) once the Service's
//!   status shows the new one (cp-aws#1254 leaked them; upstream now refuses the change).
//! - `nlb-ip` and `external` Services are answered "implemented elsewhere" and are ignored on
//!   deletion too (as upstream).
//! - Deletion leaks nothing this provider made: owned groups lose every reference in the VPC
//!   and are deleted with back-off on `DependencyViolation`; only resources tagged
//!   `kubernetes.io/cluster/<id>=owned` are ever deleted.
//! - Bring-your-own groups (`security-groups`, and the managed-NLB mode's BYO groups) are never
//!   edited or deleted; the node rules admitting one are revoked when its load balancer goes or
//!   drops it, but kept while another load balancer still has the group attached (upstream
//!   revokes them regardless, cutting off the other Service). Owned groups detached from an
//!   NLB in managed mode are deleted (AWS-53).

pub mod classic;
pub mod network;
pub mod nlb;

use std::{collections::BTreeSet, sync::Arc};

use async_trait::async_trait;
use k8s_cloud_provider::{
    CloudError, CloudResult, LoadBalancer,
    service::helpers::{default_load_balancer_name, service_key},
};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};

pub(crate) use network::not_found_as_none;

use crate::{
    AwsCloud,
    annotations::{LbKind, LbOptions},
    instances::{InstanceInfo, METADATA_MAX_AGE, node_key},
};

/// One service port with a NodePort.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbPort {
    /// Port name.
    pub name: Option<String>,
    /// Service port.
    pub port: i32,
    /// NodePort.
    pub node_port: i32,
    /// `TCP` or `UDP`.
    pub protocol: String,
}

/// The pre-flight checks of AWS-27 and the ports with NodePorts.
pub fn preflight(svc: &Service, kind: LbKind) -> Result<Vec<LbPort>, CloudError> {
    let key = service_key(svc);
    let spec = svc.spec.clone().unwrap_or_default();
    if spec.session_affinity.as_deref().is_some_and(|a| a != "None") {
        return Err(CloudError::msg(format!(
            "service {key}: spec.sessionAffinity {:?} is not supported by AWS load balancers",
            spec.session_affinity.unwrap_or_default()
        )));
    }
    if spec.load_balancer_ip.as_deref().is_some_and(|ip| !ip.is_empty()) {
        return Err(CloudError::msg(format!(
            "service {key}: spec.loadBalancerIP {:?} is not supported by AWS load balancers",
            spec.load_balancer_ip.unwrap_or_default()
        )));
    }
    let ports: Vec<LbPort> = spec
        .ports
        .unwrap_or_default()
        .iter()
        .filter_map(|p| {
            Some(LbPort {
                name: p.name.clone(),
                port: p.port,
                node_port: p.node_port.filter(|n| *n > 0)?,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            })
        })
        .collect();
    if ports.is_empty() {
        return Err(CloudError::msg(format!(
            "service {key}: no port with a NodePort to balance"
        )));
    }
    let protocols: BTreeSet<&str> = ports.iter().map(|p| p.protocol.as_str()).collect();
    if protocols.len() > 1 {
        return Err(CloudError::msg(format!(
            "service {key}: mixed protocols ({}) are not supported",
            protocols.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    let proto = ports[0].protocol.as_str();
    match kind {
        LbKind::Classic if proto != "TCP" => Err(CloudError::msg(format!(
            "service {key}: Classic ELBs support TCP only, not {proto}; use type nlb for UDP"
        ))),
        LbKind::Network if proto != "TCP" && proto != "UDP" => Err(CloudError::msg(format!(
            "service {key}: NLBs support TCP and UDP only, not {proto}"
        ))),
        _ => Ok(ports),
    }
}

fn hostname_status(dns: &str) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: (!dns.is_empty()).then(|| {
            vec![LoadBalancerIngress {
                hostname: Some(dns.to_string()),
                ..Default::default()
            }]
        }),
    }
}

impl AwsCloud {
    fn parse_options(&self, svc: &Service) -> CloudResult<LbOptions> {
        LbOptions::parse(svc).map_err(|e| CloudError::msg(e.to_string()))
    }

    /// The instances behind the backend Nodes (filtered by `target-node-labels`; Nodes
    /// without a usable instance are skipped, AWS-30).
    async fn target_instances(
        &self,
        nodes: &[Arc<Node>],
        opts: &LbOptions,
    ) -> CloudResult<Vec<Arc<InstanceInfo>>> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for node in nodes {
            let labels = node.metadata.labels.clone().unwrap_or_default();
            let selected = opts.target_node_labels.iter().all(|(k, v)| match v {
                None => labels.contains_key(k),
                Some(v) => labels.get(k) == Some(v),
            });
            if !selected {
                continue;
            }
            let Ok(key) = node_key(node) else { continue };
            match self.lookup(&key, METADATA_MAX_AGE).await? {
                // A Fargate node has no instance to register.
                Some(i) if !i.fargate && seen.insert(i.id.clone()) => out.push(i),
                _ => tracing::debug!(
                    node = node.metadata.name.as_deref().unwrap_or_default(),
                    "no instance for node; not a load-balancer target"
                ),
            }
        }
        Ok(out)
    }

    /// Groups the Service names explicitly (never deleted).
    fn byo_groups(opts: Option<&LbOptions>) -> BTreeSet<String> {
        opts.map(|o| {
            o.security_groups
                .iter()
                .chain(o.extra_security_groups.iter())
                .cloned()
                .collect()
        })
        .unwrap_or_default()
    }
}

/// The load-balancer hostname the Service's status shows, if any.
fn status_hostname(svc: &Service) -> Option<&str> {
    svc.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .hostname
        .as_deref()
}

/// Who deletes a load balancer; they differ in what they know of its Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deleter {
    /// The service controller, which knows the Service's annotations: the nodes' permission
    /// for a bring-your-own first group is revoked (when no other load balancer has it), and a
    /// security group the CCM made that rules it did not make still name fails the deletion,
    /// retried until they are removed (upstream waits for the same `DependencyViolation`).
    ServiceController,
    /// `orphans`, for a load balancer whose Service is gone: the nodes' permission for a group
    /// the CCM did not make is left as it is, and a group it made that other rules name is
    /// kept (its own orphan entry reports it).
    Orphans,
}

impl AwsCloud {
    /// Deletes the load balancer of kind `old` of `svc` (a type switch), if the Service still
    /// wants the other kind.
    async fn delete_replaced(&self, cluster: &str, svc: &Service, old: LbKind) -> CloudResult<()> {
        let name = default_load_balancer_name(svc);
        let opts = LbOptions::parse(svc).ok();
        let wanted = opts.as_ref().and_then(|o| o.kind).unwrap_or(LbKind::Classic);
        if wanted == old || wanted == LbKind::Elsewhere {
            return Ok(());
        }
        let keep = Self::byo_groups(opts.as_ref());
        let deleted = match old {
            LbKind::Classic => {
                self.delete_classic(&name, &keep, Deleter::ServiceController)
                    .await?
            }
            _ => {
                self.delete_nlb(cluster, &name, svc, &keep, Deleter::ServiceController)
                    .await?
            }
        };
        if deleted {
            tracing::info!(lb = %name, service = %service_key(svc), from = ?old, to = ?wanted, "load-balancer type changed: deleted the old load balancer");
        }
        Ok(())
    }

    /// Whether a load balancer of the other kind than `kind` exists for `name`.
    async fn other_kind_exists(&self, name: &str, kind: LbKind) -> CloudResult<bool> {
        Ok(match kind {
            LbKind::Classic => self.describe_nlb(name).await?.is_some(),
            _ => self.describe_classic(name).await?.is_some(),
        })
    }
}

#[async_trait]
impl LoadBalancer for AwsCloud {
    async fn get_load_balancer(
        &self,
        _cluster: &str,
        svc: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let name = default_load_balancer_name(svc);
        if let Some(lb) = self.describe_classic(&name).await? {
            return Ok(Some(hostname_status(lb.dns_name().unwrap_or_default())));
        }
        Ok(self
            .describe_nlb(&name)
            .await?
            .map(|lb| hostname_status(lb.dns_name().unwrap_or_default())))
    }

    /// Creates or updates the load balancer. A change of type (annotation added, removed or
    /// changed) creates the new load balancer first; the old one keeps serving until the
    /// Service's status shows the new one and is deleted then (upstream refuses the change; a
    /// first version of this provider deleted the old one first). If the new one cannot be
    /// made, the error (a Warning event on the Service) says that the old one still serves.
    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        let opts = self.parse_options(svc)?;
        let kind = opts.kind.unwrap_or(LbKind::Classic);
        if kind == LbKind::Elsewhere {
            return Err(CloudError::ImplementedElsewhere);
        }
        let ports = preflight(svc, kind)?;
        let name = default_load_balancer_name(svc);
        let mut switching = self.other_kind_exists(&name, kind).await?;
        let old = match kind {
            LbKind::Classic => LbKind::Network,
            _ => LbKind::Classic,
        };
        if switching {
            // A sync after the status moved to the new load balancer: the old one is deleted
            // first, so that nothing else this sync does (and may fail at) delays it.
            let new_dns = match kind {
                LbKind::Classic => self
                    .describe_classic(&name)
                    .await?
                    .and_then(|lb| lb.dns_name().map(str::to_string)),
                _ => self
                    .describe_nlb(&name)
                    .await?
                    .and_then(|lb| lb.dns_name().map(str::to_string)),
            };
            if new_dns.as_deref().is_some_and(|d| !d.is_empty()) && status_hostname(svc) == new_dns.as_deref()
            {
                self.delete_replaced(cluster, svc, old).await?;
                switching = false;
            }
        }
        let instances = self.target_instances(nodes, &opts).await?;
        let ensured = match kind {
            LbKind::Classic => self.ensure_classic(&name, svc, &opts, &ports, &instances).await,
            _ => {
                self.ensure_nlb(cluster, &name, svc, &opts, &ports, &instances)
                    .await
            }
        };
        let dns = match ensured {
            Ok(dns) => dns,
            Err(e) if switching => {
                let (old, new) = match kind {
                    LbKind::Classic => ("NLB", "classic ELB"),
                    _ => ("classic ELB", "NLB"),
                };
                return Err(CloudError::msg(format!(
                    "switching load-balancer type: the new {new} could not be made, the {old} keeps serving: {e}"
                )));
            }
            Err(e) => return Err(e),
        };
        if switching {
            if !dns.is_empty() && status_hostname(svc) == Some(dns.as_str()) {
                self.delete_replaced(cluster, svc, old).await?;
            } else if !dns.is_empty()
                && let Some(uid) = &svc.metadata.uid
            {
                // The service controller writes the new status, then syncs again: the old load
                // balancer is deleted in that sync (above), under the Service's lock.
                self.switch_pending.lock().insert(uid.clone());
            }
        }
        Ok(hostname_status(&dns))
    }

    async fn update_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        let opts = self.parse_options(svc)?;
        let kind = opts.kind.unwrap_or(LbKind::Classic);
        if kind == LbKind::Elsewhere {
            return Err(CloudError::ImplementedElsewhere);
        }
        let name = default_load_balancer_name(svc);
        let instances = self.target_instances(nodes, &opts).await?;
        match kind {
            LbKind::Classic => {
                let lb = self
                    .describe_classic(&name)
                    .await?
                    .ok_or_else(|| CloudError::msg(format!("classic ELB {name} does not exist")))?;
                self.sync_classic_instances(&name, Some(&lb), &instances).await?;
                if !self.config.disable_security_group_ingress
                    && let Some(g) = classic::primary_group(&lb, &opts)
                {
                    self.sync_node_group_access(&g, &instances).await?;
                }
                Ok(())
            }
            _ => {
                if self.describe_nlb(&name).await?.is_none() {
                    return Err(CloudError::msg(format!("NLB {name} does not exist")));
                }
                let ports = preflight(svc, kind)?;
                self.ensure_nlb(cluster, &name, svc, &opts, &ports, &instances)
                    .await
                    .map(|_| ())
            }
        }
    }

    /// After a type switch whose new load balancer is not yet in the Service's status: once
    /// the controller has written it, one more sync deletes the old load balancer. A failure
    /// there is the sync's error (an event, retried with back-off); a restarted process finds
    /// the switch in its first sync of the Service.
    fn sync_again_after_status(&self, svc: &Service) -> bool {
        svc.metadata
            .uid
            .as_ref()
            .is_some_and(|uid| self.switch_pending.lock().remove(uid))
    }

    /// Deletes whatever this provider made for the Service, of either kind. A Service of type
    /// `nlb-ip`/`external` belongs to another controller and is left alone, as upstream does.
    async fn ensure_load_balancer_deleted(&self, cluster: &str, svc: &Service) -> CloudResult<()> {
        let name = default_load_balancer_name(svc);
        if let Some(uid) = &svc.metadata.uid {
            self.switch_pending.lock().remove(uid);
        }
        if crate::annotations::is_external(svc) {
            return Ok(());
        }
        // Bad annotations must not block deletion: only the groups they name are kept.
        let opts = LbOptions::parse(svc).ok();
        let keep = Self::byo_groups(opts.as_ref());
        self.delete_classic(&name, &keep, Deleter::ServiceController)
            .await?;
        self.delete_nlb(cluster, &name, svc, &keep, Deleter::ServiceController)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    fn svc(ports: Vec<(i32, Option<i32>, &str)>) -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(
                    ports
                        .into_iter()
                        .map(|(p, n, proto)| ServicePort {
                            port: p,
                            node_port: n,
                            protocol: Some(proto.into()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn preflight_rules() {
        assert_eq!(
            preflight(
                &svc(vec![(80, Some(30080), "TCP"), (81, None, "TCP")]),
                LbKind::Classic
            )
            .unwrap()
            .len(),
            1,
            "ports without NodePort are skipped"
        );
        assert!(
            preflight(&svc(vec![(53, Some(30053), "UDP")]), LbKind::Classic)
                .unwrap_err()
                .to_string()
                .contains("Classic ELBs support TCP only")
        );
        assert!(preflight(&svc(vec![(53, Some(30053), "UDP")]), LbKind::Network).is_ok());
        assert!(
            preflight(
                &svc(vec![(53, Some(30053), "UDP"), (80, Some(30080), "TCP")]),
                LbKind::Network
            )
            .unwrap_err()
            .to_string()
            .contains("mixed protocols")
        );
        assert!(
            preflight(&svc(vec![(80, Some(30080), "SCTP")]), LbKind::Network)
                .unwrap_err()
                .to_string()
                .contains("NLBs support TCP and UDP only")
        );
        assert!(
            preflight(&svc(vec![]), LbKind::Classic)
                .unwrap_err()
                .to_string()
                .contains("no port")
        );
        let mut s = svc(vec![(80, Some(30080), "TCP")]);
        s.spec.as_mut().unwrap().session_affinity = Some("ClientIP".into());
        assert!(
            preflight(&s, LbKind::Classic)
                .unwrap_err()
                .to_string()
                .contains("sessionAffinity")
        );
    }
}
