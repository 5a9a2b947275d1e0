//! Node helpers: provider IDs, taints, conditions, the address rules of the cloud-node
//! controller (`updateNodeAddress`, spec §2.5), the `--node-ip` annotation, and label rules.

use std::{collections::BTreeMap, net::IpAddr, sync::LazyLock};

use k8s_openapi::api::core::v1::{Node, NodeAddress, Taint};
use regex::Regex;

use crate::well_known::{ANNOTATION_PROVIDED_NODE_IP, BETA_TO_GA_LABELS};

/// A parsed `<provider>://<id>` provider ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderId {
    /// The provider name before `://`.
    pub provider: String,
    /// Everything after `://` (provider-defined, e.g. `/us-east-1a/i-0abc` for AWS).
    pub id: String,
}

/// A malformed provider ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderIdError {
    /// No `://` separator.
    #[error("spec.providerID {0:?} is not of the form <provider>://<id>")]
    Malformed(String),
    /// Empty provider name or ID.
    #[error("spec.providerID {0:?} has an empty provider name or instance ID")]
    Empty(String),
    /// Another provider's ID.
    #[error("spec.providerID {value:?} belongs to provider {found:?}, not {expected:?}")]
    WrongProvider {
        /// The whole value.
        value: String,
        /// Its provider part.
        found: String,
        /// The provider we are.
        expected: String,
    },
}

impl ProviderId {
    /// Parses `<provider>://<id>`. Never panics.
    pub fn parse(value: &str) -> Result<Self, ProviderIdError> {
        let (provider, id) = value
            .split_once("://")
            .ok_or_else(|| ProviderIdError::Malformed(value.into()))?;
        if provider.is_empty() || id.trim_matches('/').is_empty() {
            return Err(ProviderIdError::Empty(value.into()));
        }
        Ok(Self {
            provider: provider.into(),
            id: id.into(),
        })
    }

    /// Parses and checks that the provider part is `expected`.
    pub fn parse_for(value: &str, expected: &str) -> Result<Self, ProviderIdError> {
        let p = Self::parse(value)?;
        if p.provider != expected {
            return Err(ProviderIdError::WrongProvider {
                value: value.into(),
                found: p.provider,
                expected: expected.into(),
            });
        }
        Ok(p)
    }

    /// Builds `<provider>://<id>`.
    pub fn format(provider: &str, id: &str) -> String {
        format!("{provider}://{id}")
    }
}

/// The Node's name (empty if unset).
pub fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

/// The Node's `spec.providerID` (empty if unset).
pub fn provider_id(node: &Node) -> &str {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or_default()
}

/// The Node's taints.
pub fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// Whether the Node has a taint with this key (any effect).
pub fn has_taint(node: &Node, key: &str) -> bool {
    taints(node).iter().any(|t| t.key == key)
}

/// Whether the Node has a taint with this key and effect.
pub fn has_taint_with_effect(node: &Node, key: &str, effect: &str) -> bool {
    taints(node).iter().any(|t| t.key == key && t.effect == effect)
}

/// The status of the Node's condition `type_` (`True`/`False`/`Unknown`), `Unknown` if absent.
pub fn condition_status<'a>(node: &'a Node, type_: &str) -> &'a str {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .map(|c| c.status.as_str())
        .unwrap_or("Unknown")
}

/// The Node's current `status.addresses`.
pub fn addresses(node: &Node) -> &[NodeAddress] {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default()
}

/// An invalid `alpha.kubernetes.io/provided-node-ip` value or an unmatched node IP.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeIpError {
    /// An entry does not parse as an IP.
    #[error("could not parse {0:?}")]
    Unparsable(String),
    /// More than two IPs, or two of the same family.
    #[error("{0:?} must contain either a single IP or a dual-stack pair of IPs")]
    NotSingleOrDualStack(String),
    /// A dual-stack pair containing `0.0.0.0` or `::`.
    #[error("dual-stack --node-ip {0:?} cannot include '0.0.0.0' or '::'")]
    UnspecifiedInPair(String),
    /// No cloud address equals a provided IP.
    #[error("failed to get node address from cloud provider that matches ip: {0}")]
    NoMatchingAddress(IpAddr),
}

/// Parses the provided-node-ip annotation: one IP or a comma-separated dual-stack pair; no
/// whitespace trimming.
pub fn parse_provided_node_ips(value: &str) -> Result<Vec<IpAddr>, NodeIpError> {
    let ips = value
        .split(',')
        .map(|s| {
            s.parse::<IpAddr>()
                .map_err(|_| NodeIpError::Unparsable(s.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    match ips.as_slice() {
        [_] => {}
        [a, b] => {
            if a.is_ipv4() == b.is_ipv4() {
                return Err(NodeIpError::NotSingleOrDualStack(value.into()));
            }
            if a.is_unspecified() || b.is_unspecified() {
                return Err(NodeIpError::UnspecifiedInPair(value.into()));
            }
        }
        _ => return Err(NodeIpError::NotSingleOrDualStack(value.into())),
    }
    Ok(ips)
}

/// The IPs of the Node's provided-node-ip annotation, if it has one.
pub fn provided_node_ips(node: &Node) -> Option<Result<Vec<IpAddr>, NodeIpError>> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_PROVIDED_NODE_IP))
        .map(|v| parse_provided_node_ips(v))
}

/// Reorders `addresses` so the addresses equal to `node_ips` (in that order) come first, and
/// drops the other addresses of the matched types (newest upstream behaviour).
pub fn addresses_by_provided_ips(
    addresses: &[NodeAddress],
    node_ips: &[IpAddr],
) -> Result<Vec<NodeAddress>, NodeIpError> {
    let mut result: Vec<NodeAddress> = Vec::new();
    let mut matched_types: Vec<&str> = Vec::new();
    for ip in node_ips {
        let mut found = false;
        for a in addresses {
            if a.address.parse::<IpAddr>().ok().as_ref() == Some(ip) {
                found = true;
                if !result.contains(a) {
                    result.push(a.clone());
                }
                if !matched_types.contains(&a.type_.as_str()) {
                    matched_types.push(a.type_.as_str());
                }
            }
        }
        if !found {
            return Err(NodeIpError::NoMatchingAddress(*ip));
        }
    }
    for a in addresses {
        if !matched_types.contains(&a.type_.as_str()) {
            result.push(a.clone());
        }
    }
    Ok(result)
}

/// The addresses the node controller wants on `node`, from the cloud's `cloud` list (spec
/// §2.5 steps 2–4): `Ok(None)` means "leave the Node alone" (still tainted, or the cloud
/// returned no address).
pub fn desired_node_addresses(
    node: &Node,
    cloud: &[NodeAddress],
) -> Result<Option<Vec<NodeAddress>>, NodeIpError> {
    if has_taint(node, crate::well_known::TAINT_UNINITIALIZED) || cloud.is_empty() {
        return Ok(None);
    }
    let mut wanted = cloud.to_vec();
    if !wanted.iter().any(|a| a.type_ == "Hostname") {
        wanted.extend(addresses(node).iter().filter(|a| a.type_ == "Hostname").cloned());
    }
    if let Some(ips) = provided_node_ips(node) {
        wanted = addresses_by_provided_ips(&wanted, &ips?)?;
    }
    Ok(Some(wanted))
}

/// Upstream's change detection (§2.5 step 5): changed if the lengths differ, or if any new
/// entry's type maps (last entry wins) to a different address in the current list.
pub fn node_addresses_changed(current: &[NodeAddress], new: &[NodeAddress]) -> bool {
    if current.len() != new.len() {
        return true;
    }
    let by_type: BTreeMap<&str, &str> = current
        .iter()
        .map(|a| (a.type_.as_str(), a.address.as_str()))
        .collect();
    new.iter()
        .any(|a| by_type.get(a.type_.as_str()) != Some(&a.address.as_str()))
}

static LABEL_VALUE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$").expect("static regex"));

/// Whether `value` is a valid label value (the API server's `IsValidLabelValue`): at most 63
/// characters, empty or alphanumerics with `-`, `_`, `.` inside.
pub fn is_valid_label_value(value: &str) -> bool {
    value.len() <= 63 && LABEL_VALUE.is_match(value)
}

static KUBERNETES_NAMESPACE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(^|\.)(kubernetes|k8s)\.io/").expect("static regex"));

/// Applies `additional` labels to `labels` by the upstream rule: keys in the `kubernetes.io`
/// or `k8s.io` namespaces are dropped, existing labels are never overwritten. Returns the keys
/// that were skipped (for logging).
pub fn apply_additional_labels(
    labels: &mut BTreeMap<String, String>,
    additional: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut skipped = Vec::new();
    for (k, v) in additional {
        if !is_valid_label_value(v) {
            tracing::warn!(label = %k, value = %v, "Discarding node label whose value is not a valid label value");
            skipped.push(k.clone());
            continue;
        }
        if KUBERNETES_NAMESPACE.is_match(k) {
            tracing::warn!(label = %k, "Discarding node label with kubernetes namespace");
            skipped.push(k.clone());
            continue;
        }
        match labels.get(k) {
            Some(existing) => {
                if existing != v {
                    tracing::warn!(label = %k, "Discarding node label that is already present");
                }
                skipped.push(k.clone());
            }
            None => {
                labels.insert(k.clone(), v.clone());
            }
        }
    }
    skipped
}

/// The GA labels that must be set so that each beta label's value is mirrored (§2.6).
pub fn beta_to_ga_label_changes(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut changes = BTreeMap::new();
    for (primary, secondary) in BETA_TO_GA_LABELS {
        if let Some(value) = labels.get(primary)
            && labels.get(secondary) != Some(value)
        {
            changes.insert(secondary.to_string(), value.clone());
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use kube::api::ObjectMeta;

    fn addr(t: &str, a: &str) -> NodeAddress {
        NodeAddress {
            type_: t.into(),
            address: a.into(),
        }
    }

    fn node(annotation: Option<&str>, current: Vec<NodeAddress>, tainted: bool) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                annotations: annotation
                    .map(|v| [(ANNOTATION_PROVIDED_NODE_IP.to_string(), v.to_string())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: tainted.then(|| {
                    vec![Taint {
                        key: crate::well_known::TAINT_UNINITIALIZED.into(),
                        value: Some("true".into()),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(current),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn provider_ids_parse_without_panicking() {
        assert_eq!(
            ProviderId::parse("aws:///us-east-1a/i-0abc").unwrap(),
            ProviderId {
                provider: "aws".into(),
                id: "/us-east-1a/i-0abc".into()
            }
        );
        assert_eq!(
            ProviderId::parse("i-0abc"),
            Err(ProviderIdError::Malformed("i-0abc".into()))
        );
        assert_eq!(
            ProviderId::parse("://x"),
            Err(ProviderIdError::Empty("://x".into()))
        );
        assert_eq!(
            ProviderId::parse("aws:///"),
            Err(ProviderIdError::Empty("aws:///".into()))
        );
        assert!(matches!(
            ProviderId::parse_for("gce://p/z/n", "aws"),
            Err(ProviderIdError::WrongProvider { .. })
        ));
        let e = ProviderId::parse("garbage").unwrap_err().to_string();
        assert!(e.contains("spec.providerID") && e.contains("\"garbage\""), "{e}");
        assert_eq!(ProviderId::format("vsphere", "4211-ab"), "vsphere://4211-ab");
    }

    #[test]
    fn provided_node_ip_parsing_follows_upstream() {
        assert_eq!(
            parse_provided_node_ips("10.0.0.1").unwrap(),
            vec!["10.0.0.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(parse_provided_node_ips("10.0.0.1,fd00::1").unwrap().len(), 2);
        assert!(matches!(
            parse_provided_node_ips("10.0.0.1, fd00::1"),
            Err(NodeIpError::Unparsable(_))
        ));
        assert!(matches!(
            parse_provided_node_ips("10.0.0.1,10.0.0.2"),
            Err(NodeIpError::NotSingleOrDualStack(_))
        ));
        assert!(matches!(
            parse_provided_node_ips("10.0.0.1,fd00::1,fd00::2"),
            Err(NodeIpError::NotSingleOrDualStack(_))
        ));
        assert!(matches!(
            parse_provided_node_ips("0.0.0.0,fd00::1"),
            Err(NodeIpError::UnspecifiedInPair(_))
        ));
        assert!(matches!(
            parse_provided_node_ips("nope"),
            Err(NodeIpError::Unparsable(_))
        ));
        assert!(matches!(
            parse_provided_node_ips(""),
            Err(NodeIpError::Unparsable(_))
        ));
    }

    #[test]
    fn provided_ip_moves_first_and_drops_same_type_others() {
        let cloud = vec![
            addr("InternalIP", "10.0.0.1"),
            addr("InternalIP", "10.0.0.2"),
            addr("ExternalIP", "54.1.2.3"),
            addr("InternalDNS", "ip-10-0-0-1.ec2.internal"),
        ];
        let n = node(Some("10.0.0.2"), vec![addr("Hostname", "kubelet-host")], false);
        let want = desired_node_addresses(&n, &cloud).unwrap().unwrap();
        assert_eq!(
            want,
            vec![
                addr("InternalIP", "10.0.0.2"),
                addr("ExternalIP", "54.1.2.3"),
                addr("InternalDNS", "ip-10-0-0-1.ec2.internal"),
                addr("Hostname", "kubelet-host"),
            ]
        );
    }

    #[test]
    fn provided_ip_compares_ips_not_strings() {
        let cloud = vec![addr("InternalIP", "fd00::1"), addr("InternalIP", "10.0.0.1")];
        let n = node(Some("fd00:0:0::1"), vec![], false);
        assert_eq!(
            desired_node_addresses(&n, &cloud).unwrap().unwrap(),
            vec![addr("InternalIP", "fd00::1")]
        );
    }

    #[test]
    fn dual_stack_pair_orders_both_families() {
        let cloud = vec![
            addr("InternalIP", "10.0.0.1"),
            addr("InternalIP", "fd00::1"),
            addr("ExternalIP", "54.1.2.3"),
        ];
        let n = node(Some("fd00::1,10.0.0.1"), vec![], false);
        assert_eq!(
            desired_node_addresses(&n, &cloud).unwrap().unwrap(),
            vec![
                addr("InternalIP", "fd00::1"),
                addr("InternalIP", "10.0.0.1"),
                addr("ExternalIP", "54.1.2.3")
            ]
        );
    }

    #[test]
    fn unmatched_provided_ip_is_an_error() {
        let cloud = vec![addr("InternalIP", "10.0.0.1")];
        let n = node(Some("10.9.9.9"), vec![], false);
        let e = desired_node_addresses(&n, &cloud).unwrap_err();
        assert_eq!(
            e.to_string(),
            "failed to get node address from cloud provider that matches ip: 10.9.9.9"
        );
    }

    #[test]
    fn tainted_nodes_and_empty_cloud_answers_are_left_alone() {
        let cloud = vec![addr("InternalIP", "10.0.0.1")];
        assert_eq!(
            desired_node_addresses(&node(None, vec![], true), &cloud).unwrap(),
            None
        );
        assert_eq!(
            desired_node_addresses(&node(None, vec![], false), &[]).unwrap(),
            None
        );
    }

    #[test]
    fn cloud_hostname_wins_over_kubelets() {
        let cloud = vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "cloud-name")];
        let n = node(None, vec![addr("Hostname", "kubelet-name")], false);
        assert_eq!(desired_node_addresses(&n, &cloud).unwrap().unwrap(), cloud);
    }

    #[test]
    fn change_detection_matches_upstream() {
        let a = vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "h")];
        assert!(!node_addresses_changed(&a, &a));
        assert!(node_addresses_changed(&a, &a[..1]));
        assert!(node_addresses_changed(
            &a,
            &[addr("InternalIP", "10.0.0.2"), addr("Hostname", "h")]
        ));
        // Reordering alone is not a change.
        assert!(!node_addresses_changed(
            &a,
            &[addr("Hostname", "h"), addr("InternalIP", "10.0.0.1")]
        ));
    }

    #[test]
    fn additional_labels_skip_kubernetes_namespaces_and_existing_keys() {
        let mut labels: BTreeMap<String, String> = [("team".to_string(), "a".to_string())].into();
        let extra: BTreeMap<String, String> = [
            ("topology.k8s.aws/zone-id".to_string(), "use1-az1".to_string()),
            ("node.kubernetes.io/foo".to_string(), "x".to_string()),
            ("kubernetes.io/bar".to_string(), "x".to_string()),
            ("team".to_string(), "b".to_string()),
            ("example.com/rack".to_string(), "r1".to_string()),
        ]
        .into();
        let skipped = apply_additional_labels(&mut labels, &extra);
        assert_eq!(labels.get("example.com/rack").map(String::as_str), Some("r1"));
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        assert!(!labels.contains_key("node.kubernetes.io/foo"));
        assert!(!labels.contains_key("kubernetes.io/bar"));
        // k8s.aws is not k8s.io: allowed.
        assert_eq!(
            labels.get("topology.k8s.aws/zone-id").map(String::as_str),
            Some("use1-az1")
        );
        assert_eq!(skipped.len(), 3);
    }

    #[test]
    fn beta_labels_are_mirrored_to_ga() {
        let labels: BTreeMap<String, String> = [
            (
                "failure-domain.beta.kubernetes.io/zone".to_string(),
                "z1".to_string(),
            ),
            ("topology.kubernetes.io/zone".to_string(), "old".to_string()),
            ("beta.kubernetes.io/instance-type".to_string(), "m5".to_string()),
            ("node.kubernetes.io/instance-type".to_string(), "m5".to_string()),
        ]
        .into();
        let changes = beta_to_ga_label_changes(&labels);
        assert_eq!(
            changes,
            [("topology.kubernetes.io/zone".to_string(), "z1".to_string())].into()
        );
    }
}
