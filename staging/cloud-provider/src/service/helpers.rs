//! Service helpers for providers and the service controller (upstream `service/helpers`).

use std::{collections::BTreeMap, sync::Arc};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service, ServicePort};

use crate::well_known::{
    ANNOTATION_LOAD_BALANCER_SOURCE_RANGES, FINALIZER_LOAD_BALANCER_CLEANUP,
    LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS, TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER,
};

/// `"a"` + the Service UID without dashes, cut to 32 characters (the legacy naming every
/// in-tree provider uses).
pub fn default_load_balancer_name(service: &Service) -> String {
    let uid: String = service
        .metadata
        .uid
        .as_deref()
        .unwrap_or_default()
        .chars()
        .filter(|c| *c != '-')
        .collect();
    let mut name = format!("a{uid}");
    name.truncate(32);
    name
}

/// `namespace/name` of an object.
pub fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A source range that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceRangeError {
    /// `spec.loadBalancerSourceRanges` holds an invalid CIDR.
    #[error(
        "service.Spec.LoadBalancerSourceRanges: {ranges:?} is not valid. Expecting a list of IP ranges. For example, 10.0.0.0/24. Error msg: {reason}"
    )]
    Spec {
        /// The list as given.
        ranges: Vec<String>,
        /// The parse error.
        reason: String,
    },
    /// The `service.beta.kubernetes.io/load-balancer-source-ranges` annotation holds an invalid CIDR.
    #[error(
        "annotation service.beta.kubernetes.io/load-balancer-source-ranges: {value:?} is not valid. Expecting a comma-separated list of source IP ranges. For example, 10.0.0.0/24,192.168.2.0/24. Error msg: {reason}"
    )]
    Annotation {
        /// The annotation value.
        value: String,
        /// The parse error.
        reason: String,
    },
}

fn parse_cidrs(items: &[&str]) -> Result<Vec<IpNet>, String> {
    items
        .iter()
        .map(|s| {
            s.trim()
                .parse::<IpNet>()
                .map(|n| n.trunc())
                .map_err(|e| format!("{s:?}: {e}"))
        })
        .collect()
}

/// The allowed client CIDRs: `spec.loadBalancerSourceRanges`, else the annotation, else
/// `0.0.0.0/0`.
pub fn load_balancer_source_ranges(service: &Service) -> Result<Vec<IpNet>, SourceRangeError> {
    let spec_ranges = service
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_source_ranges.clone())
        .unwrap_or_default();
    if !spec_ranges.is_empty() {
        let items: Vec<&str> = spec_ranges.iter().map(String::as_str).collect();
        return parse_cidrs(&items).map_err(|reason| SourceRangeError::Spec {
            ranges: spec_ranges.clone(),
            reason,
        });
    }
    let value = service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_LOAD_BALANCER_SOURCE_RANGES))
        .map(|v| v.trim().to_string())
        .unwrap_or_default();
    if value.is_empty() {
        return Ok(vec!["0.0.0.0/0".parse().expect("static CIDR")]);
    }
    let items: Vec<&str> = value.split(',').collect();
    parse_cidrs(&items).map_err(|reason| SourceRangeError::Annotation { value, reason })
}

/// Whether the set allows every IPv4 client (`0.0.0.0/0`).
pub fn is_allow_all(ranges: &[IpNet]) -> bool {
    ranges.iter().any(|r| r.to_string() == "0.0.0.0/0")
}

fn service_type(service: &Service) -> &str {
    service
        .spec
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .unwrap_or("ClusterIP")
}

/// Type LoadBalancer or NodePort with `externalTrafficPolicy: Local`.
pub fn requests_only_local_traffic(service: &Service) -> bool {
    matches!(service_type(service), "LoadBalancer" | "NodePort")
        && service
            .spec
            .as_ref()
            .and_then(|s| s.external_traffic_policy.as_deref())
            == Some("Local")
}

/// Type LoadBalancer with `externalTrafficPolicy: Local` (kube-proxy serves a health check).
pub fn needs_health_check(service: &Service) -> bool {
    service_type(service) == "LoadBalancer" && requests_only_local_traffic(service)
}

/// `("/healthz", healthCheckNodePort)` when the Service needs a health check and has a port.
pub fn service_health_check_path_port(service: &Service) -> Option<(&'static str, i32)> {
    if !needs_health_check(service) {
        return None;
    }
    let port = service
        .spec
        .as_ref()
        .and_then(|s| s.health_check_node_port)
        .unwrap_or(0);
    (port != 0).then_some(("/healthz", port))
}

/// Whether the Service carries the load-balancer cleanup finalizer.
pub fn has_lb_finalizer(service: &Service) -> bool {
    service
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER_LOAD_BALANCER_CLEANUP))
}

/// Semantic equality of the `ingress` lists (what the service controller compares).
///
/// An entry with an `ip` and no `ipMode` equals the same entry with `ipMode: VIP`: API servers
/// since 1.30 write that default into every such entry, so a provider that leaves the field
/// unset (all of them before 1.29, AWS' hostnames never have one) would otherwise see a change
/// at every sync and write the same status again (upstream's `LoadBalancerStatusEqual` compares
/// the lists as they are, and so re-patches). Entries are compared in order, as upstream does.
pub fn load_balancer_status_equal(a: Option<&LoadBalancerStatus>, b: Option<&LoadBalancerStatus>) -> bool {
    fn ingress(s: Option<&LoadBalancerStatus>) -> Vec<LoadBalancerIngress> {
        let mut list = s.and_then(|s| s.ingress.clone()).unwrap_or_default();
        for entry in &mut list {
            if entry.ip.as_deref().is_some_and(|ip| !ip.is_empty()) && entry.ip_mode.is_none() {
                entry.ip_mode = Some(LOAD_BALANCER_IP_MODE_VIP.to_string());
            }
        }
        list
    }
    ingress(a) == ingress(b)
}

/// `status.loadBalancer.ingress[].ipMode` for a load balancer that forwards packets with the
/// destination still the Service's IP (the API server's default for entries with an `ip`).
pub const LOAD_BALANCER_IP_MODE_VIP: &str = "VIP";
/// `status.loadBalancer.ingress[].ipMode` for a load balancer that proxies (the backends see its
/// address, e.g. with PROXY protocol): kube-proxy then sends in-cluster traffic for that IP to
/// the load balancer instead of short-cutting it.
pub const LOAD_BALANCER_IP_MODE_PROXY: &str = "Proxy";

/// `type: LoadBalancer` and no `spec.loadBalancerClass`.
pub fn wants_load_balancer(service: &Service) -> bool {
    service_type(service) == "LoadBalancer"
        && service
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_class.as_ref())
            .is_none()
}

/// Has the finalizer and is being deleted or no longer `type: LoadBalancer`.
pub fn needs_cleanup(service: &Service) -> bool {
    has_lb_finalizer(service)
        && (service.metadata.deletion_timestamp.is_some() || service_type(service) != "LoadBalancer")
}

fn ports_differ(a: &[ServicePort], b: &[ServicePort]) -> bool {
    a.len() != b.len()
        || a.iter().zip(b).any(|(x, y)| {
            x.name != y.name
                || x.protocol != y.protocol
                || x.port != y.port
                || x.node_port != y.node_port
                || x.target_port != y.target_port
                || x.app_protocol != y.app_protocol
        })
}

/// Whether a Service update needs a load-balancer sync (upstream `needsUpdate`, newest
/// rules). Returns the reason for logging.
pub fn needs_update(old: &Service, new: &Service) -> Option<&'static str> {
    if !wants_load_balancer(old) && !wants_load_balancer(new) {
        return None;
    }
    if wants_load_balancer(old) != wants_load_balancer(new) {
        return Some("Type");
    }
    let (os, ns) = (
        old.spec.clone().unwrap_or_default(),
        new.spec.clone().unwrap_or_default(),
    );
    if wants_load_balancer(new) && os.load_balancer_source_ranges != ns.load_balancer_source_ranges {
        return Some("LoadBalancerSourceRanges");
    }
    if ports_differ(
        os.ports.as_deref().unwrap_or_default(),
        ns.ports.as_deref().unwrap_or_default(),
    ) {
        return Some("Ports");
    }
    if os.session_affinity != ns.session_affinity || os.session_affinity_config != ns.session_affinity_config
    {
        return Some("SessionAffinity");
    }
    if os.load_balancer_ip != ns.load_balancer_ip {
        return Some("LoadbalancerIP");
    }
    if os.external_ips != ns.external_ips {
        return Some("ExternalIP");
    }
    if old.metadata.annotations != new.metadata.annotations {
        return Some("Annotations");
    }
    if old.metadata.uid != new.metadata.uid {
        return Some("UID");
    }
    if os.external_traffic_policy != ns.external_traffic_policy {
        return Some("ExternalTrafficPolicy");
    }
    if os.health_check_node_port != ns.health_check_node_port {
        return Some("HealthCheckNodePort");
    }
    if os.ip_families.as_ref().map(Vec::len) != ns.ip_families.as_ref().map(Vec::len) {
        return Some("IPFamilies");
    }
    None
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Whether a Node is a load-balancer backend (newest predicates, spec §4.3): not being
/// deleted, exclusion label absent or parsing as `false` (unparsable — including the empty
/// value kubeadm sets on control-plane nodes — excludes), no cluster-autoscaler deletion
/// taint. Readiness is not considered.
pub fn is_load_balancer_backend(node: &Node) -> bool {
    if node.metadata.deletion_timestamp.is_some() {
        return false;
    }
    if let Some(v) = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS))
        && parse_go_bool(v) != Some(false)
    {
        return false;
    }
    !crate::node::helpers::has_taint(node, TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER)
}

/// The backends among `nodes`, sorted by name.
pub fn load_balancer_backends(nodes: &[Arc<Node>]) -> Vec<Arc<Node>> {
    let mut v: Vec<Arc<Node>> = nodes
        .iter()
        .filter(|n| is_load_balancer_backend(n))
        .cloned()
        .collect();
    v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    v
}

/// Node name → (provider ID, labels), to compare node sets "sufficiently". Upstream compares
/// names and provider IDs only; labels are included here so that provider-side label filters
/// (e.g. AWS `target-node-labels`) follow label changes (deliberate difference).
pub fn node_set_fingerprint(nodes: &[Arc<Node>]) -> BTreeMap<String, (String, BTreeMap<String, String>)> {
    nodes
        .iter()
        .map(|n| {
            (
                n.metadata.name.clone().unwrap_or_default(),
                (
                    crate::node::helpers::provider_id(n).to_string(),
                    n.metadata.labels.clone().unwrap_or_default(),
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{NodeSpec, ServiceSpec, Taint},
        apimachinery::pkg::apis::meta::v1::Time,
    };

    #[test]
    fn an_ip_without_ip_mode_equals_the_servers_vip_default_and_nothing_else() {
        let status = |ip: Option<&str>, hostname: Option<&str>, mode: Option<&str>| LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: ip.map(str::to_string),
                hostname: hostname.map(str::to_string),
                ip_mode: mode.map(str::to_string),
                ..Default::default()
            }]),
        };
        let ours = status(Some("192.0.2.1"), None, None);
        let stored = status(Some("192.0.2.1"), None, Some("VIP"));
        assert!(load_balancer_status_equal(Some(&stored), Some(&ours)));
        assert!(load_balancer_status_equal(Some(&ours), Some(&stored)));
        // Proxy differs from the default, and from nothing.
        let proxy = status(Some("192.0.2.1"), None, Some("Proxy"));
        assert!(!load_balancer_status_equal(Some(&stored), Some(&proxy)));
        assert!(!load_balancer_status_equal(Some(&ours), Some(&proxy)));
        // A hostname gets no default.
        let host = status(None, Some("lb.example"), None);
        assert!(!load_balancer_status_equal(
            Some(&host),
            Some(&status(None, Some("lb.example"), Some("VIP")))
        ));
        assert!(load_balancer_status_equal(Some(&host), Some(&host.clone())));
        // Another address is a change whatever the modes.
        assert!(!load_balancer_status_equal(
            Some(&stored),
            Some(&status(Some("192.0.2.2"), None, None))
        ));
    }
    use kube::api::ObjectMeta;

    fn svc(type_: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("8f1c7d4e-1234-4bcd-9e0f-0123456789ab".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn node(labels: &[(&str, &str)], taints: &[&str]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(
                    taints
                        .iter()
                        .map(|k| Taint {
                            key: k.to_string(),
                            effect: "NoSchedule".into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn default_name_is_a_plus_uid_without_dashes_cut_to_32() {
        let s = svc("LoadBalancer");
        assert_eq!(default_load_balancer_name(&s), "a8f1c7d4e12344bcd9e0f0123456789a");
        assert_eq!(default_load_balancer_name(&s).len(), 32);
    }

    #[test]
    fn source_ranges_spec_then_annotation_then_allow_all() {
        let mut s = svc("LoadBalancer");
        assert_eq!(
            load_balancer_source_ranges(&s).unwrap(),
            vec!["0.0.0.0/0".parse::<IpNet>().unwrap()]
        );
        assert!(is_allow_all(&load_balancer_source_ranges(&s).unwrap()));
        s.metadata.annotations = Some(
            [(
                ANNOTATION_LOAD_BALANCER_SOURCE_RANGES.to_string(),
                " 10.0.0.0/8, 192.168.1.0/24 ".to_string(),
            )]
            .into(),
        );
        assert_eq!(load_balancer_source_ranges(&s).unwrap().len(), 2);
        s.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["172.16.0.0/12".into()]);
        assert_eq!(
            load_balancer_source_ranges(&s).unwrap(),
            vec!["172.16.0.0/12".parse::<IpNet>().unwrap()]
        );
        s.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["bogus".into()]);
        let e = load_balancer_source_ranges(&s).unwrap_err().to_string();
        assert!(
            e.starts_with("service.Spec.LoadBalancerSourceRanges: [\"bogus\"] is not valid."),
            "{e}"
        );
    }

    #[test]
    fn health_check_only_for_local_load_balancers() {
        let mut s = svc("LoadBalancer");
        assert_eq!(service_health_check_path_port(&s), None);
        let spec = s.spec.as_mut().unwrap();
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(32000);
        assert!(requests_only_local_traffic(&s));
        assert_eq!(service_health_check_path_port(&s), Some(("/healthz", 32000)));
        s.spec.as_mut().unwrap().type_ = Some("NodePort".into());
        assert!(requests_only_local_traffic(&s));
        assert!(!needs_health_check(&s));
    }

    #[test]
    fn load_balancer_class_opts_out() {
        let mut s = svc("LoadBalancer");
        assert!(wants_load_balancer(&s));
        s.spec.as_mut().unwrap().load_balancer_class = Some("example.com/lb".into());
        assert!(!wants_load_balancer(&s));
        assert!(!wants_load_balancer(&svc("ClusterIP")));
    }

    #[test]
    fn cleanup_needs_the_finalizer_and_deletion_or_type_change() {
        let mut s = svc("LoadBalancer");
        assert!(!needs_cleanup(&s));
        s.metadata.finalizers = Some(vec![FINALIZER_LOAD_BALANCER_CLEANUP.into()]);
        assert!(!needs_cleanup(&s));
        s.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        assert!(needs_cleanup(&s));
        let mut d = svc("LoadBalancer");
        d.metadata.finalizers = Some(vec![FINALIZER_LOAD_BALANCER_CLEANUP.into()]);
        d.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert!(needs_cleanup(&d));
    }

    #[test]
    fn needs_update_rules() {
        let old = svc("LoadBalancer");
        assert_eq!(needs_update(&old, &old), None);
        assert_eq!(needs_update(&svc("ClusterIP"), &svc("NodePort")), None);
        assert_eq!(needs_update(&svc("ClusterIP"), &old), Some("Type"));
        let mut new = old.clone();
        new.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        assert_eq!(needs_update(&old, &new), Some("Annotations"));
        let mut new = old.clone();
        new.spec.as_mut().unwrap().ports = Some(vec![ServicePort {
            port: 80,
            ..Default::default()
        }]);
        assert_eq!(needs_update(&old, &new), Some("Ports"));
        let mut new = old.clone();
        new.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into());
        assert_eq!(needs_update(&old, &new), Some("ExternalTrafficPolicy"));
    }

    #[test]
    fn node_predicates_newest_rules() {
        assert!(is_load_balancer_backend(&node(&[], &[])));
        assert!(is_load_balancer_backend(&node(
            &[(LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS, "false")],
            &[]
        )));
        assert!(!is_load_balancer_backend(&node(
            &[(LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS, "true")],
            &[]
        )));
        assert!(!is_load_balancer_backend(&node(
            &[(LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS, "")],
            &[]
        )));
        assert!(!is_load_balancer_backend(&node(
            &[(LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS, "garbage")],
            &[]
        )));
        assert!(!is_load_balancer_backend(&node(
            &[],
            &[TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER]
        )));
        // The master role label no longer excludes.
        assert!(is_load_balancer_backend(&node(
            &[("node-role.kubernetes.io/master", "")],
            &[]
        )));
        let mut deleting = node(&[], &[]);
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert!(!is_load_balancer_backend(&deleting));
    }

    #[test]
    fn go_bool_parsing() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Some(true));
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Some(false));
        }
        assert_eq!(parse_go_bool("yes"), None);
        assert_eq!(parse_go_bool(""), None);
    }
}
