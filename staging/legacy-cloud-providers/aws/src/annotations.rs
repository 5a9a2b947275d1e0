//! The Service annotations of the AWS load balancers (spec A6.6, prefix
//! `service.beta.kubernetes.io/aws-load-balancer-`), parsed and validated **before** any cloud
//! call: a bad value is an error naming the annotation and the value, so the service
//! controller records a Warning event and nothing is created or changed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;

/// The annotation prefix.
pub const PREFIX: &str = "service.beta.kubernetes.io/aws-load-balancer-";

/// Every annotation suffix this provider reads (all 30 of the newest provider).
pub const ALL: [&str; 30] = [
    "type",
    "internal",
    "proxy-protocol",
    "access-log-emit-interval",
    "access-log-enabled",
    "access-log-s3-bucket-name",
    "access-log-s3-bucket-prefix",
    "connection-draining-enabled",
    "connection-draining-timeout",
    "connection-idle-timeout",
    "cross-zone-load-balancing-enabled",
    "extra-security-groups",
    "security-groups",
    "ssl-cert",
    "ssl-ports",
    "ssl-negotiation-policy",
    "backend-protocol",
    "additional-resource-tags",
    "healthcheck-protocol",
    "healthcheck-port",
    "healthcheck-path",
    "healthcheck-healthy-threshold",
    "healthcheck-unhealthy-threshold",
    "healthcheck-timeout",
    "healthcheck-interval",
    "target-group-attributes",
    "eip-allocations",
    "private-ipv4-addresses",
    "target-node-labels",
    "subnets",
];

/// Which load balancer a Service gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbKind {
    /// Classic ELB (no `type` annotation).
    Classic,
    /// Network Load Balancer with instance targets (`type: nlb`).
    Network,
    /// Handled by another controller (`nlb-ip`, `external`).
    Elsewhere,
}

/// A validated annotation set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LbOptions {
    /// `type`.
    pub kind: Option<LbKind>,
    /// `internal`.
    pub internal: bool,
    /// `proxy-protocol: "*"`.
    pub proxy_protocol: bool,
    /// `access-log-emit-interval` (minutes, 5 or 60).
    pub access_log_emit_interval: Option<i32>,
    /// `access-log-enabled`.
    pub access_log_enabled: Option<bool>,
    /// `access-log-s3-bucket-name`.
    pub access_log_bucket: Option<String>,
    /// `access-log-s3-bucket-prefix`.
    pub access_log_prefix: Option<String>,
    /// `connection-draining-enabled`.
    pub draining_enabled: Option<bool>,
    /// `connection-draining-timeout` (s).
    pub draining_timeout: Option<i32>,
    /// `connection-idle-timeout` (s).
    pub idle_timeout: Option<i32>,
    /// `cross-zone-load-balancing-enabled`.
    pub cross_zone: Option<bool>,
    /// `extra-security-groups`.
    pub extra_security_groups: Vec<String>,
    /// `security-groups`.
    pub security_groups: Vec<String>,
    /// `ssl-cert`.
    pub ssl_cert: Option<String>,
    /// `ssl-ports` (numbers or port names; `None` = all).
    pub ssl_ports: Option<Vec<String>>,
    /// `ssl-negotiation-policy`.
    pub ssl_negotiation_policy: Option<String>,
    /// `backend-protocol` (lower-case).
    pub backend_protocol: Option<String>,
    /// `additional-resource-tags`.
    pub additional_tags: BTreeMap<String, String>,
    /// `healthcheck-protocol` (upper-case).
    pub hc_protocol: Option<String>,
    /// `healthcheck-port` (`traffic-port` or a number).
    pub hc_port: Option<String>,
    /// `healthcheck-path`.
    pub hc_path: Option<String>,
    /// `healthcheck-healthy-threshold`.
    pub hc_healthy: Option<i32>,
    /// `healthcheck-unhealthy-threshold`.
    pub hc_unhealthy: Option<i32>,
    /// `healthcheck-timeout` (s).
    pub hc_timeout: Option<i32>,
    /// `healthcheck-interval` (s).
    pub hc_interval: Option<i32>,
    /// `target-group-attributes`.
    pub target_group_attributes: BTreeMap<String, String>,
    /// `eip-allocations`.
    pub eip_allocations: Vec<String>,
    /// `private-ipv4-addresses`.
    pub private_ipv4_addresses: Vec<String>,
    /// `target-node-labels` (`k=v`, or `k` = must exist).
    pub target_node_labels: BTreeMap<String, Option<String>>,
    /// `subnets`.
    pub subnets: Vec<String>,
}

/// An invalid annotation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {PREFIX}{suffix}: {value:?} is invalid: {reason}")]
pub struct AnnotationError {
    /// The suffix.
    pub suffix: String,
    /// The value.
    pub value: String,
    /// Why.
    pub reason: String,
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Whether the Service's `type` annotation hands it to another controller (`nlb-ip`,
/// `external`), exactly as upstream's `isLBExternal`.
pub fn is_external(service: &Service) -> bool {
    service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&format!("{PREFIX}type")))
        .is_some_and(|v| v == "nlb-ip" || v == "external")
}

impl LbOptions {
    /// Parses and validates a Service's annotations.
    pub fn parse(service: &Service) -> Result<Self, AnnotationError> {
        let ann = service.metadata.annotations.clone().unwrap_or_default();
        let mut o = LbOptions::default();
        for (key, value) in ann.iter() {
            let Some(suffix) = key.strip_prefix(PREFIX) else {
                continue;
            };
            let bad = |reason: &str| AnnotationError {
                suffix: suffix.into(),
                value: value.clone(),
                reason: reason.into(),
            };
            let int = |min: i32, max: i32| -> Result<i32, AnnotationError> {
                value
                    .trim()
                    .parse::<i32>()
                    .ok()
                    .filter(|n| (min..=max).contains(n))
                    .ok_or_else(|| bad(&format!("must be an integer from {min} to {max}")))
            };
            // Go's strconv.ParseBool.
            let boolean = || -> Result<bool, AnnotationError> {
                match value.trim() {
                    "1" | "t" | "T" | "true" | "True" | "TRUE" => Ok(true),
                    "0" | "f" | "F" | "false" | "False" | "FALSE" => Ok(false),
                    _ => Err(bad(
                        "must be true or false (or 1, t, T, TRUE, True, 0, f, F, FALSE, False)",
                    )),
                }
            };
            match suffix {
                "type" => {
                    // Exactly as upstream's isNLB/isLBExternal: anything else is a Classic ELB,
                    // so a Service migrated from the Go provider keeps its kind.
                    o.kind = Some(match value.as_str() {
                        "nlb" => LbKind::Network,
                        "nlb-ip" | "external" => LbKind::Elsewhere,
                        other => {
                            if !other.is_empty() {
                                tracing::warn!(annotation = %key, value = %other, "unknown load-balancer type: a Classic ELB is used, as upstream does");
                            }
                            LbKind::Classic
                        }
                    })
                }
                // As upstream: "" and exactly "false" mean internet-facing, anything else internal.
                "internal" => o.internal = !value.is_empty() && value != "false",
                "proxy-protocol" => {
                    if value.trim() != "*" {
                        return Err(bad("only \"*\" (all backends) is supported"));
                    }
                    o.proxy_protocol = true;
                }
                "access-log-emit-interval" => {
                    let v = int(5, 60)?;
                    if v != 5 && v != 60 {
                        return Err(bad("must be 5 or 60 (minutes)"));
                    }
                    o.access_log_emit_interval = Some(v);
                }
                "access-log-enabled" => o.access_log_enabled = Some(boolean()?),
                "access-log-s3-bucket-name" => o.access_log_bucket = Some(value.trim().to_string()),
                "access-log-s3-bucket-prefix" => o.access_log_prefix = Some(value.trim().to_string()),
                "connection-draining-enabled" => o.draining_enabled = Some(boolean()?),
                "connection-draining-timeout" => o.draining_timeout = Some(int(1, 3600)?),
                "connection-idle-timeout" => o.idle_timeout = Some(int(1, 4000)?),
                "cross-zone-load-balancing-enabled" => o.cross_zone = Some(boolean()?),
                "extra-security-groups" | "security-groups" => {
                    let groups = list(value);
                    if let Some(g) = groups.iter().find(|g| !g.starts_with("sg-")) {
                        return Err(bad(&format!("{g:?} is not a security group ID (sg-…)")));
                    }
                    if suffix == "security-groups" {
                        o.security_groups = groups;
                    } else {
                        o.extra_security_groups = groups;
                    }
                }
                "ssl-cert" => {
                    if !value.trim().starts_with("arn:") {
                        return Err(bad("must be a certificate ARN (arn:aws:acm:… or arn:aws:iam:…)"));
                    }
                    o.ssl_cert = Some(value.trim().to_string());
                }
                "ssl-ports" => {
                    let ports = list(value);
                    o.ssl_ports = if ports.iter().any(|p| p == "*") {
                        None
                    } else {
                        Some(ports)
                    };
                }
                "ssl-negotiation-policy" => o.ssl_negotiation_policy = Some(value.trim().to_string()),
                "backend-protocol" => {
                    let p = value.trim().to_ascii_lowercase();
                    if !matches!(p.as_str(), "http" | "https" | "ssl" | "tcp") {
                        return Err(bad("must be http, https, ssl or tcp"));
                    }
                    o.backend_protocol = Some(p);
                }
                "additional-resource-tags" => {
                    for item in list(value) {
                        let (k, v) = item.split_once('=').unwrap_or((item.as_str(), ""));
                        let (k, v) = (k.trim(), v.trim());
                        if k.is_empty() || k.starts_with("aws:") || k.len() > 128 || v.len() > 256 {
                            return Err(bad(&format!(
                                "tag {item:?}: keys must be 1–128 characters, not start with aws:, values ≤ 256"
                            )));
                        }
                        o.additional_tags.insert(k.into(), v.into());
                    }
                }
                "healthcheck-protocol" => {
                    let p = value.trim().to_ascii_uppercase();
                    if !matches!(p.as_str(), "TCP" | "HTTP" | "HTTPS" | "SSL") {
                        return Err(bad("must be TCP, HTTP, HTTPS or SSL"));
                    }
                    o.hc_protocol = Some(p);
                }
                "healthcheck-port" => {
                    let p = value.trim();
                    if p != "traffic-port" && !p.parse::<u16>().is_ok_and(|n| n > 0) {
                        return Err(bad("must be traffic-port or a port number"));
                    }
                    o.hc_port = Some(p.to_string());
                }
                "healthcheck-path" => {
                    if !value.trim().starts_with('/') {
                        return Err(bad("must be a path starting with /"));
                    }
                    o.hc_path = Some(value.trim().to_string());
                }
                "healthcheck-healthy-threshold" => o.hc_healthy = Some(int(2, 10)?),
                "healthcheck-unhealthy-threshold" => o.hc_unhealthy = Some(int(2, 10)?),
                "healthcheck-timeout" => o.hc_timeout = Some(int(2, 120)?),
                "healthcheck-interval" => o.hc_interval = Some(int(5, 300)?),
                "target-group-attributes" => {
                    for item in list(value) {
                        let (k, v) = item
                            .split_once('=')
                            .ok_or_else(|| bad(&format!("{item:?} is not key=value")))?;
                        let (k, v) = (k.trim(), v.trim());
                        if !matches!(k, "preserve_client_ip.enabled" | "proxy_protocol_v2.enabled") {
                            return Err(bad(&format!(
                                "{k:?}: only preserve_client_ip.enabled and proxy_protocol_v2.enabled are supported"
                            )));
                        }
                        if v != "true" && v != "false" {
                            return Err(bad(&format!("{k}={v:?}: must be true or false")));
                        }
                        o.target_group_attributes.insert(k.into(), v.into());
                    }
                }
                "eip-allocations" => {
                    o.eip_allocations = list(value);
                    if let Some(e) = o.eip_allocations.iter().find(|e| !e.starts_with("eipalloc-")) {
                        return Err(bad(&format!("{e:?} is not an EIP allocation ID (eipalloc-…)")));
                    }
                }
                "private-ipv4-addresses" => {
                    o.private_ipv4_addresses = list(value);
                    if let Some(ip) = o
                        .private_ipv4_addresses
                        .iter()
                        .find(|ip| ip.parse::<std::net::Ipv4Addr>().is_err())
                    {
                        return Err(bad(&format!("{ip:?} is not an IPv4 address")));
                    }
                }
                "target-node-labels" => {
                    for item in list(value) {
                        match item.split_once('=') {
                            Some((k, v)) if !k.trim().is_empty() => o
                                .target_node_labels
                                .insert(k.trim().into(), Some(v.trim().into())),
                            None => o.target_node_labels.insert(item.trim().into(), None),
                            _ => return Err(bad(&format!("{item:?} has no label key"))),
                        };
                    }
                }
                "subnets" => o.subnets = list(value),
                other => {
                    tracing::warn!(annotation = %format!("{PREFIX}{other}"), "unknown AWS load-balancer annotation ignored")
                }
            }
        }
        o.check(service)?;
        Ok(o)
    }

    fn check(&self, service: &Service) -> Result<(), AnnotationError> {
        let nlb = self.kind == Some(LbKind::Network);
        let err = |suffix: &str, reason: &str| AnnotationError {
            suffix: suffix.into(),
            value: service
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(&format!("{PREFIX}{suffix}")).cloned())
                .unwrap_or_default(),
            reason: reason.into(),
        };
        if nlb && !self.extra_security_groups.is_empty() {
            return Err(err("extra-security-groups", "is not supported for NLBs"));
        }
        if !nlb && !self.target_group_attributes.is_empty() {
            return Err(err("target-group-attributes", "applies to NLBs only (type: nlb)"));
        }
        if self
            .target_group_attributes
            .get("preserve_client_ip.enabled")
            .map(String::as_str)
            == Some("false")
            && service
                .spec
                .as_ref()
                .and_then(|s| s.ports.as_ref())
                .is_some_and(|p| p.iter().any(|p| p.protocol.as_deref() == Some("UDP")))
        {
            return Err(err(
                "target-group-attributes",
                "preserve_client_ip.enabled=false is not allowed with UDP ports",
            ));
        }
        if self.access_log_enabled == Some(true)
            && self.access_log_bucket.as_deref().unwrap_or_default().is_empty()
        {
            return Err(err(
                "access-log-enabled",
                "needs service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name",
            ));
        }
        if !nlb && self.hc_protocol.as_deref() == Some("SSL") && self.hc_path.is_some() {
            return Err(err(
                "healthcheck-path",
                "is not used with the SSL health-check protocol",
            ));
        }
        if nlb && self.hc_protocol.as_deref() == Some("SSL") {
            return Err(err(
                "healthcheck-protocol",
                "NLB health checks are TCP, HTTP or HTTPS",
            ));
        }
        if !nlb && (!self.eip_allocations.is_empty() || !self.private_ipv4_addresses.is_empty()) {
            let which = if self.eip_allocations.is_empty() {
                "private-ipv4-addresses"
            } else {
                "eip-allocations"
            };
            return Err(err(which, "applies to NLBs only (type: nlb)"));
        }
        Ok(())
    }

    /// Whether `port` (service port number or name) gets TLS: a certificate is set and the
    /// port is in `ssl-ports` (all ports when absent).
    pub fn is_ssl_port(&self, port: i32, name: Option<&str>) -> bool {
        self.ssl_cert.is_some()
            && match &self.ssl_ports {
                None => true,
                Some(ports) => ports
                    .iter()
                    .any(|p| p == &port.to_string() || Some(p.as_str()) == name),
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use kube::api::ObjectMeta;

    fn svc(annotations: &[(&str, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(vec![ServicePort {
                    port: 443,
                    name: Some("https".into()),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn there_are_thirty() {
        let set: std::collections::BTreeSet<&str> = ALL.iter().copied().collect();
        assert_eq!(set.len(), 30);
    }

    #[test]
    fn a_full_set_parses() {
        let o = LbOptions::parse(&svc(&[
            ("internal", "true"),
            ("proxy-protocol", "*"),
            ("access-log-emit-interval", "5"),
            ("access-log-enabled", "true"),
            ("access-log-s3-bucket-name", "logs"),
            ("access-log-s3-bucket-prefix", "p"),
            ("connection-draining-enabled", "true"),
            ("connection-draining-timeout", "60"),
            ("connection-idle-timeout", "120"),
            ("cross-zone-load-balancing-enabled", "true"),
            ("extra-security-groups", "sg-1, sg-2"),
            ("ssl-cert", "arn:aws:acm:us-east-1:123456789012:certificate/x"),
            ("ssl-ports", "https"),
            ("ssl-negotiation-policy", "ELBSecurityPolicy-TLS-1-2-2017-01"),
            ("backend-protocol", "HTTP"),
            ("additional-resource-tags", "team=web, cost-center=42,flag"),
            ("healthcheck-protocol", "http"),
            ("healthcheck-port", "traffic-port"),
            ("healthcheck-path", "/ready"),
            ("healthcheck-healthy-threshold", "3"),
            ("healthcheck-unhealthy-threshold", "4"),
            ("healthcheck-timeout", "6"),
            ("healthcheck-interval", "12"),
            ("target-node-labels", "role=web,gpu"),
            ("subnets", "subnet-1,public-a"),
        ]))
        .unwrap();
        assert!(o.internal && o.proxy_protocol);
        assert_eq!(o.extra_security_groups, vec!["sg-1", "sg-2"]);
        assert_eq!(o.additional_tags.get("flag").map(String::as_str), Some(""));
        assert_eq!(o.backend_protocol.as_deref(), Some("http"));
        assert!(o.is_ssl_port(443, Some("https")) && !o.is_ssl_port(80, Some("http")));
        assert_eq!(o.target_node_labels.get("gpu"), Some(&None));
        assert_eq!(o.hc_protocol.as_deref(), Some("HTTP"));
    }

    #[test]
    fn every_bad_value_names_the_annotation_and_value() {
        let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
            (vec![("proxy-protocol", "true")], "only \"*\""),
            (vec![("access-log-emit-interval", "7")], "must be 5 or 60"),
            (
                vec![("access-log-enabled", "yes")],
                "access-log-enabled: \"yes\" is invalid: must be true or false",
            ),
            (
                vec![("access-log-enabled", "true")],
                "needs service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name",
            ),
            (
                vec![("connection-idle-timeout", "0")],
                "connection-idle-timeout: \"0\"",
            ),
            (
                vec![("security-groups", "web")],
                "\"web\" is not a security group ID",
            ),
            (vec![("ssl-cert", "mycert")], "must be a certificate ARN"),
            (
                vec![("backend-protocol", "grpc")],
                "must be http, https, ssl or tcp",
            ),
            (
                vec![("additional-resource-tags", "aws:x=1")],
                "must be 1–128 characters, not start with aws:",
            ),
            (
                vec![("healthcheck-protocol", "udp")],
                "must be TCP, HTTP, HTTPS or SSL",
            ),
            (
                vec![("healthcheck-port", "http")],
                "must be traffic-port or a port number",
            ),
            (
                vec![("healthcheck-path", "healthz")],
                "must be a path starting with /",
            ),
            (vec![("healthcheck-interval", "2")], "integer from 5 to 300"),
            (
                vec![("type", "nlb"), ("extra-security-groups", "sg-1")],
                "is not supported for NLBs",
            ),
            (
                vec![("target-group-attributes", "preserve_client_ip.enabled=true")],
                "applies to NLBs only",
            ),
            (
                vec![
                    ("type", "nlb"),
                    ("target-group-attributes", "stickiness.enabled=true"),
                ],
                "only preserve_client_ip.enabled and proxy_protocol_v2.enabled",
            ),
            (
                vec![("type", "nlb"), ("eip-allocations", "eip-1")],
                "is not an EIP allocation ID",
            ),
            (vec![("eip-allocations", "eipalloc-1")], "applies to NLBs only"),
            (
                vec![("type", "nlb"), ("private-ipv4-addresses", "10.0.0.300")],
                "is not an IPv4 address",
            ),
            (vec![("target-node-labels", "=x")], "has no label key"),
        ];
        for (ann, expected) in cases {
            let e = LbOptions::parse(&svc(&ann)).unwrap_err().to_string();
            assert!(e.contains(expected), "{ann:?}: expected {expected:?} in {e:?}");
            assert!(
                e.starts_with("annotation service.beta.kubernetes.io/aws-load-balancer-"),
                "{e}"
            );
        }
    }

    #[test]
    fn kinds() {
        assert_eq!(LbOptions::parse(&svc(&[])).unwrap().kind, None);
        assert_eq!(
            LbOptions::parse(&svc(&[("type", "nlb")])).unwrap().kind,
            Some(LbKind::Network)
        );
        assert_eq!(
            LbOptions::parse(&svc(&[("type", "external")])).unwrap().kind,
            Some(LbKind::Elsewhere)
        );
        assert!(!LbOptions::parse(&svc(&[("internal", "false")])).unwrap().internal);
        // Upstream's exact comparisons: anything but "nlb", "nlb-ip", "external" is a CLB.
        for other in ["NLB", " nlb", "alb", "classic"] {
            assert_eq!(
                LbOptions::parse(&svc(&[("type", other)])).unwrap().kind,
                Some(LbKind::Classic),
                "{other:?}"
            );
        }
        assert!(
            LbOptions::parse(&svc(&[("internal", " false")]))
                .unwrap()
                .internal
        );
        assert!(
            LbOptions::parse(&svc(&[("internal", "0.0.0.0/0")]))
                .unwrap()
                .internal
        );
        assert!(is_external(&svc(&[("type", "nlb-ip")])));
        assert!(!is_external(&svc(&[("type", "nlb")])));
    }

    #[test]
    fn booleans_accept_what_go_parse_bool_accepts() {
        for (v, want) in [
            ("t", true),
            ("T", true),
            ("1", true),
            ("TRUE", true),
            ("f", false),
            ("False", false),
            ("0", false),
        ] {
            assert_eq!(
                LbOptions::parse(&svc(&[("cross-zone-load-balancing-enabled", v)]))
                    .unwrap()
                    .cross_zone,
                Some(want),
                "{v}"
            );
        }
        assert!(LbOptions::parse(&svc(&[("cross-zone-load-balancing-enabled", "yes")])).is_err());
    }
}
